"""The AllReduce's device kernels, one per method of
:class:`~triton_dist.kernels.collectives.allreduce.AllReduceContext`, whose module notes give the protocols
(signals, epochs, halves, the copy-engine flags) these kernels carry out; the host side lives
there. :func:`ll_reduce_kernel` also serves the LL ReduceScatter."""

from __future__ import annotations

import triton
import triton.language as tl

from ... import language as dl
from ...distributed_jit import jit
from ...language.signals import _settings
from ..common.call_counter import enter_call
from ..common.ll_protocol import ll_call, ll_receive, ll_store_values, ll_values, ll_words
from ..common.ring import ring_all_gather_steps
from ..common.tickets import last_to_finish
from ..common.tiles import copy_program_tiles, copy_tile, each_tile, load_tile, program_share, store_tile


@triton.jit
def _reduce_one_shot_tile(args, offs, n, WORLD: tl.constexpr, MASKED: tl.constexpr):
    out, stage, half, token = args
    acc = tl.zeros(offs.shape, tl.float32)
    for r in tl.static_range(WORLD):
        src = tl.multiple_of(dl.symm_at(stage, r), 16)  # symm_at loses the alignment fact
        acc += load_tile(dl.consume_token(src + half + offs, token), offs, n, MASKED).to(tl.float32)
    store_tile(out + offs, acc.to(out.dtype.element_ty), offs, n, MASKED)


@jit(do_not_specialize=["n", "half_tiles", "max_programs"])
def all_reduce_one_shot_kernel(x, out, stage, signals, n, calls, half_tiles, WORLD: tl.constexpr,
                               max_programs, BLOCK: tl.constexpr):
    """``out = sum over ranks of x`` (``n`` elements). ``stage``: symmetric, two halves of
    ``half_tiles * BLOCK`` elements of x's dtype (sizes are arguments, so contexts of every size
    share one compiled kernel); ``signals``: the context's pad (region 0: ``WORLD *
    max_programs``); ``calls``: the context's device call counter."""
    epoch = enter_call(calls)
    me = dl.rank()
    pid, grid, _ = program_share(BLOCK)
    half = (epoch % 2).to(tl.int64) * half_tiles * BLOCK
    tiles = tl.cdiv(n, BLOCK)

    # 1. Publish this rank's slice: local stores, then one release signal on every peer.
    mine = stage + half
    copy_program_tiles(mine, x, n, tiles, BLOCK)
    for r in tl.static_range(1, WORLD):
        dl.notify(signals + me * max_programs + pid, (me + r) % WORLD, epoch, "set", "intra_node")
    tl.debug_barrier()  # this program's own staging stores are read below by other threads

    # 2. Wait for the same slice from every peer, then reduce it in rank order.
    token = dl.wait(signals + ((me + 1) % WORLD) * max_programs + pid, 1, "sys", "acquire", epoch)
    for r in tl.static_range(2, WORLD):
        token = token + dl.wait(signals + ((me + r) % WORLD) * max_programs + pid, 1, "sys", "acquire", epoch)
    each_tile(_reduce_one_shot_tile, (out, stage, half, token), pid, tiles, grid, n, WORLD, BLOCK)


@triton.jit
def _reduce_two_shot_tile(x, out, stage, gather, half, shard, local, idx, n, token, WORLD: tl.constexpr,
                          MASKED: tl.constexpr):
    """``local``: the tile's offsets inside a shard; ``idx``: inside the tensor (``n`` elements).
    This rank's own part comes straight from ``x``, the peers' from their staging slots."""
    me = dl.rank()
    acc = tl.zeros(idx.shape, tl.float32)
    slot = half + local
    for r in tl.static_range(WORLD):
        if r == me:
            acc += load_tile(x + idx, idx, n, MASKED).to(tl.float32)
        else:
            src = dl.consume_token(stage + slot + r * shard, token)
            acc += load_tile(src, idx, n, MASKED).to(tl.float32)
    result = acc.to(out.dtype.element_ty)
    store_tile(out + idx, result, idx, n, MASKED)
    for r in tl.static_range(1, WORLD):
        peer_gather = tl.multiple_of(dl.symm_at(gather, (me + r) % WORLD), 16)
        store_tile(peer_gather + half + idx, result, idx, n, MASKED)


