"""AllReduce (sum) over the ranks of one node: one-shot and two-shot, from tiles and signals.

Both kernels split the tensor into ``BLOCK``-element tiles and give program ``p`` of a grid of
``G`` programs the tiles ``p, p + G, p + 2G, ...``. Every rank launches the same grid for the same
``numel``, so program ``p`` of every rank owns the same tiles, and it only ever waits for program
``p`` of the other ranks: there is no grid-wide barrier, and no program waits for data it does not
read.

One-shot (:func:`all_reduce_one_shot_kernel`), latency-bound sizes:

1. program ``p`` copies its tiles of the input into this rank's symmetric staging buffer and
   notifies signal ``(me, p)`` on every peer ("my slice ``p`` is ready");
2. it waits for signal ``(r, p)`` from every peer ``r``, then reads its tiles from every rank's
   staging buffer (``dl.symm_at``), sums them in fp32 in rank order 0, 1, ..., ``WORLD - 1`` (the
   same order on every rank, so every rank gets the same bits) and writes the output.

Two-shot (:func:`all_reduce_two_shot_kernel`), bandwidth-bound sizes. The tensor is cut into
``WORLD`` shards of ``shard_tiles`` tiles; rank ``s`` reduces shard ``s``:

1. scatter: program ``p`` pushes its tiles of shard ``s`` into rank ``s``'s staging slot for this
   rank (stores through ``dl.symm_at``) and notifies signal ``(me, p)`` of region 1 on rank ``s``;
2. reduce: it waits for region-1 signal ``(r, p)`` from every peer, sums its tiles of its own shard
   over the ``WORLD`` slots (fp32, rank order), writes the result into its own output and into
   every peer's gather buffer, and notifies region-2 signal ``(me, p)`` on every peer;
3. gather: it waits for region-2 signal ``(r, p)`` from every peer and copies shard ``r``'s tiles
   from the gather buffer into the output.

Reuse between calls: the epoch is the context's device call counter and buffers alternate halves
by its parity (see :mod:`triton_dist.kernels.context` for why that is safe and graph-capturable).

Inputs and outputs need not be symmetric; only the staging buffers are. Accumulation is fp32 for
every dtype; staging and gather buffers hold the input dtype.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .. import language as dl
from .. import runtime as _runtime
from ..distributed_jit import jit
from .context import CollectiveContext
from .tiles import copy_tile, load_tile, store_tile


@triton.jit
def _reduce_one_shot_tile(out, stage, half, offs, n, token, WORLD: tl.constexpr, MASKED: tl.constexpr):
    acc = tl.zeros(offs.shape, tl.float32)
    for r in tl.static_range(WORLD):
        src = tl.multiple_of(dl.symm_at(stage, r), 16)  # symm_at loses the alignment fact
        acc += load_tile(dl.consume_token(src + half + offs, token), offs, n, MASKED).to(tl.float32)
    store_tile(out + offs, acc.to(out.dtype.element_ty), offs, n, MASKED)


@jit(do_not_specialize=["n"])
def all_reduce_one_shot_kernel(x, out, stage, signals, n, epoch_ptr, WORLD: tl.constexpr, HALF: tl.constexpr,
                               MAX_PROGRAMS: tl.constexpr, BLOCK: tl.constexpr):
    """``out = sum over ranks of x`` (``n`` elements). ``stage``: symmetric, ``2 * HALF``
    elements of x's dtype; ``signals``: the context's pad (region 0: ``WORLD * MAX_PROGRAMS``);
    ``epoch_ptr``: the context's device call counter."""
    epoch = tl.load(epoch_ptr)
    me = dl.rank()
    pid = tl.program_id(0)
    grid = tl.num_programs(0)
    lanes = tl.arange(0, BLOCK)
    half = (epoch % 2).to(tl.int64) * HALF
    tiles = tl.cdiv(n, BLOCK)

    # 1. Publish this rank's slice: local stores, then one release signal on every peer.
    mine = stage + half
    for t in range(pid, tiles, grid):
        offs = t.to(tl.int64) * BLOCK + lanes
        if (t.to(tl.int64) + 1) * BLOCK <= n:
            copy_tile(mine + offs, x + offs, offs, n, False)
        else:
            copy_tile(mine + offs, x + offs, offs, n, True)
    for r in tl.static_range(1, WORLD):
        dl.notify(signals + me * MAX_PROGRAMS + pid, (me + r) % WORLD, epoch, "set", "intra_node")
    tl.debug_barrier()  # this program's own staging stores are read below by other threads

    # 2. Wait for the same slice from every peer, then reduce it in rank order.
    token = dl.wait(signals + ((me + 1) % WORLD) * MAX_PROGRAMS + pid, 1, "sys", "acquire", epoch)
    for r in tl.static_range(2, WORLD):
        token = token + dl.wait(signals + ((me + r) % WORLD) * MAX_PROGRAMS + pid, 1, "sys", "acquire", epoch)
    for t in range(pid, tiles, grid):
        offs = t.to(tl.int64) * BLOCK + lanes
        if (t.to(tl.int64) + 1) * BLOCK <= n:
            _reduce_one_shot_tile(out, stage, half, offs, n, token, WORLD, False)
        else:
            _reduce_one_shot_tile(out, stage, half, offs, n, token, WORLD, True)


