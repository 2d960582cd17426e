"""Bring-up and tear-down of the distributed runtime, and where this process stands in it."""

from __future__ import annotations

import dataclasses
import datetime
import os

from . import config as _config
from . import nvshmem as _nvshmem
from . import placement as _placement

_state: dict = {}


def _core():
    from . import _C

    return _C


def _require_initialized(op: str) -> None:
    if not _state:
        raise RuntimeError(
            f"triton_dist {op}: triton_dist is not initialised; call triton_dist.init() first "
            "(under torchrun, or with a torch ProcessGroup)")


def _import_torch(op: str):
    """torch, or an ImportError that says why triton_dist needs it and how to install it (torch is
    not a declared dependency: which build a machine needs depends on its CUDA driver)."""
    try:
        import torch
    except ImportError as e:
        raise ImportError(f"triton_dist {op}: PyTorch is not installed, and triton_dist needs it (its runtime "
                          f"runs over torch.distributed and its ops take and return torch tensors); install a "
                          f"CUDA build of torch for this machine's driver, e.g. pip install 'triton-dist[torch]' "
                          f"or pip install torch") from e
    return torch


def _env_int(name: str) -> int | None:
    raw = os.environ.get(name)
    return int(raw) if raw not in (None, "") else None


def init(process_group=None, *, heap_size: int | str | None = None,
         local_world_size: int | None = None, device: int | None = None,
         ranks_per_gpu: int | None = None, keep_nvshmem: bool | None = None) -> None:
    """Collective: initialise triton_dist on every rank.

    Also puts the prebuilt kernels in front of Triton's cache (:mod:`triton_dist.prebuilt_cache`),
    unless the user has a Triton cache manager of their own, and starts recording the variants
    Triton compiles or loads when ``Config.record_variants`` asks (:mod:`triton_dist.variant_list`);
    finalize() undoes both.

    Args:
        process_group: the ranks to span. ``None`` uses the default group, creating it from the
            torchrun environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``) when
            torch.distributed is not initialised yet (gloo for host data and NCCL for CUDA
            tensors; gloo alone when ranks share GPUs).
        heap_size: bytes of symmetric memory per rank (int, or a string such as ``"8G"``);
            defaults to ``TRITON_DIST_SYMMETRIC_HEAP_SIZE`` or 1 GiB.
        local_world_size: ranks per node; defaults to ``TRITON_DIST_LOCAL_WORLD_SIZE`` or the
            count discovered from host names.
        device: the CUDA device of this rank; defaults to ``LOCAL_RANK // ranks_per_gpu``.
        ranks_per_gpu: ranks sharing each GPU; defaults to ``TRITON_DIST_RANKS_PER_GPU`` or 1.
            Above 1 needs CUDA MPS (:mod:`triton_dist.placement` says why and how).
        keep_nvshmem: let finalize() keep NVSHMEM up for a later init() of the same processes
            (``Config.keep_nvshmem``: for programs that init and finalize many times); defaults
            to ``TRITON_DIST_KEEP_NVSHMEM`` or off.

    Raises:
        RuntimeError: already initialised, no GPU, a world size that disagrees with the
            environment, NVSHMEM missing, ranks that disagree on the heap size, two ranks on one
            GPU without ``ranks_per_gpu``, or a shared GPU without MPS.
    """
    if _state:
        raise RuntimeError("triton_dist init: already initialised; call triton_dist.finalize() "
                           "before init() again")
    if keep_nvshmem is not None and not isinstance(keep_nvshmem, bool):
        raise TypeError(f"triton_dist init: keep_nvshmem must be True, False or None, got {keep_nvshmem!r}")
    _import_torch("init")
    import torch
    import torch.distributed as dist

    base = _config.Config.from_environment()
    cfg = dataclasses.replace(
        base,
        symmetric_heap_size=_config.parse_size(heap_size) if heap_size is not None else base.symmetric_heap_size,
        local_world_size=local_world_size if local_world_size is not None else base.local_world_size,
        ranks_per_gpu=_placement.check_ranks_per_gpu(
            ranks_per_gpu if ranks_per_gpu is not None else base.ranks_per_gpu),
        keep_nvshmem=keep_nvshmem if keep_nvshmem is not None else base.keep_nvshmem,
    )
    if not torch.cuda.is_available():
        raise RuntimeError("triton_dist init: no CUDA GPU is visible to this process; triton_dist "
                           "kernels need one (python -m triton_dist.selfcheck runs without)")

    env_rank, env_world = _env_int("RANK"), _env_int("WORLD_SIZE")
    env_local_rank = _env_int("LOCAL_RANK")
    if device is None and env_local_rank is not None:
        device = _placement.device_of(env_local_rank, cfg.ranks_per_gpu, torch.cuda.device_count(), env_rank)
    created_group = False
    if process_group is None:
        if not dist.is_initialized():
            if env_rank is None or env_world is None:
                raise RuntimeError(
                    "triton_dist init: torch.distributed is not initialised and RANK/WORLD_SIZE are "
                    "not set; launch with torchrun, or pass a ProcessGroup")
            if device is not None:
                torch.cuda.set_device(device)
            dist.init_process_group(backend=_placement.host_backend(cfg.ranks_per_gpu),
                                    timeout=datetime.timedelta(seconds=cfg.bootstrap_timeout_s))
            created_group = True
        process_group = dist.group.WORLD
    try:
        device, mps_state = _join(process_group, cfg, device)
    except BaseException:
        # A group init() created must not outlive a failed init(): the next init() in this
        # process would find it and skip the checks the caller asked for.
        if created_group:
            dist.destroy_process_group()
        raise
    _state.update(process_group=process_group, device=device, created_group=created_group,
                  config=cfg, mps_active=mps_state == "on")
    from . import torch_library

    try:
        torch_library.register(world_size())  # torch.ops.triton_dist.*, for torch.compile
    except Exception as error:  # noqa: BLE001  an optional feature must not fail init
        import warnings

        warnings.warn(f"triton_dist: the ops are not registered with torch.library ({type(error).__name__}: "
                      f"{error}); torch.compile will trace into them instead", stacklevel=2)


