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

Reuse between calls. Every call takes the next epoch of the context's :class:`~triton_dist.SignalPad`
(1, 2, 3, ... on every rank alike); signals are set to the epoch and waited for with ``>=``, so
they never need resetting. Staging and gather buffers have two halves, picked by epoch parity.
A rank cannot start call ``e + 2`` before it has finished call ``e + 1``, which needs a signal
from every peer's call ``e + 1``, which that peer sends only after its call ``e`` kernel finished
(kernels on one stream run in order). So a half written in call ``e + 2`` is never one a peer
still reads for call ``e``. A signal that already shows a later epoch than the one waited for
implies the same, so the data of the awaited epoch is still in place.

Inputs and outputs need not be symmetric; only the staging buffers are. Accumulation is fp32 for
every dtype; staging and gather buffers hold the input dtype.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .. import runtime as _runtime
from ..distributed_jit import jit
from .. import language as dl
from ..signals import SignalPad
from ..symmetric import symm_empty

_DTYPES = ("float32", "bfloat16", "float16")


# Tile bodies. Masks on an unspecialised ``n`` defeat vectorisation (Triton cannot prove a
# vector's lanes share the mask), so whole tiles take the unmasked path (MASKED=False) and only
# the tile that straddles ``n`` is masked.


@triton.jit
def _ld(ptrs, idx, n, MASKED: tl.constexpr):
    if MASKED:
        return tl.load(ptrs, mask=idx < n)
    else:
        return tl.load(ptrs)


@triton.jit
def _st(ptrs, value, idx, n, MASKED: tl.constexpr):
    if MASKED:
        tl.store(ptrs, value, mask=idx < n)
    else:
        tl.store(ptrs, value)


@triton.jit
def _copy(dst, src, idx, n, MASKED: tl.constexpr):
    """``dst[i] = src[i]`` for the tile's pointers; ``idx`` (element indices) < ``n`` when masked."""
    _st(dst, _ld(src, idx, n, MASKED), idx, n, MASKED)


@triton.jit
def _reduce_one_shot_tile(out, stage, half, offs, n, token, WORLD: tl.constexpr, MASKED: tl.constexpr):
    acc = tl.zeros(offs.shape, tl.float32)
    for r in tl.static_range(WORLD):
        src = tl.multiple_of(dl.symm_at(stage, r), 16)  # symm_at loses the alignment fact
        acc += _ld(dl.consume_token(src + half + offs, token), offs, n, MASKED).to(tl.float32)
    _st(out + offs, acc.to(out.dtype.element_ty), offs, n, MASKED)


@jit(do_not_specialize=["n", "epoch"])
def all_reduce_one_shot_kernel(x, out, stage, signals, n, epoch, WORLD: tl.constexpr, HALF: tl.constexpr,
                               MAX_PROGRAMS: tl.constexpr, BLOCK: tl.constexpr):
    """``out = sum over ranks of x`` (``n`` elements). ``stage``: symmetric, ``2 * HALF``
    elements of x's dtype; ``signals``: the context's pad (region 0: ``WORLD * MAX_PROGRAMS``)."""
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
            _copy(mine + offs, x + offs, offs, n, False)
        else:
            _copy(mine + offs, x + offs, offs, n, True)
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
        acc += _ld(src, idx, n, MASKED).to(tl.float32)
    result = acc.to(out.dtype.element_ty)
    _st(out + idx, result, idx, n, MASKED)
    for r in tl.static_range(1, WORLD):
        peer_gather = tl.multiple_of(dl.symm_at(gather, (me + r) % WORLD), 16)
        _st(peer_gather + half + idx, result, idx, n, MASKED)


@jit(do_not_specialize=["n", "epoch", "shard_tiles"])
def all_reduce_two_shot_kernel(x, out, stage, gather, signals, n, epoch, shard_tiles, WORLD: tl.constexpr,
                               HALF: tl.constexpr, MAX_PROGRAMS: tl.constexpr, BLOCK: tl.constexpr):
    """``out = sum over ranks of x`` by reduce-scatter then all-gather. Shard ``s`` is elements
    ``[s * shard, (s + 1) * shard)``, ``shard = shard_tiles * BLOCK``. ``stage`` and ``gather``:
    symmetric, ``2 * HALF`` elements each (a half holds ``WORLD`` shards); ``signals``: regions 1
    and 2 of the context's pad."""
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
                _copy(dst + local, x + idx, idx, n, False)
            else:
                _copy(dst + local, x + idx, idx, n, True)
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
                _copy(out + idx, src + idx, idx, n, False)
            else:
                _copy(out + idx, src + idx, idx, n, True)