@jit(do_not_specialize=["n", "shard_tiles", "half_tiles", "max_programs"])
def all_reduce_two_shot_kernel(x, out, stage, gather, signals, n, calls, shard_tiles, half_tiles,
                               WORLD: tl.constexpr, max_programs, BLOCK: tl.constexpr):
    """``out = sum over ranks of x`` by reduce-scatter then all-gather. Shard ``s`` is elements
    ``[s * shard, (s + 1) * shard)``, ``shard = shard_tiles * BLOCK``. ``stage`` and ``gather``:
    symmetric, two halves of ``half_tiles * BLOCK`` elements each (a half holds ``WORLD``
    shards); ``signals``: regions 1 and 2 of the context's pad; ``calls``: the context's
    device call counter."""
    epoch = enter_call(calls)
    me = dl.rank()
    pid, grid, lanes = program_share(BLOCK)
    half = (epoch % 2).to(tl.int64) * half_tiles * BLOCK
    shard = shard_tiles.to(tl.int64) * BLOCK
    sig_scatter = signals + WORLD * max_programs
    sig_gather = signals + 2 * WORLD * max_programs

    # 1. Scatter: shard s of this rank's input goes to rank s's staging slot `me`, each destination
    # signalled as soon as its tiles are stored. The own shard stays in x: staging it would cost
    # a local copy of 1/WORLD of the tensor before the first NVLink store.
    for r in tl.static_range(1, WORLD):
        s = (me + r) % WORLD
        dst = tl.multiple_of(dl.symm_at(stage, s), 16) + half + me * shard
        for t in range(pid, shard_tiles, grid):
            local = t.to(tl.int64) * BLOCK + lanes
            idx = s * shard + local
            if s * shard + (t.to(tl.int64) + 1) * BLOCK <= n:
                copy_tile(dst + local, x + idx, idx, n, False)
            else:
                copy_tile(dst + local, x + idx, idx, n, True)
        dl.notify(sig_scatter + me * max_programs + pid, s, epoch, "set", "intra_node")
    tl.debug_barrier()  # in place (out is x): every thread's reads of x precede any write of out

    # 2. Reduce this rank's shard over the WORLD slots, send the result to every rank.
    token = dl.wait(sig_scatter + ((me + 1) % WORLD) * max_programs + pid, 1, "sys", "acquire", epoch)
    for r in tl.static_range(2, WORLD):
        token = token + dl.wait(sig_scatter + ((me + r) % WORLD) * max_programs + pid, 1, "sys", "acquire", epoch)
    for t in range(pid, shard_tiles, grid):
        local = t.to(tl.int64) * BLOCK + lanes
        idx = me * shard + local
        if me * shard + (t.to(tl.int64) + 1) * BLOCK <= n:
            _reduce_two_shot_tile(x, out, stage, gather, half, shard, local, idx, n, token, WORLD, False)
        else:
            _reduce_two_shot_tile(x, out, stage, gather, half, shard, local, idx, n, token, WORLD, True)
    for r in tl.static_range(1, WORLD):
        dl.notify(sig_gather + me * max_programs + pid, (me + r) % WORLD, epoch, "set", "intra_node")

    # 3. Gather: copy every peer's reduced shard out of this rank's gather buffer.
    for r in tl.static_range(1, WORLD):
        s = (me + r) % WORLD
        token = dl.wait(sig_gather + s * max_programs + pid, 1, "sys", "acquire", epoch)
        src = dl.consume_token(gather + half, token)
        for t in range(pid, shard_tiles, grid):
            idx = s * shard + t.to(tl.int64) * BLOCK + lanes
            if s * shard + (t.to(tl.int64) + 1) * BLOCK <= n:
                copy_tile(out + idx, src + idx, idx, n, False)
            else:
                copy_tile(out + idx, src + idx, idx, n, True)


