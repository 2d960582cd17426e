"""AllGather over the ranks of one node: every rank's ``x`` (``n`` elements, the same ``n`` on
every rank), concatenated in rank order into ``out`` (``world * n`` elements).

Three ways to move the data, one context (:class:`AllGatherContext`):

``"sm_push"`` (:func:`all_gather_push_kernel`): the tensor is cut into ``BLOCK``-element tiles;
program ``p`` of a grid of ``G`` programs owns tiles ``p, p + G, ...`` (the same on every rank,
since every rank has the same ``n``).

1. program ``p`` loads each of its tiles of ``x`` once and stores it into slot ``me`` of the
   symmetric ``gathered`` buffer of every rank (itself included; peers through ``dl.symm_at``) and
   into ``out``'s own slot; then it notifies signal ``(me, p)`` on every peer;
2. it waits for signal ``(r, p)`` from every peer ``r`` and copies its tiles of slot ``r`` of its
   own ``gathered`` buffer into ``out``.

   Signal layout (for consumers that start per chunk, e.g. AllGather+GEMM): on every rank, pad
   index ``r * MAX_PROGRAMS + p`` holds the epoch of the latest call whose tiles ``p, p + G, ...``
   of rank ``r`` have landed in slot ``r`` of this rank's ``gathered`` buffer (half ``epoch % 2``);
   see :meth:`AllGatherContext.signals_for` and :meth:`AllGatherContext.slot`.

``"ce_push"`` (copy engine, large messages; host code in :meth:`AllGatherContext._run_ce`): the
copies are ``cudaMemcpyAsync`` (``peer_tensor(...).copy_``) on the caller's stream, the signalling
tiny one-program kernels (:func:`all_gather_ce_signal_kernel`) between them:

1. wait until every peer has acknowledged copying out this rank's data of the previous
   ``ce_push`` call (the ``ce`` buffer has a single region, see below);
2. copy ``x`` into slot ``me`` of every peer's ``ce`` buffer (and, on a side stream, into ``out``'s
   own slot);
3. release-notify ``ready[me] = k`` on every peer, then acquire-wait ``ready[r] >= k`` from every
   peer (``k``: the context's device-side count of ``ce_push`` calls);
4. copy slot ``r`` of the local ``ce`` buffer into ``out`` for every peer ``r``;
5. release-notify ``ack[me] = k`` on every peer.

   Why the notify of step 3 publishes the copies of step 2: operations on one stream run in order,
   so the copy engine has finished the copies (their writes to the peer's memory are complete)
   before the notify kernel starts; the notify is a release at system scope after that, and the
   peer's acquire-wait of that value, followed (stream order again) by its copy-out, therefore
   observes the data. Symmetrically, a peer's ack (step 5) is released after its copy-out finished
   reading, so step 1 of the next call, an acquire, orders the next copies after those reads.
   ``ce_push`` uses its own buffer, counter and signals, so it needs nothing from the other
   methods' epochs; the acks replace the parity halves because the host cannot know the device
   counter's parity inside a replayed CUDA graph.

``"ll"`` (low-latency protocol, :func:`all_gather_ll_kernel`, up to :data:`LL_MAX_BYTES` per
rank): every 8-byte word written to a peer carries 4 bytes of payload (low half) and a 4-byte flag
(high half) derived from the epoch, written with one 64-bit ``st.relaxed.sys`` store (single-copy
atomic), so a receiver that sees the flag sees the payload: no signal, no fence. Receivers spin
with ``ld.relaxed.sys`` on every word of a tile until every flag is this call's, then extract the
payload. The buffer holds ``2x`` the payload and alternates halves by epoch parity like the others;
it is zeroed at creation and flags are never 0, so a stale word never matches.

Reuse between calls (``sm_push``, ``ll``): the epoch is the context's device call counter and
buffers alternate halves by its parity (see :mod:`triton_dist.kernels.context`). Inputs and
outputs need not be symmetric; only the context's buffers are.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language import core

from .. import language as dl
from .. import runtime as _runtime
from ..distributed_jit import jit
from ..language.signals import _settings, _timed_out
from ..symmetric import peer_tensor, symm_empty
from .context import CollectiveContext
from .tiles import load_tile, store_tile

LL_MAX_BYTES = 64 * 1024
"""The largest input (bytes per rank) the ``"ll"`` method takes."""

AUTO_LL_MAX_BYTES = LL_MAX_BYTES
"""``method="auto"`` uses ``"ll"`` up to this many bytes per rank (bench/results/h200-x2/allgather.json:
ll 5.8 us against sm_push 8.1 us at 32 KiB, even at 8 KiB)."""

AUTO_SM_MAX_BYTES = 32 << 20
"""``method="auto"`` uses ``"sm_push"`` up to this many bytes per rank, ``"ce_push"`` above
(bench/results/h200-x2/allgather.json: sm_push ahead up to 32 MiB, ce_push from 128 MiB)."""

LL_BLOCK = 512
"""8-byte LL words per tile (one program handles a tile at a time)."""

ALIGN_ELEMENTS = 8
"""Calls whose ``n`` is a multiple of this use the variant that knows every rank's slot of
``out`` starts 16-byte aligned (so its stores are vectorised)."""

# Pad layout: [0, W*MP) sm_push ready signals (r, p); then W ce_push ready signals; then W acks.


def _ce_ready_base(world, max_programs):
    return world * max_programs


def _ce_ack_base(world, max_programs):
    return world * max_programs + world


# --------------------------------------------------------------------------------------------
# sm_push


@triton.jit
def _push_tile(x, out, gathered, half, offs, n, stride, me, WORLD: tl.constexpr, SLOT: tl.constexpr,
               MASKED: tl.constexpr):
    v = load_tile(x + offs, offs, n, MASKED)
    store_tile(out + me.to(tl.int64) * stride + offs, v, offs, n, MASKED)
    for r in tl.static_range(WORLD):
        dst = tl.multiple_of(dl.symm_at(gathered, (me + r) % WORLD), 16)  # symm_at loses the alignment fact
        store_tile(dst + half + me.to(tl.int64) * SLOT + offs, v, offs, n, MASKED)


@jit(do_not_specialize=["n"])
def all_gather_push_kernel(x, out, gathered, signals, n, epoch_ptr, WORLD: tl.constexpr, SLOT: tl.constexpr,
                           MAX_PROGRAMS: tl.constexpr, BLOCK: tl.constexpr, ALIGNED: tl.constexpr):
    """``out[r * n:(r + 1) * n] = x of rank r`` for every rank. ``gathered``: symmetric, ``2 *
    WORLD * SLOT`` elements of x's dtype (half ``epoch % 2``, slot ``r`` = rank ``r``'s data);
    ``signals``: the context's pad (region 0: ``WORLD * MAX_PROGRAMS``); ``epoch_ptr``: the
    context's device call counter. ``ALIGNED``: ``n % ALIGN_ELEMENTS == 0``."""
    epoch = tl.load(epoch_ptr)
    me = dl.rank()
    pid = tl.program_id(0)
    grid = tl.num_programs(0)
    lanes = tl.arange(0, BLOCK)
    half = (epoch % 2).to(tl.int64) * (WORLD * SLOT)
    tiles = tl.cdiv(n, BLOCK)
    if ALIGNED:
        stride = ((n // 8) * 8).to(tl.int64)  # == n; tells the compiler slots of out are aligned
    else:
        stride = n.to(tl.int64)

    # 1. Push: each tile of x, loaded once, goes to slot `me` of every rank and to out's own slot.
    for t in range(pid, tiles, grid):
        offs = t.to(tl.int64) * BLOCK + lanes
        if (t.to(tl.int64) + 1) * BLOCK <= n:
            _push_tile(x, out, gathered, half, offs, n, stride, me, WORLD, SLOT, False)
        else:
            _push_tile(x, out, gathered, half, offs, n, stride, me, WORLD, SLOT, True)
    for r in tl.static_range(1, WORLD):
        dl.notify(signals + me * MAX_PROGRAMS + pid, (me + r) % WORLD, epoch, "set", "intra_node")

    # 2. Copy out every peer's tiles of this program once that peer's program p has signalled.
    for k in tl.static_range(1, WORLD):
        src = (me + k) % WORLD
        token = dl.wait(signals + src * MAX_PROGRAMS + pid, 1, "sys", "acquire", epoch)
        slot = dl.consume_token(gathered + half + src.to(tl.int64) * SLOT, token)
        dst = out + src.to(tl.int64) * stride
        for t in range(pid, tiles, grid):
            offs = t.to(tl.int64) * BLOCK + lanes
            if (t.to(tl.int64) + 1) * BLOCK <= n:
                store_tile(dst + offs, load_tile(slot + offs, offs, n, False), offs, n, False)
            else:
                store_tile(dst + offs, load_tile(slot + offs, offs, n, True), offs, n, True)


# --------------------------------------------------------------------------------------------
# ce_push: the signalling kernels between the copy-engine copies


@jit
def all_gather_ce_signal_kernel(signals, k_ptr, PHASE: tl.constexpr, WORLD: tl.constexpr, READY: tl.constexpr,
                                ACK: tl.constexpr):
    """One program. ``k_ptr``: the context's device count of ``ce_push`` calls (this call's ``k``).
    ``PHASE`` 0: wait for ``ack[r] >= k - 1`` from every peer (it finished reading this rank's
    previous data); 1: notify ``ready[me] = k`` on every peer, then wait for ``ready[r] >= k`` from
    every peer; 2: notify ``ack[me] = k`` on every peer. ``READY``/``ACK``: pad offsets."""
    k = tl.load(k_ptr)
    me = dl.rank()
    if PHASE == 0:
        for r in tl.static_range(1, WORLD):
            dl.wait(signals + ACK + (me + r) % WORLD, 1, "sys", "acquire", k - 1)
    elif PHASE == 1:
        for r in tl.static_range(1, WORLD):
            dl.notify(signals + READY + me, (me + r) % WORLD, k, "set", "intra_node")
        for r in tl.static_range(1, WORLD):
            dl.wait(signals + READY + (me + r) % WORLD, 1, "sys", "acquire", k)
    else:
        for r in tl.static_range(1, WORLD):
            dl.notify(signals + ACK + me, (me + r) % WORLD, k, "set", "intra_node")


# --------------------------------------------------------------------------------------------
# ll


@core.builtin
def _globaltimer(_semantic=None):
    return core.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.uint64, is_pure=False,
                                       pack=1, _semantic=_semantic)


@triton.jit
def _ll_words(x, w, n, ELEMS: tl.constexpr):
    """The 32-bit payloads of LL words ``w`` (zero-extended to int64; 0 past the data)."""
    if ELEMS == 1:
        v = tl.load(x.to(tl.pointer_type(tl.int32)) + w, mask=w < n, other=0)
        return v.to(tl.uint32, bitcast=True).to(tl.int64)
    else:
        e = w[:, None] * 2 + tl.arange(0, 2)[None, :]
        v = tl.load(x.to(tl.pointer_type(tl.int16)) + e, mask=e < n, other=0)
        lo, hi = tl.split(v)
        return lo.to(tl.uint16, bitcast=True).to(tl.int64) | (hi.to(tl.uint16, bitcast=True).to(tl.int64) << 16)


@triton.jit
def _ll_store(out, w, n, payload, ELEMS: tl.constexpr):
    """Store the payloads (int64, low 32 bits used) of words ``w`` as elements of ``out``."""
    if ELEMS == 1:
        tl.store(out.to(tl.pointer_type(tl.int32)) + w, payload.to(tl.int32), mask=w < n)
    else:
        e = w[:, None] * 2 + tl.arange(0, 2)[None, :]
        lo = payload.to(tl.int16)
        hi = (payload >> 16).to(tl.int16)
        tl.store(out.to(tl.pointer_type(tl.int16)) + e, tl.join(lo, hi), mask=e < n)


@triton.jit
def _ll_own_copy(x, out, w, n, ELEMS: tl.constexpr):
    if ELEMS == 1:
        tl.store(out.to(tl.pointer_type(tl.int32)) + w,
                 tl.load(x.to(tl.pointer_type(tl.int32)) + w, mask=w < n), mask=w < n)
    else:
        e = w[:, None] * 2 + tl.arange(0, 2)[None, :]
        tl.store(out.to(tl.pointer_type(tl.int16)) + e, tl.load(x.to(tl.pointer_type(tl.int16)) + e, mask=e < n),
                 mask=e < n)


@triton.jit
def _ll_receive(ptrs, valid, flag, lanes, TIMEOUT_NS: tl.constexpr):
    """Spin on the LL words at ``ptrs`` until every valid one carries ``flag`` in its high half;
    returns the words. On timeout, reports (word index in the tile, its address, expected flag,
    observed flag) like a timed-out ``dl.wait`` and traps."""
    vals = dl.ld(ptrs, "sys", "relaxed")
    ok = (((vals >> 32) & 0xFFFFFFFF) == flag) | (valid == 0)
    pending = tl.sum((ok == 0).to(tl.int32), 0)
    if TIMEOUT_NS == 0:
        while pending > 0:
            vals = dl.ld(ptrs, "sys", "relaxed")
            ok = (((vals >> 32) & 0xFFFFFFFF) == flag) | (valid == 0)
            pending = tl.sum((ok == 0).to(tl.int32), 0)
    else:
        start = _globaltimer()
        waited = start - start
        while (pending > 0) & (waited < TIMEOUT_NS):
            vals = dl.ld(ptrs, "sys", "relaxed")
            ok = (((vals >> 32) & 0xFFFFFFFF) == flag) | (valid == 0)
            pending = tl.sum((ok == 0).to(tl.int32), 0)
            waited = _globaltimer() - start
        if pending > 0:
            first = tl.min(tl.where(ok, lanes.shape[0], lanes), 0)
            observed = tl.sum(tl.where(lanes == first, (vals >> 32) & 0xFFFFFFFF, 0), 0)
            bad = tl.sum(tl.where(lanes == first, ptrs.to(tl.int64), 0), 0)
            _timed_out(first, bad.to(tl.pointer_type(tl.int64)), flag, observed, waited)
    return vals


@jit(do_not_specialize=["n", "words"])
def all_gather_ll_kernel(x, out, ll, n, words, epoch_ptr, WORLD: tl.constexpr, LL_SLOT: tl.constexpr,
                         BLOCK_W: tl.constexpr, ELEMS: tl.constexpr):
    """``out[r * n:(r + 1) * n] = x of rank r`` through the LL protocol. ``ll``: symmetric int64,
    ``2 * WORLD * LL_SLOT`` words, zeroed at creation; ``words``: LL words per rank (``n`` elements
    of ``4 / ELEMS`` bytes, 4 payload bytes a word); ``epoch_ptr``: the context's call counter."""
    TIMEOUT_NS, DEBUG_BARRIERS = _settings(None)
    epoch = tl.load(epoch_ptr)
    # The flag: never 0 (the buffer starts zeroed), and different for epochs e and e - 2 (the
    # previous user of this half).
    flag = (epoch % 0xFFFFFFFF) + 1
    high = flag << 32
    me = dl.rank()
    pid = tl.program_id(0)
    grid = tl.num_programs(0)
    lanes = tl.arange(0, BLOCK_W)
    half = (epoch % 2).to(tl.int64) * (WORLD * LL_SLOT)
    tiles = tl.cdiv(words, BLOCK_W)
    n64 = n.to(tl.int64)

    # 1. Send: one 64-bit relaxed system-scope store per word (payload | flag << 32) to every peer.
    # Words past `words` in the last tile are written too (they stay inside the slot: LL_SLOT is
    # whole tiles) and ignored by the receiver.
    for t in range(pid, tiles, grid):
        w = t.to(tl.int64) * BLOCK_W + lanes
        packed = _ll_words(x, w, n, ELEMS) | high
        _ll_own_copy(x, out + me.to(tl.int64) * n64, w, n, ELEMS)
        for r in tl.static_range(1, WORLD):
            dst = dl.symm_at(ll, (me + r) % WORLD) + half + me.to(tl.int64) * LL_SLOT
            dl.st(dst + w, packed, "sys", "relaxed")

    # 2. Receive: spin on each tile of every peer's slot until all its flags are this call's.
    for k in tl.static_range(1, WORLD):
        src = (me + k) % WORLD
        slot = ll + half + src.to(tl.int64) * LL_SLOT
        for t in range(pid, tiles, grid):
            w = t.to(tl.int64) * BLOCK_W + lanes
            vals = _ll_receive(slot + w, (w < words).to(tl.int32), flag, lanes, TIMEOUT_NS)
            _ll_store(out + src.to(tl.int64) * n64, w, n, vals & 0xFFFFFFFF, ELEMS)


# --------------------------------------------------------------------------------------------


class AllGatherContext(CollectiveContext):
    """Symmetric buffers and signals for AllGather of up to ``max_bytes`` bytes per rank (the
    INPUT size) of ``dtype`` (float32, bfloat16 or float16), reused across calls.

    Methods (:attr:`METHODS`): ``"sm_push"`` (Triton stores into every peer's buffer, per-program
    signals), ``"ce_push"`` (copy engine: ``cudaMemcpyAsync`` into peers' buffers, for large
    messages), ``"ll"`` (low-latency protocol, flags inside the data, up to :data:`LL_MAX_BYTES`
    per rank) and ``"auto"`` (``ll`` up to :data:`AUTO_LL_MAX_BYTES`, ``sm_push`` up to
    :data:`AUTO_SM_MAX_BYTES`, ``ce_push`` above). See the module notes for each protocol.

    Collective: every rank creates it with the same arguments, in the same order as its other
    symmetric allocations; creating it compiles and loads every kernel. Memory on the symmetric
    heap: ``gathered`` ``2 * world * max_bytes`` (sm_push), ``ce`` ``world * max_bytes``
    (ce_push), ``ll`` ``2 * world * 2 * min(max_bytes, LL_MAX_BYTES)`` (all rounded up to whole
    tiles), plus ``3 * world * max_programs`` signals.

    Call with :meth:`run` (or :func:`triton_dist.ops.all_gather`). Every call must be made by every
    rank, in the same order, with the same ``numel`` and method. Calls may be captured in a CUDA
    graph and replayed.
    """

    METHODS = ("auto", "sm_push", "ce_push", "ll")

    def __init__(self, max_bytes: int, dtype, *, max_programs: int | None = None):
        import torch

        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes <= 0:
            raise ValueError(f"triton_dist AllGatherContext: max_bytes must be a positive int, got {max_bytes!r}")
        itemsize = dtype.itemsize if isinstance(dtype, torch.dtype) else 1
        max_numel = max(1, max_bytes // itemsize)
        world = _runtime.world_size() if _runtime.is_initialized() else 1
        slot = triton.cdiv(max_numel, self.BLOCK) * self.BLOCK
        super().__init__("AllGatherContext", dtype, max_numel, {"gathered": world * slot}, 3 * world, max_programs)
        self.slot_numel = slot
        """Elements per rank slot of ``gathered`` (and of ``ce``)."""
        self.ce = symm_empty((world * slot, ), dtype)
        """The copy-engine method's receive buffer: one region of ``world`` slots."""
        self.ll_max_bytes = min(self.max_bytes, LL_MAX_BYTES)
        self.ll_slot = triton.cdiv(triton.cdiv(self.ll_max_bytes, 4), LL_BLOCK) * LL_BLOCK
        self.ll = symm_empty((2 * world * self.ll_slot, ), torch.int64)
        """The LL buffer: two halves of ``world`` slots of ``ll_slot`` 8-byte words, zeroed."""
        self.ll.zero_()
        self.ce_calls = torch.zeros(1, dtype=torch.int64, device=self.calls.device)
        """The device-side count of ``ce_push`` calls (their ``k``)."""
        self._ce_peers = [peer_tensor(self.ce, r) if r != self.rank else self.ce for r in range(self.world)]
        self._side = torch.cuda.Stream(device=self.calls.device)
        self.ready()

    # ---------------------------------------------------------------- introspection

    def signals_for(self, rank: int):
        """The ``sm_push`` ready signals from ``rank`` on this rank: a uint64 tensor of
        ``max_programs`` signals; entry ``p`` (pad index ``rank * max_programs + p``) holds the
        epoch of the latest call whose tiles ``p, p + G, p + 2G, ...`` (``BLOCK`` elements each, ``G``
        the call's grid) of ``rank``'s input are in :meth:`slot` ``(rank, epoch % 2)``."""
        if not 0 <= rank < self.world:
            raise IndexError(f"triton_dist AllGatherContext: rank {rank} out of range for world {self.world}")
        return self.pad.signals[rank * self.max_programs:(rank + 1) * self.max_programs]

    def slot(self, rank: int, half: int):
        """This rank's ``gathered`` slot of ``rank`` in ``half`` (``max_numel`` elements; a call of
        ``n`` elements fills the first ``n``)."""
        start = (half * self.world + rank) * self.slot_numel
        return self.gathered[start:start + self.max_numel]

    # ---------------------------------------------------------------- kernels

    def _push_meta(self, aligned: bool) -> dict:
        return self.meta(SLOT=self.slot_numel, ALIGNED=aligned)

    def _ll_meta(self) -> dict:
        return dict(WORLD=self.world, LL_SLOT=self.ll_slot, BLOCK_W=LL_BLOCK, ELEMS=4 // self.dtype.itemsize,
                    num_warps=self.NUM_WARPS)

    def _ce_meta(self, phase: int) -> dict:
        return dict(PHASE=phase, WORLD=self.world, READY=_ce_ready_base(self.world, self.max_programs),
                    ACK=_ce_ack_base(self.world, self.max_programs), num_warps=1)

    def preload(self) -> None:
        """Compile and load every kernel with the specialisation of real calls (16-byte aligned
        tensors of this dtype; ``n`` and ``words`` unspecialised 32-bit ints)."""
        n = max(2, self.max_numel)  # the int type (i32) real calls have
        for aligned in (False, True):
            all_gather_push_kernel.preload(self.gathered, self.gathered, self.gathered, self.pad.signals, n,
                                           self.calls, grid=(1, ), **self._push_meta(aligned))
        all_gather_ll_kernel.preload(self.gathered, self.gathered, self.ll, n, n, self.calls, grid=(1, ),
                                     **self._ll_meta())
        for phase in (0, 1, 2):
            all_gather_ce_signal_kernel.preload(self.pad.signals, self.ce_calls, grid=(1, ), **self._ce_meta(phase))

    def method_for(self, nbytes: int) -> str:
        """The method ``"auto"`` picks for ``nbytes`` bytes per rank."""
        if nbytes <= min(AUTO_LL_MAX_BYTES, self.ll_max_bytes):
            return "ll"
        return "sm_push" if nbytes <= AUTO_SM_MAX_BYTES else "ce_push"

    # ---------------------------------------------------------------- calls

    def run(self, x, out, method: str = "auto") -> None:
        """``out[r * n:(r + 1) * n] = x of rank r`` with ``method`` (see :attr:`METHODS`), on the
        current stream. ``x``: contiguous CUDA tensor of this dtype, ``n = x.numel() <= max_numel``;
        ``out``: contiguous, ``world * n`` elements (both validated by
        :func:`triton_dist.ops.all_gather`, not here)."""
        n = x.numel()
        if method not in self.METHODS:
            raise ValueError(f"triton_dist AllGatherContext.run: method must be one of {self.METHODS}, "
                             f"got {method!r}")
        if n == 0:
            return
        nbytes = n * self.dtype.itemsize
        if method == "auto":
            method = self.method_for(nbytes)
        if method == "ll" and nbytes > self.ll_max_bytes:
            raise ValueError(f"triton_dist all_gather: method 'll' takes at most {self.ll_max_bytes} bytes per rank, "
                             f"got {nbytes}; use 'sm_push', 'ce_push' or 'auto'")
        x = x.reshape(-1)
        if self.world == 1:
            out.view(-1)[:n].copy_(x)
            return
        if method == "ce_push":
            self._run_ce(x, out.view(-1), n)
            return
        # The preloaded variants assume 16-byte aligned pointers: a misaligned tensor would
        # compile and load another variant here, possibly while a peer spins.
        if x.data_ptr() % 16:
            x = x.clone()
        target = out if out.data_ptr() % 16 == 0 else out.new_empty(out.shape)
        epoch_ptr = self.next_call()
        if method == "sm_push":
            grid = self.grid(triton.cdiv(n, self.BLOCK))
            all_gather_push_kernel[grid](x, target, self.gathered, self.pad.signals, n, epoch_ptr,
                                         **self._push_meta(n % ALIGN_ELEMENTS == 0))
        else:
            words = triton.cdiv(nbytes, 4)
            grid = self.grid(triton.cdiv(words, LL_BLOCK))
            all_gather_ll_kernel[grid](x, target, self.ll, n, words, epoch_ptr, **self._ll_meta())
        if target is not out:
            out.copy_(target)

    def _run_ce(self, x, out, n: int) -> None:
        """The ``ce_push`` method (see the module notes for the protocol and its ordering)."""
        import torch

        me, slot = self.rank, self.slot_numel
        stream = torch.cuda.current_stream()
        self.ce_calls.add_(1)
        # Own slot of out on a side stream, overlapping the peer copies (joined before returning).
        self._side.wait_stream(stream)
        with torch.cuda.stream(self._side):
            out[me * n:(me + 1) * n].copy_(x)
        all_gather_ce_signal_kernel[(1, )](self.pad.signals, self.ce_calls, **self._ce_meta(0))
        for k in range(1, self.world):
            r = (me + k) % self.world
            self._ce_peers[r][me * slot:me * slot + n].copy_(x)
        all_gather_ce_signal_kernel[(1, )](self.pad.signals, self.ce_calls, **self._ce_meta(1))
        for k in range(1, self.world):
            r = (me + k) % self.world
            out[r * n:(r + 1) * n].copy_(self.ce[r * slot:r * slot + n])
        all_gather_ce_signal_kernel[(1, )](self.pad.signals, self.ce_calls, **self._ce_meta(2))
        stream.wait_stream(self._side)
