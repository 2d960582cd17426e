"""ReduceScatter (sum): push and ring within a node, ``"2d"`` across nodes
(:mod:`~triton_dist.kernels.collectives.reduce_scatter_2d`), from tiles and signals.

The input ``x`` (``n = WORLD * m`` elements) is cut into ``WORLD`` shards of ``m`` elements; rank
``s`` ends with shard ``s`` of the sum over ranks, ``m`` elements. Shards are cut into
``BLOCK``-element tiles, and program ``p`` of a grid of ``G`` programs owns the tiles ``p, p + G,
p + 2G, ...`` of every shard. Every rank launches the same grid for the same ``m``, so program
``p`` only ever waits for program ``p`` of other ranks: no grid-wide barrier.

Push (:func:`reduce_scatter_push_kernel`), a full-mesh (NVSwitch) machine:

1. scatter: for every peer ``s``, program ``p`` stores its tiles of shard ``s`` of ``x`` into
   rank ``s``'s staging slot ``me`` (``dl.symm_at``), then notifies signal ``(me, p)`` on rank
   ``s``;
2. reduce: it waits for signal ``(r, p)`` from every peer ``r``, then sums its tiles of its own
   shard in fp32 in rank order 0, 1, ..., ``WORLD - 1`` (own contribution read straight from
   ``x``, peers' from the staging slots) and rounds once into ``out``. The order is fixed, so the
   result is the same bits whichever rank computes it.

Ring (:func:`reduce_scatter_ring_kernel`), for machines whose GPUs are not all directly linked:
``WORLD - 1`` steps; at step ``k`` rank ``r`` sends its running partial sum of chunk
``(r - k - 1) mod WORLD`` (at step 0 that is just its own ``x`` chunk) to rank ``r + 1``'s inbox
slot ``k`` and notifies it; it then waits for slot ``k`` from rank ``r - 1``, which holds the
partial of chunk ``(r - k - 2) mod WORLD``: adding its own ``x`` chunk gives what it sends at step
``k + 1``. After step ``WORLD - 2`` the received partial is of chunk ``r`` and summed over every
other rank; adding ``x``'s chunk ``r`` gives the result. Partials travel in fp32 (the inbox is
fp32 whatever the dtype). Each program signals once per step (after all its tiles of the step).
The summation order is not rank order, so bits may differ from push's in the last place.

Reuse between calls: the epoch is the context's device call counter, buffers alternate halves by
its parity (see :mod:`triton_dist.kernels.common.context`). The argument there holds for both methods
and any mix of them: finishing call ``e + 1`` needs (directly for push, through the ring for
ring) every peer to have started call ``e + 1``, hence to have finished call ``e``.

Shards start at ``s * m`` elements of ``x``, so ``m``'s divisibility decides whether whole tiles
of ``x`` can be read with 16-byte vectors: kernels take ``m = shard_vecs * VEC`` with the constant
``VEC`` (``16 // itemsize`` when ``m`` is a multiple of it, else 1), and both variants are loaded
at construction.

``out`` may be this rank's shard of ``x`` (in place): each of its elements is read by the program
that writes it, just before.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ... import language as dl
from ...distributed_jit import jit
from ...symmetric import symm_empty
from . import policy as _policy
from .allreduce_kernels import ll_reduce_kernel
from ... import runtime as _runtime
from ..common.call_counter import enter_call
from ..common.chunks import chunk_and_grid
from ..common.context import CollectiveContext, OneRankCopy
from ..common import reach as _reach
from ..common.ll_buffer import ll_buffer
from ..common.launch_plan import OUT, X, LaunchPlan
from ..common.ll_protocol import LL_BLOCK
from ..common.tiles import copy_program_tiles, each_tile, load_tile, store_tile
from .reduce_scatter_2d import reduce_scatter_2d_kernel
from ..common.host_math import cdiv


@triton.jit
def _reduce_push_tile(args, local, m, WORLD: tl.constexpr, MASKED: tl.constexpr):
    """One tile of the reduction in rank order: this rank's term from ``own`` (its shard of x),
    rank ``r``'s from staging slot ``r`` (``stage`` + ``r * slot``)."""
    out, own, stage, slot, token = args
    me = dl.rank()
    acc = tl.zeros(local.shape, tl.float32)
    for r in tl.static_range(WORLD):
        if r == me:
            v = load_tile(own + local, local, m, MASKED)
        else:
            v = load_tile(dl.consume_token(stage + r * slot + local, token), local, m, MASKED)
        acc += v.to(tl.float32)
    store_tile(out + local, acc.to(out.dtype.element_ty), local, m, MASKED)


