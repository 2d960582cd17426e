"""GEMM+AllReduce (bf16, decode sizes): ours (:func:`triton_dist.ops.gemm_ar`, one kernel) vs torch
(``matmul`` then NCCL ``all_reduce``) vs ``matmul`` into a torch symmetric buffer then
``torch.ops.symm_mem.one_shot_all_reduce`` vs ours unfused (our GEMM then ``ops.all_reduce``).

    torchrun --nproc-per-node=2 bench/gemm_ar.py [--quick]

Shapes: a row-parallel linear layer (each model's MLP down projection, ``N`` = the model's hidden
size, ``K`` = its intermediate size split across ranks) at ``M`` = 1, 16, 64 and 128 rows
(``--quick``: llama3.1-8b at 16 and 128). ``A [M, K / world]``, ``B [N, K / world]``, result the
``[M, N]`` sum on every rank.

- ``ours_us``: ``ops.gemm_ar`` (``method="auto"``); ``split_k_us``, ``output_tiles_us``: each
  method forced; ``unfused_us``: ``gemm`` + ``ops.all_reduce`` (auto);
- ``torch_nccl_us``: ``torch.matmul`` + ``dist.all_reduce``;
- ``torch_symm_mem_us``: ``torch.matmul`` into a symmetric buffer + ``one_shot_all_reduce``
  (omitted when unavailable);
- ``gemm_us`` / ``cublas_us``: our GEMM / ``torch.matmul`` alone; ``transfer_us``: the faster of
  ``ops.all_reduce`` and NCCL alone on the ``[M, N]`` result; ``bound_us`` = max(``gemm_us``,
  ``transfer_us``) (docs/design.md §7).

Every contender's result is checked against the fp32 reference first (max |error| / max |ref| <
1e-2), and ours and each forced method for bit-identical results on every rank. Timing: :mod:`triton_dist.bench.timing`,
CUDA graphs of :data:`GROUP` calls, fixed counts on every rank, median per rank, MAX over ranks. Writes
bench/results/<gpu>-x<world>/gemm_ar.json.
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
from triton_dist.kernels import GemmAllReduceContext  # noqa: E402
from triton_dist.kernels.gemm.dense import gemm  # noqa: E402

log = bench.script.logger("gemm_ar")
all_ok = bench.script.all_ranks_ok
REL_TOL = 1e-2
ROWS = (1, 16, 64, 128)
METHODS = ("split_k", "output_tiles")  # ops.gemm_ar's methods besides "auto" (what "ours" runs)
GROUP = 10
"""Calls per timed sample, captured in one CUDA graph: with one decode-sized call per sample the
graph launch's host latency sat inside the sample (docs/design.md §3): the run at 129a76a timed our
all-reduce of 8-512 KiB at 17-96 us, where bench/allreduce.py measures 6-14 us."""


def _shapes(quick: bool) -> list[tuple[str, int, int, int]]:
    """``(model, M, N, K)``: the MLP down projection, ``N`` = hidden, ``K`` = intermediate."""
    models = bench.script.MODEL_SHAPES
    if quick:
        n_up, hidden = models["llama3.1-8b"]
        return [("llama3.1-8b", m, hidden, n_up) for m in (16, 128)]
    return [(name, m, hidden, n_up) for name, (n_up, hidden) in models.items() if name.startswith("llama")
            for m in ROWS]


def _matmul_then_one_shot(a, b, symm_out, one_shot):
    """torch's symmetric-memory path: ``matmul`` into the symmetric buffer, then its one-shot
    all-reduce (which returns the result)."""
    import torch

    def run():
        torch.matmul(a, b.t(), out=symm_out)
        return one_shot()

    return run


def main() -> int:
    parser = bench.script.argument_parser(__doc__, HERE / "results")
    args = parser.parse_args()

    import torch
    import torch.distributed as dist

    world, rank, device, gpu = bench.script.start(args, log)
    dtype = torch.bfloat16
    shapes = _shapes(args.quick)
    iters = 20 if args.quick else 50

    records = []
    for label, m, n, k_full in shapes:
        k = k_full // world
        ctx = GemmAllReduceContext(max(ROWS), n, dtype)  # collective; preloads
        g = torch.Generator(device=device)
        g.manual_seed(5000 + rank)
        a = torch.randn((m, k), device=device, generator=g).to(dtype)
        b = torch.randn((n, k), device=device, generator=g).to(dtype)
        ref = a.float() @ b.float().T
        dist.all_reduce(ref)
        outs = {name: torch.empty((m, n), device=device, dtype=dtype) for name in ("ours", *METHODS, "unfused",
                                                                                   "torch_nccl")}
        partial = torch.empty((m, n), device=device, dtype=dtype)

        def unfused():
            gemm(a, b, out=partial)
            ops.all_reduce(partial, out=outs["unfused"])

        def torch_nccl():
            torch.matmul(a, b.t(), out=outs["torch_nccl"])
            dist.all_reduce(outs["torch_nccl"])

        fns = {"ours": lambda: ops.gemm_ar(a, b, out=outs["ours"], context=ctx), "unfused": unfused,
               **{v: (lambda v=v: ops.gemm_ar(a, b, out=outs[v], method=v, context=ctx)) for v in METHODS},
               "torch_nccl": torch_nccl, "gemm": lambda: gemm(a, b, out=partial),
               "cublas": lambda: torch.matmul(a, b.t(), out=partial),
               "ar_ours": lambda: ops.all_reduce(partial, out=outs["unfused"]),
               "ar_nccl": lambda: dist.all_reduce(partial)}
        symm = None
        try:
            buf, one_shot = bench.script.symm_mem_one_shot_all_reduce(m * n, dtype, device)
            symm = _matmul_then_one_shot(a, b, buf[:m * n].view(m, n), one_shot(m * n))
        except Exception as e:  # noqa: BLE001 - the baseline is optional
            log(f"torch symm_mem one_shot_all_reduce unavailable ({type(e).__name__}: {e}); baseline omitted")
        if not all_ok(symm is not None):  # collective: every rank runs it or none
            symm = None

        errors = {}
        for name in ("ours", *METHODS, "unfused", "torch_nccl"):
            outs[name].fill_(float("nan"))
            fns[name]()
            torch.cuda.synchronize()
            errors[name] = bench.script.relative_error(outs[name], ref)
        if symm is not None:
            got = symm()
            torch.cuda.synchronize()
            errors["torch_symm_mem"] = bench.script.relative_error(got.view(m, n), ref)
            fns["torch_symm_mem"] = symm
        checks = {name: all_ok(err < REL_TOL) for name, err in errors.items()}
        for name in ("ours", *METHODS):
            gathered = [torch.empty_like(outs[name]) for _ in range(world)]
            dist.all_gather(gathered, outs[name])
            checks[f"{name}_identical_on_every_rank"] = all_ok(all(torch.equal(x, outs[name]) for x in gathered))
        bench.sync_and_barrier()

        times = {name: bench.median_us(fn, warmup=5, iters=iters, group=GROUP, graph=True) for name, fn in fns.items()}
        transfer = min(times["ar_ours"], times["ar_nccl"])
        bound = max(times["gemm"], transfer)
        log(f"{label} M={m} N={n} K={k}: ours {times['ours']:.1f} us, unfused {times['unfused']:.1f} us, "
            f"matmul+NCCL {times['torch_nccl']:.1f} us, symm_mem {times.get('torch_symm_mem', float('nan')):.1f} us, "
            f"gemm alone {times['gemm']:.1f} us (cuBLAS {times['cublas']:.1f} us), all_reduce {transfer:.1f} us, "
            f"errors {errors}, checks {checks}")
        records.append(
            bench.record("gemm_ar", shape=[m, n, k], dtype="bfloat16", world_size=world, gpu=gpu, model=label,
                         ours_us=times["ours"],
                         baselines={"torch_nccl_us": times["torch_nccl"],
                                    "torch_symm_mem_us": times.get("torch_symm_mem")},
                         bound_us=bound, unfused_us=times["unfused"], gemm_us=times["gemm"],
                         **{f"{v}_us": times[v] for v in METHODS},
                         cublas_us=times["cublas"], transfer_us=transfer, all_reduce_ours_us=times["ar_ours"],
                         all_reduce_nccl_us=times["ar_nccl"], of_bound=bound / times["ours"],
                         verified=all(checks.values()), checks=checks,
                         rel_errors={name: (e if e < 1e30 else None) for name, e in errors.items()},
                         timing={"iters": iters, "calls_per_sample": GROUP, "cuda_graph": True, "gpu_barrier": True},
                         bound_method="max(our gemm alone, min(ops.all_reduce, NCCL all_reduce))",
                         shape_meaning="[M, N, K per rank]"))
        bench.sync_and_barrier()
        del ctx, symm
        ops.clear_contexts()

    extra = ("model", *(f"{v}_us" for v in METHODS), "unfused_us", "gemm_us", "cublas_us", "transfer_us", "of_bound")
    return bench.script.finish("gemm_ar", records, args, extra)


if __name__ == "__main__":
    sys.exit(main())