def _join(process_group, cfg, device: int | None) -> tuple[int, str]:
    """The checks and the NVSHMEM bring-up of init() once the host group exists; returns this
    rank's device and its MPS state (``_C.mps_state``)."""
    import socket

    import torch
    import torch.distributed as dist

    rank = dist.get_rank(process_group)
    world_size = dist.get_world_size(process_group)
    _placement.check_host_group(str(dist.get_backend(process_group)), cfg.ranks_per_gpu, rank)
    env_world = _env_int("WORLD_SIZE")
    if env_world is not None and process_group is dist.group.WORLD and env_world != world_size:
        raise RuntimeError(
            f"triton_dist [rank {rank}] init: the process group has {world_size} ranks but "
            f"WORLD_SIZE={env_world}; launch every rank with the same world size")
    if device is None:
        device = _placement.device_of(rank % (torch.cuda.device_count() * cfg.ranks_per_gpu), cfg.ranks_per_gpu,
                                      torch.cuda.device_count(), rank)
    if not 0 <= device < torch.cuda.device_count():
        raise RuntimeError(
            f"triton_dist [rank {rank}] init: device {device} does not exist; this host has "
            f"{torch.cuda.device_count()} GPUs (run at most that many ranks per node)")
    torch.cuda.set_device(device)
    # NVSHMEM binds to the context current on this thread; make torch create it now.
    torch.empty(1, device=f"cuda:{device}")

    def allgather(blob: bytes) -> list[bytes]:
        gathered: list = [None] * world_size
        dist.all_gather_object(gathered, blob, group=process_group)
        return gathered

    mps_state = _core().mps_state(device, rank)
    if cfg.ranks_per_gpu > 1:
        _placement.check_gpu_sharing(cfg.ranks_per_gpu, mps_state,
                                     os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), rank,
                                     sm_partition=os.environ.get("CUDA_MPS_SM_PARTITION"))
    gpu = (socket.gethostname(), str(torch.cuda.get_device_properties(device).uuid))
    _placement.check_placement([tuple(g.decode().split("\0")) for g in allgather("\0".join(gpu).encode())],
                               cfg.ranks_per_gpu, rank)

    _core().init(rank, world_size, allgather, cfg.symmetric_heap_size, cfg.local_world_size,
                 _nvshmem.library_dir(), cfg.keep_nvshmem)
    _config._set(cfg)
    from . import distributed_jit as _jit
    from . import prebuilt_cache, variant_list

    _jit.install_module_hook()
    prebuilt_cache.install()  # the prebuilt kernels before Triton's cache (unless the user has a manager)
    if cfg.record_variants:
        variant_list.start_recording(cfg.record_variants)
    return device, mps_state


