"""Tensor-parallel MoE (bf16): ours (:func:`triton_dist.ops.ag_group_gemm`,
:func:`triton_dist.ops.group_gemm_rs`) against torch doing the same with NCCL, and against the bound
of each overlapped op.

    torchrun --nproc-per-node=2 bench/moe_tp.py [--quick]

Every rank holds ``m`` tokens (a sequence shard) with their top-k routing (uniform random, seeded
per rank) and a tensor-parallel shard of every expert: the first weights split by output columns
(``w1 [E, ffn / world, hidden]``), the second by input columns (``w2 [E, hidden, ffn / world]``).

- ``ag_group_gemm``: ours; torch: ``all_gather_into_tensor`` of the tokens and of the routing, the
  expert-major sort (``argsort``), the row gather, then ``torch._grouped_mm`` (or, where this torch
  has none, our grouped GEMM: the comparison is then of the communication and its overlap only).
  Bound: max(the grouped GEMM alone on the gathered, sorted rows; the tokens' all-gather alone).
- ``group_gemm_rs``: ours; torch: the grouped GEMM, the router-weighted ``index_add_`` into token
  order (fp32), ``reduce_scatter_tensor``. Bound: max(the grouped GEMM alone; the reduce-scatter
  of the fp32 ``[world * m, hidden]`` sums alone).

Both are checked against torch's result first (max |error| / max |ref|). CUDA-graph timing
(:mod:`triton_dist.bench.timing`), median per rank, max over ranks. Refuses to run with ranks
sharing GPUs. Writes bench/results/<gpu>-x<world>/moe_tp.json.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
try:
    import triton_dist._C  # noqa: F401  an installed build
except ImportError:
    sys.path.insert(0, str(HERE.parent / "python"))

from triton_dist import bench  # noqa: E402
from triton_dist import ops  # noqa: E402

log = bench.script.logger("moe_tp")
REL_TOL = 2e-2

LAYERS = {
    # name: experts, topk, hidden, ffn (the expert's inner size before the tensor-parallel split)
    "mixtral-8x7b": (8, 2, 4096, 14336),
    "qwen3-30b-a3b": (128, 8, 2048, 768),
}
TOKENS = (512, 2048)
"""Tokens per rank (a sequence shard of a prefill)."""


def _inputs(m, experts, topk, hidden, shard, rank, device):
    import torch

    g = torch.Generator(device=device).manual_seed(11 + rank)
    x = (torch.randn((m, hidden), device=device, generator=g) * hidden ** -0.25).to(torch.bfloat16)
    scores = torch.rand((m, experts), device=device, generator=g)
    weights, idx = scores.topk(topk, dim=1)
    w1 = (torch.randn((experts, shard, hidden), device=device, generator=g) * hidden ** -0.25).to(torch.bfloat16)
    w2 = (torch.randn((experts, hidden, shard), device=device, generator=g) * shard ** -0.25).to(torch.bfloat16)
    return x, idx.to(torch.int32).contiguous(), weights.contiguous(), w1, w2


def _grouped_mm(a, w, offsets):
    """``(fn(rows, w [E, N, K], offsets) -> [rows, N], name)``: torch's grouped GEMM when this torch
    has it and it takes ``a``, ``w`` and ``offsets`` (tried once), else ours."""
    import torch

    ours = (lambda a, w, offs: ops.group_gemm(a, w, offsets=offs, check_rows=False)), "triton_dist group_gemm"
    fn = getattr(torch, "_grouped_mm", None)
    if fn is None:
        return ours
    try:
        fn(a, w.transpose(1, 2), offs=offsets)
    except (RuntimeError, TypeError, ValueError) as e:
        log(f"torch._grouped_mm refused the shapes ({str(e).splitlines()[0]}): the baseline uses ours")
        return ours
    return (lambda a, w, offs: fn(a, w.transpose(1, 2), offs=offs)), "torch._grouped_mm"


def _expert_ends(flat, experts: int):
    """Cumulative row ends per expert of the ids ``flat``, without a host synchronisation (so that
    the baseline can be captured in a CUDA graph, as ours is)."""
    import torch

    counts = torch.zeros(experts, dtype=torch.int32, device=flat.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))
    return torch.cumsum(counts, 0, dtype=torch.int32)


def main() -> int:
    parser = bench.script.argument_parser(__doc__, HERE / "results")
    parser.set_defaults(heap_size="8G")
    args = parser.parse_args()

    import torch
    import torch.distributed as dist

    from triton_dist.kernels.moe import AllGatherGroupGemmContext, GroupGemmReduceScatterContext

    world, rank, device, gpu = bench.script.start(args, log)
    iters = 10 if args.quick else 30
    records = []
    layers = list(LAYERS.items())[:1] if args.quick else list(LAYERS.items())
    for name, (experts, topk, hidden, ffn) in layers:
        shard = ffn // world
        for m in TOKENS[:1] if args.quick else TOKENS:
            x, idx, weights, w1, w2 = _inputs(m, experts, topk, hidden, shard, rank, device)
            agg = AllGatherGroupGemmContext(m, hidden, torch.bfloat16, experts, topk)
            grs = GroupGemmReduceScatterContext(m, hidden, torch.bfloat16, experts, topk)
            h = ops.ag_group_gemm(x, idx, w1, context=agg)
            grouped_mm, grouped_name = _grouped_mm(h.out, w2, h.offsets)
            rows = world * m * topk
            x_all = torch.empty((world * m, hidden), device=device, dtype=x.dtype)
            idx_all = torch.empty((world * m, topk), device=device, dtype=idx.dtype)
            w_all = torch.empty((world * m, topk), device=device, dtype=weights.dtype)
            combined = torch.empty((world * m, hidden), device=device, dtype=torch.float32)
            torch_y = torch.empty((m, hidden), device=device, dtype=torch.float32)

            def torch_ag():
                dist.all_gather_into_tensor(x_all, x)
                dist.all_gather_into_tensor(idx_all, idx)
                flat = idx_all.reshape(-1).long()
                order = torch.argsort(flat, stable=True)
                return grouped_mm(x_all[order // topk], w1, _expert_ends(flat, experts))

            def torch_rs():
                y = grouped_mm(h.out, w2, h.offsets)
                dist.all_gather_into_tensor(w_all, weights)
                scale = w_all[h.token_index.long(), h.topk_slot.long()][:, None]
                combined.zero_().index_add_(0, h.token_index.long(), y.float() * scale)
                dist.reduce_scatter_tensor(torch_y, combined)
                return torch_y

            want_h = torch_ag()
            torch.cuda.synchronize()
            err_ag = bench.script.relative_error(h.out, want_h)
            got_y = ops.group_gemm_rs(h.out, w2, h, weights, context=grs)
            want_y = torch_rs()
            torch.cuda.synchronize()
            err_rs = bench.script.relative_error(got_y, want_y)
            ok_ag, ok_rs = bench.script.all_ranks_ok(err_ag < REL_TOL), bench.script.all_ranks_ok(err_rs < REL_TOL)
            sorted_rows = x_all[h.token_index.long()].contiguous()
            gemm1 = lambda: ops.group_gemm(sorted_rows, w1, offsets=h.offsets, check_rows=False)  # noqa: E731
            gemm2 = lambda: ops.group_gemm(h.out, w2, offsets=h.offsets, check_rows=False)  # noqa: E731
            gather_x = lambda: dist.all_gather_into_tensor(x_all, x)  # noqa: E731
            scatter = lambda: dist.reduce_scatter_tensor(torch_y, combined)  # noqa: E731
            times = {key: bench.median_us(fn, warmup=3, iters=iters, graph=True) for key, fn in (
                ("ours_ag", lambda: ops.ag_group_gemm(x, idx, w1, context=agg, check_routing=False)),
                ("torch_ag", torch_ag), ("gemm1", gemm1), ("gather", gather_x),
                ("ours_rs", lambda: ops.group_gemm_rs(h.out, w2, h, weights, context=grs)),
                ("torch_rs", torch_rs), ("gemm2", gemm2), ("scatter", scatter))}
            for op, ours, theirs, bound, err, ok in (
                    ("ag_group_gemm", times["ours_ag"], times["torch_ag"], max(times["gemm1"], times["gather"]),
                     err_ag, ok_ag),
                    ("group_gemm_rs", times["ours_rs"], times["torch_rs"], max(times["gemm2"], times["scatter"]),
                     err_rs, ok_rs)):
                log(f"{op} {name} m={m}: ours {ours:.1f} us, torch {theirs:.1f} us, bound {bound:.1f} us "
                    f"(speed-up {theirs / ours:.2f}x, of the bound {bound / ours:.2f}); rel error {err:.1e}")
                records.append(bench.record(op, shape=[world * m, experts, topk, hidden, ffn], dtype="bfloat16",
                                            world_size=world, gpu=gpu, ours_us=ours,
                                            baselines={"torch_nccl_us": theirs}, bound_us=bound, layer=name,
                                            rows=rows, grouped_gemm_baseline=grouped_name, relative_error=err,
                                            verified=ok, timing={"iters": iters, "cuda_graph": True}))
    return bench.script.finish("moe_tp", records, args, extra=("layer", ))


if __name__ == "__main__":
    sys.exit(main())
