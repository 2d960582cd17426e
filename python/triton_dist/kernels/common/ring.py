"""The ring AllGather schedule (:func:`ring_all_gather_steps`), shared by the ring AllGather
(:func:`all_gather_ring_kernel`) and the second half of the ring AllReduce, for machines whose
GPUs are not all linked to each other: data moves only from rank ``r`` to rank ``r + 1``,
``WORLD - 1`` steps, one chunk per step.

A *chunk* is one rank's part of the result (a rank's input for AllGather, a reduced shard for
AllReduce's second half). At step ``k`` rank ``me`` holds chunk ``c = (me - k) mod WORLD`` (its
own at step 0, after that the one that arrived at step ``k - 1``) and

1. stores each of its tiles of chunk ``c`` into slot ``c`` of rank ``me + 1``'s receive buffer
   (and, for chunks that arrived, into ``out``), then notifies signal ``(k, p)`` on rank ``me + 1``
   (release, system scope);
2. acquire-waits for signal ``(k, p)`` from rank ``me - 1``: chunk ``(me - k - 1) mod WORLD`` is
   now in its own slot of the local receive buffer.

After the last step the chunk of rank ``me + 1`` has arrived; it is copied into ``out``. Program
``p`` owns tiles ``p, p + G, ...`` of every chunk on every rank (the same grid everywhere), so it
only waits for program ``p`` of rank ``me - 1``. Each rank sends ``WORLD - 1`` chunks over one
link: the bytes of a full-mesh push, but over one neighbour link at a time, and ``WORLD - 1``
dependent steps. On a full mesh (NVSwitch, or two GPUs) push is the better choice; on two GPUs the
two are the same transfer.

Buffer reuse: the receive buffer alternates halves by the epoch's parity, as the callers' other
methods do (:mod:`triton_dist.kernels.common.context`): a rank writes rank ``me + 1``'s half ``e % 2``
again only in call ``e + 2``, after finishing call ``e + 1``, which needed something rank ``me + 1``
sent in call ``e + 1`` (in a ring call, its own chunk, which arrives at the last step; every
other method hears from every rank directly), hence sent after rank ``me + 1`` finished call
``e`` and its reads of half ``e % 2``.
"""

import triton
import triton.language as tl

from ... import language as dl
from ...distributed_jit import jit
from .call_counter import enter_call
from .tiles import load_tile, program_share, store_tile


@triton.jit
def _ring_forward_tile(own, out, mine, theirs, c, chunk_stride, slot_stride, local, valid, token,
                       STEP: tl.constexpr, WORLD: tl.constexpr, OWN_TO_OUT: tl.constexpr, MASKED: tl.constexpr):
    """Step ``STEP``'s work on one tile of chunk ``c``: the chunk in hand goes to the next rank's
    slot ``c`` (steps before the last) and, when it arrived here, into ``out``."""
    if STEP == 0:
        v = load_tile(own + local, local, valid, MASKED)
        if OWN_TO_OUT:
            store_tile(out + c * chunk_stride + local, v, local, valid, MASKED)
    else:
        v = load_tile(dl.consume_token(mine + c * slot_stride + local, token), local, valid, MASKED)
        store_tile(out + c * chunk_stride + local, v, local, valid, MASKED)
    if STEP < WORLD - 1:
        store_tile(theirs + c * slot_stride + local, v, local, valid, MASKED)


@triton.jit
def ring_all_gather_steps(own, out, received, signals, epoch, half, chunk_stride, slot_stride, bound, tiles,
                          WORLD: tl.constexpr, max_programs, BLOCK: tl.constexpr,
                          OWN_TO_OUT: tl.constexpr):
    """The whole ring (module notes) for this program. ``own``: this rank's chunk; chunk ``c`` goes
    to ``out + c * chunk_stride`` (elements ``< bound`` of ``out`` only) and arrives in slot ``c``
    (``received + half + c * slot_stride``, symmetric). ``signals``: ``(WORLD - 1) *
    max_programs`` signals, step-major. ``tiles``: ``BLOCK``-element tiles per chunk.
    ``OWN_TO_OUT``: also copy ``own`` into its place in ``out`` (False when it is already there)."""
    me = dl.rank()
    nxt = (me + 1) % WORLD
    pid, grid, lanes = program_share(BLOCK)
    mine = received + half
    theirs = tl.multiple_of(dl.symm_at(received, nxt), 16) + half  # symm_at loses the alignment fact
    token = tl.zeros((), tl.int32)
    # WORLD iterations: steps 0 .. WORLD - 2 send; the last only copies out what arrived last.
    for k in tl.static_range(WORLD):
        c = ((me + WORLD - k) % WORLD).to(tl.int64)
        valid = tl.minimum(chunk_stride, bound - c * chunk_stride)  # <= 0: an empty chunk
        for t in range(pid, tiles, grid):
            local = t.to(tl.int64) * BLOCK + lanes
            if (t.to(tl.int64) + 1) * BLOCK <= valid:
                _ring_forward_tile(own, out, mine, theirs, c, chunk_stride, slot_stride, local, valid, token, k,
                                   WORLD, OWN_TO_OUT, False)
            else:
                _ring_forward_tile(own, out, mine, theirs, c, chunk_stride, slot_stride, local, valid, token, k,
                                   WORLD, OWN_TO_OUT, True)
        if k < WORLD - 1:
            dl.notify(signals + k * max_programs + pid, nxt, epoch, "set", "intra_node")
            token = dl.wait(signals + k * max_programs + pid, 1, "sys", "acquire", epoch)


@jit(do_not_specialize=["n", "slot_tiles", "max_programs"])
def all_gather_ring_kernel(x, out, gathered, signals, n, calls, slot_tiles, WORLD: tl.constexpr,
                           max_programs, BLOCK: tl.constexpr, ALIGNED: tl.constexpr):
    """``out[r * n:(r + 1) * n] = x of rank r`` around the ring. ``gathered``: symmetric, ``2 *
    WORLD`` slots of ``slot_tiles * BLOCK`` elements of x's dtype (half ``epoch % 2``, slot ``r`` =
    rank ``r``'s data); ``signals``: ``(WORLD - 1) * max_programs`` signals of the context's pad;
    ``calls``: the context's device call counter. ``ALIGNED``: ``n % 8 == 0``."""
    epoch = enter_call(calls)
    if ALIGNED:
        stride = ((n // 8) * 8).to(tl.int64)  # == n; tells the compiler slots of out are aligned
    else:
        stride = n.to(tl.int64)
    slot = slot_tiles.to(tl.int64) * BLOCK
    half = (epoch % 2).to(tl.int64) * WORLD * slot
    ring_all_gather_steps(x, out, gathered, signals, epoch, half, stride, slot, WORLD * stride, tl.cdiv(n, BLOCK),
                          WORLD, max_programs, BLOCK, True)