def finalize() -> None:
    """Collective: tear triton_dist down on every rank (after which init() may run again).

    Symmetric tensors that are still alive must not be used afterwards. NVSHMEM is taken down too
    (its heap's GPU memory is returned, less the 1.1 MiB that each NVSHMEM bring-up leaves behind,
    NVSHMEM's own), unless init() was given ``keep_nvshmem``. A process that exits without calling
    this does not hang: nothing collective runs at interpreter exit. (One whose NVSHMEM was taken
    down once and brought up again should finalize before it exits: NVSHMEM 3.4.5 left up a second
    time segfaulted at exit on one H200.)

    The default process group that init() created (none was passed, none existed) is destroyed
    here. A second init() in the same torchrun job then creates it again, and torch's second
    ``init_process_group`` failed to connect its gloo pairs in both of our tries on 2 x H200
    (2026-11-29, "Connection refused"). To init again in one process, create the process group
    yourself and pass it (or leave it to torch.distributed) so that it outlives finalize().
    """
    _require_initialized("finalize")
    import torch

    from . import distributed_jit as _jit
    from . import ops, prebuilt_cache, variant_list

    torch.cuda.synchronize()
    # The ops' cached contexts hold memory of the heap torn down here: a later init() must not
    # find them (they would point into the old heap).
    ops.clear_contexts()
    _jit.remove_module_hook()
    prebuilt_cache.uninstall()
    variant_list.stop_recording()
    _core().finalize()
    created_group = _state["created_group"]
    _state.clear()
    _config._set(None)
    if created_group:
        import torch.distributed as dist

        dist.destroy_process_group()


def is_initialized() -> bool:
    """True between init() and finalize()."""
    return bool(_state)


def rank() -> int:
    """This process's rank in the triton_dist world."""
    _require_initialized("rank")
    return _core().rank()


def world_size() -> int:
    """Number of ranks."""
    _require_initialized("world_size")
    return _core().world_size()


def local_rank() -> int:
    """This rank's index among the ranks of its node."""
    _require_initialized("local_rank")
    return _core().local_rank()


def local_world_size() -> int:
    """Ranks on this node (as discovered, or as TRITON_DIST_LOCAL_WORLD_SIZE declares)."""
    _require_initialized("local_world_size")
    return _core().local_world_size()


def node() -> int:
    """This rank's node: ranks ``[node * local_world_size(), (node + 1) * local_world_size())``
    share it (contiguous blocks, as discovered from host names or as TRITON_DIST_LOCAL_WORLD_SIZE
    declares; the same on every rank, checked at init)."""
    _require_initialized("node")
    return _core().node()


def num_nodes() -> int:
    """The number of nodes: ``world_size() // local_world_size()``."""
    _require_initialized("num_nodes")
    return _core().num_nodes()


def barrier() -> None:
    """Host-side barrier across all ranks. It does not wait for GPU work; synchronize first if
    the barrier must order kernels."""
    _require_initialized("barrier")
    _core().barrier()


def device_barrier(stream=None) -> None:
    """Stream-ordered barrier across all ranks: later work on ``stream`` (default: the current
    one) starts after every rank's earlier work on its stream has finished."""
    _require_initialized("device_barrier")
    import torch

    stream = stream or torch.cuda.current_stream()
    _core().barrier_all_on_stream(stream.cuda_stream)


def process_group():
    """The torch.distributed process group triton_dist was initialised over (host exchange)."""
    _require_initialized("process_group")
    return _state["process_group"]


def ranks_per_gpu() -> int:
    """Ranks sharing each GPU (1 unless the several-ranks-per-GPU mode is on; see Config)."""
    _require_initialized("ranks_per_gpu")
    return _state["config"].ranks_per_gpu


def mps_active() -> bool:
    """True when this rank's GPU runs under CUDA MPS (whether or not ranks share it): kernels of
    other processes then run beside ours, and a fault in any client ends every client's work."""
    _require_initialized("mps_active")
    return _state["mps_active"]
