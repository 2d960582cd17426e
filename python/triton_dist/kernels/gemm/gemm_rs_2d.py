"""GEMM+ReduceScatter across nodes: two methods of
:class:`~triton_dist.kernels.gemm.gemm_rs.GemmReduceScatterContext` for a world of ``NODES`` nodes
of ``LOCAL`` ranks (the runtime's nodes); rank ``me = node * LOCAL + local``, destination ``s =
d * LOCAL + l`` is rank ``(d, l)``.

``"2d"`` (:class:`GemmThenReduceScatter`): the GEMM of every row, then the hierarchical
ReduceScatter of :mod:`~triton_dist.kernels.collectives.reduce_scatter_2d` (within nodes over
NVLink, fp32 partials across by NVSHMEM put-with-signal). Not overlapped: the ReduceScatter starts
when the GEMM has finished.

``"push_2d"`` (:class:`PushAcrossNodes`), overlapped tile by tile like ``"push"``. Call ``e``:

1. the producer GEMM (``"push"``'s, with ``NODE_RANKS = LOCAL``: its epilogue stores its partial
   of destination ``(d, l)``'s tile ``t`` into the ``partials`` of rank ``(node, l)`` of its own
   node, slot ``local * NODES + d``, and sets signal ``(local * NODES + d) * R + t`` there:
   :func:`~triton_dist.kernels.gemm.epilogues.partial_destination`). Only NVLink stores, within
   the node; the GEMM never waits;
2. the reduce kernel (:func:`gemm_rs_reduce_2d_kernel`, :data:`~.gemm_rs.REDUCE_SMS` programs on
   the side stream, beside the GEMM), first for each other node ``d`` (from the next): per tile of
   destination ``(d, local)``, wait for the slots ``l * NODES + d`` of every rank of the node, sum
   them (fp32, local order) into the program's ``staging`` tile and send its rows below ``m`` to
   ``(d, local)`` with one ``putmem_signal_block`` into its ``inbox`` slot ``(node - d - 1) % NODES``, tile ``t``,
   setting inbox signal ``slot * R + t`` there after the data (the only traffic between nodes);
3. then this rank's own tiles: wait for the node's slots ``l * NODES + node`` and for the inbox
   signals of every other node, and store the sum over nodes in node order (this node's partial
   summed here in local order) into ``out``, in fp32, rounded once. At one node this is ``"push"``'s
   reduction, the same order and bits; across nodes the order of ``"2d"``.

No deadlock: the GEMM waits for nothing; step 2 waits for GEMM tiles only; step 3 for GEMM tiles
and other ranks' step 2. Buffers and signals: ``partials`` is the context's (``"push"``'s halves,
the call's half ``e % 2``); this method's own pad (region ``partials``: ``WORLD * R``, one writer
each, the sending node rank; region ``inbox``: ``(NODES - 1) * R``, one writer each, the other
node's rank of this local index), so that no signal is shared with another method's writers;
``inbox`` (fp32, two halves, ``NODES - 1`` slots of whole tiles). Reuse: rank ``X`` writes a half
again two calls later, after finishing the call between, which needed (through its node's GEMM
tiles and the other nodes' puts of it, whose senders waited for their nodes' GEMM tiles) every
rank to have started that call, so every rank finished reading the half: the argument of
:mod:`~triton_dist.kernels.collectives.reduce_scatter_2d`, for any mix of methods. ``staging`` is
the program's own and reused at once: the put is blocking.

Across several nodes a GemmReduceScatterContext makes both methods' buffers when it is created
(``"auto"`` takes ``"2d"`` there, and a first call may be captured in a CUDA graph); at one node
the first call of either does (collective; not during capture). ``"auto"`` stays ``"2d"`` until
``"push_2d"`` has been timed across real nodes.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ... import language as dl
from ... import runtime as _runtime
from ...distributed_jit import jit
from ...signals import SignalPad
from ...symmetric import symm_empty
from ..collectives.reduce_scatter import ReduceScatterContext
from ..common.nodes import node_position
from ..common.signal_layout import SignalLayout
from . import dense as _gemm
from .tile import tile_coords
from ..common.host_math import cdiv


class GemmThenReduceScatter:
    """The ReduceScatter context of ``"2d"`` for up to ``max_m`` rows of ``n`` columns of ``dtype``
    (collective to create)."""

    def __init__(self, max_m: int, n: int, dtype):
        import torch

        self.reduce_scatter = ReduceScatterContext(max_m * n * dtype.itemsize, dtype)
        self._partials = torch.empty(max_m * n, dtype=dtype, device=self.reduce_scatter.calls.device)
        """This rank's GEMM of every row (``[M, n]`` in its first ``M * n`` elements)."""

    def run(self, a, b, out) -> None:
        """``out`` = this rank's rows of the sum over ranks of ``a @ b.T`` (``a [M, K]``, ``M`` a
        multiple of the world size; ``out [M / world, n]``), on the current stream."""
        partial = self._partials[:a.shape[0] * b.shape[0]].view(a.shape[0], b.shape[0])
        _gemm.gemm(a, b, out=partial)
        self.reduce_scatter.run(partial.view(-1), out.view(-1), "2d")


