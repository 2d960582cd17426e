"""ReduceScatter within nodes, then across (method ``"2d"`` of
:class:`~triton_dist.kernels.collectives.reduce_scatter.ReduceScatterContext`): the seeds'
hierarchical ReduceScatter, for a world of ``NODES`` nodes of ``LOCAL`` ranks (the runtime's
nodes). Rank ``me = node * LOCAL + local``; ``x`` holds ``WORLD`` shards of ``m`` elements, shard
``s = d * LOCAL + l`` for rank ``(d, l)``.

Program ``p`` owns the contiguous elements ``[p * chunk, (p + 1) * chunk)`` of every shard
(:mod:`~triton_dist.kernels.common.chunks`). Program ``p``:

1. scatters within the node: to every other rank ``(node, l)`` of its node it stores (NVLink,
   ``dl.symm_at``) its chunk of every shard of local index ``l`` (``NODES`` shards, one per node)
   into that rank's ``stage`` slot ``local * NODES + d``, then notifies ``(me, p)`` there;
2. waits for ``(r, p)`` of every other rank ``r`` of its node, then for every other node ``d``
   sums its chunk of shard ``(d, local)`` over the node's ranks (fp32, local-rank order) into its
   ``partials`` slot and sends it to rank ``(d, local)``: one ``putmem_signal_block`` into that
   rank's ``inbox`` slot ``(node - d - 1) % NODES``, setting ``(me, p)`` there;
3. waits for ``(r, p)`` of the rank ``r`` of its local index on every other node and writes
   ``out``: the sum over nodes in node
   order of each node's partial (its own node's summed here, in local-rank order, from ``x`` and
   ``stage``), in fp32, rounded once.

One kernel, not the seeds' two streams (the intra-node scatter on one, the reduction and the
traffic between nodes on the other): each program takes its chunk through the three steps on its
own, so one chunk's put leaves as soon as its node partial is summed while other chunks are still
being scattered, the overlap the two streams give, with no host-side split or cross-stream event.
Only step 2's puts cross nodes. At one node the kernel is the push method's reduction (the same
order, the same bits); across nodes the order is (node, local rank), not rank order, so bits may
differ from push's in the last place. No deadlock: step 1 waits for nothing, step 2 for step 1 of
the node's ranks, step 3 for step 2 of the other nodes' ranks of this local index; programs of one
index only wait for programs of that index, and the grid is within the co-resident limit.

Signal ``(r, p)`` (pad index ``r * max_programs + p``, push's region) is set only by rank ``r``,
as in push: a rank sends to another either within its node (step 1) or across (step 2), never
both, so every signal keeps one writer whatever the mix of methods (the ring's region has other
writers: sharing it let a ring call's signal pass for a 2d call's).

Reuse: the epoch and halves of ``push`` and ``ring`` (the context's call counter; ``stage``,
``inbox``). A
rank that finishes call ``e + 1`` has seen a signal sent in call ``e + 1`` by every rank: directly
from its node's ranks, and from each other node's ranks through that node's rank of its local
index (whose partial waited for them), so every rank has finished call ``e`` before anything of
call ``e + 2`` writes its half ``e % 2``: the argument of the module notes of
:mod:`~triton_dist.kernels.collectives.reduce_scatter`, for any mix of the methods. ``partials``
is the sender's own and needs no halves: the put is blocking, so the next call's program finds
its source free.

``out`` may be this rank's shard of ``x``: step 3 reads each of its elements in the program that
writes it, just before.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ... import language as dl
from ...distributed_jit import jit
from ..common.call_counter import enter_call
from ..common.chunks import copy_chunk, program_chunk
from ..common.nodes import node_position
from ..common.tiles import load_tile, store_tile


@triton.jit
def _node_partial(x, stage, half, shard, d, slot, m, offs, end, node_first, local, token, LOCAL: tl.constexpr,
                  NODES: tl.constexpr, MASKED: tl.constexpr):
    """This node's sum (fp32, local-rank order) of one tile of shard ``shard`` (of node ``d``):
    this rank's term from ``x``, local rank ``l``'s from ``stage`` slot ``l * NODES + d``."""
    acc = tl.zeros(offs.shape, tl.float32)
    for l in tl.static_range(LOCAL):
        if l == local:
            v = load_tile(x + shard.to(tl.int64) * m + offs, offs, end, MASKED)
        else:
            src = dl.consume_token(stage + half + (l * NODES + d) * slot, token)  # slot: int64
            v = load_tile(src + offs, offs, end, MASKED)
        acc += v.to(tl.float32)
    return acc


@triton.jit
def _result_tile(out, x, stage, half, inbox_half, slot, m, offs, end, me, node, node_first, local, token,
                 LOCAL: tl.constexpr, NODES: tl.constexpr, MASKED: tl.constexpr):
    """One tile of ``out``: the sum over nodes, in node order, of each node's partial (this node's
    summed here, the others' from their ``inbox`` slots), rounded once."""
    acc = tl.zeros(offs.shape, tl.float32)
    for d in tl.static_range(NODES):
        if d == node:
            acc += _node_partial(x, stage, half, me, d, slot, m, offs, end, node_first, local, token, LOCAL, NODES,
                                 MASKED)
        else:
            src = dl.consume_token(inbox_half + ((d - node - 1 + NODES) % NODES).to(tl.int64) * slot, token)
            acc += load_tile(src + offs, offs, end, MASKED)
    store_tile(out + offs, acc.to(out.dtype.element_ty), offs, end, MASKED)