@triton.jit
def _ring_partial_tile(x, inbox, theirs, c, k, shard, local, valid, token, FIRST: tl.constexpr,
                       MASKED: tl.constexpr):
    """Ring step ``k``: the next rank's inbox slot ``k`` gets x's part of chunk ``c``, plus (after
    step 0) the partial of chunk ``c`` that arrived in slot ``k - 1``; fp32."""
    acc = load_tile(x + c * shard + local, local, valid, MASKED).to(tl.float32)
    if not FIRST:
        acc += load_tile(dl.consume_token(inbox + (k - 1) * shard + local, token), local, valid, MASKED)
    store_tile(theirs + k * shard + local, acc, local, valid, MASKED)


@triton.jit
def _ring_final_tile(x, out, inbox, me, k, shard, local, valid, token, MASKED: tl.constexpr):
    """This rank's chunk: the partial summed over every other rank (slot ``k``) plus x's part."""
    acc = load_tile(dl.consume_token(inbox + k * shard + local, token), local, valid, MASKED)
    acc += load_tile(x + me * shard + local, local, valid, MASKED).to(tl.float32)
    store_tile(out + me * shard + local, acc.to(out.dtype.element_ty), local, valid, MASKED)


@jit(do_not_specialize=["n", "shard_tiles", "half_tiles", "max_programs"])
def all_reduce_ring_kernel(x, out, inbox, stage, signals, n, calls, shard_tiles, half_tiles,
                           WORLD: tl.constexpr, max_programs, BLOCK: tl.constexpr):
    """``out = sum over ranks of x`` around the ring ``r -> r + 1``: a ring reduce-scatter (fp32
    partials in ``inbox``, symmetric, ``(WORLD - 1)`` slots of ``shard``, one region), then the
    ring all-gather of :mod:`triton_dist.kernels.common.ring` through ``stage`` (half ``epoch % 2``).
    Shards as two-shot's. ``signals``: the ring regions of the context's pad, ``2 * (WORLD - 1) *
    max_programs`` signals (reduce-scatter steps, then all-gather steps)."""
    epoch = enter_call(calls)
    me = dl.rank()
    nxt = (me + 1) % WORLD
    pid, grid, lanes = program_share(BLOCK)
    shard = shard_tiles.to(tl.int64) * BLOCK
    theirs = tl.multiple_of(dl.symm_at(inbox, nxt), 16)  # symm_at loses the alignment fact

    # 1. Reduce-scatter: at step k, send the partial of chunk (me - k - 1) mod WORLD.
    token = tl.zeros((), tl.int32)
    for k in tl.static_range(WORLD - 1):
        c = ((me + 2 * WORLD - k - 1) % WORLD).to(tl.int64)
        valid = tl.minimum(shard, n - c * shard)  # <= 0: an empty chunk past the end of x
        for t in range(pid, shard_tiles, grid):
            local = t.to(tl.int64) * BLOCK + lanes
            if (t.to(tl.int64) + 1) * BLOCK <= valid:
                _ring_partial_tile(x, inbox, theirs, c, k, shard, local, valid, token, k == 0, False)
            else:
                _ring_partial_tile(x, inbox, theirs, c, k, shard, local, valid, token, k == 0, True)
        dl.notify(signals + k * max_programs + pid, nxt, epoch, "set", "intra_node")
        token = dl.wait(signals + k * max_programs + pid, 1, "sys", "acquire", epoch)
    valid = tl.minimum(shard, n - me.to(tl.int64) * shard)
    for t in range(pid, shard_tiles, grid):
        local = t.to(tl.int64) * BLOCK + lanes
        if (t.to(tl.int64) + 1) * BLOCK <= valid:
            _ring_final_tile(x, out, inbox, me.to(tl.int64), WORLD - 2, shard, local, valid, token, False)
        else:
            _ring_final_tile(x, out, inbox, me.to(tl.int64), WORLD - 2, shard, local, valid, token, True)
    tl.debug_barrier()  # the reduced chunk, stored by every thread, is read back by others below

    # 2. All-gather the reduced chunks around the same ring.
    half = (epoch % 2).to(tl.int64) * half_tiles * BLOCK
    ring_all_gather_steps(out + me.to(tl.int64) * shard, out, stage, signals + (WORLD - 1) * max_programs, epoch,
                          half, shard, shard, n.to(tl.int64), shard_tiles, WORLD, max_programs, BLOCK, False)


