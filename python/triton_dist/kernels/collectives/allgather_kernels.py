"""The AllGather's device kernels, one or a few per method of
:class:`~triton_dist.kernels.collectives.allgather.AllGatherContext`, whose module notes give the protocols
(signals, epochs, halves) these kernels carry out; the host side and the signal layout live there."""

from __future__ import annotations

import triton
import triton.language as tl

from ... import language as dl
from ...distributed_jit import jit
from ...language.signals import _settings
from ..common.call_counter import enter_call
from ..common.ll_protocol import ll_call, ll_own_copy, ll_receive, ll_store, ll_words
from ..common.tiles import each_tile, load_tile, program_share, store_tile


# --------------------------------------------------------------------------------------------
# sm_push


@triton.jit
def _push_tile(args, offs, n, WORLD: tl.constexpr, MASKED: tl.constexpr):
    x, out, gathered, half, stride, me, slot = args
    v = load_tile(x + offs, offs, n, MASKED)
    store_tile(out + me.to(tl.int64) * stride + offs, v, offs, n, MASKED)
    for r in tl.static_range(WORLD):
        dst = tl.multiple_of(dl.symm_at(gathered, (me + r) % WORLD), 16)  # symm_at loses the alignment fact
        store_tile(dst + half + me.to(tl.int64) * slot + offs, v, offs, n, MASKED)


