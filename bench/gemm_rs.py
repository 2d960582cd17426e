"""GEMM+ReduceScatter (bf16): ours (:func:`triton_dist.ops.gemm_rs`, every method) vs torch
(``matmul`` then NCCL ``reduce_scatter_tensor``) vs ``torch.ops.symm_mem.fused_matmul_reduce_scatter``
(when this torch has it and it runs), plus our GEMM alone vs ``torch.matmul`` (cuBLAS).

    torchrun --nproc-per-node=2 bench/gemm_rs.py [--quick] [--reduce-sms 8]

Shapes (``A [M, K]`` and weight shard ``B [N, K]`` per rank, ``K`` the rank's shard of the
contraction; result ``[M / world, N]``: this rank's rows of the sum over ranks of ``A @ B^T``):
:func:`triton_dist.bench.script.overlap_shapes` (each model's ``(N, K)`` at ``M = 8192``, and an
M sweep for llama3.1-70b), ``K`` split across ranks.

- ``ours_us``: ``ops.gemm_rs(method="auto")``; ``fused_us``, ``push_us``, ``pull_us``: each
  method (:mod:`triton_dist.kernels.gemm.gemm_rs`);
- ``torch_nccl_us``: ``torch.matmul(A, B.T)`` + ``dist.reduce_scatter_tensor``;
- ``torch_symm_mem_us``: ``torch.ops.symm_mem.fused_matmul_reduce_scatter(A, B.T, "sum", 0,
  group)`` (omitted when unavailable or failing; timed without a CUDA graph);
- ``gemm_us`` / ``cublas_us``: our GEMM alone / ``torch.matmul``, ``[M, N, K]``;
- ``transfer_us``: the reduce-scatter of the ``[M, N]`` partial alone, the faster of
  ``ops.reduce_scatter`` and NCCL;
- ``bound_us`` = max(``gemm_us``, ``transfer_us``) (docs/design.md §7, an overlapped op);
- outside CUDA graphs: ``ours_eager_us`` and ``torch_nccl_eager_us`` (per-call timing, host launch
  included), ``ours_host_enqueue_us`` (host time of one call with the GPU idle: the Python and
  driver calls that queue it; ``fused_ce`` queues its copy stream's operations one by one).

Every contender's result is checked against the fp32 reference (max |error| / max |ref| < 1e-2)
first. Timing: :mod:`triton_dist.bench.timing`, CUDA graphs (every contender but the symm_mem
op), fixed counts on every rank, median per rank, MAX over ranks. Writes
bench/results/<gpu>-x<world>/gemm_rs.json.
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
from triton_dist.kernels import GemmReduceScatterContext  # noqa: E402
from triton_dist.kernels.gemm.dense import gemm  # noqa: E402
from triton_dist.kernels.gemm.gemm_rs import METHODS  # noqa: E402
from triton_dist.kernels.gemm.policy import GEMM_RS_METHOD  # noqa: E402

log = bench.script.logger("gemm_rs")
all_ok = bench.script.all_ranks_ok
REL_TOL = 1e-2
_METHODS = [v for v in METHODS if v != "auto"]

_rel_error = bench.script.relative_error


def _symm_mem_op(a, b):
    """``fused_matmul_reduce_scatter`` as a no-argument call, or ``(None, why)``."""
    import torch

    try:
        group_name = bench.script.symm_mem_world_group()  # first: it registers the op
        fused = torch.ops.symm_mem.fused_matmul_reduce_scatter
        bt = b.t()

        def run():
            return fused(a, bt, "sum", 0, group_name)

        return run, None
    except Exception as e:  # noqa: BLE001
        return None, f"{type(e).__name__}: {e}"


def _host_enqueue_us(fn, iters: int) -> float:
    """Median host time (µs) of one call of ``fn`` that returns once its work is queued: the GPU
    is synchronised before each, so only the Python and driver calls are inside."""
    import statistics
    import time

    import torch

    samples = []
    for _ in range(iters):
        bench.sync_and_barrier()
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e6)
    torch.cuda.synchronize()
    return statistics.median(samples)


def main() -> int:
    parser = bench.script.argument_parser(__doc__, HERE / "results")
    parser.add_argument("--reduce-sms", type=int, default=None,
                        help="SMs left to the reduce kernel (default: gemm_rs.REDUCE_SMS)")
    parser.set_defaults(heap_size="16G")  # the largest shapes' buffers, and the transfer's own contexts
    args = parser.parse_args()

    import torch
    import torch.distributed as dist

    world, rank, device, gpu = bench.script.start(args, log, f", reduce_sms {args.reduce_sms}")
    dtype = torch.bfloat16
    shapes = bench.script.overlap_shapes(args.quick)
    iters = 10 if args.quick else 20  # GEMMs of 0.2-20 ms: 20 samples give a stable median

    records = []
    for label, big_m, n, k_full in shapes:
        k, m = k_full // world, big_m // world
        ctx = GemmReduceScatterContext(big_m, n, dtype, reduce_sms=args.reduce_sms)  # collective; preloads
        g = torch.Generator(device=device)
        g.manual_seed(4000 + rank)
        a = torch.randn((big_m, k), device=device, generator=g).to(dtype)
        b = torch.randn((n, k), device=device, generator=g).to(dtype)
        full = a.float() @ b.float().T
        dist.all_reduce(full)
        ref = full[rank * m:(rank + 1) * m].clone()
        del full
        out = torch.empty((m, n), device=device, dtype=dtype)
        method_outs = {v: torch.empty_like(out) for v in _METHODS}
        nccl_out = torch.empty_like(out)
        partial = torch.empty((big_m, n), device=device, dtype=dtype)
        gemm_out = torch.empty_like(partial)
        rs_out = torch.empty_like(out)

        def torch_nccl():
            torch.matmul(a, b.t(), out=partial)
            dist.reduce_scatter_tensor(nccl_out, partial)

        def forced(v):
            return lambda: ops.gemm_rs(a, b, out=method_outs[v], method=v, context=ctx)

        fns = {"ours": lambda: ops.gemm_rs(a, b, out=out, method="auto", context=ctx),
               **{v: forced(v) for v in _METHODS},
               "torch_nccl": torch_nccl,
               "gemm": lambda: gemm(a, b, out=gemm_out),
               "cublas": lambda: torch.matmul(a, b.t(), out=gemm_out),
               "rs_ours": lambda: ops.reduce_scatter(partial, out=rs_out),
               "rs_nccl": lambda: dist.reduce_scatter_tensor(rs_out, partial)}
        outputs = {"ours": out, **method_outs, "torch_nccl": nccl_out}

        symm, why = _symm_mem_op(a, b)
        checks, errors = {}, {}
        if symm is not None:
            try:
                got = symm()
                torch.cuda.synchronize()
                errors["torch_symm_mem"] = _rel_error(got, ref)
            except Exception as e:  # noqa: BLE001
                symm, why = None, f"{type(e).__name__}: {e}"
        if not all_ok(symm is not None):  # collective: every rank runs it or none
            symm = None
            # The same checks on every rank below (each is collective), whichever rank dropped it.
            errors.pop("torch_symm_mem", None)
        if symm is None:
            log(f"torch symm_mem fused_matmul_reduce_scatter skipped: {why}")
        for name in outputs:
            outputs[name].fill_(float("nan"))
            fns[name]()
            torch.cuda.synchronize()
            errors[name] = _rel_error(outputs[name], ref)
        gemm_out.fill_(float("nan"))
        fns["gemm"]()
        torch.cuda.synchronize()
        errors["gemm"] = _rel_error(gemm_out, a.float() @ b.float().T)
        for name, err in errors.items():
            checks[name] = all_ok(err < REL_TOL)
        bench.sync_and_barrier()

        times = {name: bench.median_us(fn, warmup=3, iters=iters, graph=True) for name, fn in fns.items()}
        if symm is not None:
            times["torch_symm_mem"] = bench.median_us(symm, warmup=3, iters=iters, graph=False)
        # Outside a graph: fused_ce queues O(world x chunks) stream operations from Python per call.
        for name in ("ours", "torch_nccl"):
            times[f"{name}_eager"] = bench.median_us(fns[name], warmup=3, iters=iters, graph=False)
        host_us = bench.max_over_ranks(_host_enqueue_us(fns["ours"], iters))
        transfer = min(times["rs_ours"], times["rs_nccl"])
        bound = max(times["gemm"], transfer)
        flop = 2.0 * big_m * n * k
        per_method = ", ".join(f"{v} {times[v]:.1f} us" for v in _METHODS)
        log(f"{label} M={big_m} N={n} K={k}: ours ({GEMM_RS_METHOD}) {times['ours']:.1f} us, {per_method}, "
            f"matmul+NCCL {times['torch_nccl']:.1f} us, symm_mem {times.get('torch_symm_mem', float('nan')):.1f} us, "
            f"gemm alone {times['gemm']:.1f} us (cuBLAS {times['cublas']:.1f} us), transfer {transfer:.1f} us, "
            f"bound {bound:.1f} us; eager: ours {times['ours_eager']:.1f} us (host enqueue {host_us:.1f} us), "
            f"matmul+NCCL {times['torch_nccl_eager']:.1f} us; errors {errors}, checks {checks}")
        records.append(
            bench.record("gemm_rs", shape=[big_m, n, k], dtype="bfloat16", world_size=world, gpu=gpu, model=label,
                         ours_us=times["ours"],
                         baselines={"torch_nccl_us": times["torch_nccl"],
                                    "torch_symm_mem_us": times.get("torch_symm_mem")},
                         bound_us=bound, m_per_rank=m, method=GEMM_RS_METHOD,
                         **{f"{v}_us": times[v] for v in _METHODS},
                         reduce_sms=ctx.reduce_sms, gemm_us=times["gemm"], cublas_us=times["cublas"],
                         gemm_vs_cublas=times["cublas"] / times["gemm"], transfer_us=transfer,
                         reduce_scatter_ours_us=times["rs_ours"], reduce_scatter_nccl_us=times["rs_nccl"],
                         ours_tflops=flop / (times["ours"] * 1e6), of_bound=bound / times["ours"],
                         ours_eager_us=times["ours_eager"], torch_nccl_eager_us=times["torch_nccl_eager"],
                         ours_host_enqueue_us=host_us,
                         verified=all(checks[v] for v in ("ours", "gemm", *_METHODS)), checks=checks,
                         rel_errors={name: (e if e < 1e30 else None) for name, e in errors.items()},
                         timing={"iters": iters, "cuda_graph": True, "torch_symm_mem_cuda_graph": False,
                                 "gpu_barrier": True},
                         bound_method="max(our gemm alone, min(ops.reduce_scatter, NCCL reduce_scatter_tensor))",
                         shape_meaning="[M rows in total, N, K per rank]"))
        bench.sync_and_barrier()
        del ctx
        ops.clear_contexts()  # the transfer's cached contexts: the next shape's need the heap

    extra = ("model", *(f"{v}_us" for v in _METHODS), "gemm_us", "cublas_us", "transfer_us", "of_bound",
             "ours_eager_us", "ours_host_enqueue_us")
    return bench.script.finish("gemm_rs", records, args, extra)


if __name__ == "__main__":
    sys.exit(main())
