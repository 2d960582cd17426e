"""Tutorial 03: ring AllReduce from tiles, signals and peer stores (the seeds' example, made exact).

    torchrun --nproc-per-node=2 tutorials/03_ring_allreduce.py

The tensor is cut into ``world`` chunks and every chunk into tiles. Each program owns a set of
tile columns and walks them through the ring on its own, with no grid-wide barrier:

- reduce-scatter, ``world - 1`` steps: send the running partial sum of one chunk to the next rank
  (stores through ``dl.symm_at`` into its inbox, then ``dl.notify``), wait for the previous
  rank's partial of the next chunk (``dl.wait`` + ``dl.consume_token``) and add the local part.
  After the last step this rank holds the full sum of chunk ``rank + 1``.
- all-gather, ``world - 1`` steps: pass finished chunks along the ring the same way.

Each step has its own inbox slot and signal, and slots alternate between two halves by epoch
parity: a rank can run at most one call ahead of its successor (a call cannot finish before every
rank has joined it), so the half it writes is never the one its successor still reads.
Partial sums travel in fp32, whatever the input dtype.
"""

import torch
import triton
import triton.language as tl

import triton_dist as tdist
import triton_dist.language as dl


@tdist.jit(do_not_specialize=["n", "epoch"])
def ring_all_reduce_kernel(x, inbox, signals, n, epoch, chunk, WORLD: tl.constexpr, BLOCK: tl.constexpr,
                           TILES: tl.constexpr):
    me = dl.rank()
    nxt = (me + 1) % WORLD
    half = (epoch % 2) * (2 * (WORLD - 1))  # first inbox slot of this call's half
    lanes = tl.arange(0, BLOCK)
    for tile in range(tl.program_id(0), TILES, tl.num_programs(0)):
        offs = tile * BLOCK + lanes

        # Reduce-scatter: start with our own chunk `me`.
        c = me
        idx = c * chunk + offs
        acc = tl.load(x + idx, mask=(offs < chunk) & (idx < n), other=0.0).to(tl.float32)
        for step in range(WORLD - 1):
            slot = half + step
            tl.store(dl.symm_at(inbox, nxt) + slot * chunk + offs, acc, mask=offs < chunk)
            dl.notify(signals + slot * TILES + tile, nxt, epoch, "set", "intra_node")
            c = (c + WORLD - 1) % WORLD  # the chunk the previous rank sends at this step
            token = dl.wait(signals + slot * TILES + tile, 1, "sys", "acquire", epoch)
            incoming = tl.load(dl.consume_token(inbox + slot * chunk + offs, token), mask=offs < chunk)
            idx = c * chunk + offs
            acc = incoming + tl.load(x + idx, mask=(offs < chunk) & (idx < n), other=0.0).to(tl.float32)
        # acc is now the full sum of chunk c == (me + 1) % WORLD.
        tl.store(x + c * chunk + offs, acc.to(x.dtype.element_ty), mask=(offs < chunk) & (c * chunk + offs < n))

        # All-gather: forward finished chunks.
        for step in range(WORLD - 1):
            slot = half + WORLD - 1 + step
            tl.store(dl.symm_at(inbox, nxt) + slot * chunk + offs, acc, mask=offs < chunk)
            dl.notify(signals + slot * TILES + tile, nxt, epoch, "set", "intra_node")
            c = (c + WORLD - 1) % WORLD
            token = dl.wait(signals + slot * TILES + tile, 1, "sys", "acquire", epoch)
            acc = tl.load(dl.consume_token(inbox + slot * chunk + offs, token), mask=offs < chunk)
            idx = c * chunk + offs
            tl.store(x + idx, acc.to(x.dtype.element_ty), mask=(offs < chunk) & (idx < n))


class RingAllReduce:
    """In-place ring AllReduce (sum) of 1-D CUDA tensors of up to ``max_numel`` elements.

    Collective to create (it allocates symmetric memory) and to call. Reused across calls: each
    call takes the next epoch of its signal pad.
    """

    BLOCK = 1024

    def __init__(self, max_numel: int, num_programs: int = 32):
        self.world = tdist.world_size()
        self.chunk = triton.cdiv(triton.cdiv(max_numel, self.world), self.BLOCK) * self.BLOCK
        self.tiles = self.chunk // self.BLOCK
        # Programs wait for their peers' programs, so all of them must be resident at once: never
        # more than the SMs this process may use (fewer under an MPS share; triton_dist.residency).
        self.num_programs = min(num_programs, self.tiles, tdist.residency.max_waiting_programs())
        slots = 2 * 2 * max(self.world - 1, 1)
        self.inbox = tdist.symm_zeros((slots * self.chunk, ), torch.float32)
        self.pad = tdist.SignalPad(slots * self.tiles)
        self.max_numel = max_numel

    def _args(self, x, epoch):
        return (x, self.inbox, self.pad.signals, x.numel(), epoch, self.chunk)

    def _meta(self):
        return dict(WORLD=self.world, BLOCK=self.BLOCK, TILES=self.tiles)

    def preload(self, x: torch.Tensor) -> None:
        """Compile and load the kernel for ``x``'s dtype before any rank can spin."""
        ring_all_reduce_kernel.preload(*self._args(x, 1), grid=(self.num_programs, ), **self._meta())

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if not (x.is_cuda and x.is_contiguous() and x.dim() == 1):
            raise ValueError("RingAllReduce: expected a contiguous 1-D CUDA tensor")
        if x.numel() > self.max_numel:
            raise ValueError(f"RingAllReduce: {x.numel()} elements exceed max_numel={self.max_numel}")
        if self.world == 1:
            return x
        ring_all_reduce_kernel[(self.num_programs, )](*self._args(x, self.pad.next_epoch()), **self._meta())
        return x


def check(numel: int = 1_000_003, rounds: int = 20, dtype=torch.float32) -> bool:
    """Compare with the sum over ranks (through host memory: :mod:`triton_dist.host_collectives`) on
    fresh random data, ``rounds`` calls."""
    from triton_dist import host_collectives

    op = RingAllReduce(numel)
    x = torch.randn(numel, device="cuda", dtype=dtype)
    op.preload(x)
    torch.cuda.synchronize()
    tdist.barrier()
    ok = True
    for _ in range(rounds):
        x = torch.randn(numel, device="cuda", dtype=dtype)
        expected = host_collectives.all_reduce(x)
        torch.cuda.synchronize()
        op(x)
        torch.cuda.synchronize()
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        ok = ok and torch.allclose(x.float(), expected.float(), rtol=tol, atol=tol * tdist.world_size())
    tdist.barrier()
    return ok


def main():
    tdist.init()
    ok = check()
    print(f"rank {tdist.rank()}: ring AllReduce {'matches' if ok else 'DIFFERS FROM'} the sum over ranks")
    tdist.finalize()
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