@jit(do_not_specialize=["n", "slot_tiles", "max_programs"])
def all_gather_push_kernel(x, out, gathered, signals, n, calls, slot_tiles, WORLD: tl.constexpr,
                           max_programs, BLOCK: tl.constexpr, ALIGNED: tl.constexpr):
    """``out[r * n:(r + 1) * n] = x of rank r`` for every rank. ``gathered``: symmetric, ``2 *
    WORLD`` slots of ``slot_tiles * BLOCK`` elements of x's dtype (half ``epoch % 2``, slot ``r`` =
    rank ``r``'s data; sizes are arguments, so contexts of every size share one compiled kernel);
    ``signals``: the context's pad (region 0: ``WORLD * max_programs``); ``calls``: the
    context's device call counter. ``ALIGNED``: ``n % ALIGN_ELEMENTS == 0``."""
    epoch = enter_call(calls)
    me = dl.rank()
    pid, grid, lanes = program_share(BLOCK)
    slot_numel = slot_tiles.to(tl.int64) * BLOCK
    half = (epoch % 2).to(tl.int64) * WORLD * slot_numel
    tiles = tl.cdiv(n, BLOCK)
    if ALIGNED:
        stride = ((n // 8) * 8).to(tl.int64)  # == n; tells the compiler slots of out are aligned
    else:
        stride = n.to(tl.int64)

    # 1. Push: each tile of x, loaded once, goes to slot `me` of every rank and to out's own slot.
    each_tile(_push_tile, (x, out, gathered, half, stride, me, slot_numel), pid, tiles, grid, n, WORLD, BLOCK)
    for r in tl.static_range(1, WORLD):
        dl.notify(signals + me * max_programs + pid, (me + r) % WORLD, epoch, "set", "intra_node")

    # 2. Copy out every peer's tiles of this program once that peer's program p has signalled.
    for k in tl.static_range(1, WORLD):
        src = (me + k) % WORLD
        token = dl.wait(signals + src * max_programs + pid, 1, "sys", "acquire", epoch)
        slot = dl.consume_token(gathered + half + src.to(tl.int64) * slot_numel, token)
        dst = out + src.to(tl.int64) * stride
        for t in range(pid, tiles, grid):
            offs = t.to(tl.int64) * BLOCK + lanes
            if (t.to(tl.int64) + 1) * BLOCK <= n:
                store_tile(dst + offs, load_tile(slot + offs, offs, n, False), offs, n, False)
            else:
                store_tile(dst + offs, load_tile(slot + offs, offs, n, True), offs, n, True)


# --------------------------------------------------------------------------------------------
# ce_push: the signalling kernels between the copy-engine copies


@jit(do_not_specialize=["ready", "ack"])
def all_gather_ce_signal_kernel(signals, k_ptr, PHASE: tl.constexpr, WORLD: tl.constexpr, ready,
                                ack):
    """One program. ``k_ptr``: the calling method's device call counter (this call's ``k``).
    ``PHASE`` 0: wait for ``ack[r] >= k - 1`` from every peer (it finished reading this rank's
    previous data); 1: notify ``ready[me] = k`` on every peer, then wait for ``ready[r] >= k`` from
    every peer; 2: notify ``ack[me] = k`` on every peer. ``ready``/``ack``: pad offsets."""
    k = tl.load(k_ptr)
    me = dl.rank()
    if PHASE == 0:
        for r in tl.static_range(1, WORLD):
            dl.wait(signals + ack + (me + r) % WORLD, 1, "sys", "acquire", k - 1)
    elif PHASE == 1:
        for r in tl.static_range(1, WORLD):
            dl.notify(signals + ready + me, (me + r) % WORLD, k, "set", "intra_node")
        for r in tl.static_range(1, WORLD):
            dl.wait(signals + ready + (me + r) % WORLD, 1, "sys", "acquire", k)
    else:
        for r in tl.static_range(1, WORLD):
            dl.notify(signals + ack + me, (me + r) % WORLD, k, "set", "intra_node")


# --------------------------------------------------------------------------------------------
# ce_chunked: per-chunk signals and the overlapped copy-out


@jit(do_not_specialize=["c", "chunk_ready"])
def all_gather_ce_chunk_signal_kernel(signals, k_ptr, c, WORLD: tl.constexpr, chunk_ready,
                                      MAX_CHUNKS: tl.constexpr):
    """One program, launched (on the notify stream) once chunk ``c`` of this rank's copies into
    every peer's ``ce`` buffer has completed: release-notify ``chunk_ready[me][c] = k`` on every
    peer. ``k_ptr``: the context's ``ce_calls`` (this call's ``k``); ``signals``: ``pad_ext``."""
    k = tl.load(k_ptr)
    me = dl.rank()
    for r in tl.static_range(1, WORLD):
        dl.notify(signals + chunk_ready + me * MAX_CHUNKS + c, (me + r) % WORLD, k, "set", "intra_node")


@jit(do_not_specialize=["n", "chunk", "slot_tiles", "chunk_ready"])
def all_gather_ce_copy_out_kernel(out, ce, signals, n, chunk, k_ptr, slot_tiles, WORLD: tl.constexpr,
                                  chunk_ready, MAX_CHUNKS: tl.constexpr, BLOCK: tl.constexpr,
                                  ALIGNED: tl.constexpr):
    """``out[r * n + i] = ce[r * slot + i]`` (``slot = slot_tiles * BLOCK``) for every peer ``r``,
    chunk by chunk (``chunk`` elements, a multiple of ``BLOCK``), each chunk as soon as
    ``chunk_ready[r][c] >= k``: runs while the later chunks are still on the link. ``k_ptr``:
    ``ce_calls``; ``signals``: ``pad_ext``. Program ``p`` copies tiles ``first + p, first + p + G,
    ...`` of each chunk."""
    k = tl.load(k_ptr)
    me = dl.rank()
    pid, grid, lanes = program_share(BLOCK)
    tiles = tl.cdiv(n, BLOCK)
    chunk_tiles = chunk // BLOCK
    chunks = tl.cdiv(tiles, chunk_tiles)
    if ALIGNED:
        stride = ((n // 8) * 8).to(tl.int64)  # == n; tells the compiler slots of out are aligned
    else:
        stride = n.to(tl.int64)
    for c in range(chunks):
        first = c * chunk_tiles
        last = tl.minimum(first + chunk_tiles, tiles)
        for j in tl.static_range(1, WORLD):
            src = (me + j) % WORLD
            token = dl.wait(signals + chunk_ready + src * MAX_CHUNKS + c, 1, "sys", "acquire", k)
            slot = dl.consume_token(ce + src.to(tl.int64) * slot_tiles.to(tl.int64) * BLOCK, token)
            dst = out + src.to(tl.int64) * stride
            for t in range(first + pid, last, grid):
                offs = t.to(tl.int64) * BLOCK + lanes
                if (t.to(tl.int64) + 1) * BLOCK <= n:
                    store_tile(dst + offs, load_tile(slot + offs, offs, n, False), offs, n, False)
                else:
                    store_tile(dst + offs, load_tile(slot + offs, offs, n, True), offs, n, True)


# --------------------------------------------------------------------------------------------
# sm_zero_copy: stores straight into every rank's (symmetric) out


@triton.jit
def _zero_copy_tile(args, offs, n, WORLD: tl.constexpr, MASKED: tl.constexpr):
    x, out, stride, me = args
    v = load_tile(x + offs, offs, n, MASKED)
    for r in tl.static_range(WORLD):
        dst = tl.multiple_of(dl.symm_at(out, (me + r) % WORLD), 16)  # symm_at loses the alignment fact
        store_tile(dst + me.to(tl.int64) * stride + offs, v, offs, n, MASKED)


@jit(do_not_specialize=["n", "max_programs", "ready", "done"])
def all_gather_zero_copy_kernel(x, out, signals, n, epoch_ptr, WORLD: tl.constexpr, max_programs,
                                BLOCK: tl.constexpr, ALIGNED: tl.constexpr, ready,
                                done):
    """``out[me * n:(me + 1) * n] = x`` on every rank, ``out`` symmetric (same offset on every
    rank). ``signals``: ``pad_ext`` (``ready``/``done``: regions of ``WORLD * max_programs``);
    ``epoch_ptr``: the context's ``zc_calls``. Program ``p``: (1) notify ``ready(me, p)`` on every
    peer, wait ``ready(r, p)`` from every peer (peer ``r``'s program ``p`` is running, so ``r``'s
    earlier work on its ``out`` is finished); (2) push its tiles; (3) notify ``done(me, p)``, wait
    ``done(r, p)`` (peer ``r``'s program ``p``'s tiles, the same tile indices, are in my ``out``)."""
    epoch = tl.load(epoch_ptr)
    me = dl.rank()
    pid, grid, _ = program_share(BLOCK)
    tiles = tl.cdiv(n, BLOCK)
    if ALIGNED:
        stride = ((n // 8) * 8).to(tl.int64)
    else:
        stride = n.to(tl.int64)

    # 1. Handshake: my program p has started (my out is ours now); peers' programs p likewise.
    for r in tl.static_range(1, WORLD):
        dl.notify(signals + ready + me * max_programs + pid, (me + r) % WORLD, epoch, "set", "intra_node")
    for r in tl.static_range(1, WORLD):
        token = dl.wait(signals + ready + ((me + r) % WORLD) * max_programs + pid, 1, "sys", "acquire", epoch)
        x = dl.consume_token(x, token)

    # 2. Push: each tile of x, loaded once, into slot `me` of every rank's out (own included).
    each_tile(_zero_copy_tile, (x, out, stride, me), pid, tiles, grid, n, WORLD, BLOCK)

    # 3. Done: my tiles are in every peer's out; wait until every peer's are in mine.
    for r in tl.static_range(1, WORLD):
        dl.notify(signals + done + me * max_programs + pid, (me + r) % WORLD, epoch, "set", "intra_node")
    for r in tl.static_range(1, WORLD):
        dl.wait(signals + done + ((me + r) % WORLD) * max_programs + pid, 1, "sys", "acquire", epoch)


# --------------------------------------------------------------------------------------------
# ll


@jit(do_not_specialize=["n", "words"])
def all_gather_ll_kernel(x, out, ll, n, words, calls, WORLD: tl.constexpr, ll_slot,
                         BLOCK_W: tl.constexpr, ELEMS: tl.constexpr):
    """``out[r * n:(r + 1) * n] = x of rank r`` through the LL protocol. ``ll``: symmetric int64,
    ``2 * WORLD * ll_slot`` words, zeroed at creation; ``words``: LL words per rank (``n`` elements
    of ``4 / ELEMS`` bytes, 4 payload bytes a word); ``calls``: the context's call counter."""
    TIMEOUT_NS, DEBUG_BARRIERS = _settings(None)
    flag, high, half, tiles, lanes = ll_call(calls, words, WORLD, ll_slot, BLOCK_W)
    me = dl.rank()
    pid = tl.program_id(0)
    grid = tl.num_programs(0)
    n64 = n.to(tl.int64)

    # 1. Send: one 64-bit relaxed system-scope store per word (payload | flag << 32) to every peer.
    # Words past `words` in the last tile are written too (they stay inside the slot: ll_slot is
    # whole tiles) and ignored by the receiver.
    for t in range(pid, tiles, grid):
        w = t.to(tl.int64) * BLOCK_W + lanes
        packed = ll_words(x, w, n, ELEMS) | high
        ll_own_copy(x, out + me.to(tl.int64) * n64, w, n, ELEMS)
        for r in tl.static_range(1, WORLD):
            dst = dl.symm_at(ll, (me + r) % WORLD) + half + me.to(tl.int64) * ll_slot
            dl.st(dst + w, packed, "sys", "relaxed")

    # 2. Receive: spin on each tile of every peer's slot until all its flags are this call's.
    for k in tl.static_range(1, WORLD):
        src = (me + k) % WORLD
        slot = ll + half + src.to(tl.int64) * ll_slot
        for t in range(pid, tiles, grid):
            w = t.to(tl.int64) * BLOCK_W + lanes
            vals = ll_receive(slot + w, (w < words).to(tl.int32), flag, lanes, TIMEOUT_NS)
            ll_store(out + src.to(tl.int64) * n64, w, n, vals & 0xFFFFFFFF, ELEMS)


# --------------------------------------------------------------------------------------------