@jit(do_not_specialize=["shard_vecs", "chunk", "shard_tiles", "half_tiles", "inbox_half_tiles", "max_programs"])
def reduce_scatter_2d_kernel(x, out, stage, inbox, partials, signals, shard_vecs, chunk, shard_tiles, calls,
                             half_tiles, inbox_half_tiles, WORLD: tl.constexpr, LOCAL: tl.constexpr,
                             max_programs, BLOCK: tl.constexpr, VEC: tl.constexpr):
    """``out = shard me of (sum over ranks of x)``, within nodes then across (module notes).
    ``stage``: symmetric, x's dtype, halves of ``half_tiles * BLOCK`` (``WORLD`` slots of
    ``shard_tiles * BLOCK``); ``inbox``: symmetric fp32, halves of ``inbox_half_tiles * BLOCK``
    (``NODES - 1`` slots used); ``partials``: symmetric fp32, ``NODES - 1`` slots; ``signals``:
    the pad, ``(r, p)`` at ``r * max_programs + p``. Shards of ``m = shard_vecs * VEC`` elements;
    ``chunk``: elements per program, a multiple of ``BLOCK``. ``LOCAL``: ranks per node (dividing
    ``WORLD``)."""
    NODES: tl.constexpr = WORLD // LOCAL
    epoch = enter_call(calls)
    me, node_first, local = node_position(LOCAL)
    node = node_first // LOCAL
    pid = tl.program_id(0)
    parity = (epoch % 2).to(tl.int64)
    half = parity * half_tiles * BLOCK
    inbox_half = inbox + parity * inbox_half_tiles * BLOCK
    m = shard_vecs.to(tl.int64) * VEC  # VEC: the divisibility fact that lets x's shards vectorise
    slot = shard_tiles.to(tl.int64) * BLOCK
    start, end, first, last = program_chunk(m, chunk, BLOCK)
    lanes = tl.arange(0, BLOCK)

    # 1. Within the node: every shard of local index l to that rank's stage slot (local, d).
    for k in tl.static_range(1, LOCAL):
        peer = node_first + (local + k) % LOCAL
        for d in tl.static_range(NODES):
            dst = tl.multiple_of(dl.symm_at(stage, peer), 16) + half + (local * NODES + d).to(tl.int64) * slot
            copy_chunk(dst, x + (d * LOCAL + (local + k) % LOCAL).to(tl.int64) * m, first, last, end, BLOCK)
        dl.notify(signals + me * max_programs + pid, peer, epoch, "set", "intra_node")
    token = tl.zeros((), tl.int32)
    for k in tl.static_range(1, LOCAL):
        token = token + dl.wait(signals + (node_first + (local + k) % LOCAL) * max_programs + pid, 1, "sys",
                                "acquire", epoch)

    # 2. Across nodes: this node's partial of each other node's shard of my local index, sent there.
    for j in tl.static_range(1, NODES):
        d = (node + j) % NODES
        mine = partials + (j - 1) * slot
        for t in range(first, last):
            offs = t * BLOCK + lanes
            if (t + 1) * BLOCK > end:
                acc = _node_partial(x, stage, half, d * LOCAL + local, d, slot, m, offs, end, node_first, local,
                                    token, LOCAL, NODES, True)
                store_tile(mine + offs, acc, offs, end, True)
            else:
                acc = _node_partial(x, stage, half, d * LOCAL + local, d, slot, m, offs, end, node_first, local,
                                    token, LOCAL, NODES, False)
                store_tile(mine + offs, acc, offs, end, False)
        tl.debug_barrier()  # every thread's partial stored before the block-wide put reads it
        theirs = (node - d - 1 + NODES) % NODES  # my slot in the receiver's inbox
        dl.shmem.putmem_signal_block(inbox_half + theirs * slot + start, mine + start, (end - start) * 4,
                                     signals + me * max_programs + pid, epoch, dl.shmem.SIGNAL_SET, d * LOCAL + local)

    # 3. The result: every node's partial, in node order.
    for j in tl.static_range(1, NODES):
        sender = ((node + j) % NODES) * LOCAL + local
        token = token + dl.wait(signals + sender * max_programs + pid, 1, "sys", "acquire", epoch)
    for t in range(first, last):
        offs = t * BLOCK + lanes
        if (t + 1) * BLOCK > end:
            _result_tile(out, x, stage, half, inbox_half, slot, m, offs, end, me, node, node_first, local, token,
                         LOCAL, NODES, True)
        else:
            _result_tile(out, x, stage, half, inbox_half, slot, m, offs, end, me, node, node_first, local, token,
                         LOCAL, NODES, False)