@jit(do_not_specialize=["shard_vecs", "shard_tiles", "half_tiles", "max_programs"])
def reduce_scatter_push_kernel(x, out, stage, signals, shard_vecs, shard_tiles, calls, half_tiles,
                               WORLD: tl.constexpr, max_programs, BLOCK: tl.constexpr,
                               VEC: tl.constexpr):
    """``out = shard me of (sum over ranks of x)``; shards of ``m = shard_vecs * VEC`` elements,
    ``shard_tiles = cdiv(m, BLOCK)``. ``stage``: symmetric, ``2 * half_tiles * BLOCK`` elements of
    x's dtype (a half holds ``WORLD`` slots of ``shard_tiles * BLOCK``; sizes are arguments, not
    constants, so contexts of every size share one compiled kernel); ``signals``: the context's pad
    (region 0, ``WORLD * max_programs``); ``calls``: the context's device call counter."""
    epoch = enter_call(calls)
    me = dl.rank()
    pid = tl.program_id(0)
    half = (epoch % 2).to(tl.int64) * half_tiles * BLOCK
    m = shard_vecs.to(tl.int64) * VEC  # VEC: the divisibility fact that lets x's shards vectorise
    slot = shard_tiles.to(tl.int64) * BLOCK

    # 1. Scatter: shard s of x goes to rank s's staging slot `me`; rank s is signalled as soon as
    # this program's tiles for it are stored.
    for r in tl.static_range(1, WORLD):
        s = (me + r) % WORLD
        dst = tl.multiple_of(dl.symm_at(stage, s), 16) + half + me * slot  # symm_at loses alignment
        copy_program_tiles(dst, x + s * m, m, shard_tiles, BLOCK)
        dl.notify(signals + me * max_programs + pid, s, epoch, "set", "intra_node")

    # 2. Reduce: wait for this program's tiles from every peer, sum in rank order.
    token = dl.wait(signals + ((me + 1) % WORLD) * max_programs + pid, 1, "sys", "acquire", epoch)
    for r in tl.static_range(2, WORLD):
        token = token + dl.wait(signals + ((me + r) % WORLD) * max_programs + pid, 1, "sys", "acquire", epoch)
    own = x + me * m
    mine = stage + half
    each_tile(_reduce_push_tile, (out, own, mine, slot, token), pid, shard_tiles, tl.num_programs(0), m, WORLD,
              BLOCK)


@triton.jit
def _ring_send_tile(dst, received, chunk, local, m, token, FIRST: tl.constexpr, MASKED: tl.constexpr):
    """``dst = chunk`` (step 0) or ``dst = received + chunk`` (later steps), in fp32."""
    acc = load_tile(chunk + local, local, m, MASKED).to(tl.float32)
    if not FIRST:
        acc = load_tile(dl.consume_token(received + local, token), local, m, MASKED) + acc
    store_tile(dst + local, acc, local, m, MASKED)


@triton.jit
def _ring_finish_tile(out, received, chunk, local, m, token, MASKED: tl.constexpr):
    acc = load_tile(dl.consume_token(received + local, token), local, m, MASKED)
    acc = acc + load_tile(chunk + local, local, m, MASKED).to(tl.float32)
    store_tile(out + local, acc.to(out.dtype.element_ty), local, m, MASKED)