@jit(do_not_specialize=["n", "shard_tiles", "chunk_tiles", "chunks"])
def all_reduce_ce_reduce_kernel(x, out, stage, gather, flags, tickets, n, shard_tiles, chunk_tiles, chunks,
                                WORLD: tl.constexpr, MAX_CHUNKS: tl.constexpr, BLOCK: tl.constexpr):
    """Step 3 of ``"ce_two_shot"`` (module notes): ``out`` and ``gather`` at this rank's shard
    (elements ``[me * shard, (me + 1) * shard)`` below ``n``, ``shard = shard_tiles * BLOCK``) =
    the sum over ranks of their part of it (``x`` for this rank, ``stage`` slot ``r`` for rank
    ``r``), chunk by chunk as the peers' copies land. ``flags``: the context's ``ce_pad`` (``scattered[r][c]`` at ``r * MAX_CHUNKS +
    c``, ``reduced[r][c]`` at ``(WORLD + r) * MAX_CHUNKS + c``); ``tickets``: ``MAX_CHUNKS`` int32
    counters, zero between calls."""
    me = dl.rank()
    pid, grid, lanes = program_share(BLOCK)
    shard = shard_tiles.to(tl.int64) * BLOCK  # a multiple of BLOCK, as the compiler sees: 16-byte vectors
    start = me.to(tl.int64) * shard
    own = tl.minimum(tl.maximum(n - start, 0), shard)  # elements of this rank's shard
    own_tiles = tl.cdiv(own, BLOCK)
    for c in range(0, chunks):
        token = dl.wait(flags + ((me + 1) % WORLD) * MAX_CHUNKS + c, 1, "sys", "acquire", 1)
        for i in tl.static_range(2, WORLD):
            token = token + dl.wait(flags + ((me + i) % WORLD) * MAX_CHUNKS + c, 1, "sys", "acquire", 1)
        for t in range(c * chunk_tiles + pid, tl.minimum((c + 1) * chunk_tiles, own_tiles), grid):
            local = t.to(tl.int64) * BLOCK + lanes
            if (t.to(tl.int64) + 1) * BLOCK <= own:
                _sum_shard_tile(x, out, stage, gather, start, local, own, shard, token, WORLD, False)
            else:
                _sum_shard_tile(x, out, stage, gather, start, local, own, shard, token, WORLD, True)
        # The chunk's last program publishes it for every program (module tickets), to the peers.
        if last_to_finish(tickets, c, grid):
            for i in tl.static_range(1, WORLD):
                dl.atomic_xchg(flags + ((me + i) % WORLD) * MAX_CHUNKS + c, 0, scope="gpu", semantic="relaxed")
            for i in tl.static_range(1, WORLD):
                dl.notify(flags + (WORLD + me) * MAX_CHUNKS + c, (me + i) % WORLD, 1, "set", "intra_node")