@triton.jit
def _reduce_two_shot_tile(out, stage, gather, half, shard, local, idx, n, token, WORLD: tl.constexpr,
                          MASKED: tl.constexpr):
    """``local``: the tile's offsets inside a shard; ``idx``: inside the tensor (``n`` elements)."""
    me = dl.rank()
    acc = tl.zeros(idx.shape, tl.float32)
    slot = half + local
    for r in tl.static_range(WORLD):
        src = dl.consume_token(stage + slot + r * shard, token)
        acc += load_tile(src, idx, n, MASKED).to(tl.float32)
    result = acc.to(out.dtype.element_ty)
    store_tile(out + idx, result, idx, n, MASKED)
    for r in tl.static_range(1, WORLD):
        peer_gather = tl.multiple_of(dl.symm_at(gather, (me + r) % WORLD), 16)
        store_tile(peer_gather + half + idx, result, idx, n, MASKED)


@jit(do_not_specialize=["n", "shard_tiles"])
def all_reduce_two_shot_kernel(x, out, stage, gather, signals, n, epoch_ptr, shard_tiles, WORLD: tl.constexpr,
                               HALF: tl.constexpr, MAX_PROGRAMS: tl.constexpr, BLOCK: tl.constexpr):
    """``out = sum over ranks of x`` by reduce-scatter then all-gather. Shard ``s`` is elements
    ``[s * shard, (s + 1) * shard)``, ``shard = shard_tiles * BLOCK``. ``stage`` and ``gather``:
    symmetric, ``2 * HALF`` elements each (a half holds ``WORLD`` shards); ``signals``: regions 1
    and 2 of the context's pad; ``epoch_ptr``: the context's device call counter."""
    epoch = tl.load(epoch_ptr)
    me = dl.rank()
    pid = tl.program_id(0)
    grid = tl.num_programs(0)
    lanes = tl.arange(0, BLOCK)
    half = (epoch % 2).to(tl.int64) * HALF
    shard = shard_tiles.to(tl.int64) * BLOCK
    sig_scatter = signals + WORLD * MAX_PROGRAMS
    sig_gather = signals + 2 * WORLD * MAX_PROGRAMS

    # 1. Scatter: shard s of this rank's input goes to rank s's staging slot `me` (own shard first,
    # locally), each destination signalled as soon as its tiles are stored.
    for r in tl.static_range(WORLD):
        s = (me + r) % WORLD
        dst = tl.multiple_of(dl.symm_at(stage, s), 16) + half + me * shard
        for t in range(pid, shard_tiles, grid):
            local = t.to(tl.int64) * BLOCK + lanes
            idx = s * shard + local
            if s * shard + (t.to(tl.int64) + 1) * BLOCK <= n:
                copy_tile(dst + local, x + idx, idx, n, False)
            else:
                copy_tile(dst + local, x + idx, idx, n, True)
        if r != 0:
            dl.notify(sig_scatter + me * MAX_PROGRAMS + pid, s, epoch, "set", "intra_node")
    tl.debug_barrier()

    # 2. Reduce this rank's shard over the WORLD slots, send the result to every rank.
    token = dl.wait(sig_scatter + ((me + 1) % WORLD) * MAX_PROGRAMS + pid, 1, "sys", "acquire", epoch)
    for r in tl.static_range(2, WORLD):
        token = token + dl.wait(sig_scatter + ((me + r) % WORLD) * MAX_PROGRAMS + pid, 1, "sys", "acquire", epoch)
    for t in range(pid, shard_tiles, grid):
        local = t.to(tl.int64) * BLOCK + lanes
        idx = me * shard + local
        if me * shard + (t.to(tl.int64) + 1) * BLOCK <= n:
            _reduce_two_shot_tile(out, stage, gather, half, shard, local, idx, n, token, WORLD, False)
        else:
            _reduce_two_shot_tile(out, stage, gather, half, shard, local, idx, n, token, WORLD, True)
    for r in tl.static_range(1, WORLD):
        dl.notify(sig_gather + me * MAX_PROGRAMS + pid, (me + r) % WORLD, epoch, "set", "intra_node")

    # 3. Gather: copy every peer's reduced shard out of this rank's gather buffer.
    for r in tl.static_range(1, WORLD):
        s = (me + r) % WORLD
        token = dl.wait(sig_gather + s * MAX_PROGRAMS + pid, 1, "sys", "acquire", epoch)
        src = dl.consume_token(gather + half, token)
        for t in range(pid, shard_tiles, grid):
            idx = s * shard + t.to(tl.int64) * BLOCK + lanes
            if s * shard + (t.to(tl.int64) + 1) * BLOCK <= n:
                copy_tile(out + idx, src + idx, idx, n, False)
            else:
                copy_tile(out + idx, src + idx, idx, n, True)


