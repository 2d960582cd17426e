"""Tutorial 04: put and get, through ``dl.symm_at`` and through the OpenSHMEM device API.

    torchrun --nproc-per-node=2 tutorials/04_put_get.py

Three ways to move a buffer to or from the right neighbour, each checked against what that
neighbour holds:

1. put through ``symm_at``: plain vector stores into the neighbour's memory over NVLink, then
   ``dl.notify``; the neighbour ``dl.wait``s and reads. Works between GPUs of one node.
2. put through NVSHMEM: ``putmem_signal_nbi_block`` moves the bytes and sets the signal after
   them (any rank NVSHMEM reaches, other nodes included); the neighbour waits on the signal.
3. get through NVSHMEM: ``getmem_block`` reads the left neighbour's buffer once it has signalled
   that the buffer is ready (``dl.notify`` with ``comm_scope="inter_node"``, i.e. NVSHMEM).

Which threads call what: ``*_block`` functions are called by every thread of the program with
the same arguments; ``dl.notify`` by every thread (one performs the update); thread-scope
NVSHMEM calls (``putmem``, ``signal_op``) by one thread, e.g. under ``if dl.tid(0) == 0``.
"""

import torch
import triton
import triton.language as tl

import triton_dist as tdist
import triton_dist.language as dl
from triton_dist.language import shmem


@tdist.jit(do_not_specialize=["n", "epoch"])
def put_with_stores(dst, src, signals, n, epoch, BLOCK: tl.constexpr):
    right = (dl.rank() + 1) % dl.num_ranks()
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    tl.store(dl.symm_at(dst, right) + offs, tl.load(src + offs, mask=offs < n), mask=offs < n)
    dl.notify(signals + pid, right, epoch, "set", "intra_node")


@tdist.jit(do_not_specialize=["n", "epoch"])
def put_with_nvshmem(dst, src, signals, n, epoch, BLOCK: tl.constexpr):
    right = (dl.rank() + 1) % dl.num_ranks()
    pid = tl.program_id(0)
    count = tl.minimum(n - pid * BLOCK, BLOCK)
    shmem.putmem_signal_nbi_block(dst + pid * BLOCK, src + pid * BLOCK, count * 4, signals + pid, epoch,
                                  shmem.SIGNAL_SET, right)


@tdist.jit(do_not_specialize=["n", "epoch"])
def copy_when_signalled(out, inbox, signals, n, epoch, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    token = dl.wait(signals + pid, 1, "sys", "acquire", epoch)
    tl.store(out + offs, tl.load(dl.consume_token(inbox + offs, token), mask=offs < n), mask=offs < n)


@tdist.jit(do_not_specialize=["epoch"])
def announce_ready(signals, epoch):
    right = (dl.rank() + 1) % dl.num_ranks()
    dl.notify(signals, right, epoch, "set", "inter_node")


@tdist.jit(do_not_specialize=["n", "epoch"])
def get_with_nvshmem(out, src, signals, n, epoch, BLOCK: tl.constexpr):
    left = (dl.rank() + dl.num_ranks() - 1) % dl.num_ranks()
    pid = tl.program_id(0)
    dl.wait(signals, 1, "sys", "acquire", epoch)  # the left neighbour's src is ready
    count = tl.minimum(n - pid * BLOCK, BLOCK)
    shmem.getmem_block(out + pid * BLOCK, src + pid * BLOCK, count * 4, left)


def check(n: int = 3_000_017, rounds: int = 20) -> dict[str, bool]:
    """Run the three transfers ``rounds`` times on fresh random data; which of them delivered
    exactly the neighbour's values every time."""
    me, world = tdist.rank(), tdist.world_size()
    block = 4096
    grid = (triton.cdiv(n, block), )
    src = tdist.symm_empty((n, ), torch.float32)
    dst = tdist.symm_empty((n, ), torch.float32)
    out = torch.empty(n, device="cuda")
    pad = tdist.SignalPad(grid[0])
    ready = tdist.SignalPad(1)
    # Load every kernel before any of them spins (epoch 0 signals are already satisfied).
    for kernel, args in ((put_with_stores, (dst, src, pad.signals, n, 0)),
                         (put_with_nvshmem, (dst, src, pad.signals, n, 0)),
                         (copy_when_signalled, (out, dst, pad.signals, n, 0)),
                         (get_with_nvshmem, (out, src, ready.signals, n, 0))):
        kernel.preload(*args, grid=grid, BLOCK=block)
    announce_ready.preload(ready.signals, 0, grid=(1, ))
    ok = {"put via symm_at": True, "put via nvshmem": True, "get via nvshmem": True}
    left = (me - 1) % world
    for r in range(rounds):
        for name in ok:
            # The neighbours have finished the last transfer: a get still reading this rank's src
            # (or a put still landing in dst) must not see the next round's values.
            torch.cuda.synchronize()
            tdist.barrier()
            torch.manual_seed(1000 * r + me)
            src.copy_(torch.randn(n, device="cuda"))
            torch.manual_seed(1000 * r + left)
            expected = torch.randn(n, device="cuda")
            out.fill_(float("nan"))
            torch.cuda.synchronize()
            tdist.barrier()  # every rank's src and out are ready before anyone transfers
            if name == "get via nvshmem":
                epoch = ready.next_epoch()
                announce_ready[(1, )](ready.signals, epoch)
                get_with_nvshmem[grid](out, src, ready.signals, n, epoch, BLOCK=block)
            else:
                epoch = pad.next_epoch()
                put = put_with_stores if name == "put via symm_at" else put_with_nvshmem
                put[grid](dst, src, pad.signals, n, epoch, BLOCK=block)
                copy_when_signalled[grid](out, dst, pad.signals, n, epoch, BLOCK=block)
            torch.cuda.synchronize()
            ok[name] = ok[name] and torch.equal(out, expected)
    tdist.barrier()
    return ok


def main():
    tdist.init()
    for name, good in check().items():
        print(f"rank {tdist.rank()}: {name}: {'ok' if good else 'WRONG DATA'}")
    tdist.finalize()


if __name__ == "__main__":
    main()
