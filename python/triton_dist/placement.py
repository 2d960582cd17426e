"""Which GPU each rank uses, and when several ranks may share one (CUDA MPS).

One rank per GPU is the default. Several ranks per GPU (``Config.ranks_per_gpu``) is a mode for
proving correctness at a world size larger than the GPUs at hand: it needs CUDA MPS, because only
under MPS do kernels of different processes run at the same time, and our kernels wait for each
other across ranks (without MPS the GPU time-slices between processes, and a kernel spinning on a
peer's signal holds the GPU while the peer's kernel waits for its turn: a deadlock). It also needs
each rank to have SMs of its own, so that the grids of every rank on the GPU are resident at once
(:mod:`triton_dist.residency`): a static SM partition (``CUDA_MPS_SM_PARTITION``, the daemon
started with ``-S``: SMs no other client may use) or, where the driver has none, a share capped at
``100 / ranks_per_gpu`` percent (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``: a cap, which keeps the
count of a rank's SMs but not which ones, so another client's spinning grid may still hold the
SM a rank's next kernel needs).

These are pure functions of what :func:`triton_dist.init` reads or gathers, so the rules are tested
without a GPU.
"""

from __future__ import annotations

DEFAULT_BACKEND = "cpu:gloo,cuda:nccl"
SHARED_GPU_BACKEND = "gloo"
"""NCCL refuses two ranks on one GPU ("Duplicate GPU detected"), so host exchange is gloo only."""

_HOW_TO_SHARE = ("start the MPS control daemon (nvidia-cuda-mps-control -d -S) and give every rank a static SM "
                 "partition of its own (CUDA_MPS_SM_PARTITION), or (without -S) CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="
                 "100/K, and set TRITON_DIST_RANKS_PER_GPU=K; scripts/gpu-test --ranks-per-gpu K does all of this")


def _prefix(rank: int | None) -> str:
    return "triton_dist init" if rank is None else f"triton_dist [rank {rank}] init"


def host_backend(ranks_per_gpu: int) -> str:
    """The torch.distributed backend init() creates for host exchange."""
    return SHARED_GPU_BACKEND if ranks_per_gpu > 1 else DEFAULT_BACKEND


def check_ranks_per_gpu(ranks_per_gpu) -> int:
    """``ranks_per_gpu`` if it is an int >= 1, else a ValueError naming it."""
    if isinstance(ranks_per_gpu, bool) or not isinstance(ranks_per_gpu, int) or ranks_per_gpu < 1:
        raise ValueError(f"triton_dist init: ranks_per_gpu must be an int >= 1, got {ranks_per_gpu!r}")
    return ranks_per_gpu


def device_of(local_rank: int, ranks_per_gpu: int, device_count: int, rank: int | None = None) -> int:
    """The GPU of the node's ``local_rank``-th rank: ranks ``K * g .. K * g + K - 1`` share GPU ``g``."""
    device = local_rank // ranks_per_gpu
    if not 0 <= device < device_count:
        most = device_count * ranks_per_gpu
        hint = (f"run at most {most} ranks per node" if ranks_per_gpu > 1 else
                f"run at most {device_count} ranks per node, or share GPUs: {_HOW_TO_SHARE}")
        raise RuntimeError(f"{_prefix(rank)}: local rank {local_rank} would use GPU {device}, but this host has "
                           f"{device_count} GPU(s) and {ranks_per_gpu} rank(s) share each; {hint}")
    return device


def check_gpu_sharing(ranks_per_gpu: int, mps_state: str, thread_percentage: str | None,
                      rank: int | None = None, sm_partition: str | None = None) -> None:
    """Raise unless ``ranks_per_gpu`` ranks can share this rank's GPU: MPS on (``mps_state`` as
    ``_C.mps_state`` says it: "on", "off" or "unknown") and this rank either on a static SM
    partition (``sm_partition``: its ``CUDA_MPS_SM_PARTITION``) or with
    ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` at most its share."""
    if ranks_per_gpu == 1:
        return
    if mps_state == "off":
        raise RuntimeError(
            f"{_prefix(rank)}: TRITON_DIST_RANKS_PER_GPU={ranks_per_gpu} needs CUDA MPS, and MPS is not active "
            "on this GPU. Without it, kernels of different processes take turns on the GPU, so a kernel that "
            "waits for a signal from another rank's kernel on the same GPU holds it for ever (a deadlock). To "
            f"share GPUs, {_HOW_TO_SHARE}; otherwise run one rank per GPU")
    if sm_partition is not None and sm_partition.strip():
        return  # SMs of its own (MPS refuses a client whose partition does not exist)
    if thread_percentage is None or thread_percentage.strip() == "":
        raise RuntimeError(
            f"{_prefix(rank)}: TRITON_DIST_RANKS_PER_GPU={ranks_per_gpu} needs "
            f"a static SM partition (CUDA_MPS_SM_PARTITION) or CUDA_MPS_ACTIVE_THREAD_PERCENTAGE <= "
            f"{100 / ranks_per_gpu:g} for every rank: ranks whose kernels wait on each other must all be resident at "
            "once, so each may take only its share of the SMs")
    try:
        percent = float(thread_percentage)
    except ValueError:
        raise RuntimeError(f"{_prefix(rank)}: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={thread_percentage!r} is not a "
                           "number") from None
    if not 0 < percent * ranks_per_gpu <= 100 + 1e-9:
        raise RuntimeError(
            f"{_prefix(rank)}: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={thread_percentage} lets {ranks_per_gpu} ranks "
            f"ask for {percent * ranks_per_gpu:g} % of one GPU; set it to at most {100 / ranks_per_gpu:g}, or "
            "ranks that wait on each other may not all be resident (a deadlock)")


def check_placement(gpu_of_rank: list[tuple[str, str]], ranks_per_gpu: int, rank: int | None = None) -> None:
    """``gpu_of_rank[r]``: ``(host name, GPU UUID)`` of rank ``r``. Raise when a GPU holds more ranks
    than ``ranks_per_gpu`` (naming them), so that two ranks never share a GPU by accident."""
    ranks_on: dict[tuple[str, str], list[int]] = {}
    for r, gpu in enumerate(gpu_of_rank):
        ranks_on.setdefault(tuple(gpu), []).append(r)
    for (host, uuid), ranks in ranks_on.items():
        if len(ranks) > ranks_per_gpu:
            fix = (f"give each rank its own GPU (LOCAL_RANK, CUDA_VISIBLE_DEVICES), or share GPUs: {_HOW_TO_SHARE}"
                   if ranks_per_gpu == 1 else f"run at most {ranks_per_gpu} ranks on each GPU")
            raise RuntimeError(f"{_prefix(rank)}: ranks {ranks} all use GPU {uuid} on {host}, but "
                               f"TRITON_DIST_RANKS_PER_GPU={ranks_per_gpu}; {fix}")


def check_host_group(backend: str, ranks_per_gpu: int, rank: int | None = None) -> None:
    """A process group given to init() (or already there) must not route host exchange through NCCL
    when ranks share a GPU: NCCL refuses two ranks on one GPU."""
    if ranks_per_gpu > 1 and "nccl" in backend.lower():
        raise RuntimeError(
            f"{_prefix(rank)}: the process group's backend is {backend!r}, but ranks share GPUs "
            f"(TRITON_DIST_RANKS_PER_GPU={ranks_per_gpu}) and NCCL refuses two ranks on one GPU; create it with "
            f"backend={SHARED_GPU_BACKEND!r}, or let triton_dist.init() create it")
