"""Tutorial 02: notify / wait ping-pong between pairs of GPUs.

    torchrun --nproc-per-node=2 tutorials/02_notify_wait.py

Ranks pair up (0-1, 2-3, ...; with an odd world the last rank sits out). In each round the even
rank sets its partner's flag to the round's value with ``dl.notify`` (a release atomic over
NVLink) and waits with ``dl.wait`` (an acquire spin) until the partner has set its flag back. One
launch runs every round, so the time per round is the one-signal round trip between two GPUs:
the latency floor of every fine-grained overlapped kernel.

Two rules every multi-GPU Triton program follows, shown here:
- signal values only grow (``base`` + round), so flags never need resetting between launches;
- per-launch values are kept out of Triton's specialisation (``do_not_specialize``), and every
  kernel is loaded before any rank spins (``preload``): loading a module while a kernel spins can
  deadlock (see ``triton_dist.distributed_jit``).
"""

import torch
import triton.language as tl

import triton_dist as tdist
import triton_dist.language as dl


@tdist.jit(do_not_specialize=["rounds", "base"])
def ping_pong(flags, rounds, base):
    me = dl.rank()
    partner = me ^ 1
    if partner < dl.num_ranks():
        for i in range(rounds):
            value = (base + i + 1).to(tl.uint64)
            if me % 2 == 0:
                dl.notify(flags, partner, value, "set", "intra_node")
                dl.wait(flags, 1, "sys", "acquire", value)
            else:
                dl.wait(flags, 1, "sys", "acquire", value)
                dl.notify(flags, partner, value, "set", "intra_node")


def run(rounds: int = 10_000) -> tuple[bool, float]:
    """Run ``rounds`` round trips in one launch; returns (flag ended where expected, us per round)."""
    pad = tdist.SignalPad(1)
    ping_pong.preload(pad.signals, rounds, 0, grid=(1, ))
    torch.cuda.synchronize()
    tdist.barrier()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    ping_pong[(1, )](pad.signals, rounds, 0)
    stop.record()
    torch.cuda.synchronize()
    paired = (tdist.rank() ^ 1) < tdist.world_size()
    final = int(pad.signals.view(torch.int64)[0])
    ok = final == (rounds if paired else 0)
    tdist.barrier()
    return ok, start.elapsed_time(stop) * 1000 / rounds


def main():
    tdist.init()
    ok, us = run()
    print(f"rank {tdist.rank()}: {'ok' if ok else 'WRONG FLAG'}, one-signal round trip {us:.2f} us")
    tdist.finalize()
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