@jit(do_not_specialize=["shard_vecs", "shard_tiles", "half_tiles", "max_programs"])
def reduce_scatter_ring_kernel(x, out, inbox, signals, shard_vecs, shard_tiles, calls, half_tiles,
                               WORLD: tl.constexpr, max_programs, BLOCK: tl.constexpr,
                               VEC: tl.constexpr):
    """``out = shard me of (sum over ranks of x)`` around the ring ``r -> r + 1``. ``inbox``:
    symmetric fp32, ``2 * half_tiles * BLOCK`` elements (a half holds ``WORLD - 1`` slots of
    ``shard_tiles * BLOCK``); ``signals``: the context's pad (ring region: ``(WORLD - 1) *
    max_programs`` signals after the push region's ``WORLD * max_programs``)."""
    epoch = enter_call(calls)
    me = dl.rank()
    nxt = (me + 1) % WORLD
    pid = tl.program_id(0)
    lanes = tl.arange(0, BLOCK)
    half = (epoch % 2).to(tl.int64) * half_tiles * BLOCK
    m = shard_vecs.to(tl.int64) * VEC
    slot = shard_tiles.to(tl.int64) * BLOCK
    sig = signals + WORLD * max_programs + pid
    mine = inbox + half
    theirs = tl.multiple_of(dl.symm_at(inbox, nxt), 16) + half  # symm_at loses alignment

    token = tl.zeros((), tl.int32)
    for k in tl.static_range(WORLD - 1):
        # Send the partial of chunk (me - k - 1) mod WORLD: x's chunk, plus (after step 0) what
        # step k - 1 received, which is the partial of that same chunk.
        src = x + ((me + 2 * WORLD - k - 1) % WORLD) * m
        for t in range(pid, shard_tiles, tl.num_programs(0)):
            local = t.to(tl.int64) * BLOCK + lanes
            if (t.to(tl.int64) + 1) * BLOCK <= m:
                _ring_send_tile(theirs + k * slot, mine + (k - 1) * slot, src, local, m, token, k == 0, False)
            else:
                _ring_send_tile(theirs + k * slot, mine + (k - 1) * slot, src, local, m, token, k == 0, True)
        dl.notify(sig + k * max_programs, nxt, epoch, "set", "intra_node")
        token = dl.wait(sig + k * max_programs, 1, "sys", "acquire", epoch)

    # The last slot holds chunk `me` summed over every other rank: add x's chunk `me`.
    own = x + me * m
    for t in range(pid, shard_tiles, tl.num_programs(0)):
        local = t.to(tl.int64) * BLOCK + lanes
        if (t.to(tl.int64) + 1) * BLOCK <= m:
            _ring_finish_tile(out, mine + (WORLD - 2) * slot, own, local, m, token, False)
        else:
            _ring_finish_tile(out, mine + (WORLD - 2) * slot, own, local, m, token, True)