@triton.jit
def _sum_shard_tile(x, out, stage, gather, start, local, own, shard, token, WORLD: tl.constexpr,
                    MASKED: tl.constexpr):
    """One tile of :func:`all_reduce_ce_reduce_kernel`: ``local`` offsets inside the shard."""
    me = dl.rank()
    acc = tl.zeros(local.shape, tl.float32)
    for r in tl.static_range(WORLD):
        if r == me:
            acc += load_tile(x + start + local, local, own, MASKED).to(tl.float32)
        else:
            src = dl.consume_token(stage + r * shard + local, token)
            acc += load_tile(src, local, own, MASKED).to(tl.float32)
    result = acc.to(out.dtype.element_ty)
    store_tile(out + start + local, result, local, own, MASKED)
    store_tile(gather + start + local, result, local, own, MASKED)


@jit(do_not_specialize=["n", "words"])
def ll_reduce_kernel(x, out, ll, n, words, calls, WORLD: tl.constexpr, ll_slot,
                         BLOCK_W: tl.constexpr, ELEMS: tl.constexpr, SCATTER: tl.constexpr = False):
    """``out = sum over ranks of x`` (``n`` elements) through the LL protocol (module notes).
    ``ll``: symmetric int64, ``2 * WORLD * ll_slot`` words (half ``epoch % 2``, slot ``r`` = rank
    ``r``'s data), zeroed at creation; ``words``: LL words per rank (``n`` elements of ``4 / ELEMS``
    bytes, 4 payload bytes a word); ``calls``: the context's device call counter. ``ll_slot``
    is a whole number of ``BLOCK_W``-word tiles.

    ``SCATTER`` (ReduceScatter, :mod:`~triton_dist.kernels.collectives.reduce_scatter`'s ``"ll"``): ``x`` holds
    ``WORLD * n`` elements and rank ``r`` receives only ``x[r * n:(r + 1) * n]`` of every rank;
    ``out`` is this rank's ``n``-element shard of the sum (it may be this rank's shard of
    ``x``)."""
    TIMEOUT_NS, DEBUG_BARRIERS = _settings(None)
    flag, high, half, tiles, lanes = ll_call(calls, words, WORLD, ll_slot, BLOCK_W)
    me = dl.rank()
    pid = tl.program_id(0)
    grid = tl.num_programs(0)
    mine = ll + half  # this rank's half

    # 1. Push: each tile, packed once, goes to slot `me` of every rank (own buffer first, then
    # peers), one 64-bit relaxed system-scope store per word. Words past `words` in the last tile
    # are written too (they stay inside the slot) and never waited for.
    for t in range(pid, tiles, grid):
        w = t.to(tl.int64) * BLOCK_W + lanes
        if not SCATTER:
            packed = ll_words(x, w, n, ELEMS) | high
        for r in tl.static_range(WORLD):
            if r == 0:
                base = ll
            else:
                base = dl.symm_at(ll, (me + r) % WORLD)
            if SCATTER:  # rank (me + r)'s shard of x
                packed = ll_words(x + ((me + r) % WORLD).to(tl.int64) * n, w, n, ELEMS) | high
            dl.st(base + half + me.to(tl.int64) * ll_slot + w, packed, "sys", "relaxed")
    # Every thread's loads of x are done before any thread stores into out (out may be x).
    tl.debug_barrier()

    # 2. Reduce: spin on the local buffer for each rank's tile, in rank order, and add in fp32.
    for t in range(pid, tiles, grid):
        w = t.to(tl.int64) * BLOCK_W + lanes
        valid = (w < words).to(tl.int32)
        v = ll_values(ll_receive(mine + w, valid, flag, lanes, TIMEOUT_NS), out, ELEMS)
        acc = tl.zeros_like(v) + v  # 0 + x first, as one-shot does: the same bits for -0.0
        for r in tl.static_range(1, WORLD):
            acc += ll_values(ll_receive(mine + r * ll_slot + w, valid, flag, lanes, TIMEOUT_NS), out, ELEMS)
        ll_store_values(out, w, n, acc, ELEMS)
