"""GPU tests run under torchrun: every rank runs the same tests in the same order.

    torchrun --nproc-per-node=2 -m pytest tests/gpu

A failed check on one rank must fail the test on every rank, or the others would walk into the
next test's collectives alone and hang: checks go through ``all_ranks_agree``.
"""

import os

# Every rank on a host compiles its Inductor kernels at the same moment, each with a worker pool as
# large as the host's cores by default. At world 8 on one 16-core GPU host test_torch_compile took
# 352 s (its all_gather case 143 s, of which 20 s compiling the library's kernels) against 17 s at
# world 2; 8 ranks' pools on 16 cores are the suspect (not yet measured). So half a share of the
# cores per local rank: in-process compiling (no pool) from 8 ranks per 16 cores. Set before
# torch._inductor reads it.
_local_ranks = os.environ.get("LOCAL_WORLD_SIZE", "1")
_local_ranks = max(1, int(_local_ranks)) if _local_ranks.isdigit() else 1
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", str(max(1, len(os.sched_getaffinity(0)) // _local_ranks // 2)))

import pytest  # noqa: E402 - after the compile-thread setting
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import triton_dist as tdist  # noqa: E402


def pytest_runtest_logreport(report):
    """A rank's failure at once, on stderr: an exception on one rank (a check outside
    ``all_ranks_agree``) leaves the others in a collective, and the session's summary, where pytest
    would print it, may then never come."""
    if report.failed:
        import sys

        rank = os.environ.get("RANK", "?")
        text = str(report.longrepr).strip().splitlines()
        print(f"\n[rank {rank}] {report.when} of {report.nodeid} FAILED: " + "\n  ".join(text[-12:]),
              file=sys.stderr, flush=True)


def _heap_gib(world: int) -> int:
    """Symmetric heap per rank. Contexts sized by the world (gathered rows, every rank's partials)
    grow with it: 2 GiB was measured enough at two ranks; each rank gets 1 GiB more per rank
    beyond, but ranks sharing a GPU (MPS) must fit beside each other: at world 8 on one H100 8 GiB
    heaps left each rank ~1 GiB for torch, and 20 MiB allocations failed (2026-12-07). So at most
    70 % of the GPU's memory over its ranks, less ~2 GiB each of CUDA context and NVSHMEM state."""
    import torch

    wanted = 2 + max(0, world - 2)
    per_gpu = int(os.environ.get("TRITON_DIST_RANKS_PER_GPU", "1") or 1)
    if per_gpu <= 1:
        return wanted
    gib = torch.cuda.get_device_properties(0).total_memory / (1 << 30)
    return max(1, min(wanted, int(0.7 * gib / per_gpu) - 2))


@pytest.fixture(scope="session", autouse=True)
def runtime():
    if "RANK" not in os.environ:
        pytest.skip("GPU tests run under torchrun (scripts/gpu-test)", allow_module_level=True)
    tdist.init(heap_size=f"{_heap_gib(int(os.environ.get('WORLD_SIZE', '1')))}G")
    yield
    if tdist.is_initialized():
        tdist.finalize()


@pytest.fixture(scope="module", autouse=True)
def fresh_op_contexts():
    """Each test module starts and ends without the ops' cached contexts, so one module's symmetric
    memory is free for the next (every rank runs the same modules, so this stays collective)."""
    yield
    if tdist.is_initialized():
        from triton_dist import ops

        torch.cuda.synchronize()
        tdist.barrier()
        ops.clear_contexts()


@pytest.fixture
def replays(monkeypatch):
    """``[replayed, off_bound]``: the ops calls replayed from a recorded plan (triton_dist.eager_calls'
    replay and replay_gemm wrapped: ops looks them up on every call), and the plan launches that
    took a slower path than their bound C++ launch (``LaunchPlan.launch_arguments``: a plan's first
    launch, or one the bound launch declined)."""
    from triton_dist import eager_calls
    from triton_dist.kernels.common.launch_plan import LaunchPlan

    count = [0, 0]
    for name in ("replay", "replay_gemm"):
        def counted(*args, _original=getattr(eager_calls, name)):
            got = _original(*args)
            count[0] += got is not None
            return got

        monkeypatch.setattr(eager_calls, name, counted)
    original = LaunchPlan.launch_arguments

    def off_bound(plan, args):
        count[1] += 1
        return original(plan, args)

    monkeypatch.setattr(LaunchPlan, "launch_arguments", off_bound)
    return count


def check_repeated_calls(what: str, call, draw, out_shape, dtype, replays, calls: int = 200) -> None:
    """``calls`` calls ``call(*operands, out=out)`` of one shape, ``(operands, reference) =
    draw(i)`` fresh each call (``draw`` runs on every rank in the same order: a reference may be a
    host collective), ``out`` a new tensor (even calls) or a given NaN-poisoned one (odd calls):
    every element of every call within tolerance, and all but the first call of each form replayed
    from the recorded plan (triton_dist.eager_calls; with one rank, the plain GEMM's plan),
    through the plan's bound C++ launch but for its first launch or two (one per plan of the call).
    ``replays``: the fixture."""
    bad = []
    for i in range(calls):
        operands, want = draw(i)
        out = None if i % 2 == 0 else torch.full(out_shape, float("nan"), device="cuda", dtype=dtype)
        got = call(*operands, out=out)
        if (out is not None and got is not out) or not tolerance_ratio(got, want) < 1.0:
            bad.append(i)
    all_ranks_agree(not bad, f"{what} repeated: wrong at calls {bad[:10]}")
    expected = calls - 2
    all_ranks_agree(replays[0] == expected, f"{what}: {replays[0]} calls replayed, expected {expected}")
    # The GEMMs' plans launch from C++ only with tensor descriptors there (Config's switch, on by default).
    from_cpp = expected > 0 and tdist.config.get().eager_tensor_descriptors
    all_ranks_agree(replays[1] <= 2 or not from_cpp,
                    f"{what}: {replays[1]} of {calls} calls' launches off their bound C++ launch")
    tdist.barrier()


