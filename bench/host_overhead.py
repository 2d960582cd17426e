"""Host time to issue one call (µs), eager: each op of :mod:`triton_dist.ops` against its torch
equivalent, the GPU kept busy so that only the host's issuing is timed.

    torchrun --nproc-per-node=2 bench/host_overhead.py [--quick]

Why: outside CUDA graphs an op whose host time exceeds its GPU time is host-bound in a loop.
The first measurement (a throwaway script at 83199e2, one call after an idle GPU) found 169 µs
for an 8 KiB ``ops.all_reduce`` and 457 µs for ``ops.gemm_rs``, but also 75 µs for
``torch.matmul``: an idle GPU inflates whatever comes first. Here every rank first queues a
``torch.cuda._sleep`` long enough to cover all the calls, then issues ``CALLS`` calls back to back;
host time per call = the issuing's wall time / ``CALLS``. Calls queue behind the sleep on every
rank alike, so no collective waits on the host. Median of ``REPEATS`` such rounds, max over ranks.

Contenders (bf16; the small collectives are the decode case, the GEMMs the 70b prefill shapes at
M=1024): ``ops.all_reduce`` 8 KiB (``ll``) vs ``dist.all_reduce``; ``ops.all_gather`` 8 KiB vs
``dist.all_gather_into_tensor``; ``ops.reduce_scatter`` 8 KiB vs ``dist.reduce_scatter_tensor``;
``ops.ag_gemm`` vs all-gather + ``matmul``; ``ops.gemm_rs`` vs ``matmul`` + reduce-scatter;
``ops.gemm_ar`` (M=16) vs ``matmul`` + all-reduce. Each contender's result is checked once against
the torch one before timing (the record's ``verified``). ``ours_us`` / ``baselines.torch_us`` are host
µs per call; the GPU time of the same calls is in the other benchmarks' JSON.
With ranks sharing GPUs (``TRITON_DIST_RANKS_PER_GPU`` > 1, MPS) host time still means what it says
(it does not depend on the link), but NCCL refuses such ranks: the torch contender is then the
op's local part alone (``baselines.torch_local_us``) and the results are checked against a
reference gathered through gloo. Writes bench/results/<gpu>-x<world>/host_overhead.json (with
shared GPUs: ``host_overhead_shared.json``). ``--breakdown`` also times the parts of an 8 KiB
``all_reduce`` (a bare launch, a plan's bound launch and the same through its prepared launch, the
op's paths, torch's allocations) into the all_reduce record's ``breakdown_us``.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
try:
    import triton_dist._C  # noqa: F401  an installed build
except ImportError:
    sys.path.insert(0, str(HERE.parent / "python"))

from triton_dist import bench  # noqa: E402
from triton_dist import ops  # noqa: E402

log = bench.script.logger("host_overhead")
all_ok = bench.script.all_ranks_ok
CALLS = 20
"""Calls per round: enough to average, few enough that the launch queue never fills (a full queue
would block the host and time the GPU instead)."""
REPEATS = 15
SLEEP_CYCLES = 400_000_000
"""``torch.cuda._sleep`` before each round: ~0.2 s at H200 clocks, longer than 20 eager calls'
issuing (at most a few ms)."""


def issue_us(fn, repeats: int = REPEATS) -> float:
    """Median over ``repeats`` rounds of the host µs per call of ``fn``, the GPU busy throughout;
    max over ranks."""
    import torch

    samples = []
    for _ in range(repeats):
        bench.sync_and_barrier()
        torch.cuda._sleep(SLEEP_CYCLES)
        start = time.perf_counter()
        for _ in range(CALLS):
            fn()
        samples.append((time.perf_counter() - start) * 1e6 / CALLS)
        torch.cuda.synchronize()
    return bench.max_over_ranks(statistics.median(samples))


def profile(name: str, fn, calls: int = 200) -> None:
    """Rank 0 prints the functions where ``fn``'s host time goes (cProfile, by own time)."""
    import cProfile
    import io
    import pstats

    import torch

    bench.sync_and_barrier()
    torch.cuda._sleep(SLEEP_CYCLES)
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        fn()
    profiler.disable()
    torch.cuda.synchronize()
    if torch.distributed.get_rank() == 0:
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(14)
        print(f"[host_overhead] profile of {calls} {name} calls (own time; cProfile adds its own):\n"
              + "\n".join(line for line in text.getvalue().splitlines() if line.strip()), flush=True)


