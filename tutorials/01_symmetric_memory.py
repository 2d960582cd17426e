"""Tutorial 01: symmetric tensors, peer views, and an NVSHMEM put from a Triton kernel.

    torchrun --nproc-per-node=2 tutorials/01_symmetric_memory.py

Every rank allocates the same tensors (symmetric allocation is collective), writes its right
neighbour's copy directly through a peer view, then does the same from inside a Triton kernel
with NVSHMEM's put-with-signal. Last, it times a large write into the neighbour's memory, the
floor every overlapped kernel builds on.
"""

import torch

import triton_dist as tdist
from triton_dist.language import shmem


@tdist.jit
def put_to_right_neighbour(dst, src, signals, nbytes, epoch):
    right = (shmem.my_pe() + 1) % shmem.n_pes()
    # All threads of the CTA share the block-scope put; the signal lands after the data.
    shmem.putmem_signal_block(dst, src, nbytes, signals, epoch, shmem.SIGNAL_SET, right)
    # Wait for our left neighbour's put into our `dst`.
    shmem.signal_wait_until(signals, shmem.CMP_GE, epoch)


def main():
    tdist.init()
    me, world = tdist.rank(), tdist.world_size()
    right, left = (me + 1) % world, (me - 1) % world

    # 1. Stores through a peer view.
    x = tdist.symm_zeros((1024, 1024), torch.float32)
    torch.cuda.synchronize()
    tdist.barrier()  # everyone zeroed before anyone writes
    tdist.peer_tensor(x, right).fill_(me)
    torch.cuda.synchronize()
    tdist.barrier()  # every write landed
    assert torch.all(x == left), "peer view write did not arrive"

    # 2. The same, from a Triton kernel calling NVSHMEM's device API.
    nbytes = 8 << 20
    src = tdist.symm_empty((nbytes,), torch.uint8)
    dst = tdist.symm_empty((nbytes,), torch.uint8)
    src.fill_(me)
    pad = tdist.SignalPad(1)
    torch.cuda.synchronize()
    tdist.barrier()
    put_to_right_neighbour[(1, )](dst, src, pad.signals, nbytes, pad.next_epoch())
    torch.cuda.synchronize()
    assert torch.all(dst == left), "NVSHMEM put did not arrive"

    # 3. How fast does a plain SM copy write into the neighbour's memory?
    big = tdist.symm_empty((256 << 20,), torch.uint8)
    payload = torch.randint(0, 255, big.shape, dtype=torch.uint8, device="cuda")
    peer_big = tdist.peer_tensor(big, right)
    for _ in range(3):
        peer_big.copy_(payload)
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(20):
        start.record()
        peer_big.copy_(payload)
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    median_ms = sorted(times)[len(times) // 2]
    tdist.barrier()
    print(f"rank {me}/{world}: peer view and NVSHMEM put OK; SM copy into rank {right}: "
          f"{big.numel() / median_ms / 1e6:.0f} GB/s (median of 20, 256 MiB)", flush=True)
    tdist.finalize()


if __name__ == "__main__":
    main()
