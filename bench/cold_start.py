"""A user's first call (seconds): how long ``triton_dist.init()`` and the first call of each op take,
from the call to its synchronised result: the op's context (symmetric memory, kernels compiled or
loaded, barrier) and the call itself.

    torchrun --nproc-per-node=2 bench/cold_start.py [--empty-cache] [--ops all_reduce,all_gather] [--profile]

Ops run one after another in one process, so an op's first call does not pay for what an earlier
one loaded (the runtime, the call counter's kernel, CUDA's and Triton's own start). Without
``--empty-cache`` Triton's cache is whatever the machine has (a second run: everything compiled,
only loads left); with it each rank starts from a new, empty cache directory, as after a fresh
install. The torch contender is the same op's first call through torch (NCCL; with ranks sharing a
GPU, where NCCL refuses them, the op's local torch part), also in this process.
Max over ranks. Writes bench/results/<gpu>-x<world>/cold_start[_empty][_shared].json.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if "--empty-cache" in sys.argv:  # before Triton reads its cache directory
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="tdist-cold-triton-")
try:
    import triton_dist._C  # noqa: F401  an installed build
except ImportError:
    sys.path.insert(0, str(HERE.parent / "python"))

from triton_dist import bench  # noqa: E402
from triton_dist import ops  # noqa: E402

log = bench.script.logger("cold_start")


def seconds(fn, profile_as: str | None = None):
    """``(wall seconds of fn() to its synchronised result, max over ranks; its result)``; with
    ``profile_as``, rank 0 also logs where the call's time went (cProfile, by cumulative time:
    compiling, loading and initialising modules, allocating, the barrier)."""
    import torch

    profiler = None
    if profile_as is not None:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    start = time.perf_counter()
    result = fn()
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    if profiler is not None:
        profiler.disable()
        import io
        import pstats

        import torch.distributed as dist

        if dist.get_rank() == 0:
            text = io.StringIO()
            pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(30)
            log(f"profile of {profile_as}'s first call on rank 0 ({elapsed:.2f} s):\n{text.getvalue()}")
    return bench.max_over_ranks(elapsed), result


def _cases(world: int, device, dtype, shared: bool):
    """``(name, shape, ours, torch, reference)``: first calls, each a zero-argument callable;
    ``reference`` is what ``ours`` must return (:mod:`triton_dist.host_collectives`, any mode)."""
    import torch
    import torch.distributed as dist

    from triton_dist import host_collectives as host

    rank = dist.get_rank()
    g = torch.Generator(device=device).manual_seed(rank)
    x = torch.randn(1 << 16, device=device, generator=g).to(dtype)
    m, n, k = 1024, 4096, 4096
    a_shard = torch.randn(m // world, k, device=device, generator=g).to(dtype)
    a_full = torch.randn(m, k // world, device=device, generator=g).to(dtype)
    w_ag = torch.randn(n // world, k, device=device, generator=g).to(dtype)
    w_rs = torch.randn(n, k // world, device=device, generator=g).to(dtype)

    if shared:
        torch_ops = {"all_reduce": lambda: x.add(1), "all_gather": lambda: x.repeat(world),
                     "reduce_scatter": lambda: x[:x.numel() // world].clone(),
                     "ag_gemm": lambda: a_shard @ w_ag.T, "gemm_rs": lambda: a_full @ w_rs.T}
    else:
        def all_gather():
            out = torch.empty(world * x.numel(), device=device, dtype=dtype)
            dist.all_gather_into_tensor(out, x)

        def reduce_scatter():
            dist.reduce_scatter_tensor(torch.empty(x.numel() // world, device=device, dtype=dtype), x)

        def ag_gemm():
            full = torch.empty(m, k, device=device, dtype=dtype)
            dist.all_gather_into_tensor(full, a_shard)
            return full @ w_ag.T

        def gemm_rs():
            dist.reduce_scatter_tensor(torch.empty(m // world, n, device=device, dtype=dtype), a_full @ w_rs.T)

        torch_ops = {"all_reduce": lambda: dist.all_reduce(x.clone()), "all_gather": all_gather,
                     "reduce_scatter": reduce_scatter, "ag_gemm": ag_gemm, "gemm_rs": gemm_rs}
    return [
        ("all_reduce", [x.numel()], lambda: ops.all_reduce(x), torch_ops["all_reduce"], lambda: host.all_reduce(x)),
        ("all_gather", [x.numel()], lambda: ops.all_gather(x), torch_ops["all_gather"], lambda: host.all_gather(x)),
        ("reduce_scatter", [x.numel()], lambda: ops.reduce_scatter(x), torch_ops["reduce_scatter"],
         lambda: host.reduce_scatter(x)),
        ("ag_gemm", [m, n // world, k], lambda: ops.ag_gemm(a_shard, w_ag), torch_ops["ag_gemm"],
         lambda: host.all_gather(a_shard) @ w_ag.T),
        ("gemm_rs", [m, n, k // world], lambda: ops.gemm_rs(a_full, w_rs), torch_ops["gemm_rs"],
         lambda: host.reduce_scatter(a_full @ w_rs.T)),
    ]


def main() -> int:
    parser = bench.script.argument_parser(__doc__, HERE / "results")
    parser.add_argument("--empty-cache", action="store_true", help="start from an empty Triton cache (see above)")
    parser.add_argument("--ops", default="all_reduce,all_gather,reduce_scatter,ag_gemm,gemm_rs",
                        help="comma-separated ops (default: all five)")
    parser.add_argument("--profile", action="store_true",
                        help="rank 0 logs where each first call's time goes (cProfile, by cumulative time)")
    args = parser.parse_args()

    import torch

    from triton_dist import config

    shared = config.get().ranks_per_gpu > 1
    init_start = time.perf_counter()
    world, rank, device, gpu = bench.script.start(args, log, allow_shared_gpus=shared)
    init_s = bench.max_over_ranks(time.perf_counter() - init_start)
    log(f"init: {init_s:.2f} s (Triton cache {'empty' if args.empty_cache else 'as found'})")
    wanted = args.ops.split(",")
    cache = "empty" if args.empty_cache else "as found"
    records = []
    for name, shape, ours, theirs, reference in _cases(world, device, torch.bfloat16, shared):
        if name not in wanted:
            continue
        ours_s, got = seconds(ours, name if args.profile else None)
        torch_s, _ = seconds(theirs)
        # bf16 from different summation orders: a rounding apart, not a missing rank's share.
        err = bench.script.relative_error(got.float(), reference().float())
        log(f"{name} {shape}: first call {ours_s:.2f} s, torch {torch_s:.2f} s; rel error {err:.2e}")
        records.append(bench.record(f"cold_{name}", shape=shape, dtype="bfloat16", world_size=world, gpu=gpu,
                                    ours_us=ours_s * 1e6, baselines={"torch_first_call_us": torch_s * 1e6},
                                    init_s=init_s, triton_cache=cache, shared_gpus=shared,
                                    method="wall time of the first call to its synchronised result, max over ranks",
                                    relative_error=err, verified=bench.script.all_ranks_ok(err < 2e-2)))
    # A profiled run's times include cProfile's own cost: kept apart from the real first calls.
    name = ("cold_start" + ("_empty" if args.empty_cache else "") + ("_shared" if shared else "")
            + ("_profiled" if args.profile else ""))
    return bench.script.finish(name, records, args, extra=("init_s", "triton_cache"))


if __name__ == "__main__":
    sys.exit(main())
