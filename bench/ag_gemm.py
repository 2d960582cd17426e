"""AllGather+GEMM (bf16): ours (:func:`triton_dist.ops.ag_gemm`) vs torch (NCCL
``all_gather_into_tensor`` then ``matmul``) vs ``torch.ops.symm_mem.fused_all_gather_matmul``
(when this torch has it and it runs), plus our GEMM alone vs ``torch.matmul`` (cuBLAS).

    torchrun --nproc-per-node=2 bench/ag_gemm.py [--quick]

Shapes (``M`` rows gathered in total, ``m = M / world`` per rank, weight shard ``[N, K]`` per
rank, ``C = allgather(A) @ B^T`` of ``[M, N]``): :func:`triton_dist.bench.script.overlap_shapes`
(each model's ``(N, K)`` at ``M = 8192``, and an M sweep for llama3.1-70b), ``N`` split across
ranks, plus llama3.1-70b at the small ``M`` of :data:`SMALL_M` (where a producer's latency, not
its bandwidth, decides).

- ``ours_us``: ``ops.ag_gemm`` with one context per shape (the default ``"ce_push"`` producer);
  ``ce_pull_us``: the same with a ``method="ce_pull"`` context (the GEMM reads ordinary memory);
  ``sm_push_us``: with a ``method="sm_push"`` context (the rows pushed by a kernel of a few SMs);
  ``sm_push_inline_us``: with a ``method="sm_push_inline"`` context (the GEMM's programs push first);
- outside CUDA graphs: ``ours_eager_us`` (``ops.ag_gemm`` with ``method="auto"`` and no context:
  the producer ``auto_eager_method`` names, kernels/gemm/policy.py) and ``torch_nccl_eager_us``;
- ``torch_nccl_us``: ``dist.all_gather_into_tensor`` + ``torch.matmul(A, B.T)``;
- ``torch_symm_mem_us``: ``torch.ops.symm_mem.fused_all_gather_matmul(A_shard, [B.T], 0, group)``
  (omitted when unavailable or failing; timed without a CUDA graph, see ``timing``);
- ``gemm_us`` / ``cublas_us``: our GEMM alone / ``torch.matmul`` on the gathered ``[M, K]``;
- ``transfer_us``: the gather alone, the faster of ``ops.all_gather`` (auto) and NCCL;
- ``bound_us`` = max(``gemm_us``, ``transfer_us``) (docs/design.md §7, an overlapped op);
- diagnostics of the gap between ``ours_us`` and the bound: ``consumer_only_us``, the waiting GEMM
  alone after a call (every ready signal already set, nothing in flight); ``gemm_symm_us``, the
  plain GEMM reading A from the context's symmetric buffer.

Every contender's result is checked against the fp32 reference of the gathered inputs first
(max |error| / max |ref| < 1e-2). Timing: :mod:`triton_dist.bench.timing`, CUDA graphs
(``graph=True``: every contender but the symm_mem op, whose capturability is not ours to promise),
fixed counts on every rank, synchronise, host and GPU barriers per sample, median per rank, MAX over ranks.
Writes bench/results/<gpu>-x<world>/ag_gemm.json.
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
from triton_dist.kernels import AllGatherGemmContext  # noqa: E402
from triton_dist.kernels.gemm import ag_gemm as allgather_gemm  # noqa: E402
from triton_dist.kernels.gemm import dense as gemm_module  # noqa: E402
from triton_dist.kernels.gemm.dense import gemm  # noqa: E402
from triton_dist.kernels.gemm.policy import ag_gemm_method  # noqa: E402
from triton_dist.runtime import num_nodes  # noqa: E402

log = bench.script.logger("ag_gemm")
all_ok = bench.script.all_ranks_ok
REL_TOL = 1e-2
SMALL_M = (128, 512)
"""Extra rows of the M sweep, for ag_gemm only (not in the issue's shape list)."""

_rel_error = bench.script.relative_error


def _symm_mem_op(a_shard, b):
    """``fused_all_gather_matmul`` as a no-argument call, or ``(None, why)``."""
    import torch

    try:
        group_name = bench.script.symm_mem_world_group()  # first: it registers the op
        fused = torch.ops.symm_mem.fused_all_gather_matmul
        bt = b.t()

        def run():
            return fused(a_shard, [bt], 0, group_name)[1][0]

        return run, None
    except Exception as e:  # noqa: BLE001
        return None, f"{type(e).__name__}: {e}"


def _consumer_only(ctx, m, b, out):
    """The context's waiting GEMM as :meth:`AllGatherGemmContext.run` launches it, without the
    gather: after a call every ready signal already holds this call's value, so it never waits."""
    rows, n, k = ctx.world * m, b.shape[0], ctx.k
    config = gemm_module.pick_config(rows, n, k, ctx.max_programs)
    descs = gemm_module.descriptors(ctx.gathered[:rows * k].view(rows, k), b, out, config)
    allgather_gemm.ag_gemm_consumer_kernel[gemm_module.grid_for(rows, n, config, ctx.max_programs)](
        *descs, rows, n, k, ctx.pad.signals, ctx.calls, ctx.rank, m, **ctx.consumer_meta(config))


def main() -> int:
    parser = bench.script.argument_parser(__doc__, HERE / "results")
    parser.set_defaults(heap_size="16G")  # the largest shapes' buffers, and the transfer's own contexts
    parser.add_argument("--skip-ce-pull", action="store_true", help="do not time the ce_pull producer")
    args = parser.parse_args()

    import torch
    import torch.distributed as dist

    world, rank, device, gpu = bench.script.start(args, log)
    dtype = torch.bfloat16
    shapes = bench.script.overlap_shapes(args.quick)
    if not args.quick:
        shapes += [("llama3.1-70b", m, *bench.script.MODEL_SHAPES["llama3.1-70b"]) for m in SMALL_M]
    iters = 10 if args.quick else 20  # GEMMs of 0.2-20 ms: 20 samples give a stable median

    records = []
    for label, big_m, n_full, k in shapes:
        n, m = n_full // world, big_m // world
        ctx = AllGatherGemmContext(m, k, dtype)  # collective; preloads every kernel
        pull_ctx = None if args.skip_ce_pull else AllGatherGemmContext(m, k, dtype, method="ce_pull")
        push_ctx = AllGatherGemmContext(m, k, dtype, method="sm_push")
        inline_ctx = AllGatherGemmContext(m, k, dtype, method="sm_push_inline")
        g = torch.Generator(device=device)
        g.manual_seed(3000 + rank)
        a_shard = torch.randn((m, k), device=device, generator=g).to(dtype)
        b = torch.randn((n, k), device=device, generator=g).to(dtype)
        a_full = torch.empty((big_m, k), device=device, dtype=dtype)
        dist.all_gather_into_tensor(a_full, a_shard)
        ref = a_full.float() @ b.float().T
        out = torch.empty((big_m, n), device=device, dtype=dtype)
        pull_out = torch.empty_like(out)
        push_out = torch.empty_like(out)
        inline_out = torch.empty_like(out)
        eager_out = torch.empty_like(out)
        nccl_out = torch.empty_like(out)
        nccl_a = torch.empty_like(a_full)
        gemm_out = torch.empty_like(out)
        ag_out = torch.empty_like(a_full)

        def ours():
            ops.ag_gemm(a_shard, b, out=out, context=ctx)

        def torch_nccl():
            dist.all_gather_into_tensor(nccl_a, a_shard)
            torch.matmul(nccl_a, b.t(), out=nccl_out)

        fns = {"ours": ours, "torch_nccl": torch_nccl,
               "gemm": lambda: gemm(a_full, b, out=gemm_out),
               "cublas": lambda: torch.matmul(a_full, b.t(), out=gemm_out),
               "ag_ours": lambda: ops.all_gather(a_shard, out=ag_out),
               "ag_nccl": lambda: dist.all_gather_into_tensor(ag_out, a_shard),
               "consumer_only": lambda: _consumer_only(ctx, m, b, gemm_out),
               "gemm_symm": lambda: gemm(ctx.gathered[:big_m * k].view(big_m, k), b, out=gemm_out)}
        outputs = {"ours": out, "torch_nccl": nccl_out, "gemm": gemm_out, "cublas": gemm_out}
        fns["sm_push"] = lambda: ops.ag_gemm(a_shard, b, out=push_out, context=push_ctx)
        outputs["sm_push"] = push_out
        fns["sm_push_inline"] = lambda: ops.ag_gemm(a_shard, b, out=inline_out, context=inline_ctx)
        outputs["sm_push_inline"] = inline_out
        eager = {"ours": lambda: ops.ag_gemm(a_shard, b, out=eager_out), "torch_nccl": torch_nccl}
        outputs["ours_eager"] = eager_out
        if pull_ctx is not None:
            fns["ce_pull"] = lambda: ops.ag_gemm(a_shard, b, out=pull_out, context=pull_ctx)
            outputs["ce_pull"] = pull_out

        symm, why = _symm_mem_op(a_shard, b)
        checks, errors = {}, {}
        if symm is not None:
            try:
                got = symm()
                torch.cuda.synchronize()
                errors["torch_symm_mem"] = _rel_error(got, ref)
            except Exception as e:  # noqa: BLE001
                symm, why = None, f"{type(e).__name__}: {e}"
        # Every rank must agree on whether the symm_mem baseline runs (it is collective).
        if not all_ok(symm is not None):
            symm = None
            # The same checks on every rank below (each is collective), whichever rank dropped it.
            errors.pop("torch_symm_mem", None)
        if symm is None:
            log(f"torch symm_mem fused_all_gather_matmul skipped: {why}")
        for name in outputs:
            outputs[name].fill_(float("nan"))
            (eager["ours"] if name == "ours_eager" else fns[name])()
            torch.cuda.synchronize()
            errors[name] = _rel_error(outputs[name], ref)
        for name, err in errors.items():
            checks[name] = all_ok(err < REL_TOL)
        bench.sync_and_barrier()

        times = {name: bench.median_us(fn, warmup=3, iters=iters, graph=True) for name, fn in fns.items()}
        for name, fn in eager.items():  # per-call timing: the host's launches count
            times[f"{name}_eager"] = bench.median_us(fn, warmup=3, iters=iters, graph=False)
        auto_eager = ag_gemm_method(num_nodes(), flops=2.0 * big_m * n * k, eager=True)
        if symm is not None:
            times["torch_symm_mem"] = bench.median_us(symm, warmup=3, iters=iters, graph=False)
        transfer = min(times["ag_ours"], times["ag_nccl"])
        bound = max(times["gemm"], transfer)
        flop = 2.0 * big_m * n * k
        log(f"{label} M={big_m} K={k} N={n}: ours {times['ours']:.1f} us "
            f"(ce_pull {times.get('ce_pull', float('nan')):.1f} us, sm_push {times['sm_push']:.1f} us, "
            f"sm_push_inline {times['sm_push_inline']:.1f} us; eager: ours ({auto_eager}) "
            f"{times['ours_eager']:.1f} us, NCCL+cuBLAS {times['torch_nccl_eager']:.1f} us), "
            f"NCCL+cuBLAS {times['torch_nccl']:.1f} us, "
            f"symm_mem {times.get('torch_symm_mem', float('nan')):.1f} us, gemm alone {times['gemm']:.1f} us "
            f"(cuBLAS {times['cublas']:.1f} us), transfer {transfer:.1f} us, bound {bound:.1f} us, "
            f"waiting GEMM alone {times['consumer_only']:.1f} us, GEMM on the symmetric buffer "
            f"{times['gemm_symm']:.1f} us, "
            f"errors {errors}, checks {checks}")
        records.append(
            bench.record("ag_gemm", shape=[big_m, n, k], dtype="bfloat16", world_size=world, gpu=gpu, model=label,
                         ours_us=times["ours"],
                         baselines={"torch_nccl_us": times["torch_nccl"],
                                    "torch_symm_mem_us": times.get("torch_symm_mem")},
                         bound_us=bound, m_per_rank=m, gemm_us=times["gemm"], cublas_us=times["cublas"],
                         gemm_vs_cublas=times["cublas"] / times["gemm"], transfer_us=transfer,
                         all_gather_ours_us=times["ag_ours"], all_gather_nccl_us=times["ag_nccl"],
                         consumer_only_us=times["consumer_only"], gemm_symm_us=times["gemm_symm"],
                         ce_pull_us=times.get("ce_pull"), sm_push_us=times["sm_push"],
                         sm_push_inline_us=times["sm_push_inline"], ours_eager_us=times["ours_eager"],
                         torch_nccl_eager_us=times["torch_nccl_eager"], auto_eager_method=auto_eager,
                         ours_tflops=flop / (times["ours"] * 1e6), of_bound=bound / times["ours"],
                         verified=checks["ours"] and checks["gemm"], checks=checks,  # ce_pull: its own check
                         rel_errors={name: (e if e < 1e30 else None) for name, e in errors.items()},
                         timing={"iters": iters, "cuda_graph": True, "torch_symm_mem_cuda_graph": False,
                                 "gpu_barrier": True},
                         bound_method="max(our gemm alone, min(ops.all_gather, NCCL all_gather))",
                         shape_meaning="[M gathered rows, N per rank, K]"))
        bench.sync_and_barrier()
        del ctx, pull_ctx, push_ctx, inline_ctx
        ops.clear_contexts()  # the transfer's cached contexts: the next shape's need the heap

    extra = ("model", "ce_pull_us", "sm_push_us", "sm_push_inline_us", "ours_eager_us", "consumer_only_us",
             "gemm_symm_us", "gemm_us", "cublas_us", "transfer_us", "of_bound")
    return bench.script.finish("ag_gemm", records, args, extra)


if __name__ == "__main__":
    sys.exit(main())
