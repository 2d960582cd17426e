"""Timing a GPU operation the same way on every rank (docs/design.md §7).

Method:

- ``warmup`` calls first (compilation, module loading, NCCL communicator set-up), bracketed by a
  synchronise + barrier so that no rank is still compiling while another one times.
- Then ``iters`` samples. Before each sample every rank synchronises its GPU, passes a host
  barrier (triton_dist's when it is initialised, else torch.distributed's) and then, on its
  stream, a GPU barrier across the ranks (:func:`gpu_barrier`); CUDA events are recorded on the
  current stream around ``group`` back-to-back calls and the sample is ``elapsed / group``.
  Why the GPU barrier: the host barrier releases the ranks several µs apart (tens when a host is
  busy), and a collective on the early rank then spends that skew waiting for the late one inside
  its timed region. After a GPU barrier the ranks start within about one link latency. It did not
  remove all run-to-run noise: two runs of unchanged all-reduce kernels on 2 x H200 agreed within
  5 % from 32 MiB up, but differed by up to 1.7x at 2-8 MiB and 25 % below 64 KiB.
- Counts are fixed, never adapted to the measured time: every rank must make the same number of
  calls, or a distributed kernel on one rank waits for a peer that has stopped calling (deadlock).
- Each rank takes the median of its samples; the reported value is the MAX over ranks (an op is
  as slow as its slowest rank).

Small ops: with ``group=1`` the GPU is idle when the start event fires, so the host's launch
latency (a few µs for a Triton launch from Python, more for NCCL) is inside the sample. That is
per-call timing. To measure GPU time instead, either time ``group > 1`` calls (launch latency
overlaps earlier calls once the queue runs ahead) or set ``gpu_delay_us``: a GPU spin of that
length is enqueued before the start event so every launch of the sample queues up behind it (the
delay must exceed the host time to enqueue the group). docs/design.md §3 notes that per-call and loop
timing differ by up to 2x for small ops: compare numbers from one harness, one run.

``fn`` may use other streams, but must make the current stream wait for them before returning.
"""

from __future__ import annotations

import statistics
from typing import Callable

_DEFAULT_CYCLES_PER_US = 1980.0  # H200 boost clock; only used to size gpu_delay_us


def _check_counts(warmup: int, iters: int, group: int) -> None:
    for name, value, least in (("warmup", warmup, 0), ("iters", iters, 1), ("group", group, 1)):
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise ValueError(f"triton_dist.bench: {name} must be an int >= {least}, got {value!r}")


def _distributed():
    """torch.distributed when a process group is up, else None."""
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def sync_and_barrier() -> None:
    """Wait for this GPU's work, then for every rank to get here (host barrier)."""
    import torch

    from ..runtime import barrier, is_initialized

    torch.cuda.synchronize()
    if is_initialized():
        barrier()
        return
    dist = _distributed()
    if dist is not None:
        dist.barrier()
        torch.cuda.synchronize()


def gpu_barrier() -> None:
    """Stream-ordered barrier across the ranks on the current stream: the next work on it starts
    after every rank's GPU reached its barrier (triton_dist's ``device_barrier`` when initialised,
    else a one-element NCCL all-reduce; nothing on one rank). Collective."""
    from ..runtime import device_barrier, is_initialized, world_size

    if is_initialized():
        if world_size() > 1:
            device_barrier()
        return
    dist = _distributed()
    if dist is not None and dist.get_world_size() > 1:
        import torch

        dist.all_reduce(torch.zeros(1, device=torch.device("cuda", torch.cuda.current_device())))


def _gpu_delay(us: float) -> None:
    import torch

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    khz = getattr(props, "clock_rate", None)
    cycles_per_us = khz / 1000.0 if khz else _DEFAULT_CYCLES_PER_US
    torch.cuda._sleep(int(us * cycles_per_us))


def sample_us(fn: Callable[[], object], *, warmup: int = 5, iters: int = 50, group: int = 1, barrier: bool = True,
              gpu_delay_us: float = 0.0, graph: bool = False) -> list[float]:
    """This rank's samples (µs per call) of ``fn``; see the module docstring for the method.

    ``barrier=False`` skips the per-sample synchronise and barrier: samples then run back to back
    (loop timing); warm-up is still bracketed by barriers. ``graph=True`` captures the ``group``
    calls in a CUDA graph once (after warm-up) and times its replays: GPU time without the host's
    launch cost, for ours and the baselines alike (NCCL captures too). ``fn`` must then allocate
    nothing and keep its tensors alive.
    """
    _check_counts(warmup, iters, group)
    import torch

    sync_and_barrier()
    for _ in range(warmup):
        fn()
    sync_and_barrier()
    if graph:
        captured = torch.cuda.CUDAGraph()
        # thread_local: NCCL's watchdog thread must not invalidate the capture.
        with torch.cuda.graph(captured, capture_error_mode="thread_local"):
            for _ in range(group):
                fn()
        sync_and_barrier()
        captured.replay()  # the first replay uploads the graph
        sync_and_barrier()
    events = []
    for _ in range(iters):
        if barrier:
            sync_and_barrier()
        if gpu_delay_us > 0:
            _gpu_delay(gpu_delay_us)
        if barrier:
            gpu_barrier()  # after the delay: the ranks leave the delay as far apart as the host barrier left them
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        if graph:
            captured.replay()
        else:
            for _ in range(group):
                fn()
        stop.record()
        events.append((start, stop))
    torch.cuda.synchronize()
    return [start.elapsed_time(stop) * 1000.0 / group for start, stop in events]


def rank_medians_us(fn: Callable[[], object], **kwargs) -> list[float]:
    """Every rank's median (µs per call) of ``fn``, indexed by rank; the same list on every rank.
    Collective when torch.distributed is initialised. Keyword arguments as :func:`sample_us`."""
    local = statistics.median(sample_us(fn, **kwargs))
    return all_gather_floats(local)


def median_us(fn: Callable[[], object], *, warmup: int = 5, iters: int = 50, group: int = 1, barrier: bool = True,
              gpu_delay_us: float = 0.0, graph: bool = False) -> float:
    """Median µs per call of ``fn``: the MAX over ranks of each rank's median. Collective."""
    return max(rank_medians_us(fn, warmup=warmup, iters=iters, group=group, barrier=barrier,
                               gpu_delay_us=gpu_delay_us, graph=graph))


def all_gather_floats(value: float) -> list[float]:
    """``value`` from every rank, indexed by rank (``[value]`` without a process group)."""
    dist = _distributed()
    if dist is None or dist.get_world_size() == 1:
        return [float(value)]
    import torch

    device = _exchange_device(dist)
    mine = torch.tensor([float(value)], dtype=torch.float64, device=device)
    every = torch.empty(dist.get_world_size(), dtype=torch.float64, device=device)
    dist.all_gather_into_tensor(every, mine)
    return [float(v) for v in every.tolist()]


def max_over_ranks(value: float) -> float:
    """The largest ``value`` over all ranks (all_reduce MAX on one float). Collective."""
    dist = _distributed()
    if dist is None or dist.get_world_size() == 1:
        return float(value)
    import torch

    t = torch.tensor([float(value)], dtype=torch.float64, device=_exchange_device(dist))
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def _exchange_device(dist):
    """Where the process group exchanges tensors: the GPU for NCCL, the host for gloo (ranks that
    share a GPU, where NCCL refuses them)."""
    import torch

    if dist.get_backend() == "gloo":
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())