def _schedules(device) -> tuple:
    """The same 16 local copies, each followed by a flag write, as two StreamSchedules: enqueued
    one driver call at a time, and as one CUDA graph (``Config.stream_schedule_graphs``' path)."""
    import torch

    from triton_dist import StreamSchedule

    src = torch.randn(16, 16384, device=device)
    dst = torch.empty_like(src)
    flags = torch.zeros(16, dtype=torch.int64, device=device)
    made = []
    for as_graph in (False, True):
        schedule = StreamSchedule(as_graph=as_graph)
        for c in range(16):
            schedule.copy(dst[c], src[c]).write(flags, c, 1)
        made.append(schedule)
    return tuple(made), (src, dst, flags)


def breakdown(device, dtype) -> tuple[dict, list[str]]:
    """Host µs per call of the parts of an 8 KiB ``ops.all_reduce``, and of a copy-engine
    schedule's enqueue one by one and as a graph (``--breakdown``): what a bare launch and a
    driver call cost on this host (under MPS too), against what the op's Python adds. Returns
    ``({part: µs}, lines to log)``; the times go into the all_reduce record (``breakdown_us``)."""
    import torch
    from triton.tools.tensor_descriptor import TensorDescriptor

    from triton_dist.kernels.common import call_counter
    from triton_dist.kernels.common.launch_plan import LaunchPlan
    from triton_dist.kernels.gemm import gemm

    x = torch.randn(4096, device=device).to(dtype)
    y = torch.empty_like(x)
    ops.all_reduce(x, out=y)
    context = ops._cached_context("all_reduce", dtype, x.numel() * x.element_size())
    plan = context.run(x, y, "ll")  # with one rank a copy (OneRankCopy), no kernel: its rows are left out
    plan = plan if isinstance(plan, LaunchPlan) else None
    counter = torch.zeros(1, dtype=torch.int64, device=device)
    # gemm_ar's split_k at decode size: a replayed call is one launch (the kernel enters its call)
    # and two host descriptors.
    a16, w = torch.randn(16, 512, device=device).to(dtype), torch.randn(1024, 512, device=device).to(dtype)
    o16 = torch.empty(16, 1024, device=device, dtype=dtype)
    ops.gemm_ar(a16, w, out=o16, method="split_k")
    a1k, o1k = torch.randn(1024, 512, device=device).to(dtype), torch.empty(1024, 1024, device=device, dtype=dtype)
    gemm(a1k, w, out=o1k)
    # K deep enough for the split-K rule's slices: each call takes a workspace and the stream's tickets.
    a16k, w8k = torch.randn(16, 8192, device=device).to(dtype), torch.randn(1024, 8192, device=device).to(dtype)
    gemm(a16k, w8k, out=o16)
    # The schedules hold raw addresses: their buffers must live while they are enqueued.
    (one_by_one, as_graph), _buffers = _schedules(device)
    parts = [
        ("torch.empty 8 KiB", lambda: torch.empty(4096, device=device, dtype=dtype)),
        # A replayed call's one allocation (eager_calls: torch.empty_like, or torch.empty for another
        # shape; new_empty before): which form costs least.
        ("x.new_empty(shape)", lambda: x.new_empty(x.shape)),
        ("torch.empty_like(x)", lambda: torch.empty_like(x)),
        ("torch.empty_like(x, memory_format=contiguous)",
         lambda: torch.empty_like(x, memory_format=torch.contiguous_format)),
        ("x.add(1)", lambda: x.add(1)),
        ("y.copy_(x)", lambda: y.copy_(x)),
        ("call counter bump (one C++ launch)", lambda: call_counter.bump(counter)),
        *([("LaunchPlan.launch(x, y) of 'll' (its bound C++ launch)", lambda: plan.launch(x, y)),
           # The path before bound launches: every argument classified in C++ on every call.
           ("the same through its PreparedLaunch (all arguments passed)",
            lambda: plan._prepared and plan._prepared.launch(plan.arguments(x, y)))] if plan is not None else []),
        ("context.run(x, y, 'll')", lambda: context.run(x, y, "ll")),
        ("ops.all_reduce(..., method='ll', context=): replayed from the context",
         lambda: ops.all_reduce(x, out=y, method="ll", context=context)),
        ("ops.all_reduce(x, out=y, method='ll'): replayed", lambda: ops.all_reduce(x, out=y, method="ll")),
        ("ops.all_reduce(x, out=y)", lambda: ops.all_reduce(x, out=y)),
        ("ops.all_reduce(x, method='ll'): replayed, allocating", lambda: ops.all_reduce(x, method="ll")),
        ("ops.all_reduce(x)", lambda: ops.all_reduce(x)),
        ("TensorDescriptor.from_tensor(w, [128, 128])", lambda: TensorDescriptor.from_tensor(w, [128, 128])),
        ("ops.gemm_ar(a, w, out=o, method='split_k'): replayed",
         lambda: ops.gemm_ar(a16, w, out=o16, method="split_k")),
        ("ops.gemm_ar(a, w, method='split_k'): replayed, allocating", lambda: ops.gemm_ar(a16, w, method="split_k")),
        # The plain GEMM (kernels/gemm/plain_plan.py): its checks and rule, then its plan's launch.
        ("gemm(a, w, out=o): split-K in slices, 16 x 1024 x 8192", lambda: gemm(a16k, w8k, out=o16)),
        ("gemm(a, w, out=o): 1024 rows", lambda: gemm(a1k, w, out=o1k)),
        (f"StreamSchedule enqueue, {one_by_one.driver_calls} driver calls", one_by_one.enqueue),
        ("the same StreamSchedule as one CUDA graph", as_graph.enqueue),
    ]
    times = {name: issue_us(fn) for name, fn in parts}
    torch.cuda.synchronize()
    lines = [f"{name}: {us:.1f} us per call" for name, us in times.items()]
    lines.append(f"graph schedule: {as_graph.graphs} graph(s) made, "
                 f"fallback: {as_graph.graph_failure or 'none (each enqueue was one graph launch)'}")
    return times, lines


