"""AllGather+GEMM across nodes: the producer ``"sm_2d"`` of
:class:`~triton_dist.kernels.gemm.ag_gemm.AllGatherGemmContext`, ``"sm_push"``'s kernel made
node-aware for a world of ``NODES`` nodes of ``LOCAL`` ranks (the runtime's nodes). The
consumer, the buffer and the meaning of the signals are ``"sm_push"``'s (:mod:`.ag_gemm`'s
module notes): ``gathered`` holds rank ``r``'s rows at ``r * n``, ``ready[r] >= k`` (pad index
``r``) says they are in this rank's ``gathered`` for call ``k``, and ``ack[r] = k - 1`` (index
``WORLD + r``) says rank ``r``'s GEMM of call ``k - 1`` no longer reads its ``gathered``.

Call ``k`` on rank ``me = node * LOCAL + local``, every program of the producer kernel:

1. program 0: ``ready[me] = k`` here, ``ack[me] = k - 1`` to every rank that writes into this
   rank's ``gathered``: the other ranks of its node (NVLink release) and its local index on every
   other node (NVSHMEM's signal);
2. across nodes: for each other node, one program waits for that node's rank ``c`` of this local
   index to acknowledge, then sends this rank's rows there whole with one ``putmem_signal_block``
   setting ``ready[me] = k`` on ``c`` after the data (the only traffic between nodes);
3. within the node: every program stores its share of this rank's rows into each node peer's
   ``gathered`` once that peer acknowledged; the last program to finish a peer (tickets) sets
   ``ready[me] = k`` there;
4. forwarding: for each other node's rank ``c`` of this local index, once ``ready[c] >= k``
   here (its put has landed), every program stores its share of ``c``'s rows into each node
   peer's ``gathered``; the last one sets ``ready[c] = k`` there.

Every ``ready[r]`` of a rank has one writer: ``r`` on its node and at its local index elsewhere,
else the receiver's node rank of ``r``'s local index. Every rank that writes a ``gathered`` waits
for its owner's ack of the previous call, which the owner sends after its GEMM and its producer of
that call are done (the next call's producer waits for the caller's stream, which waited for the
producer): no write lands where a GEMM or a forward still reads. No cycle: acks need only the
previous call; step 2 waits for acks, step 4 for step 2 of other ranks. The GEMM leaves the
kernel's programs their SMs, as for ``"sm_push"``, and walks its m-tiles in the order rows arrive:
this node's first (from this rank's own), then each other node's from its rank at this rank's
local index, whose rows come straight across (:func:`~triton_dist.kernels.gemm.tile.own_node_first`).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ... import language as dl
from ...distributed_jit import jit
from ..common.nodes import node_position, same_local_rank
from ..common.tickets import last_to_finish
from ..common.tiles import copy_program_tiles


@triton.jit
def _share_to_node(gathered, src_rank, signals, tickets, n, k, node_first, local, stride, grid,
                   WORLD: tl.constexpr, LOCAL: tl.constexpr, BLOCK: tl.constexpr):
    """This program's share of rank ``src_rank``'s rows (in the local ``gathered``) into every
    node peer's, each after its ack; the last program of a peer sets ``ready[src_rank] = k``."""
    src = gathered + src_rank.to(tl.int64) * stride
    tiles = tl.cdiv(n, BLOCK)
    for i in tl.static_range(1, LOCAL):
        # Node peers in the order sm_push feeds ranks: the one whose GEMM needs these rows first.
        r = node_first + (local - i + LOCAL) % LOCAL
        token = dl.wait(signals + WORLD + r, 1, "sys", "acquire", k - 1)  # r no longer reads its gathered
        dst = dl.consume_token(tl.multiple_of(dl.symm_at(gathered, r), 16), token) + src_rank.to(tl.int64) * stride
        copy_program_tiles(dst, src, n, tiles, BLOCK)
        if last_to_finish(tickets, src_rank * WORLD + r, grid, "sys"):
            dl.notify(signals + src_rank, r, k, "set", "intra_node")


@jit(do_not_specialize=["n"])
def ag_gemm_push_2d_kernel(gathered, signals, calls, tickets, n, WORLD: tl.constexpr, LOCAL: tl.constexpr,
                           ELEMENT_BYTES: tl.constexpr, BLOCK: tl.constexpr):
    """``"sm_2d"``'s producer (module notes): this rank's ``n`` elements in slot ``me`` of the
    local ``gathered`` into every rank's, across nodes by NVSHMEM puts, within by NVLink stores
    and forwarding. ``signals``: ``ready`` at ``[0, WORLD)``, ``ack`` at ``[WORLD, 2 * WORLD)``;
    ``tickets``: ``WORLD * WORLD`` int32 counters, zero between calls. ``n``: a multiple of 8."""
    NODES: tl.constexpr = WORLD // LOCAL
    k = tl.load(calls)
    me, node_first, local = node_position(LOCAL)
    pid = tl.program_id(0)
    grid = tl.num_programs(0)
    stride = ((n // 8) * 8).to(tl.int64)  # == n, with the divisibility fact for 16-byte vectors

    # 1. Acknowledge the previous call to every rank that writes here.
    if pid == 0:
        dl.notify(signals + me, me, k, "set", "gpu")
        for i in tl.static_range(1, LOCAL):
            dl.notify(signals + WORLD + me, node_first + (local + i) % LOCAL, k - 1, "set", "intra_node")
        for d in tl.static_range(1, NODES):
            c = same_local_rank(node_first, d, local, LOCAL, WORLD)
            dl.notify(signals + WORLD + me, c, k - 1, "set", "inter_node")

    # 2. Across nodes: all my rows in one put per node, its signal set after the data.
    mine = gathered + me.to(tl.int64) * stride
    for d in tl.static_range(1, NODES):
        if pid == (d - 1) % grid:
            c = same_local_rank(node_first, d, local, LOCAL, WORLD)
            token = dl.wait(signals + WORLD + c, 1, "sys", "acquire", k - 1)
            src = dl.consume_token(mine, token)
            dl.shmem.putmem_signal_block(src, src, n.to(tl.int64) * ELEMENT_BYTES, signals + me, k,
                                         dl.shmem.SIGNAL_SET, c)

    # 3. Within the node: my rows.
    _share_to_node(gathered, me, signals, tickets, n, k, node_first, local, stride, grid, WORLD, LOCAL, BLOCK)

    # 4. Forwarding: each other node's rows of my local index, once landed here.
    for d in tl.static_range(1, NODES):
        c = same_local_rank(node_first, d, local, LOCAL, WORLD)
        dl.wait(signals + c, 1, "sys", "acquire", k)
        _share_to_node(gathered, c, signals, tickets, n, k, node_first, local, stride, grid, WORLD, LOCAL, BLOCK)
