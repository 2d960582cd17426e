"""triton_dist: Triton-distributed on stock Triton.

Symmetric memory, signal primitives and compute-communication overlapping kernels for multi-GPU
programs. Importing is cheap and inert: nothing touches the GPU, torch or NVSHMEM until
:func:`init`.

    import triton_dist as tdist
    tdist.init()                                  # under torchrun
    x = tdist.symm_empty((1024, 1024), torch.bfloat16)
    peer = tdist.peer_tensor(x, (tdist.rank() + 1) % tdist.world_size())
    tdist.finalize()
"""

from . import host_collectives, placement, residency, timeline
from .config import Config
from .config import get as get_config
from .device_map import symmetric_map, symmetric_map_bytes
from .distributed_jit import DistributedKernel, jit
from .runtime import (barrier, device_barrier, finalize, init, is_initialized, local_rank, local_world_size,
                      mps_active, node, num_nodes, process_group, rank, ranks_per_gpu, world_size)
from .signals import SignalPad, stream_copy_2d, stream_wait_value64, stream_write_value64
from .stream_schedule import StreamSchedule
from .symmetric import check_symmetric, is_symmetric, peer_tensor, peer_tensors, symm_empty, symm_zeros

__version__ = "0.1.0"

__all__ = [
    "Config", "DistributedKernel", "SignalPad", "StreamSchedule", "barrier", "check_symmetric", "device_barrier",
    "finalize", "get_config", "host_collectives", "init", "is_initialized", "is_symmetric", "jit", "local_rank",
    "local_world_size", "mps_active", "node", "num_nodes", "peer_tensor", "peer_tensors", "placement",
    "process_group", "rank", "ranks_per_gpu", "residency", "stream_copy_2d", "stream_wait_value64",
    "stream_write_value64", "symm_empty", "symm_zeros", "symmetric_map", "symmetric_map_bytes", "world_size"
]