class ReduceScatterContext(CollectiveContext):
    """Symmetric staging, ring inbox and signals for ReduceScatter (sum) of inputs of up to
    ``max_bytes`` bytes (the whole input, all ``world`` shards) of ``dtype`` (float32, bfloat16 or
    float16), reused across calls.

    Methods (:meth:`run`): ``"push"`` (every rank pushes each peer's shard straight into that
    peer's staging; every rank moves ``(w-1)/w`` of the input once over its links; the result is
    summed in rank order, so it is bit-identical to what any rank would compute), ``"ring"`` (``w -
    1`` steps around the ring ``r -> r + 1``, fp32 partials; for machines without a full NVLink
    mesh), ``"ll"`` (inputs of at most :attr:`ll_max_bytes`: the low-latency protocol of
    :func:`~triton_dist.kernels.collectives.allreduce_kernels.ll_reduce_kernel`, data and flag in 8-byte words, no
    signals; the same bits as push), ``"2d"`` (within nodes, then across: NVSHMEM puts of fp32
    partials between nodes, :mod:`~triton_dist.kernels.collectives.reduce_scatter_2d`; the only
    method whose loads and stores stay within a node, so ``"auto"``'s choice across nodes; at one
    node the same bits as push), ``"auto"``: what :func:`triton_dist.kernels.collectives.policy.reduce_scatter_method`
    decides (push at every size on the full-mesh machines measured so far).

    Collective: every rank creates it with the same arguments, in the same order as its other
    symmetric allocations; creating it compiles and loads every kernel variant. Memory on the
    symmetric heap: ``2 * max_bytes`` (staging) plus ``8 (w-1)/w * max_numel`` bytes (fp32 ring
    inbox), each rounded up to whole tiles, plus ``(2w - 1) * max_programs`` signals, plus the LL
    buffer (``4 * ll_max_bytes``, rounded up to whole LL tiles per rank), plus across nodes
    ``"2d"``'s fp32 partials (``4 (nodes - 1)`` bytes per element of the largest shard).

    Every call must be made by every rank, in the same order, with the same ``numel`` and method.
    Calls may be captured in a CUDA graph and replayed.
    """

    METHODS = ("auto", "push", "ring", "ll", "2d")

    LL_MAX_BYTES = 1 << 20
    """The largest input (bytes, all ``world`` shards) the ``"ll"`` method takes."""

    def __init__(self, max_bytes: int, dtype, *, max_programs: int | None = None):
        import torch

        max_numel, world = self.numel_and_world("ReduceScatterContext", max_bytes, dtype)
        slot = cdiv(max(1, max_numel // world), self.BLOCK) * self.BLOCK  # the largest shard, whole tiles
        super().__init__("ReduceScatterContext", dtype, max_numel, {"stage": world * slot}, 2 * world - 1,
                         max_programs)
        self.half = self.halves["stage"]
        self.ring_half = max(1, world - 1) * slot
        self.inbox = symm_empty((2 * self.ring_half, ), torch.float32)
        self.vec = 16 // dtype.itemsize
        self.ll_max_bytes = min(self.max_bytes, self.LL_MAX_BYTES)
        """The largest input (bytes, all shards) this context's ``"ll"`` method takes."""
        self.ll, self.ll_slot = ll_buffer("ReduceScatterContext", world, cdiv(self.ll_max_bytes, world))
        self.local_world = _runtime.local_world_size()
        """Ranks per node (``"2d"``'s ``LOCAL``; several nodes make it ``"auto"``'s choice)."""
        self.partials = symm_empty((max(1, (world // self.local_world - 1) * slot), ), torch.float32)
        """``"2d"``'s fp32 partials for the other nodes (``nodes - 1`` shards)."""
        """The LL buffer (:func:`~triton_dist.kernels.common.ll_buffer.ll_buffer`) and its 8-byte
        words per rank slot (one shard's payload)."""
        self.ready()

    def _meta(self, vec: int) -> dict:
        return self.meta(VEC=vec)

    def _2d_meta(self, vec: int) -> dict:
        return self.meta(VEC=vec, LOCAL=self.local_world)

    def _ll_meta(self) -> dict:
        return dict(WORLD=self.world, ll_slot=self.ll_slot, BLOCK_W=LL_BLOCK, ELEMS=4 // self.dtype.itemsize,
                    SCATTER=True, num_warps=self.NUM_WARPS)

    def preload(self) -> None:
        """Compile and load both kernels, each for ``VEC`` 1 and ``16 // itemsize``, with the
        specialisation of real calls (16-byte aligned tensors of this dtype, ``shard_vecs`` and
        ``shard_tiles`` and ``half_tiles`` unspecialised 32-bit ints)."""
        count = max(2, self.max_numel // max(1, self.world))  # the int type (i32) real calls have
        for vec in sorted({1, self.vec}):
            reduce_scatter_push_kernel.preload(self.stage, self.stage, self.stage, self.pad.signals, count, 3,
                                               self.calls, self.half // self.BLOCK, grid=(1, ), **self._meta(vec))
            reduce_scatter_ring_kernel.preload(self.stage, self.stage, self.inbox, self.pad.signals, count, 3,
                                               self.calls, self.ring_half // self.BLOCK, grid=(1, ), **self._meta(vec))
            reduce_scatter_2d_kernel.preload(self.stage, self.stage, self.stage, self.inbox, self.partials,
                                             self.pad.signals, count, count, 3, self.calls, self.half // self.BLOCK,
                                             self.ring_half // self.BLOCK, grid=(1, ), **self._2d_meta(vec))
        ll_reduce_kernel.preload(self.stage, self.stage, self.ll, count, count, self.calls, grid=(1, ),
                                 **self._ll_meta())

    def run(self, x, out, method: str = "auto") -> LaunchPlan | OneRankCopy | None:
        """``out`` = this rank's shard (``x.numel() // world`` elements) of the sum over ranks of
        ``x``, with ``method`` (see the class), on the current stream. ``x`` and ``out``: 1-D
        contiguous CUDA tensors of this dtype (validated by :func:`triton_dist.ops.reduce_scatter`,
        not here), ``x.numel()`` a multiple of the world size and ``<= max_numel``. ``out`` may be
        this rank's shard of ``x``, and must not overlap the rest of ``x``. Returns the
        :class:`LaunchPlan` it launched (any 16-byte aligned tensors of the same sizes would launch
        it again by the same method); with one rank the copy (:data:`~triton_dist.kernels.common.context.ONE_RANK_COPY`)."""
        if method not in self.METHODS:
            raise ValueError(f"triton_dist ReduceScatterContext.run: method must be one of {self.METHODS}, got "
                             f"{method!r}")
        n = x.numel()
        if n % self.world or n > self.max_numel or out.numel() != n // self.world:
            raise ValueError(f"triton_dist ReduceScatterContext.run: x has {n} elements and out {out.numel()}; need "
                             f"a multiple of the world size {self.world}, at most {self.max_numel}, and out of "
                             f"x.numel() // {self.world}")
        if n == 0:
            return
        if method == "ll" and n * self.dtype.itemsize > self.ll_max_bytes:
            raise ValueError(f"triton_dist reduce_scatter: method 'll' takes inputs of at most {self.ll_max_bytes} "
                             f"bytes, got {n * self.dtype.itemsize}; use 'push', 'ring' or 'auto'")
        copied = self.ran_on_one_rank(x, out)
        if copied:
            return copied
        if method == "auto":
            method = _policy.reduce_scatter_method(n * self.dtype.itemsize, self.world,
                                                   self.world // self.local_world)
        _reach.check_reach("reduce_scatter", method, ("2d", ), self.unmapped, self.rank)
        return self.launch_aligned(n, method, x, out)

    def _make_launch_plan(self, n: int, method: str) -> LaunchPlan | None:
        """Every method is one kernel, which advances the call counter itself; ``n`` counts the
        input's elements, ``m = n // world`` this rank's shard's."""
        m = n // self.world
        vec = self.vec if m % self.vec == 0 else 1
        if method == "ll":
            return self.ll_plan(ll_reduce_kernel, m, self._ll_meta())
        shard_tiles = cdiv(m, self.BLOCK)
        if method == "2d":
            chunk, programs = chunk_and_grid(m, self.max_programs, self.BLOCK)
            return LaunchPlan(reduce_scatter_2d_kernel, (programs, ),
                              (X, OUT, self.stage, self.inbox, self.partials, self.pad.signals, m // vec, chunk,
                               shard_tiles, self.calls, self.half // self.BLOCK, self.ring_half // self.BLOCK),
                              self._2d_meta(vec))
        if method == "push":
            return LaunchPlan(reduce_scatter_push_kernel, self.grid(shard_tiles),
                              (X, OUT, self.stage, self.pad.signals, m // vec, shard_tiles, self.calls,
                               self.half // self.BLOCK), self._meta(vec))
        if method == "ring":
            return LaunchPlan(reduce_scatter_ring_kernel, self.grid(shard_tiles),
                              (X, OUT, self.inbox, self.pad.signals, m // vec, shard_tiles, self.calls,
                               self.ring_half // self.BLOCK), self._meta(vec))
        return None
