"""The co-residency rule on the GPU (triton_dist.residency): every context's waiting grids fit the
SMs this rank may use, which an MPS share lowers, and every kernel the contexts compiled fits at
least one program per SM, so that a grid of one program per SM is resident at once."""

import os

import torch
import torch.distributed as dist

import triton_dist as tdist
from conftest import all_ranks_agree
from triton_dist import kernels, residency
from triton_dist.distributed_jit import DistributedKernel
from triton_dist.kernels import (AllGatherContext, AllGatherGemmContext, AllReduceContext, GemmAllReduceContext,
                                 GemmReduceScatterContext, ReduceScatterContext)


def test_the_sm_count_is_the_device_attribute_and_follows_the_share():
    sms = residency.sm_count()
    ok = sms == torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    counts = [None] * dist.get_world_size()
    dist.all_gather_object(counts, sms)
    if tdist.rank() == 0:
        partition = os.environ.get("CUDA_MPS_SM_PARTITION")
        share = (f"static SM partition {partition}" if partition else
                 f"MPS share {os.environ.get('CUDA_MPS_ACTIVE_THREAD_PERCENTAGE', '100')} %")
        print(f"\nSMs per rank at {tdist.ranks_per_gpu()} rank(s) per GPU, {share}: {counts}")
    if tdist.ranks_per_gpu() > 1:
        # The share caps what each client sees: a rank that saw the whole GPU would size its grids
        # for SMs the other ranks on the GPU hold.
        ok = ok and sms * tdist.ranks_per_gpu() <= 144  # an H100/H200 has 132 (144 on the full die)
    all_ranks_agree(ok, f"SM count {sms} at {tdist.ranks_per_gpu()} rank(s) per GPU")


def _compiled_kernels():
    """Every compiled variant of the library's kernels in this process (name, CompiledKernel)."""
    seen = []
    for name in dir(kernels):
        kernel = getattr(kernels, name)
        fn = kernel.fn if isinstance(kernel, DistributedKernel) else kernel
        for cache in getattr(fn, "device_caches", {}).values():
            seen += [(name, compiled) for compiled in cache[0].values()]
    return seen


def test_every_context_sizes_its_waiting_grids_from_the_sms():
    sms = residency.sm_count()
    limits = {}
    for ctx in (AllReduceContext(1 << 20, torch.bfloat16, max_programs=100_000),
                AllGatherContext(1 << 20, torch.bfloat16, max_programs=100_000),
                ReduceScatterContext(1 << 20, torch.bfloat16, max_programs=100_000)):
        limits[type(ctx).__name__] = ctx.max_programs <= sms
    ag = AllGatherGemmContext(256, 512, torch.bfloat16)
    limits["AllGatherGemmContext"] = ag.num_sms == sms and ag.max_programs < sms
    rs = GemmReduceScatterContext(256 * tdist.world_size(), 512, torch.bfloat16)
    limits["GemmReduceScatterContext"] = rs.num_sms == sms and rs.max_programs + rs.reduce_sms <= sms
    limits["GemmAllReduceContext"] = GemmAllReduceContext(64, 512, torch.bfloat16).num_sms == sms
    torch.cuda.synchronize()
    tdist.barrier()
    bad = [name for name, ok in limits.items() if not ok]
    all_ranks_agree(not bad, f"contexts whose grids may outnumber the {sms} SMs: {bad}")
    # The contexts compiled and loaded their kernels: each must fit at least one program per SM.
    compiled = _compiled_kernels()
    misfits = [(name, c.n_regs, c.metadata.shared) for name, c in compiled
               if residency.compiled_programs_per_sm(c) < 1]
    # One rank compiles nothing ahead: nothing can spin, so its kernels compile on first call.
    loaded = bool(compiled) or tdist.world_size() == 1
    all_ranks_agree(loaded and not misfits, f"{len(compiled)} compiled kernels; misfits (regs, shared): {misfits}")


def test_side_streams_run_at_the_highest_priority():
    """The streams of the work that spinning grids wait for (producers, signal kernels) start their
    blocks before a consumer's that became ready at the same time (kernels/common/streams.py)."""
    highest = torch.cuda.Stream(priority=-(1 << 20)).priority  # torch maps it to the device's highest
    ag = AllGatherGemmContext(256, 512, torch.bfloat16)
    rs = GemmReduceScatterContext(256 * tdist.world_size(), 512, torch.bfloat16)
    gather = AllGatherContext(1 << 16, torch.bfloat16)
    reduce = AllReduceContext(1 << 16, torch.bfloat16)
    streams = {"ag_gemm": ag._side, "gemm_rs": rs._side, "all_gather": gather._side,
               "all_gather send": gather._send, "all_gather notify": gather._notify, "all_reduce push": reduce._push,
               "all_reduce pull": reduce._pull}
    low = {name: s.priority for name, s in streams.items() if s.priority != highest}
    torch.cuda.synchronize()
    tdist.barrier()
    all_ranks_agree(highest < 0 and not low, f"side streams below the highest priority {highest}: {low}")
