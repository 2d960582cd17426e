"""AllGather across nodes, then within (method ``"2d"`` of
:class:`~triton_dist.kernels.collectives.allgather.AllGatherContext`): the seeds' inter-node
AllGather, for a world of ``NODES`` nodes of ``LOCAL`` ranks (the runtime's nodes: contiguous
blocks of ``tdist.local_world_size()`` ranks, discovered from host names or declared with
``TRITON_DIST_LOCAL_WORLD_SIZE``). Rank ``me = node * LOCAL + local``.

Program ``p`` of a grid of ``G`` owns the contiguous chunk ``[p * chunk, (p + 1) * chunk)`` of the
``n`` elements (the same on every rank; one NVSHMEM put per chunk and node, not one per tile).
``gathered`` is the context's symmetric buffer of ``2 * WORLD`` slots (half ``epoch % 2``, slot
``r``: rank ``r``'s data) and signal ``(r, p)`` (pad index ``ready + r * max_programs + p``) on a
rank says "chunk ``p`` of rank ``r`` is in my slot ``r``, this epoch". Program ``p``:

1. stores its chunk of ``x`` into ``out``'s own slot and into slot ``me`` of its own ``gathered``
   and of every rank of its node (NVLink stores, ``dl.symm_at``), then notifies ``(me, p)`` on
   those ranks;
2. sends the chunk to the rank of its local index on every other node: one
   ``putmem_signal_block`` (NVSHMEM carries the data and then sets ``(me, p)`` there; no load or
   store of this kernel touches another node's memory);
3. for each other node, waits for ``(src, p)`` from ``src``, that node's rank of its own local
   index, copies the chunk into ``out`` and forwards it over NVLink to slot ``src`` of every
   other rank of its node, then notifies ``(src, p)`` there;
4. waits for ``(src, p)`` of every rank ``src`` of another local index (set by the rank of this
   node that owns that local index, in step 1 or 3) and copies the chunk into ``out``.

Every signal ``(r, p)`` of a rank has exactly one writer per call: ``r`` itself on ``r``'s node
and at ``r``'s local index on the other nodes, else the rank of the receiver's node at ``r``'s
local index. Only step 2 crosses nodes; at one node (``NODES == 1``) the kernel is the intra-node
push. No deadlock: steps 1 and 2 wait for nothing, step 3 waits for another rank's step 2 of the
same program index, step 4 for steps 1 and 3; the grid is within the co-resident limit.

Reuse: the epoch and halves of ``sm_push`` (the context's call counter; the methods interleave).
A rank writes half ``e % 2`` of a rank ``y`` again in call ``e + 2``, after its call ``e + 1``,
whose programs waited for a signal of every rank; each of those was set after its rank started
call ``e + 1`` (directly, or forwarded from what that rank sent in call ``e + 1``), so after ``y``
too finished reading call ``e``: ``y``'s signal reached the writer along such a chain.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ... import language as dl
from ...distributed_jit import jit
from ...language.signals import _settings
from ..common.call_counter import enter_call
from ..common.chunks import copy_chunk, program_chunk
from ..common.ll_protocol import ll_call, ll_own_copy, ll_receive, ll_store, ll_words
from ..common.nodes import node_position, same_local_rank
from ..common.tiles import load_tile, store_tile


@triton.jit
def _store_to_node(dst_base, offs, v, end, node_first, local, LOCAL: tl.constexpr, MASKED: tl.constexpr):
    """``v`` to ``dst_base + offs`` on every rank of this node but this one (``dst_base``: a
    symmetric address; the other ranks through ``dl.symm_at``)."""
    for k in tl.static_range(1, LOCAL):
        peer = node_first + (local + k) % LOCAL
        dst = tl.multiple_of(dl.symm_at(dst_base, peer), 16)  # symm_at loses the alignment fact
        store_tile(dst + offs, v, offs, end, MASKED)


@triton.jit
def _notify_node(signal, epoch, node_first, local, LOCAL: tl.constexpr):
    for k in tl.static_range(1, LOCAL):
        dl.notify(signal, node_first + (local + k) % LOCAL, epoch, "set", "intra_node")


@jit(do_not_specialize=["n", "chunk", "slot_tiles", "max_programs", "ready"])
def all_gather_2d_kernel(x, out, gathered, signals, n, chunk, calls, slot_tiles, WORLD: tl.constexpr,
                         LOCAL: tl.constexpr, max_programs, ready,
                         ELEMENT_BYTES: tl.constexpr, BLOCK: tl.constexpr, ALIGNED: tl.constexpr):
    """``out[r * n:(r + 1) * n] = x of rank r`` for every rank, across nodes then within (module
    notes). ``chunk``: elements per program, a multiple of ``BLOCK``, the same on every rank;
    ``gathered``: the context's symmetric ``2 * WORLD`` slots of ``slot_tiles * BLOCK`` elements;
    ``signals``: its pad, region ``ready`` of ``WORLD * max_programs``; ``calls``: its call
    counter. ``LOCAL``: ranks per node (dividing ``WORLD``). ``ALIGNED``: ``n % 8 == 0``."""
    NODES: tl.constexpr = WORLD // LOCAL
    epoch = enter_call(calls)
    me, node_first, local = node_position(LOCAL)
    pid = tl.program_id(0)
    slot_numel = slot_tiles.to(tl.int64) * BLOCK
    half = gathered + (epoch % 2).to(tl.int64) * WORLD * slot_numel
    if ALIGNED:
        stride = ((n // 8) * 8).to(tl.int64)  # == n; tells the compiler slots of out are aligned
    else:
        stride = n.to(tl.int64)
    start, end, first, last = program_chunk(n, chunk, BLOCK)
    lanes = tl.arange(0, BLOCK)
    mine = half + me.to(tl.int64) * slot_numel

    # 1. My chunk: to out's own slot, my own slot `me` and every node peer's.
    for t in range(first, last):
        offs = t * BLOCK + lanes
        masked = (t + 1) * BLOCK > end
        if masked:
            v = load_tile(x + offs, offs, end, True)
            store_tile(out + me.to(tl.int64) * stride + offs, v, offs, end, True)
            store_tile(mine + offs, v, offs, end, True)
            _store_to_node(mine, offs, v, end, node_first, local, LOCAL, True)
        else:
            v = load_tile(x + offs, offs, end, False)
            store_tile(out + me.to(tl.int64) * stride + offs, v, offs, end, False)
            store_tile(mine + offs, v, offs, end, False)
            _store_to_node(mine, offs, v, end, node_first, local, LOCAL, False)
    _notify_node(signals + ready + me * max_programs + pid, epoch, node_first, local, LOCAL)

    # 2. Across nodes: the chunk (from my own symmetric slot: NVSHMEM's source must be registered
    # memory off the node) to my local index on every other node. The CTA barrier orders every
    # thread's stores before the block-wide put reads them (notify has one, but not at LOCAL 1).
    tl.debug_barrier()
    for d in tl.static_range(1, NODES):
        pe = same_local_rank(node_first, d, local, LOCAL, WORLD)
        dl.shmem.putmem_signal_block(mine + start, mine + start, (end - start) * ELEMENT_BYTES,
                                     signals + ready + me * max_programs + pid, epoch, dl.shmem.SIGNAL_SET, pe)

    # 3. What my local index on every other node sent me: to out, and forwarded within the node.
    for d in tl.static_range(1, NODES):
        src = same_local_rank(node_first, d, local, LOCAL, WORLD)
        token = dl.wait(signals + ready + src * max_programs + pid, 1, "sys", "acquire", epoch)
        theirs = dl.consume_token(half + src.to(tl.int64) * slot_numel, token)
        for t in range(first, last):
            offs = t * BLOCK + lanes
            if (t + 1) * BLOCK > end:
                v = load_tile(theirs + offs, offs, end, True)
                store_tile(out + src.to(tl.int64) * stride + offs, v, offs, end, True)
                _store_to_node(theirs, offs, v, end, node_first, local, LOCAL, True)
            else:
                v = load_tile(theirs + offs, offs, end, False)
                store_tile(out + src.to(tl.int64) * stride + offs, v, offs, end, False)
                _store_to_node(theirs, offs, v, end, node_first, local, LOCAL, False)
        _notify_node(signals + ready + src * max_programs + pid, epoch, node_first, local, LOCAL)

    # 4. Every rank of another local index: stored or forwarded to me by my node's rank of it.
    for k in tl.static_range(1, LOCAL):
        for d in tl.static_range(NODES):
            src = (node_first + d * LOCAL + (local + k) % LOCAL) % WORLD
            token = dl.wait(signals + ready + src * max_programs + pid, 1, "sys", "acquire", epoch)
            theirs = dl.consume_token(half + src.to(tl.int64) * slot_numel, token)
            copy_chunk(out + src.to(tl.int64) * stride, theirs, first, last, end, BLOCK)


@jit(do_not_specialize=["n", "words"])
def all_gather_ll_2d_kernel(x, out, ll, n, words, calls, WORLD: tl.constexpr, LOCAL: tl.constexpr,
                            ll_slot, BLOCK_W: tl.constexpr, ELEMS: tl.constexpr):
    """``out[r * n:(r + 1) * n] = x of rank r`` through the LL protocol
    (:mod:`~triton_dist.kernels.common.ll_protocol`: payload and flag in each 8-byte word, no
    signal), across nodes then within, for small inputs: the schedule of
    :func:`all_gather_2d_kernel` with words in place of chunks and signals. Program ``p`` takes
    tiles ``p, p + G, ...`` of ``BLOCK_W`` words. It writes its words into slot ``me`` of its own
    ``ll`` half and of every rank of its node (64-bit system-scope stores), puts them
    (``putmem_block``: a word arrives whole, its flag with its payload) into slot ``me`` of its
    local index on every other node, receives and forwards within the node what those send, then
    receives the node's other ranks' and their forwards. ``ll``: symmetric int64, ``2 * WORLD *
    ll_slot`` words, zeroed at creation."""
    TIMEOUT_NS, DEBUG_BARRIERS = _settings(None)
    NODES: tl.constexpr = WORLD // LOCAL
    flag, high, half, tiles, lanes = ll_call(calls, words, WORLD, ll_slot, BLOCK_W)
    me, node_first, local = node_position(LOCAL)
    pid = tl.program_id(0)
    grid = tl.num_programs(0)
    n64 = n.to(tl.int64)
    mine = ll + half + me.to(tl.int64) * ll_slot

    # 1. My words: to out (no flag), my own slot (the put's source) and every node peer's slot.
    for t in range(pid, tiles, grid):
        w = t.to(tl.int64) * BLOCK_W + lanes
        packed = ll_words(x, w, n, ELEMS) | high
        ll_own_copy(x, out + me.to(tl.int64) * n64, w, n, ELEMS)
        dl.st(mine + w, packed, "sys", "relaxed")
        for k in tl.static_range(1, LOCAL):
            dl.st(dl.symm_at(mine, node_first + (local + k) % LOCAL) + w, packed, "sys", "relaxed")
    # 2. Across nodes: each tile of my slot to my local index on every other node.
    tl.debug_barrier()  # every thread's words stored before the block-wide puts read them
    for d in tl.static_range(1, NODES):
        pe = same_local_rank(node_first, d, local, LOCAL, WORLD)
        for t in range(pid, tiles, grid):
            first = t.to(tl.int64) * BLOCK_W
            dl.shmem.putmem_block(mine + first, mine + first, BLOCK_W * 8, pe)

    # 3. What my local index on every other node sent: to out, and forwarded within the node.
    for d in tl.static_range(1, NODES):
        src = same_local_rank(node_first, d, local, LOCAL, WORLD)
        slot = ll + half + src.to(tl.int64) * ll_slot
        for t in range(pid, tiles, grid):
            w = t.to(tl.int64) * BLOCK_W + lanes
            vals = ll_receive(slot + w, (w < words).to(tl.int32), flag, lanes, TIMEOUT_NS)
            ll_store(out + src.to(tl.int64) * n64, w, n, vals & 0xFFFFFFFF, ELEMS)
            for k in tl.static_range(1, LOCAL):
                dl.st(dl.symm_at(slot, node_first + (local + k) % LOCAL) + w, vals, "sys", "relaxed")

    # 4. Every rank of another local index: stored or forwarded by my node's rank of it.
    for k in tl.static_range(1, LOCAL):
        for d in tl.static_range(NODES):
            src = (node_first + d * LOCAL + (local + k) % LOCAL) % WORLD
            slot = ll + half + src.to(tl.int64) * ll_slot
            for t in range(pid, tiles, grid):
                w = t.to(tl.int64) * BLOCK_W + lanes
                vals = ll_receive(slot + w, (w < words).to(tl.int32), flag, lanes, TIMEOUT_NS)
                ll_store(out + src.to(tl.int64) * n64, w, n, vals & 0xFFFFFFFF, ELEMS)
