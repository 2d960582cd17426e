"""A Triton kernel calling NVSHMEM's device API through extern_libs, end to end on the GPUs."""

import torch
import triton
import triton.language as tl

import triton_dist as tdist
from conftest import all_ranks_agree, rank_generator
from triton_dist.language import shmem


@tdist.jit
def ring_put_signal(dst, src, sig, nbytes, epoch, pe_out, npes_out):
    me = shmem.my_pe()
    peer = (me + 1) % shmem.n_pes()
    # Every thread of the CTA takes part in the block-scope put; the signal follows the data.
    shmem.putmem_signal_block(dst, src, nbytes, sig, epoch, shmem.SIGNAL_SET, peer)
    shmem.signal_wait_until(sig, shmem.CMP_GE, epoch)
    tl.store(pe_out, me)
    tl.store(npes_out, shmem.n_pes())


@tdist.jit
def read_through_nvshmem_ptr(src, out, pe, N: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    remote = shmem.ptr(src, pe)
    tl.store(out + offs, tl.load(remote + offs, mask=offs < N), mask=offs < N)


def test_ring_put_signal_kernel():
    me, world = tdist.rank(), tdist.world_size()
    left = (me - 1) % world
    n = 3 * 1024 * 1024 + 12345  # bytes, not a multiple of any chunk size
    src = tdist.symm_empty((n,), torch.uint8)
    dst = tdist.symm_empty((n,), torch.uint8)
    pad = tdist.SignalPad(1)
    pe_out = torch.empty(1, dtype=torch.int32, device="cuda")
    npes_out = torch.empty(1, dtype=torch.int32, device="cuda")
    torch.cuda.synchronize()
    tdist.barrier()
    ok, why = True, ""
    for it in range(100):
        src.copy_(torch.randint(0, 256, (n,), generator=rank_generator(it, me), device="cuda", dtype=torch.uint8))
        dst.fill_(0xAB)  # poison
        pe_out.fill_(-1)
        torch.cuda.synchronize()
        tdist.barrier()  # peers poisoned dst before anyone puts
        epoch = pad.next_epoch()
        ring_put_signal[(1, )](dst, src, pad.signals, n, epoch, pe_out, npes_out, num_warps=4)
        torch.cuda.synchronize()
        expected = torch.randint(0, 256, (n,), generator=rank_generator(it, left), device="cuda", dtype=torch.uint8)
        if int(pe_out) != me or int(npes_out) != world:
            ok, why = False, f"my_pe={int(pe_out)} n_pes={int(npes_out)}"
        elif not torch.equal(dst, expected):
            ok, why = False, f"iteration {it}: {(dst != expected).sum().item()} bytes wrong"
        if not ok:
            break
        tdist.barrier()
    all_ranks_agree(ok, why)


def test_nvshmem_ptr_reads_the_peer():
    me, world = tdist.rank(), tdist.world_size()
    right = (me + 1) % world
    n = 100_003
    x = tdist.symm_empty((n,), torch.float32)
    x.copy_(torch.randn(n, generator=rank_generator(5, me), device="cuda"))
    out = torch.full((n,), float("nan"), device="cuda")
    torch.cuda.synchronize()
    tdist.barrier()
    read_through_nvshmem_ptr[(triton.cdiv(n, 1024), )](x, out, right, N=n, BLOCK=1024)
    torch.cuda.synchronize()
    expected = torch.randn(n, generator=rank_generator(5, right), device="cuda")
    all_ranks_agree(torch.equal(out, expected), "nvshmem_ptr read the wrong data")
    tdist.barrier()