def _cases(world: int, device, dtype, shared: bool):
    """``(name, shape, ours, torch_timed, reference)``: callables of no argument (``ours`` takes an
    optional ``method``, default ``"auto"``). ``ours`` returns our result, ``reference`` the torch
    one it is checked against, ``torch_timed`` is the torch contender timed beside ours: the NCCL
    equivalent, or, when ranks share GPUs (no NCCL there),
    the op's local torch part alone (an elementwise op of the same size for the collectives, the
    matmul for the GEMMs), with the reference gathered through gloo on the CPU."""
    import torch
    import torch.distributed as dist

    from triton_dist import host_collectives as host

    def randn(*shape, seed):
        g = torch.Generator(device=device)
        g.manual_seed(seed)
        return torch.randn(shape, device=device, generator=g).to(dtype)

    rank = dist.get_rank()
    n = 4096  # 8 KiB of bf16
    x = randn(n, seed=100 + rank)
    gathered = torch.empty(world * n, device=device, dtype=dtype)
    shard = torch.empty(n // world, device=device, dtype=dtype)
    m, n_full, k_full = 1024, 14336, 8192  # 70b, M=1024: ag_gemm's N and gemm_rs's K split
    ag_a = randn(m // world, k_full, seed=200 + rank)
    ag_b = randn(n_full // world, k_full, seed=300 + rank)
    ag_full = torch.empty(m, k_full, device=device, dtype=dtype)
    rs_a = randn(m, k_full // world, seed=400 + rank)
    rs_b = randn(n_full, k_full // world, seed=500 + rank)
    rs_out = torch.empty(m // world, n_full, device=device, dtype=dtype)
    ar_a = randn(16, k_full // world, seed=600 + rank)
    ar_b = randn(n_full // 2, k_full // world, seed=700 + rank)

    if shared:
        references = {
            "all_reduce": lambda: host.all_reduce(x), "all_gather": lambda: host.all_gather(x),
            "reduce_scatter": lambda: host.reduce_scatter(x), "ag_gemm": lambda: host.all_gather(ag_a) @ ag_b.T,
            "gemm_rs": lambda: host.reduce_scatter(rs_a @ rs_b.T), "gemm_ar": lambda: host.all_reduce(ar_a @ ar_b.T),
        }
        timed = {
            "all_reduce": lambda: x.add(1), "all_gather": lambda: gathered.copy_(x.repeat(world)),
            "reduce_scatter": lambda: shard.copy_(x[:n // world]), "ag_gemm": lambda: ag_full[:m // world] @ ag_b.T,
            "gemm_rs": lambda: rs_a @ rs_b.T, "gemm_ar": lambda: ar_a @ ar_b.T,
        }
    else:
        def nccl_all_reduce():
            y = x.clone()
            dist.all_reduce(y)
            return y

        def nccl_all_gather():
            dist.all_gather_into_tensor(gathered, x)
            return gathered

        def nccl_reduce_scatter():
            dist.reduce_scatter_tensor(shard, x)
            return shard

        def nccl_ag_gemm():
            dist.all_gather_into_tensor(ag_full, ag_a)
            return ag_full @ ag_b.T

        def nccl_gemm_rs():
            dist.reduce_scatter_tensor(rs_out, rs_a @ rs_b.T)
            return rs_out

        def nccl_gemm_ar():
            y = ar_a @ ar_b.T
            dist.all_reduce(y)
            return y

        timed = {"all_reduce": nccl_all_reduce, "all_gather": nccl_all_gather, "reduce_scatter": nccl_reduce_scatter,
                 "ag_gemm": nccl_ag_gemm, "gemm_rs": nccl_gemm_rs, "gemm_ar": nccl_gemm_ar}
        references = timed
    ours = [
        ("all_reduce", [n], lambda method="auto": ops.all_reduce(x, method=method)),
        ("all_gather", [n], lambda method="auto": ops.all_gather(x, method=method)),
        ("reduce_scatter", [n], lambda method="auto": ops.reduce_scatter(x, method=method)),
        ("ag_gemm", [m, n_full // world, k_full], lambda method="auto": ops.ag_gemm(ag_a, ag_b, method=method)),
        ("gemm_rs", [m, n_full, k_full // world], lambda method="auto": ops.gemm_rs(rs_a, rs_b, method=method)),
        ("gemm_ar", [16, n_full // 2, k_full // world], lambda method="auto": ops.gemm_ar(ar_a, ar_b, method=method)),
    ]
    return [(name, shape, fn, timed[name], references[name]) for name, shape, fn in ours]


def main() -> int:
    parser = bench.script.argument_parser(__doc__, HERE / "results")
    parser.add_argument("--ops", default="all_reduce,all_gather,reduce_scatter,ag_gemm,gemm_rs,gemm_ar",
                        help="comma-separated ops to time (default: all six)")
    parser.add_argument("--profile", action="store_true",
                        help="also print, on rank 0, where each op's host time goes (cProfile of 200 calls; "
                             "with --methods, each method's too)")
    parser.add_argument("--breakdown", action="store_true",
                        help="also print the host µs of an 8 KiB all_reduce's parts (bare launches, torch ops)")
    parser.add_argument("--methods", action="store_true",
                        help="also time each op's every method (not only auto's choice): method_us in the JSON")
    args = parser.parse_args()

    import torch

    from triton_dist import config

    # Host time does not depend on the link, so ranks sharing a GPU (MPS) may measure it.
    shared = config.get().ranks_per_gpu > 1
    world, rank, device, gpu = bench.script.start(args, log, allow_shared_gpus=shared)
    dtype = torch.bfloat16
    wanted = set(args.ops.split(","))
    baseline = "torch_local_us" if shared else "torch_us"
    records = []
    parts_us = {}
    if args.breakdown:
        parts_us, lines = breakdown(device, dtype)
        for line in lines:
            log(f"breakdown: {line}")
    for name, shape, ours, torch_timed, reference in _cases(world, device, dtype, shared):
        if name not in wanted:
            continue
        got, want = ours(), reference()  # also the warm-up: contexts, compiles, NCCL communicators
        torch_timed()
        torch.cuda.synchronize()
        # Both in bf16 from different summation orders: a rounding apart, not a missing rank's share.
        err = bench.script.relative_error(got.float(), want.float())
        verified = all_ok(err < 2e-2)
        repeats = 5 if args.quick else REPEATS
        ours_us, torch_us = issue_us(ours, repeats), issue_us(torch_timed, repeats)
        if args.profile:
            profile(name, ours)
        log(f"{name} {shape}: host per call ours {ours_us:.1f} us, {baseline[:-3]} {torch_us:.1f} us; "
            f"rel error {err:.2e}")
        method = "GPU busy (torch.cuda._sleep), wall time of issuing / calls"
        if shared:
            method += f"; {world} ranks sharing one GPU (MPS): torch baseline is the op's local part, no NCCL"
        extra = method_times(name, ours, reference(), repeats, args.profile) if args.methods else {}
        if name == "all_reduce" and parts_us:
            extra["breakdown_us"] = parts_us
        records.append(bench.record(f"host_{name}", shape=shape, dtype="bfloat16", world_size=world, gpu=gpu,
                                    ours_us=ours_us, baselines={baseline: torch_us}, calls=CALLS, repeats=repeats,
                                    method=method, relative_error=err, verified=verified, **extra))
    if args.breakdown:
        for line in copy_engine_schedules():
            log(f"breakdown: {line}")
    return bench.script.finish("host_overhead_shared" if shared else "host_overhead", records, args,
                               extra=("calls", ))


def method_times(name: str, ours, want, repeats: int, profiled: bool = False) -> dict:
    """``--methods``: host µs per call of ``ours(method)`` for each of ``name``'s methods but
    ``"auto"`` (``method_us``; with ``profiled``, each one's :func:`profile` printed too), each
    checked against ``want`` first; a method that raises or
    misses (the same on every rank: the checks depend on shapes and the world) is listed in
    ``method_errors`` instead. Why: the host time of a call is mostly its driver calls, which differ
    by method by a factor of several (one kernel against a copy-engine schedule), and ``"auto"``
    picks by GPU time alone."""
    import torch

    from triton_dist import kernels

    context_class = {"all_reduce": kernels.AllReduceContext, "all_gather": kernels.AllGatherContext,
                     "reduce_scatter": kernels.ReduceScatterContext, "ag_gemm": kernels.AllGatherGemmContext,
                     "gemm_rs": kernels.GemmReduceScatterContext, "gemm_ar": kernels.GemmAllReduceContext}[name]
    methods = [m for m in context_class.METHODS if m != "auto"]
    times, errors = {}, {}
    for m in methods:
        try:
            got = ours(m)
            torch.cuda.synchronize()
            err = bench.script.relative_error(got.float(), want.float())
        except Exception as e:  # noqa: BLE001  recorded: a method this shape or world does not take
            errors[m] = f"{type(e).__name__}: {e}".splitlines()[0][:200]
            continue
        if not all_ok(err < 2e-2):
            errors[m] = f"relative error {err:.2e} on some rank"
            continue
        times[m] = issue_us(lambda: ours(m), repeats)
        log(f"{name} method {m}: host per call {times[m]:.1f} us")
        if profiled:
            profile(f"{name} method={m}", lambda: ours(m))
    return {"method_us": times, **({"method_errors": errors} if errors else {})}


def copy_engine_schedules() -> list[str]:
    """What the timed ``gemm_rs`` contexts' copy-engine schedules enqueue per call (``--breakdown``,
    after the timed calls): operations, driver calls, and whether they went as one CUDA graph (with
    ``TRITON_DIST_STREAM_SCHEDULE_GRAPHS=1``) or why not. With graphs on they did not shorten
    ``gemm_rs``'s host time (2026-12-07), where a standalone schedule's did: this says which."""
    lines = []
    for (op, _, key), context in ops._CONTEXTS.items():
        schedules = dict(getattr(context, "_ce_schedules", {}))
        if op != "gemm_rs" or not schedules:
            continue
        schedules["acks"] = context._acks
        for which, s in schedules.items():
            lines.append(f"gemm_rs context {key}, schedule {which}: {len(s)} operations, {s.driver_calls} driver "
                         f"calls, as one graph: {s.launches_as_graph}, graphs made {s.graphs}, fallback: "
                         f"{s.graph_failure or 'none'}")
    return lines or ["gemm_rs made no copy-engine schedule (not timed, or not fused_ce)"]


if __name__ == "__main__":
    sys.exit(main())