class AllReduceContext:
    """Symmetric staging, gather buffers and signals for AllReduce (sum) of up to ``max_bytes``
    bytes of ``dtype`` (float32, bfloat16 or float16), reused across calls.

    Collective: every rank creates it with the same arguments, in the same order as its other
    symmetric allocations. Creating it compiles and loads both kernels (no kernel may be loaded
    while a peer spins), then synchronises and passes a barrier, so every rank's signals are
    zeroed before any peer can signal them. Ranks must have the same GPU model (the grid is sized
    from the SM count). Memory: ``4 * max_bytes`` (rounded up to whole tiles) on the symmetric
    heap, plus ``3 * world * max_programs`` signals.

    Call with :meth:`run` (or use :func:`triton_dist.ops.all_reduce`). Every call must be made by
    every rank, in the same order, with the same ``numel`` and method.
    """

    BLOCK = 2048
    NUM_WARPS = 8
    DEFAULT_MAX_PROGRAMS = 128

    def __init__(self, max_bytes: int, dtype, *, max_programs: int | None = None):
        _runtime._require_initialized("AllReduceContext")
        import torch

        if not isinstance(dtype, torch.dtype) or str(dtype).replace("torch.", "") not in _DTYPES:
            raise TypeError(f"triton_dist AllReduceContext: dtype must be one of torch.float32, torch.bfloat16, "
                            f"torch.float16, got {dtype!r}")
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes <= 0:
            raise ValueError(f"triton_dist AllReduceContext: max_bytes must be a positive int, got {max_bytes!r}")
        self.dtype = dtype
        self.world = _runtime.world_size()
        self.rank = _runtime.rank()
        self.max_numel = max(1, max_bytes // dtype.itemsize)
        if self.max_numel >= 2**31 // 4:
            raise ValueError(f"triton_dist AllReduceContext: max_bytes={max_bytes} is too large "
                             f"(at most {2**31 // 4 - 1} elements; element counts are 32-bit kernel arguments)")
        self.max_bytes = self.max_numel * dtype.itemsize
        device = torch.device("cuda", torch.cuda.current_device())
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        if max_programs is None:
            max_programs = self.DEFAULT_MAX_PROGRAMS
        if isinstance(max_programs, bool) or not isinstance(max_programs, int) or max_programs <= 0:
            raise ValueError(f"triton_dist AllReduceContext: max_programs must be a positive int, got {max_programs!r}")
        # Every program of a grid must be resident at once (programs spin on their peers'
        # programs), so never more programs than SMs.
        self.max_programs = min(max_programs, sms)
        self.half = self.world * triton.cdiv(self.max_numel, self.world * self.BLOCK) * self.BLOCK
        self.stage = symm_empty((2 * self.half, ), dtype)
        self.gather = symm_empty((2 * self.half, ), dtype)
        self.pad = SignalPad(3 * self.world * self.max_programs)
        if self.world > 1:
            self.preload()
        torch.cuda.synchronize()
        _runtime.barrier()

    def _meta(self) -> dict:
        return dict(WORLD=self.world, HALF=self.half, MAX_PROGRAMS=self.max_programs, BLOCK=self.BLOCK,
                    num_warps=self.NUM_WARPS)

    def preload(self) -> None:
        """Compile and load both kernels with the specialisation of real calls (16-byte aligned
        tensors of this dtype; ``n``, ``epoch`` and ``shard_tiles`` unspecialised 32-bit ints)."""
        n = max(2, self.max_numel)  # the int type (i32) real calls have
        all_reduce_one_shot_kernel.preload(self.stage, self.gather, self.stage, self.pad.signals, n, 3,
                                           grid=(1, ), **self._meta())
        all_reduce_two_shot_kernel.preload(self.stage, self.gather, self.stage, self.gather, self.pad.signals, n, 3,
                                           3, grid=(1, ), **self._meta())

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
        # The preloaded variants assume 16-byte aligned pointers: a misaligned tensor would
        # compile and load another variant here, possibly while a peer spins.
        if x.data_ptr() % 16:
            x = x.clone()
        target = out if out.data_ptr() % 16 == 0 else x.new_empty(x.shape)
        epoch = self.pad.next_epoch()
        meta = self._meta()
        if method == "one_shot":
            grid = (min(triton.cdiv(n, self.BLOCK), self.max_programs), )
            all_reduce_one_shot_kernel[grid](x, target, self.stage, self.pad.signals, n, epoch, **meta)
        elif method == "two_shot":
            shard_tiles = triton.cdiv(n, self.world * self.BLOCK)
            grid = (min(shard_tiles, self.max_programs), )
            all_reduce_two_shot_kernel[grid](x, target, self.stage, self.gather, self.pad.signals, n, epoch,
                                             shard_tiles, **meta)
        else:
            raise ValueError(f"triton_dist AllReduceContext.run: method must be 'one_shot' or 'two_shot', "
                             f"got {method!r}")
        if target is not out:
            out.copy_(target)
