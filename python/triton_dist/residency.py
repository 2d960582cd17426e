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
SMs of a rank timed out; with 12 it passed once (and hung later, see below), and ``"fused"``, which copies nothing, passed on all
14). Grids that wait for copies therefore ask with ``waits_for_copies=True``, which leaves
:data:`SHARED_GPU_HEADROOM_SMS` SMs free in that mode.

Two or three free SMs were not enough (one H200, 8 ranks at 12 % each, 14 SMs a rank,
2026-12-02): ``gemm_rs`` ``"fused_ce"`` on 12 SMs hung in its first call, and ``ag_gemm``
``"ce_push"`` on 11 hung after 370 and, in a second run, 491 back-to-back calls. The signal pads
read after the hang showed every rank's acknowledgements in place and two ranks whose side
streams had sent nothing of that call: their copy, or the signal kernel after it, never ran.
With 6 SMs free both passed (500 and 100 calls), as did ``ag_gemm`` on 8 of 14 and every call
synchronised. Copies are not the only work that needs the room: ``ag_gemm`` ``"sm_push"``, its
GEMM on 7 SMs next to a push kernel of 7 (no copy), hung after 436 calls; grids that wait on a
kernel of their own process (``reserved``) leave the same headroom. The MPS share is a cap, not a reservation of SMs, so the headroom a copy needs
next to a spinning grid is a measured number, not a derived one.

A cap also leaves which SMs a rank gets to the other ranks' grids: at world 4 (2026-12-03, 32 SMs a
rank, 6 left free) ``ag_gemm`` ``"ce_push"`` hung in the first call of a new context and after 53
back-to-back calls with one rank's side-stream signal kernel never started while its GEMM spun,
and ``gemm_rs`` ``"fused_ce"`` hung likewise. With MPS static SM partitions (the daemon started
with ``-S``, each rank on a partition of its own, ``CUDA_MPS_SM_PARTITION``; what
``scripts/gpu-test --ranks-per-gpu`` sets up where the driver has them) a rank's free SMs are its
own, and the headroom holds by construction.

Waits inside one grid need the rule most: a program that waits for a share of work held by a
program of its own grid that never started waits for ever. ``ag_gemm``'s one-launch
``"sm_push_inline"`` did so at world 4, 7 MPS clients on one H100 (2026-12-07, in a context's 8th call);
its push's shares are now claimed by whichever programs run
(:mod:`~triton_dist.kernels.common.claims`), which needs no program resident but the running
ones. Grids whose tiles are assigned statically and wait for tiles of another rank's grid (the
persistent GEMMs' epilogues) still rely on the rule; claiming their tiles in the same way is the
remedy should one of them be seen to hang.
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


SHARED_GPU_HEADROOM_SMS = 6
"""SMs a grid that waits on its own process's copies or kernels leaves free when ranks share a
GPU: the smallest headroom measured to let them run at 8 ranks on one H200 (see the module
notes). Only that mode pays for it, and it times nothing."""


def _ranks_share_gpus() -> bool:
    from . import config

    return config.get().ranks_per_gpu > 1


def headroom_sms() -> int:
    """SMs of headroom a grid that waits on work of its own process gives that work:
    :data:`SHARED_GPU_HEADROOM_SMS` when ranks share a GPU, else 0."""
    return SHARED_GPU_HEADROOM_SMS if _ranks_share_gpus() else 0


def max_waiting_programs(device=None, reserved: int = 0, what: str = "a waiting kernel",
                         waits_for_copies: bool = False) -> int:
    """The most programs a grid that waits may have, one per SM, when ``reserved`` SMs stay free for
    kernels it waits on in this process (a producer on another stream). When ranks share a GPU, a
    grid that waits on such kernels or on copies (``waits_for_copies``: their copies run on SMs)
    leaves :func:`headroom_sms` more. Raises when nothing is left."""
    sms = sm_count(device)
    if waits_for_copies or reserved:
        reserved += headroom_sms()
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
