"""NVSHMEM brought up and taken down by itself, without triton_dist: what its own init/finalize
cycle costs in GPU memory, so that the lifecycle check can tell NVSHMEM's loss from the runtime's.

The calls are the ones ``csrc/runtime/nvshmem_backend.cc`` makes (the unique-id bootstrap of the
host library), through ctypes, with the structures of NVSHMEM 3.x's public headers laid out by
ctypes' own alignment rules. The unique id travels over the caller's torch.distributed group.
"""

import ctypes
import os

import torch

import triton_dist as tdist
from triton_dist import nvshmem

_INIT_WITH_UNIQUEID = 1 << 3  # NVSHMEMX_INIT_WITH_UNIQUEID


class _UniqueId(ctypes.Structure):
    _fields_ = [("version", ctypes.c_int), ("internal", ctypes.c_char * 124)]


class _UniqueIdArgs(ctypes.Structure):
    _fields_ = [("version", ctypes.c_int), ("id", ctypes.POINTER(_UniqueId)), ("myrank", ctypes.c_int),
                ("nranks", ctypes.c_int)]


class _InitArgs(ctypes.Structure):
    _fields_ = [("version", ctypes.c_int), ("uid_args", _UniqueIdArgs), ("content", ctypes.c_char * 96)]


class _InitAttr(ctypes.Structure):
    _fields_ = [("version", ctypes.c_int), ("mpi_comm", ctypes.c_void_p), ("args", _InitArgs)]


assert ctypes.sizeof(_UniqueId) == 128 and ctypes.sizeof(_InitArgs) == 128 and ctypes.sizeof(_InitAttr) == 144


def _library() -> ctypes.CDLL:
    lib = ctypes.CDLL(os.path.join(nvshmem.library_dir(), "libnvshmem_host.so.3"), mode=ctypes.RTLD_GLOBAL)
    lib.nvshmem_malloc.restype = ctypes.c_void_p
    lib.nvshmem_malloc.argtypes = [ctypes.c_size_t]
    lib.nvshmem_free.argtypes = [ctypes.c_void_p]
    return lib


def _one_cycle(lib: ctypes.CDLL, heap_bytes: int) -> None:
    import torch.distributed as dist

    uid = _UniqueId(version=(1 << 16) + ctypes.sizeof(_UniqueId))
    if dist.get_rank() == 0:
        assert lib.nvshmemx_get_uniqueid(ctypes.byref(uid)) == 0, "nvshmemx_get_uniqueid failed"
    shared = [bytes(uid)]
    dist.broadcast_object_list(shared, src=0)
    uid = _UniqueId.from_buffer_copy(shared[0])
    attr = _InitAttr(version=(1 << 16) + ctypes.sizeof(_InitAttr))
    attr.args.version = (1 << 16) + ctypes.sizeof(_InitArgs)
    attr.args.uid_args.version = (1 << 16) + ctypes.sizeof(_UniqueIdArgs)
    assert lib.nvshmemx_set_attr_uniqueid_args(dist.get_rank(), dist.get_world_size(), ctypes.byref(uid),
                                               ctypes.byref(attr)) == 0, "nvshmemx_set_attr_uniqueid_args failed"
    assert lib.nvshmemx_hostlib_init_attr(_INIT_WITH_UNIQUEID, ctypes.byref(attr)) == 0, "NVSHMEM init failed"
    heap = lib.nvshmem_malloc(heap_bytes)
    assert heap, f"nvshmem_malloc({heap_bytes}) returned NULL"
    lib.nvshmem_free(ctypes.c_void_p(heap))
    lib.nvshmemx_hostlib_finalize()


def measure_nvshmem_cycles(cycles: int, heap_bytes: int = 256 << 20) -> float:
    """``cycles`` rounds of NVSHMEM init, a heap allocation, finalize on every rank of the
    default process group; prints and returns the free GPU memory lost (MiB, the whole GPU's)
    from round 1 to the last, measured between barriers like the runtime's cycles."""
    import torch.distributed as dist

    from triton_dist import placement

    # As init() does: the device of this rank, its context current (NVSHMEM binds to it).
    ranks_per_gpu, gpus = tdist.get_config().ranks_per_gpu, torch.cuda.device_count()
    rank = dist.get_rank()
    device = placement.device_of(rank % (gpus * ranks_per_gpu), ranks_per_gpu, gpus, rank)
    torch.cuda.set_device(device)
    torch.empty(1, device=f"cuda:{device}")
    lib = _library()
    # The settings the runtime makes (nvshmem_backend.cc: it overrides NVLS, keeps a caller's NCCL
    # switch and a caller's larger heap), restored afterwards so that the runtime's own bring-up
    # sets them again as it would in a fresh process.
    wanted = heap_bytes + (256 << 20)
    given = os.environ.get("NVSHMEM_SYMMETRIC_SIZE", "")
    settings = {"NVSHMEM_SYMMETRIC_SIZE": given if given.isdigit() and int(given) >= wanted else str(wanted),
                "NVSHMEM_DISABLE_NVLS": "1", "NVSHMEM_DISABLE_NCCL": os.environ.get("NVSHMEM_DISABLE_NCCL", "1")}
    before = {name: os.environ.get(name) for name in settings}
    os.environ.update(settings)
    seen = {}
    try:
        for cycle in range(1, cycles + 1):
            _one_cycle(lib, heap_bytes)
            torch.cuda.synchronize()
            dist.barrier()
            if cycle in (1, cycles):
                seen[cycle] = torch.cuda.mem_get_info()[0]
            dist.barrier()
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    lost_mib = (seen[1] - seen[cycles]) / 2**20
    print(f"{cycles} NVSHMEM-only init/finalize cycles (no triton_dist): free GPU memory {lost_mib:+.0f} MiB "
          f"lower (the whole GPU)", flush=True)
    return lost_mib
