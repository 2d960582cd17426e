"""A stream-ordered barrier across the ranks of a node, as a one-program Triton kernel: later work
on the stream starts after every rank's earlier work on its stream has finished.

Each rank sets its signal on every peer to ``*epoch_ptr * PHASES + PHASE`` (release, system
scope) and acquire-waits for every peer's signal to reach that value. Values only grow (the epoch
is a context's device-side call counter, ``PHASE < PHASES``), so the ``WORLD`` signals need no
reset and a CUDA graph that captured the barrier replays it with fresh values. The signals are a
slot of ``WORLD`` uint64s in a context's signal pad, used by nothing else.

Why earlier copy-engine copies are covered: the kernel starts after the copy on its stream has
completed, and its release at system scope is what the peer acquires (the argument of
``ce_push`` in :mod:`triton_dist.kernels.collectives.allgather`).
"""

import triton.language as tl

from ... import language as dl
from ...distributed_jit import jit


@jit
def rank_barrier_kernel(signals, epoch_ptr, PHASE: tl.constexpr, PHASES: tl.constexpr, WORLD: tl.constexpr):
    """One program: the barrier of phase ``PHASE`` (of ``PHASES`` per epoch) on ``WORLD`` signals."""
    me = dl.rank()
    value = tl.load(epoch_ptr) * PHASES + PHASE
    for r in tl.static_range(1, WORLD):
        dl.notify(signals + me, (me + r) % WORLD, value, "set", "intra_node")
    for r in tl.static_range(1, WORLD):
        dl.wait(signals + (me + r) % WORLD, 1, "sys", "acquire", value)
