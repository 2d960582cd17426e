"""Tutorial 06: a copy-engine pipeline, recorded once with StreamSchedule.

    torchrun --nproc-per-node=2 tutorials/06_copy_engine_pipeline.py

Each rank sends a vector to its right neighbour in chunks with the copy engine (no SM runs the
copy) and publishes each chunk with a flag. The neighbour's Triton kernel has one program per
chunk, and each program starts as soon as its own chunk has landed (``dl.wait`` +
``dl.consume_token``). It then adds the chunk to local data and resets the flag.

The sender's stream work has the same addresses and values on every call: per chunk, a copy, then
a 64-bit write of 1 into the peer's flag, which the stream's system-scope barrier orders after the
copy. So it is recorded once in a :class:`triton_dist.StreamSchedule` and enqueued each call with
a single host call. This is the pattern of ``gemm_rs``'s ``"fused_ce"``. Because the values never
change, the same schedule also replays inside a CUDA graph (:func:`check` does both).

Two simplifications a real op would not make. The receiver resets its flags and the sender
rewrites them on the next call, so calls are separated by a host barrier here; ``"fused_ce"``
uses an acknowledgement flag instead. And the copies are queued before the kernel, which is
always safe; ``"fused_ce"`` queues them after the kernel, so that their host time overlaps it
(``Config.serialised_launches``).
"""

import torch
import triton
import triton.language as tl

import triton_dist as tdist
import triton_dist.language as dl


@tdist.jit(do_not_specialize=["n"])
def add_when_landed(out, received, local, flags, n, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    chunk = tl.program_id(0)
    # The flag is written by the peer's copy stream (cuStreamWriteValue64 after its copy): system scope.
    token = dl.wait(flags + chunk, 1, "sys", "acquire", 1)
    src = dl.consume_token(received, token)
    for start in range(0, CHUNK, BLOCK):
        offs = chunk * CHUNK + start + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(out + offs, tl.load(src + offs, mask=mask) + tl.load(local + offs, mask=mask), mask=mask)
    # Every thread has seen the flag (each spins in dl.wait) before one resets it.
    tl.debug_barrier()
    tl.store(flags + chunk, 0)


class ChunkedSend:
    """``out = (left neighbour's x) + local``: ``x`` goes to the right neighbour in ``chunks``
    copy-engine chunks. Collective to create (symmetric memory) and to call."""

    BLOCK = 1024

    def __init__(self, numel: int, chunks: int = 8):
        world, me = tdist.world_size(), tdist.rank()
        right = (me + 1) % world
        self.numel, self.chunks = numel, chunks
        self.chunk = triton.cdiv(triton.cdiv(numel, chunks), self.BLOCK) * self.BLOCK
        self.received = tdist.symm_empty((numel, ), torch.float32)
        self.pad = tdist.SignalPad(chunks)
        self.outgoing = torch.empty(numel, device="cuda")  # the schedule records its address
        peer_received, peer_flags = tdist.peer_tensor(self.received, right), tdist.peer_tensor(self.pad.signals, right)
        self.schedule = tdist.StreamSchedule()
        for c in range(chunks):
            lo, hi = min(c * self.chunk, numel), min((c + 1) * self.chunk, numel)
            if hi > lo:
                self.schedule.copy(peer_received[lo:hi], self.outgoing[lo:hi])
            self.schedule.write(peer_flags, c, 1)
        self.copy_stream = torch.cuda.Stream()
        self._queued = torch.cuda.Event()
        # Load the kernel before any rank can spin in it (triton_dist.distributed_jit explains).
        add_when_landed.preload(self.received, self.received, self.received, self.pad.signals, numel,
                                grid=(chunks, ), CHUNK=self.chunk, BLOCK=self.BLOCK)
        torch.cuda.synchronize()
        tdist.barrier()

    def __call__(self, x, local, out):
        stream = torch.cuda.current_stream()
        self.outgoing.copy_(x)  # a real producer would write here directly
        self._queued.record(stream)
        self.copy_stream.wait_event(self._queued)
        self.schedule.enqueue(self.copy_stream)
        add_when_landed[(self.chunks, )](out, self.received, local, self.pad.signals, self.numel, CHUNK=self.chunk,
                                         BLOCK=self.BLOCK)
        stream.wait_stream(self.copy_stream)
        return out


def check(numel: int = 1_000_003, rounds: int = 40) -> bool:
    """Eager calls, then CUDA graph replays of one call, on fresh data each round; True when every
    element of every round matched on this rank and every flag ended at 0."""
    world, me = tdist.world_size(), tdist.rank()
    left = (me - 1) % world
    send = ChunkedSend(numel)
    x, local = torch.empty(numel, device="cuda"), torch.empty(numel, device="cuda")
    out = torch.empty(numel, device="cuda")
    graph, ok = None, True
    for r in range(2 * rounds):
        if r == rounds:  # capture one call; replays read x and local in place
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                send(x, local, out)
        torch.manual_seed(1000 * r + me)
        x.copy_(torch.randn(numel, device="cuda"))
        local.copy_(torch.randn(numel, device="cuda"))
        torch.manual_seed(1000 * r + left)
        expected = torch.randn(numel, device="cuda") + local
        out.fill_(float("nan"))
        torch.cuda.synchronize()
        tdist.barrier()  # the neighbour has consumed the last call and reset its flags
        if graph is None:
            send(x, local, out)
        else:
            graph.replay()
        torch.cuda.synchronize()
        ok = ok and torch.equal(out, expected)
    tdist.barrier()
    return ok and int(send.pad.signals.to(torch.int64).abs().sum()) == 0


def main():
    tdist.init()
    print(f"rank {tdist.rank()}: copy-engine pipeline {'ok' if check() else 'WRONG DATA'}")
    tdist.finalize()


if __name__ == "__main__":
    main()