@triton.jit
def _node_waits(signals, d, t, signal_region, epoch, LOCAL: tl.constexpr, NODES: tl.constexpr):
    """A token after tile ``t`` of destination ``(d, local)`` has arrived from every rank of this
    node (slots ``l * NODES + d``)."""
    token = dl.wait(signals + d * signal_region + t, 1, "sys", "acquire", epoch)
    for l in tl.static_range(1, LOCAL):
        token = token + dl.wait(signals + (l * NODES + d) * signal_region + t, 1, "sys", "acquire", epoch)
    return token


@triton.jit
def _node_partial(partials, d, offs, mask, m, stride, token, LOCAL: tl.constexpr, NODES: tl.constexpr,
                  ROWS: tl.constexpr, BN: tl.constexpr):
    """This node's sum (fp32, local order) of destination ``(d, local)``'s rows at ``offs``."""
    acc = tl.zeros((ROWS, BN), tl.float32)
    for l in tl.static_range(LOCAL):
        src = partials + ((l * NODES + d) * m).to(tl.int64) * stride + offs
        acc += tl.load(dl.consume_token(src, token), mask=mask).to(tl.float32)
    return acc


@jit(do_not_specialize=["m", "half_elems", "signal_region", "inbox_slot"])
def gemm_rs_reduce_2d_kernel(partials, inbox, staging, out, signals, calls, m, N, half_elems, signal_region,
                             inbox_slot, WORLD: tl.constexpr, LOCAL: tl.constexpr, BM: tl.constexpr,
                             BN: tl.constexpr, GROUP_M: tl.constexpr, ROWS: tl.constexpr):
    """``"push_2d"``'s reduce (module notes): ``out [m, N]`` = this rank's rows of the sum over
    ranks. ``partials``: the context's symmetric buffer (halves of ``half_elems``, slot ``j`` at
    rows ``[j * m, (j + 1) * m)``); ``inbox``: symmetric fp32, halves of ``NODES - 1`` slots of
    ``inbox_slot`` elements (tile ``t`` at ``t * BM * BN``); ``staging``: symmetric fp32, a
    ``BM * BN`` tile per program; ``signals``: the method's pad (``WORLD`` regions of
    ``signal_region``, then ``NODES - 1``). ``N``: a multiple of 8."""
    NODES: tl.constexpr = WORLD // LOCAL
    TILE: tl.constexpr = BM * BN
    epoch = tl.load(calls)
    me, node_first, local = node_position(LOCAL)
    node = node_first // LOCAL
    parity = (epoch % 2).to(tl.int64)
    here = partials + parity * ((half_elems // 8) * 8)  # the call's half; == half_elems, a multiple of 8
    slot = inbox_slot.to(tl.int64)
    inbox_half = inbox + parity * (NODES - 1) * slot
    inbox_signals = signals + WORLD * signal_region
    stride = (N // 8) * 8  # == N, with the divisibility fact for 16-byte loads
    local_m = tl.cdiv(m, BM)
    num_n = tl.cdiv(N, BN)
    pid = tl.program_id(0)
    grid = tl.num_programs(0)
    mine = staging + pid.to(tl.int64) * TILE
    sub_rows = tl.arange(0, ROWS)
    tile_cols = tl.arange(0, BN)

    # 2. Across nodes: this node's partial of every tile of each other node's rank of my index.
    for j in tl.static_range(1, NODES):
        d = (node + j) % NODES
        for t in range(pid, local_m * num_n, grid):
            pid_m, pid_n = tile_coords(t, local_m, num_n, GROUP_M)
            token = _node_waits(signals, d, t, signal_region, epoch, LOCAL, NODES)
            cols = pid_n * BN + tile_cols
            for r0 in range(0, BM, ROWS):
                rows = pid_m * BM + r0 + sub_rows
                mask = (rows < m)[:, None] & (cols < stride)[None, :]
                offs = rows.to(tl.int64)[:, None] * stride + cols[None, :]
                acc = _node_partial(here, d, offs, mask, m, stride, token, LOCAL, NODES, ROWS, BN)
                tl.store(mine + (r0 + sub_rows)[:, None] * BN + tile_cols[None, :], acc)  # zeros where masked
            tl.debug_barrier()  # every thread's part stored before the block-wide put reads the tile
            theirs = NODES - 1 - j  # (node - d - 1) % NODES: my slot in the receiver's inbox
            # Only the tile's rows below m cross (its first rows, contiguous in mine): the receiver
            # reads the rest but stores none of them.
            rows_here = tl.minimum(m - pid_m * BM, BM)
            dl.shmem.putmem_signal_block(inbox_half + theirs * slot + t * TILE, mine, rows_here * (BN * 4),
                                         inbox_signals + theirs * signal_region + t, epoch, dl.shmem.SIGNAL_SET,
                                         d * LOCAL + local)
            tl.debug_barrier()  # the put returned in every thread before the next tile overwrites mine

    # 3. My rows: the sum over nodes, in node order.
    for t in range(pid, local_m * num_n, grid):
        pid_m, pid_n = tile_coords(t, local_m, num_n, GROUP_M)
        token = _node_waits(signals, node, t, signal_region, epoch, LOCAL, NODES)
        for q in tl.static_range(NODES - 1):
            token = token + dl.wait(inbox_signals + q * signal_region + t, 1, "sys", "acquire", epoch)
        cols = pid_n * BN + tile_cols
        for r0 in range(0, BM, ROWS):
            rows = pid_m * BM + r0 + sub_rows
            mask = (rows < m)[:, None] & (cols < stride)[None, :]
            offs = rows.to(tl.int64)[:, None] * stride + cols[None, :]
            in_tile = t * TILE + (r0 + sub_rows)[:, None] * BN + tile_cols[None, :]
            acc = tl.zeros((ROWS, BN), tl.float32)
            for sender in tl.static_range(NODES):  # a node
                if sender == node:
                    acc += _node_partial(here, node, offs, mask, m, stride, token, LOCAL, NODES, ROWS, BN)
                else:
                    src = inbox_half + ((sender - node - 1 + NODES) % NODES).to(tl.int64) * slot + in_tile
                    acc += tl.load(dl.consume_token(src, token))
            tl.store(out + offs, acc.to(out.dtype.element_ty), mask=mask)


class PushAcrossNodes:
    """``"push_2d"``'s pad, inbox and staging tiles for a GemmReduceScatterContext ``ctx`` whose
    producer GEMM kernel is ``producer`` (module notes; collective to create, like the context)."""

    def __init__(self, ctx, producer):
        import torch

        self.local = _runtime.local_world_size()
        self.nodes = ctx.world // self.local
        bm = {c["BM"] for c in _gemm.CONFIGS.values()}.pop()
        bn_max = max(c["BN"] for c in _gemm.CONFIGS.values())
        region = ctx.tiles_per_rank
        self.layout = SignalLayout(("partials", ctx.world * region), ("inbox", (self.nodes - 1) * region))
        self.pad = SignalPad(self.layout.size, owner="GemmReduceScatterContext push_2d", regions=self.layout)
        # Whole tiles of any config: cdiv(m, BM) * BM rows by cdiv(n, BN) * BN columns, which the
        # widest BN bounds.
        self.inbox_slot = cdiv(cdiv(ctx.max_m, ctx.world), bm) * bm * cdiv(ctx.n, bn_max) * bn_max
        self.inbox = symm_empty((max(1, 2 * (self.nodes - 1) * self.inbox_slot), ), torch.float32)
        self.staging = symm_empty((ctx.reduce_sms * bm * bn_max, ), torch.float32)
        self.preload(ctx, producer)
        # The pad was zeroed on this rank's stream: made by a first call (at one node), a faster
        # rank's GEMM could otherwise set signals here that the zeroing, still queued, then wipes.
        torch.cuda.synchronize()
        _runtime.barrier()

    def producer_meta(self, ctx, config: str) -> dict:
        """The producer GEMM's constexprs and options (``"push"``'s, node-aware)."""
        return _gemm.kernel_meta(config, False, epilogue="rows_to_peer", world=ctx.world, node_ranks=self.local)

    def _reduce_meta(self, ctx, config: str) -> dict:
        meta = ctx.reduce_meta(config, True)
        meta.pop("PEER_EPILOGUE")
        return dict(meta, LOCAL=self.local)

    def preload(self, ctx, producer) -> None:
        """Compile and load the producer and the reduce kernel of every GEMM config."""
        p = ctx.partials
        a = p[:ctx.max_m * ctx.n].view(ctx.max_m, ctx.n)  # only dtype and blocks matter
        for config in _gemm.CONFIGS:
            a_desc, b_desc = _gemm.operand_descriptors(a, a, config)
            producer.preload(a_desc, b_desc, p, 2, 2, 2, self.pad.signals, ctx.calls, 2, 2,
                                            half_elems=2, signal_region=2, out=p, grid=(1, ),
                                            **self.producer_meta(ctx, config))
            gemm_rs_reduce_2d_kernel.preload(p, self.inbox, self.staging, p, self.pad.signals, ctx.calls, 2, ctx.n,
                                             2, 2, 2, grid=(1, ), **self._reduce_meta(ctx, config))

    def reduce(self, ctx, config: str, out, m: int, programs: int) -> None:
        """The reduce kernel of a call with ``m`` rows per rank, on the current stream."""
        gemm_rs_reduce_2d_kernel[(programs, )](ctx.partials, self.inbox, self.staging, out, self.pad.signals,
                                               ctx.calls, m, ctx.n, ctx.half, ctx.tiles_per_rank, self.inbox_slot,
                                               **self._reduce_meta(ctx, config))