SHARED_GPU_TRAP = (
    "a kernel trap in one CUDA MPS client is delivered to every client of the GPU (NVIDIA's MPS documentation, "
    "'Error containment'; scripts/gpu-test's mps-shared-fault check shows it), so a deliberately trapped child "
    "would end the CUDA context of every process on the GPU, other worlds' included: this check runs without MPS "
    "(scripts/gpu-test without --ranks-per-gpu)")
"""Why tests that make a kernel trap on purpose are skipped under MPS."""


def skip_if_ranks_share_gpus(reason: str = SHARED_GPU_TRAP) -> None:
    """Skip (on every rank alike) when ranks share GPUs or this GPU runs under MPS at all: with
    ``--concurrent``, a world of one rank per GPU shares the MPS server with other worlds."""
    if all_ranks_any(tdist.ranks_per_gpu() > 1 or tdist.mps_active()):
        pytest.skip(reason)


def all_ranks_any(flag: bool) -> bool:
    """True on every rank when ``flag`` is true on any rank (so that all ranks take the same branch)."""
    flags = [None] * dist.get_world_size()
    dist.all_gather_object(flags, bool(flag))
    return any(flags)


def all_ranks_agree(ok: bool, what: str) -> None:
    """Assert `ok` on every rank; fails everywhere if it failed anywhere, naming the ranks."""
    flags = [None] * dist.get_world_size()
    dist.all_gather_object(flags, bool(ok))
    failed = [r for r, f in enumerate(flags) if not f]
    assert not failed, f"{what}: failed on ranks {failed}"


def raises_everywhere(fn, exc_type, match: str) -> None:
    """`fn` must raise `exc_type` on every rank, its message matching the regular expression `match`
    (re.search: escape parentheses and brackets)."""
    import re

    try:
        fn()
        ok, why = False, "no exception"
    except exc_type as e:  # noqa: PERF203
        ok, why = re.search(match, str(e)) is not None, str(e)
    all_ranks_agree(ok, f"expected {exc_type.__name__}({match!r}); rank {dist.get_rank()} saw: {why}")


def rank_generator(seed: int, rank: int) -> torch.Generator:
    """A generator every rank can rebuild for any other rank, to know what that rank wrote."""
    g = torch.Generator(device="cuda")
    g.manual_seed(seed * 1009 + rank)
    return g


def rank_randn(shape, dtype, seed: int, rank: int | None = None) -> torch.Tensor:
    """Normal samples of ``dtype`` (drawn in fp32), different on every rank; any rank can redraw
    another's by passing its ``rank``."""
    g = rank_generator(seed, dist.get_rank() if rank is None else rank)
    return torch.randn(shape, device="cuda", dtype=torch.float32, generator=g).to(dtype)


ELEMENT_RTOL = 2**-7
"""Of an element's own size: a bf16 output's rounding (half an ulp is at most ``2**-8``) with room
for fp32 sums taken in another order than the reference's."""

ELEMENT_RMS_TOL = 2**-5
"""Of the reference's RMS, for every element: the rounding of the bf16/fp16 partials that are
summed (each up to ``2**-8`` of its own size, which cancellation may leave larger than the sum).
At eight ranks of random data their summed rounding stays below about a third of this; a missing
or stale partial is off by about ``1 / sqrt(world)`` of the RMS, ten times more or over."""


def tolerance_ratio(got, ref) -> float:
    """The worst element's error over its own tolerance, ``max |got - ref| / (ELEMENT_RTOL * |ref|
    + ELEMENT_RMS_TOL * rms(ref))`` in fp32 (at most 1 passes); infinite when ``got`` holds a NaN
    or an Inf. Every element is held to its own bound: a check normalised by the largest element
    passes wrong elements that are small."""
    got, ref = got.float(), ref.float()
    if not torch.isfinite(got).all():
        return float("inf")
    bound = ELEMENT_RTOL * ref.abs() + ELEMENT_RMS_TOL * ref.pow(2).mean().sqrt().clamp_min(1e-30)
    return float(((got - ref).abs() / bound).max())


def graph_replay_errors(graph, a, out, reference, replays: int, seed: int) -> list[float]:
    """:func:`tolerance_ratio` of each of ``replays`` replays of ``graph`` against
    ``reference(a)``, ``a`` (an input the graph reads) redrawn from seed ``seed + replay`` and
    ``out`` (what it writes) poisoned with NaN before each: a replay that reads a stale input or
    leaves a tile unwritten shows up."""
    errors = []
    for replay in range(replays):
        a.copy_(rank_randn(tuple(a.shape), a.dtype, seed + replay))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        errors.append(tolerance_ratio(out, reference(a)))
    return errors
