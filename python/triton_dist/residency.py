"""How many programs of a waiting grid may run at once: the library's co-residency rule.

A kernel whose programs wait for other programs - of its own grid (persistent GEMM tiles, ticket
counters), of a kernel on another stream (producer and consumer), or of a peer rank's kernel (any
signal wait) - makes progress only while the programs it waits for are running. CUDA promises
nothing for programs beyond what fits on the GPU at once, so the rule is:

    a grid that waits has at most (SMs this process can use - SMs reserved for the kernels it
    waits on in this process) x (its programs that fit on one SM) programs,

and "SMs this process can use" is the device attribute ``multiProcessorCount``, read at run time,
never a constant: CUDA MPS lowers it to the client's share (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``;
132 on an H200, 66 at 50 %, 32 at 25 %), and a grid sized for the whole GPU would then wait for
programs that cannot start. The library's grids are sized from :func:`max_waiting_programs`
with one program per SM (a program of our persistent kernels takes most of an SM's shared memory
or registers); :func:`programs_per_sm` checks a compiled kernel against that assumption.

Copies count as kernels when ranks share a GPU. Between GPUs, a copy-engine transfer needs no SM;
between two processes on one GPU it is a same-device copy, which the driver may run as a kernel
on the SMs. A grid that holds every SM while it waits for such a copy then waits for ever: seen
at world 8 on one H200 (tutorial 05's GEMM+ReduceScatter ``"fused_ce"`` with its grid on all 14
SMs of a rank timed out; with 12 it passed, and ``"fused"``, which copies nothing, passed on all
14). Grids that wait for copies therefore ask with ``waits_for_copies=True``, which leaves
:data:`SHARED_GPU_COPY_SMS` SMs free in that mode.
"""

from __future__ import annotations

import functools


@functools.lru_cache(maxsize=None)
def _sm_count(device_index: int) -> int:
    import torch

    return torch.cuda.get_device_properties(device_index).multi_processor_count


def sm_count(device=None) -> int:
    """SMs this process may run programs on, on ``device`` (default: the current one): the device
    attribute, which follows an MPS client's share."""
    import torch

    if device is None:
        index = torch.cuda.current_device()
    elif isinstance(device, int):
        index = device
    else:
        index = torch.device(device).index
        index = torch.cuda.current_device() if index is None else index
    return _sm_count(index)


SHARED_GPU_COPY_SMS = 2
"""SMs a grid that waits for copies leaves free when ranks share a GPU (see the module notes); two,
so that a copy still finds one while a small kernel of the same process holds the other."""


def _ranks_share_gpus() -> bool:
    from . import config

    return config.get().ranks_per_gpu > 1


def max_waiting_programs(device=None, reserved: int = 0, what: str = "a waiting kernel",
                         waits_for_copies: bool = False) -> int:
    """The most programs a grid that waits may have, one per SM, when ``reserved`` SMs stay free for
    kernels it waits on in this process (a producer on another stream), and, with
    ``waits_for_copies``, :data:`SHARED_GPU_COPY_SMS` more when ranks share a GPU (their copies
    run on SMs). Raises when nothing is left."""
    sms = sm_count(device)
    if waits_for_copies and _ranks_share_gpus():
        reserved += SHARED_GPU_COPY_SMS
    if sms - reserved < 1:
        raise RuntimeError(f"triton_dist {what}: {reserved} SMs reserved for the kernels and copies it waits on "
                           f"leave none of the {sms} this process may use (an MPS share lowers the count); "
                           "reserve fewer")
    return sms - reserved


def programs_per_sm(num_warps: int, registers_per_thread: int, shared_bytes: int, *, threads_per_sm: int = 2048,
                    registers_per_sm: int = 65536, shared_per_sm: int = 233472, blocks_per_sm: int = 32,
                    warp_size: int = 32) -> int:
    """Programs of one kernel that fit on one SM at once (Hopper's limits by default; pass a device's
    own). Registers are allocated per warp in units of 256; a kernel that does not fit at all gives 0."""
    threads = num_warps * warp_size
    by_threads = threads_per_sm // threads
    per_warp = -(-registers_per_thread * warp_size // 256) * 256
    by_registers = registers_per_sm // (per_warp * num_warps) if registers_per_thread else blocks_per_sm
    by_shared = shared_per_sm // shared_bytes if shared_bytes else blocks_per_sm
    return max(0, min(by_threads, by_registers, by_shared, blocks_per_sm))


def compiled_programs_per_sm(compiled, device=None) -> int:
    """:func:`programs_per_sm` of a compiled Triton kernel (``kernel.warmup(...)`` or a launch's
    return value; its handles must be initialised), with the device's limits."""
    import torch

    props = torch.cuda.get_device_properties(torch.cuda.current_device() if device is None else device)
    compiled._init_handles()
    return programs_per_sm(compiled.metadata.num_warps, compiled.n_regs, compiled.metadata.shared,
                           threads_per_sm=props.max_threads_per_multi_processor,
                           registers_per_sm=getattr(props, "regs_per_multiprocessor", 65536),
                           shared_per_sm=getattr(props, "shared_memory_per_multiprocessor", 233472),
                           warp_size=props.warp_size)