class AllReduceContext(CollectiveContext):
    """Symmetric staging, gather buffers and signals for AllReduce (sum) of up to ``max_bytes``
    bytes of ``dtype`` (float32, bfloat16 or float16), reused across calls.

    Collective: every rank creates it with the same arguments, in the same order as its other
    symmetric allocations; creating it compiles and loads both kernels. Ranks must have the same
    GPU model (the grid is sized from the SM count). Memory: ``4 * max_bytes`` (rounded up to whole
    tiles) on the symmetric heap, plus ``3 * world * max_programs`` signals.

    Call with :meth:`run` (or use :func:`triton_dist.ops.all_reduce`). Every call must be made by
    every rank, in the same order, with the same ``numel`` and method. Calls may be captured in a
    CUDA graph and replayed.
    """

    def __init__(self, max_bytes: int, dtype, *, max_programs: int | None = None):
        import torch

        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes <= 0:
            raise ValueError(f"triton_dist AllReduceContext: max_bytes must be a positive int, got {max_bytes!r}")
        itemsize = dtype.itemsize if isinstance(dtype, torch.dtype) else 1
        max_numel = max(1, max_bytes // itemsize)
        world = _runtime.world_size() if _runtime.is_initialized() else 1
        half = world * triton.cdiv(max_numel, world * self.BLOCK) * self.BLOCK
        super().__init__("AllReduceContext", dtype, max_numel, {"stage": half, "gather": half}, 3 * world,
                         max_programs)
        self.half = self.halves["stage"]
        self.ready()

    def _meta(self) -> dict:
        return self.meta(HALF=self.half)

    def preload(self) -> None:
        """Compile and load both kernels with the specialisation of real calls (16-byte aligned
        tensors of this dtype; ``n`` and ``shard_tiles`` unspecialised 32-bit ints)."""
        n = max(2, self.max_numel)  # the int type (i32) real calls have
        all_reduce_one_shot_kernel.preload(self.stage, self.gather, self.stage, self.pad.signals, n, self.calls,
                                           grid=(1, ), **self._meta())
        all_reduce_two_shot_kernel.preload(self.stage, self.gather, self.stage, self.gather, self.pad.signals, n,
                                           self.calls, 3, grid=(1, ), **self._meta())

    def run(self, x, out, method: str) -> None:
        """``out = sum over ranks of x`` with ``method`` ``"one_shot"`` or ``"two_shot"``, on the
        current stream. ``x`` and ``out``: contiguous CUDA tensors of this dtype, ``x.numel() <=
        max_numel`` elements (validated by :func:`triton_dist.ops.all_reduce`, not here); ``out``
        may be ``x``."""
        n = x.numel()
        if n == 0:
            return
        if self.world == 1:
            if out.data_ptr() != x.data_ptr():
                out.copy_(x)
            return
        if method not in ("one_shot", "two_shot"):
            raise ValueError(f"triton_dist AllReduceContext.run: method must be 'one_shot' or 'two_shot', "
                             f"got {method!r}")
        # The preloaded variants assume 16-byte aligned pointers: a misaligned tensor would
        # compile and load another variant here, possibly while a peer spins.
        if x.data_ptr() % 16:
            x = x.clone()
        target = out if out.data_ptr() % 16 == 0 else x.new_empty(x.shape)
        epoch_ptr = self.next_call()
        meta = self._meta()
        if method == "one_shot":
            grid = self.grid(triton.cdiv(n, self.BLOCK))
            all_reduce_one_shot_kernel[grid](x, target, self.stage, self.pad.signals, n, epoch_ptr, **meta)
        else:
            shard_tiles = triton.cdiv(n, self.world * self.BLOCK)
            all_reduce_two_shot_kernel[self.grid(shard_tiles)](x, target, self.stage, self.gather, self.pad.signals,
                                                               n, epoch_ptr, shard_tiles, **meta)
        if target is not out:
            out.copy_(target)
