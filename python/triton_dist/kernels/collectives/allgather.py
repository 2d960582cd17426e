"""AllGather: every rank's ``x`` (``n`` elements, the same ``n`` on
every rank), concatenated in rank order into ``out`` (``world * n`` elements).

Several ways to move the data, one context (:class:`AllGatherContext`):

``"sm_push"`` (:func:`all_gather_push_kernel`): the tensor is cut into ``BLOCK``-element tiles;
program ``p`` of a grid of ``G`` programs owns tiles ``p, p + G, ...`` (the same on every rank,
since every rank has the same ``n``).

1. program ``p`` loads each of its tiles of ``x`` once and stores it into slot ``me`` of the
   symmetric ``gathered`` buffer of every rank (itself included; peers through ``dl.symm_at``) and
   into ``out``'s own slot; then it notifies signal ``(me, p)`` on every peer;
2. it waits for signal ``(r, p)`` from every peer ``r`` and copies its tiles of slot ``r`` of its
   own ``gathered`` buffer into ``out``.

   Signal layout (for consumers that start per chunk, e.g. AllGather+GEMM): on every rank, pad
   index ``r * max_programs + p`` holds the epoch of the latest call whose tiles ``p, p + G, ...``
   of rank ``r`` have landed in slot ``r`` of this rank's ``gathered`` buffer (half ``epoch % 2``);
   see :meth:`AllGatherContext.signals_for` and :meth:`AllGatherContext.slot`. A consumer takes
   the call's epoch in stream order, not from ``calls`` while the kernel runs: the kernel moves
   ``calls[0]`` from ``e - 1`` to ``e`` as its last program enters.

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
rank): every 8-byte word written to a peer carries its payload and the call's flag, written with
one 64-bit ``st.relaxed.sys`` store, and receivers spin on the words themselves: no signal, no
fence (:mod:`triton_dist.kernels.common.ll_protocol`). The buffer holds ``2x`` the payload and alternates
halves by epoch parity like the others.

Reuse between calls (``sm_push``, ``ll``, ``ring``): the epoch is the context's device call
counter and buffers alternate halves by its parity (see :mod:`triton_dist.kernels.common.context`).
Inputs and outputs need not be symmetric; only the context's buffers are.

Methods added after the first GPU run (``ce_push`` spent ~30 % of its time on the copy-out from
``ce`` into ``out`` after the transfer, at 256 MiB per rank); they passed their tests on 2 x H200
and are measured in bench/results/h200-x2/allgather.json (at 256 MiB per rank ``sm_zero_copy``
was the fastest, then ``ce_zero_copy``, ``ce_push`` and ``ce_chunked``):

``"ce_chunked"`` (:meth:`AllGatherContext._run_ce_chunked`): ``ce_push`` with the copy-out
overlapped with the transfer. Same staging buffer ``ce``, counter ``ce_calls`` and phase-0 wait /
phase-2 ack as ``ce_push`` (so the two interleave freely: every call of either waits for
``ack[r] >= k - 1`` and sends ``ack[me] = k``). Each peer's transfer is cut into ``C`` chunks
(:meth:`AllGatherContext.chunk_numel`, at least :data:`CE_CHUNK_BYTES`, at most
:data:`CE_MAX_CHUNKS`). Streams: the caller's ``S``, a send stream ``T``, a notify stream ``N``:

1. ``S``: ``ce_calls += 1``; phase 0 (wait ``ack[r] >= k - 1``); ``T`` waits for ``S``;
2. ``S``: the copy-out kernel (:func:`all_gather_ce_copy_out_kernel`, :data:`CE_COPY_PROGRAMS`
   programs): for each chunk ``c``, for each peer ``r``, acquire-wait ``chunk_ready[r][c] >= k``,
   then copy that chunk of slot ``r`` of ``ce`` into ``out``;
3. ``T``: for each chunk: the copies of chunk ``c`` into every peer's ``ce`` slot ``me``, then an
   event; ``N`` waits for the event and runs :func:`all_gather_ce_chunk_signal_kernel`
   (release-notify ``chunk_ready[me][c] = k`` on every peer). The copy engine goes from chunk to
   chunk without a kernel in between; the notifies run beside it;
4. ``S``: phase 2 (``ack[me] = k``, after the copy-out read everything); ``S`` joins ``T``, ``N``
   and the own-slot side stream.

   Ordering: ``N``'s notify of chunk ``c`` starts after the event, i.e. after the copy engine
   finished chunk ``c``'s writes, and releases at system scope: the argument of ``ce_push``, with
   an event edge in place of same-stream order. ``chunk_ready`` only grows and the peer sends call
   ``k + 1``'s chunks only after this rank's ack of ``k``, so a value ``>= k`` is this call's.
   Everything is stream work on the device counter: a CUDA graph replays it correctly.

``"ce_zero_copy"`` and ``"sm_zero_copy"`` (``out`` symmetric): no staging, no copy-out: each rank
writes ``x`` straight into slot ``me`` of every rank's ``out`` (``peer_tensor(out, r)`` copies on
the caller's stream; or :func:`all_gather_zero_copy_kernel`, whose programs store each tile into
every rank's ``out``). They share the counter ``zc_calls`` (``k``) and use ``pad_ext``:

1. handshake "ready": notify ``ready[me] = k`` on every peer, wait ``ready[r] >= k`` from every
   peer (``sm_zero_copy``: per program ``p``, signals ``(r, p)``);
2. the copies (stores) into every peer's ``out`` (and the own slot: the side stream for
   ``ce_zero_copy``, the same stores for ``sm_zero_copy``);
3. "done": notify ``done[me] = k`` (release, after the copies completed: same argument as
   ``ce_push``), wait ``done[r] >= k`` (every peer's data has landed in my ``out``).

   Why the handshake of step 1: ``out`` belongs to the user between calls - the user may still
   read call ``k``'s result, or write the tensor, or pass it to another op, in stream order after
   call ``k`` returned. A peer may finish call ``k`` and start ``k + 1`` while this rank is still
   in call ``k`` (it only needed my ``done``), or before this rank's user is done with ``out``.
   ``ready[me] = k + 1`` is released by this rank's stream only when call ``k + 1`` has started
   on it, i.e. after every earlier operation on that stream (the user's uses of ``out``) has
   finished; the peer's copies come after its acquire of that value. So no peer writes into my
   ``out`` before I handed it over by calling, and the tensor may differ from call to call. The
   signals only grow, and a peer sets ``ready``/``done`` to ``k + 1`` only after it passed call
   ``k`` (which needed my ``done[me] = k``), so ``>= k`` identifies call ``k`` (the per-program
   signals of ``sm_zero_copy`` likewise: the same grid on every rank, and program ``p``'s done
   covers the same tiles on both sides). ``ce_zero_copy`` and ``sm_zero_copy`` use their own
   regions, so sharing ``zc_calls`` is safe; they touch no buffer of the other methods and none
   of their signals.

   The requirement, like every symmetric allocation: every rank passes a symmetric ``out``
   (:func:`triton_dist.symm_empty`, or a view of one) at the same offset of the same allocation
   on every rank (peer ``r``'s slot is addressed through this rank's ``out``), for every call
   that uses a zero-copy method. ``"auto"`` decides on ``out`` being symmetric on the calling
   rank: if some ranks pass a symmetric ``out`` and others not, the ranks pick different
   protocols and wait for each other forever (or until the configured wait timeout traps).

``"ce_pull"`` (copy engine, pull mode; :meth:`AllGatherContext._run_ce`): each rank publishes
its ``x`` in slot ``me`` of its own ``ce`` buffer and every rank's copy engine reads the peers'
slots straight into ``out``, over NVLink. Counter ``pull_calls`` (``k``), signals ``published``
and ``pulled`` in ``pad_ext``, the signal kernel of ``ce_push`` with those regions:

1. wait until every peer has signalled ``pulled[r] >= k - 1`` (it copied out this rank's previous
   data), then copy ``x`` into slot ``me`` of the local ``ce`` (and, on the side stream, into
   ``out``'s own slot);
2. notify ``published[me] = k`` on every peer, wait for ``published[r] >= k`` from every peer;
3. copy slot ``r`` of rank ``r``'s ``ce`` into ``out`` for every peer ``r``;
4. notify ``pulled[me] = k`` on every peer.

   The ordering argument is ``ce_push``'s, with the copies reading instead of writing: the notify
   of step 2 is released after the publishing copy completed (stream order), the peer's copy of
   step 3 follows its acquire; the notify of step 4 follows the reading copies. No cycle: step 1
   of call ``k`` needs only signals of call ``k - 1``. Slot ``me`` of rank ``me``'s ``ce`` is used
   by no other method (``ce_push`` and ``ce_chunked`` write a rank's slots of its peers, and read
   those), so ``ce_pull`` mixes freely with them.

``"ring"`` (:func:`~triton_dist.kernels.common.ring.all_gather_ring_kernel`, for machines without a full
mesh): ``WORLD - 1`` steps in which each rank forwards to rank ``me + 1`` the chunk it received
at the step before, through ``gathered`` (halves and tiles as ``sm_push``, its own signal region);
the schedule and why the halves stay safe are in :mod:`triton_dist.kernels.common.ring`.
"""

from __future__ import annotations

from ... import runtime as _runtime
from ...signals import SignalPad
from ...symmetric import peer_tensor, symm_empty
from ..common import call_counter as _call_counter
from ..common import reach as _reach
from ..common.chunks import chunk_and_grid
from ..common.context import CollectiveContext, OneRankCopy
from ..common.ll_buffer import ll_buffer
from ..common.launch_plan import OUT, X, LaunchPlan
from ..common.ll_protocol import LL_BLOCK
from ..common.ring import all_gather_ring_kernel
from ..common.signal_layout import SignalLayout
from ..common.streams import side_stream, wait_for
from . import policy as _policy
from .allgather_2d import all_gather_2d_kernel, all_gather_ll_2d_kernel
from .allgather_kernels import (all_gather_ce_chunk_signal_kernel, all_gather_ce_copy_out_kernel,
                                all_gather_ce_signal_kernel, all_gather_ll_kernel, all_gather_push_kernel,
                                all_gather_zero_copy_kernel)
from ..common.host_math import cdiv

LL_MAX_BYTES = 64 * 1024
"""The largest input (bytes per rank) the ``"ll"`` method takes."""

ALIGN_ELEMENTS = 8
"""Calls whose ``n`` is a multiple of this use the variant that knows every rank's slot of
``out`` starts 16-byte aligned (so its stores are vectorised)."""

CE_CHUNK_BYTES = 8 << 20
"""``"ce_chunked"``: the smallest chunk (bytes per rank) a transfer is cut into; an input of
``nbytes`` goes in ``max(1, min(CE_MAX_CHUNKS, nbytes // CE_CHUNK_BYTES))`` chunks of equal size
(rounded up to whole ``BLOCK`` tiles; the last one takes the rest). Not measured yet: 8 MiB is
~22 us on the link, against ~2-4 us for a signal kernel and the host's per-chunk launches (the
chunk count is capped so the host keeps up outside CUDA graphs too)."""

CE_MAX_CHUNKS = 16
"""``"ce_chunked"``: at most this many chunks per call (signals: ``world * CE_MAX_CHUNKS``)."""

CE_COPY_PROGRAMS = 32
"""``"ce_chunked"``: programs of the copy-out kernel (they spin most of the time; 32 SMs copy a
chunk out of the staging buffer far faster than the link fills it)."""

def _layouts(world: int, max_programs: int) -> tuple[SignalLayout, SignalLayout]:
    """The regions of the context's two pads (the second, ``pad_ext``, holds the methods added after
    the first GPU run). Index ``r`` of a per-rank region is rank ``r``'s signal; ``r * MP + p``
    (``MP``: ``max_programs``) program ``p``'s of rank ``r``; ``r * CE_MAX_CHUNKS + c`` chunk ``c``'s."""
    main = SignalLayout(("sm_push_ready", world * max_programs),  # (r, p): r's tiles p, p + G, ... landed
                        ("ce_push_ready", world), ("ce_push_ack", world),
                        ("ring", (world - 1) * max_programs))  # (step, p): :mod:`triton_dist.kernels.common.ring`
    ext = SignalLayout(("zc_ready", world),  # ce_zero_copy: "ready to receive into out"
                       ("zc_done", world),  # ce_zero_copy: "my data is in your out"
                       ("chunk_ready", world * CE_MAX_CHUNKS),  # ce_chunked: chunk c of rank r is in my ce slot r
                       ("smz_ready", world * max_programs),  # sm_zero_copy: ready to receive
                       ("smz_done", world * max_programs),  # sm_zero_copy: done
                       ("published", world),  # ce_pull: "my data is published in my ce slot"
                       ("pulled", world),  # ce_pull: "I have copied your data out"
                       ("node_ready", world * max_programs))  # 2d: (r, p), :mod:`.allgather_2d`
    return main, ext


SIGNALS_PER_PROGRAM = 4
"""The main pad's signals per program slot and rank: its layout fits for any ``max_programs >= 1``."""


class AllGatherContext(CollectiveContext):
    """Symmetric buffers and signals for AllGather of up to ``max_bytes`` bytes per rank (the
    INPUT size) of ``dtype`` (float32, bfloat16 or float16), reused across calls.

    Methods (:attr:`METHODS`): ``"sm_push"`` (Triton stores into every peer's buffer, per-program
    signals), ``"ce_push"`` (copy engine: ``cudaMemcpyAsync`` into peers' buffers, for large
    messages), ``"ll"`` (low-latency protocol, flags inside the data, up to :data:`LL_MAX_BYTES`
    per rank), ``"ce_chunked"`` (``ce_push`` in chunks, the copy-out overlapped with the
    transfer), ``"ce_zero_copy"`` / ``"sm_zero_copy"`` (``out`` must be symmetric, the same
    layout on every rank: peers write into it directly, no staging), ``"ring"`` (around the ring
    ``r -> r + 1`` through ``gathered``, :mod:`triton_dist.kernels.common.ring`: for machines without a
    full mesh; never chosen by ``"auto"``, since every machine measured so far is one),
    ``"ce_pull"`` (copy engine, each rank reads the peers' published inputs; not chosen by
    ``"auto"`` until measured), ``"2d"`` (across nodes, then within: NVSHMEM puts to the other
    nodes, NVLink stores in the node, :mod:`~triton_dist.kernels.collectives.allgather_2d`; the
    only method whose loads and stores stay within a node, so ``"auto"``'s choice for a world of
    several nodes), ``"ll_2d"`` (the same schedule through the LL protocol, up to
    :data:`LL_MAX_BYTES` per rank: ``"auto"``'s choice across nodes for small inputs) and
    ``"auto"`` (decided by :func:`triton_dist.kernels.collectives.policy.all_gather_method`:
    ``ll`` for small inputs, ``sm_push`` up to tens of MiB, a copy-engine method above).
    See the module notes for each protocol. ``ce_chunk_bytes``: ``ce_chunked``'s smallest chunk
    (tests use small ones to get many chunks from small inputs).

    Collective: every rank creates it with the same arguments, in the same order as its other
    symmetric allocations; creating it compiles and loads every kernel. Memory on the symmetric
    heap: ``gathered`` ``2 * world * max_bytes`` (sm_push, ring), ``ce`` ``world * max_bytes``
    (ce_push, ce_chunked, ce_pull), ``ll`` ``2 * world * 2 * min(max_bytes, LL_MAX_BYTES)`` (all
    rounded up to whole tiles), plus ``4 * world * max_programs`` signals and ``pad_ext``'s
    ``world * (4 + 3 * max_programs + CE_MAX_CHUNKS)``.

    Call with :meth:`run` (or :func:`triton_dist.ops.all_gather`). Every call must be made by every
    rank, in the same order, with the same ``numel`` and method. Calls may be captured in a CUDA
    graph and replayed.
    """

    METHODS = ("auto", "sm_push", "ce_push", "ll", "ce_chunked", "ce_zero_copy", "sm_zero_copy", "ring", "ce_pull",
               "2d", "ll_2d")
    ZERO_COPY_METHODS = ("ce_zero_copy", "sm_zero_copy")
    """The methods that need a symmetric ``out`` (see :meth:`run`)."""

    def __init__(self, max_bytes: int, dtype, *, max_programs: int | None = None,
                 ce_chunk_bytes: int = CE_CHUNK_BYTES):
        import torch

        max_numel, world = self.numel_and_world("AllGatherContext", max_bytes, dtype)
        if isinstance(ce_chunk_bytes, bool) or not isinstance(ce_chunk_bytes, int) or ce_chunk_bytes <= 0:
            raise ValueError(f"triton_dist AllGatherContext: ce_chunk_bytes must be a positive int, got "
                             f"{ce_chunk_bytes!r}")
        slot = cdiv(max_numel, self.BLOCK) * self.BLOCK
        super().__init__("AllGatherContext", dtype, max_numel, {"gathered": world * slot},
                         SIGNALS_PER_PROGRAM * world, max_programs)
        self.slot_numel = slot
        """Elements per rank slot of ``gathered`` (and of ``ce``)."""
        self.ce = symm_empty((world * slot, ), dtype)
        """The copy-engine method's receive buffer: one region of ``world`` slots."""
        self.ll_max_bytes = min(self.max_bytes, LL_MAX_BYTES)
        self.ll, self.ll_slot = ll_buffer("AllGatherContext", world, self.ll_max_bytes)
        """The LL buffer (:func:`~triton_dist.kernels.common.ll_buffer.ll_buffer`) and its 8-byte
        words per rank slot."""
        self.ce_calls = torch.zeros(1, dtype=torch.int64, device=self.calls.device)
        """The device-side count of ``ce_push`` and ``ce_chunked`` calls (their ``k``; the two share
        the ``ce`` buffer and its acks)."""
        mapped = _reach.mapped_peer_tensors(self.ce, self.unmapped)
        self._ce_peers = [self.ce if r == self.rank else mapped.get(r) for r in range(self.world)]
        self._side = side_stream(self.calls.device)
        self._joined = torch.cuda.Event()  # streams.wait_for's
        self.ce_chunk_bytes = ce_chunk_bytes
        """``"ce_chunked"``'s smallest chunk in bytes (:data:`CE_CHUNK_BYTES` unless given; the
        same on every rank)."""
        self.layout, self.ext_layout = _layouts(self.world, self.max_programs)
        """Where each method's signals sit in ``pad`` and ``pad_ext``."""
        self.local_world = _runtime.local_world_size()
        """Ranks per node (``"2d"``'s ``LOCAL``; several nodes make it ``"auto"``'s choice)."""
        self.pad_ext = SignalPad(self.ext_layout.size, owner="AllGatherContext", regions=self.ext_layout)
        """Signals of ``ce_chunked``, ``ce_zero_copy``, ``sm_zero_copy`` and ``ce_pull``."""
        self.zc_calls = torch.zeros(1, dtype=torch.int64, device=self.calls.device)
        """The device-side count of zero-copy calls (``ce_zero_copy`` and ``sm_zero_copy``)."""
        self.pull_calls = torch.zeros(1, dtype=torch.int64, device=self.calls.device)
        """The device-side count of ``ce_pull`` calls (its ``k``)."""
        self._send = side_stream(self.calls.device)
        """``ce_chunked``: the copies into peers' ``ce`` buffers."""
        self._notify = side_stream(self.calls.device)
        """``ce_chunked``: the per-chunk signal kernels, each after its chunk's copies (an event)."""
        self._chunk_events = [torch.cuda.Event() for _ in range(CE_MAX_CHUNKS)]
        self.ready()

    # ---------------------------------------------------------------- introspection

    def signals_for(self, rank: int):
        """The ``sm_push`` ready signals from ``rank`` on this rank: a uint64 tensor of
        ``max_programs`` signals; entry ``p`` (pad index ``rank * max_programs + p``) holds the
        epoch of the latest call whose tiles ``p, p + G, p + 2G, ...`` (``BLOCK`` elements each, ``G``
        the call's grid) of ``rank``'s input are in :meth:`slot` ``(rank, epoch % 2)``."""
        if not 0 <= rank < self.world:
            raise IndexError(f"triton_dist AllGatherContext: rank {rank} out of range for world {self.world}")
        start = self.layout["sm_push_ready"] + rank * self.max_programs
        return self.pad.signals[start:start + self.max_programs]

    def slot(self, rank: int, half: int):
        """This rank's ``gathered`` slot of ``rank`` in ``half`` (``max_numel`` elements; a call of
        ``n`` elements fills the first ``n``)."""
        start = (half * self.world + rank) * self.slot_numel
        return self.gathered[start:start + self.max_numel]

    # ---------------------------------------------------------------- kernels

    def _push_meta(self, aligned: bool) -> dict:
        return self.meta(ALIGNED=aligned)

    def _ll_meta(self, **extra) -> dict:
        return dict(WORLD=self.world, ll_slot=self.ll_slot, BLOCK_W=LL_BLOCK, ELEMS=4 // self.dtype.itemsize,
                    num_warps=self.NUM_WARPS, **extra)

    def _2d_meta(self, aligned: bool) -> dict:
        return self.meta(ALIGNED=aligned, LOCAL=self.local_world, ready=self.ext_layout["node_ready"],
                         ELEMENT_BYTES=self.dtype.itemsize)

    def _ring_signals(self):
        return self.pad.signals[self.layout["ring"]:]

    def _ce_meta(self, phase: int) -> dict:
        return dict(PHASE=phase, WORLD=self.world, ready=self.layout["ce_push_ready"],
                    ack=self.layout["ce_push_ack"], num_warps=1)

    def _zc_meta(self, region: str) -> dict:
        """``all_gather_ce_signal_kernel`` phase 1 (notify mine, wait for every peer's) on the
        ``ce_zero_copy`` region ``"ready"`` or ``"done"`` of ``pad_ext``."""
        return dict(PHASE=1, WORLD=self.world, ready=self.ext_layout[f"zc_{region}"], ack=0, num_warps=1)

    def _pull_meta(self, phase: int) -> dict:
        """``all_gather_ce_signal_kernel`` on ``pad_ext`` for ``ce_pull``: "ready" is "published",
        "ack" is "pulled"."""
        return dict(PHASE=phase, WORLD=self.world, ready=self.ext_layout["published"],
                    ack=self.ext_layout["pulled"], num_warps=1)

    def _chunk_signal_meta(self) -> dict:
        return dict(WORLD=self.world, chunk_ready=self.ext_layout["chunk_ready"], MAX_CHUNKS=CE_MAX_CHUNKS,
                    num_warps=1)

    def _copy_out_meta(self, aligned: bool) -> dict:
        return dict(WORLD=self.world, chunk_ready=self.ext_layout["chunk_ready"],
                    MAX_CHUNKS=CE_MAX_CHUNKS, BLOCK=self.BLOCK, ALIGNED=aligned, num_warps=self.NUM_WARPS)

    def _zero_copy_meta(self, aligned: bool) -> dict:
        return dict(WORLD=self.world, max_programs=self.max_programs, BLOCK=self.BLOCK, ALIGNED=aligned,
                    ready=self.ext_layout["smz_ready"], done=self.ext_layout["smz_done"],
                    num_warps=self.NUM_WARPS)

    def preload(self) -> None:
        """Compile and load every kernel with the specialisation of real calls (16-byte aligned
        tensors of this dtype; ``n``, ``words`` and ``slot_tiles`` unspecialised 32-bit ints: one
        compiled kernel serves contexts of every size)."""
        n = max(2, self.max_numel)  # the int type (i32) real calls have
        slot_tiles = self.slot_numel // self.BLOCK
        for aligned in (False, True):
            all_gather_push_kernel.preload(self.gathered, self.gathered, self.gathered, self.pad.signals, n,
                                           self.calls, slot_tiles, grid=(1, ), **self._push_meta(aligned))
            all_gather_2d_kernel.preload(self.gathered, self.gathered, self.gathered, self.pad_ext.signals, n, n,
                                         self.calls, slot_tiles, grid=(1, ), **self._2d_meta(aligned))
            all_gather_ring_kernel.preload(self.gathered, self.gathered, self.gathered, self._ring_signals(), n,
                                           self.calls, slot_tiles, grid=(1, ), **self._push_meta(aligned))
        all_gather_ll_kernel.preload(self.gathered, self.gathered, self.ll, n, n, self.calls, grid=(1, ),
                                     **self._ll_meta())
        all_gather_ll_2d_kernel.preload(self.gathered, self.gathered, self.ll, n, n, self.calls, grid=(1, ),
                                        **self._ll_meta(LOCAL=self.local_world))
        for phase in (0, 1, 2):
            all_gather_ce_signal_kernel.preload(self.pad.signals, self.ce_calls, grid=(1, ), **self._ce_meta(phase))
        ext = self.pad_ext.signals
        for region in ("ready", "done"):
            all_gather_ce_signal_kernel.preload(ext, self.zc_calls, grid=(1, ), **self._zc_meta(region))
        for phase in (0, 1, 2):
            all_gather_ce_signal_kernel.preload(ext, self.pull_calls, grid=(1, ), **self._pull_meta(phase))
        all_gather_ce_chunk_signal_kernel.preload(ext, self.ce_calls, 2, grid=(1, ), **self._chunk_signal_meta())
        for aligned in (False, True):
            all_gather_ce_copy_out_kernel.preload(self.gathered, self.ce, ext, n, n, self.ce_calls, slot_tiles,
                                                  grid=(1, ), **self._copy_out_meta(aligned))
            all_gather_zero_copy_kernel.preload(self.gathered, self.gathered, ext, n, self.zc_calls, grid=(1, ),
                                                **self._zero_copy_meta(aligned))

    def method_for(self, nbytes: int, symmetric_out: bool = False) -> str:
        """The method ``"auto"`` picks for ``nbytes`` bytes per rank
        (:func:`triton_dist.kernels.collectives.policy.all_gather_method`); ``symmetric_out``: every
        rank's ``out`` is symmetric (see :meth:`run`)."""
        return _policy.all_gather_method(nbytes, self.ll_max_bytes, symmetric_out, self.world // self.local_world)

    def chunk_numel(self, n: int) -> int:
        """``"ce_chunked"``'s chunk (elements, a multiple of ``BLOCK``) for ``n`` elements per rank."""
        chunks = max(1, min(CE_MAX_CHUNKS, n * self.dtype.itemsize // self.ce_chunk_bytes))
        return cdiv(cdiv(n, chunks), self.BLOCK) * self.BLOCK

    # ---------------------------------------------------------------- calls

    def run(self, x, out, method: str = "auto") -> LaunchPlan | OneRankCopy | None:
        """``out[r * n:(r + 1) * n] = x of rank r`` with ``method`` (see :attr:`METHODS`), on the
        current stream. ``x``: contiguous CUDA tensor of this dtype, ``n = x.numel() <= max_numel``;
        ``out``: contiguous, ``world * n`` elements (both validated by
        :func:`triton_dist.ops.all_gather`, not here). Returns the :class:`LaunchPlan` it launched
        when the call was that one launch and any 16-byte aligned tensors of the same size would
        have launched it too (not ``"auto"``'s choice by ``out``'s memory), with one rank the copy
        (``OneRankCopy``; not for the zero-copy methods, whose checks of ``out`` only this path
        makes), else None."""
        n = x.numel()
        if method not in self.METHODS:
            raise ValueError(f"triton_dist AllGatherContext.run: method must be one of {self.METHODS}, "
                             f"got {method!r}")
        if n == 0:
            return
        nbytes = n * self.dtype.itemsize
        chose_by_out = method == "auto" and nbytes > _policy.ALL_GATHER_SM_MAX_BYTES
        if method == "auto":
            method = self.method_for(nbytes, chose_by_out and _symmetric_span(out))
        _reach.check_reach("all_gather", method, ("2d", "ll_2d"), self.unmapped, self.rank)
        if method in ("ll", "ll_2d") and nbytes > self.ll_max_bytes:
            raise ValueError(f"triton_dist all_gather: method {method!r} takes at most {self.ll_max_bytes} bytes per "
                             f"rank, got {nbytes}; use 'sm_push', 'ce_push', '2d' or 'auto'")
        if method in self.ZERO_COPY_METHODS:
            if not _symmetric_span(out):
                raise ValueError(f"triton_dist all_gather: method {method!r} needs a symmetric out (allocated with "
                                 f"triton_dist.symm_empty, the same layout on every rank); use 'ce_chunked', "
                                 f"'ce_push' or 'auto' for other tensors")
            if method == "sm_zero_copy" and out.data_ptr() % 16:
                raise ValueError("triton_dist all_gather: method 'sm_zero_copy' needs a 16-byte aligned out; use "
                                 "'ce_zero_copy'")
        x = x.reshape(-1)
        if self.world == 1:  # a zero-copy method's checks above hold only on the full path
            copied = self.ran_on_one_rank(x, out.view(-1))
            return None if method in self.ZERO_COPY_METHODS else copied
        if method == "ce_push":
            self._run_ce(x, out.view(-1), n)
            return
        if method == "ce_chunked":
            self._run_ce_chunked(x, out.view(-1), n)
            return
        if method == "ce_pull":
            self._run_ce(x, out.view(-1), n, pull=True)
            return
        if method == "ce_zero_copy":
            self._run_ce_zero_copy(x, out.view(-1), n)
            return
        if method == "sm_zero_copy":
            x, _ = self.aligned(x, out)  # out is aligned (checked above)
            grid = self.grid(cdiv(n, self.BLOCK))
            all_gather_zero_copy_kernel[grid](x, out, self.pad_ext.signals, n, self._next_zero_copy(),
                                              **self._zero_copy_meta(n % ALIGN_ELEMENTS == 0))
            return None
        plan = self.launch_aligned(n, method, x, out)
        return None if chose_by_out else plan

    def _make_launch_plan(self, n: int, method: str) -> LaunchPlan | None:
        """``"sm_push"``, ``"2d"``, ``"ring"``, ``"ll"`` and ``"ll_2d"``: one kernel each, which
        advances the call counter itself (``"sm_zero_copy"`` takes a host-side epoch per call)."""
        aligned = n % ALIGN_ELEMENTS == 0
        slot_tiles = self.slot_numel // self.BLOCK
        if method == "sm_push":
            return LaunchPlan(all_gather_push_kernel, self.grid(cdiv(n, self.BLOCK)),
                              (X, OUT, self.gathered, self.pad.signals, n, self.calls, slot_tiles),
                              self._push_meta(aligned))
        if method == "2d":
            chunk, programs = chunk_and_grid(n, self.max_programs, self.BLOCK)
            return LaunchPlan(all_gather_2d_kernel, (programs, ),
                              (X, OUT, self.gathered, self.pad_ext.signals, n, chunk, self.calls, slot_tiles),
                              self._2d_meta(aligned))
        if method == "ring":
            return LaunchPlan(all_gather_ring_kernel, self.grid(cdiv(n, self.BLOCK)),
                              (X, OUT, self.gathered, self._ring_signals(), n, self.calls, slot_tiles),
                              self._push_meta(aligned))
        if method == "ll_2d":
            return self.ll_plan(all_gather_ll_2d_kernel, n, self._ll_meta(LOCAL=self.local_world))
        if method == "ll":
            return self.ll_plan(all_gather_ll_kernel, n, self._ll_meta())
        return None

    def _run_ce(self, x, out, n: int, pull: bool = False) -> None:
        """``ce_push``, or with ``pull`` ``ce_pull`` (see the module notes for the protocols and
        their ordering): the same three signal phases around two rounds of copies; push writes
        this rank's input into every peer's ``ce`` and copies out its own, pull publishes it in its
        own ``ce`` and copies out every peer's."""
        import torch

        me, slot = self.rank, self.slot_numel
        stream = torch.cuda.current_stream()
        counter, signals, meta = ((self.pull_calls, self.pad_ext.signals, self._pull_meta) if pull else
                                  (self.ce_calls, self.pad.signals, self._ce_meta))
        peers = [(me + k) % self.world for k in range(1, self.world)]
        _call_counter.bump(counter)
        # Own slot of out on a side stream, overlapping the peer copies (joined before returning).
        wait_for(self._side, stream, self._joined)
        with torch.cuda.stream(self._side):
            out[me * n:(me + 1) * n].copy_(x)
        all_gather_ce_signal_kernel[(1, )](signals, counter, **meta(0))
        for r in ([me] if pull else peers):
            self._ce_peers[r][me * slot:me * slot + n].copy_(x)
        all_gather_ce_signal_kernel[(1, )](signals, counter, **meta(1))
        for r in peers:
            source = self._ce_peers[r] if pull else self.ce
            out[r * n:(r + 1) * n].copy_(source[r * slot:r * slot + n])
        all_gather_ce_signal_kernel[(1, )](signals, counter, **meta(2))
        wait_for(stream, self._side, self._joined)

    # ---------------------------------------------------------------- added after the first GPU run

    def _next_zero_copy(self):
        """Bump the zero-copy call counter on the current stream; returns it (the kernels' ``k``)."""
        _call_counter.bump(self.zc_calls)
        return self.zc_calls

    def _run_ce_zero_copy(self, x, out, n: int) -> None:
        """The ``ce_zero_copy`` method (``out`` symmetric; see the module notes)."""
        import torch

        me = self.rank
        stream = torch.cuda.current_stream()
        # Every host-side check before any stream work: a rank that raised after its "ready" had
        # gone out would leave its peers waiting for its "done".
        peers = {r: peer_tensor(out, r) for r in range(self.world) if r != me}
        k_ptr = self._next_zero_copy()
        # Own slot on the side stream: this rank's out is ours from the call's start (stream order).
        wait_for(self._side, stream, self._joined)
        with torch.cuda.stream(self._side):
            out[me * n:(me + 1) * n].copy_(x)
        # "ready": every peer has entered this call, so its out is ours to write.
        all_gather_ce_signal_kernel[(1, )](self.pad_ext.signals, k_ptr, **self._zc_meta("ready"))
        for k in range(1, self.world):
            r = (me + k) % self.world
            peers[r][me * n:(me + 1) * n].copy_(x)
        # "done": my copies have landed in every peer's out; every peer's have landed in mine.
        all_gather_ce_signal_kernel[(1, )](self.pad_ext.signals, k_ptr, **self._zc_meta("done"))
        wait_for(stream, self._side, self._joined)

    def _run_ce_chunked(self, x, out, n: int) -> None:
        """The ``ce_chunked`` method (see the module notes for the protocol and its ordering)."""
        import torch

        me, slot = self.rank, self.slot_numel
        stream = torch.cuda.current_stream()
        # The copy-out kernel's variants assume a 16-byte aligned out (like run()'s SM methods).
        target = out if out.data_ptr() % 16 == 0 else torch.empty_like(out)
        chunk = self.chunk_numel(n)
        chunks = cdiv(n, chunk)
        _call_counter.bump(self.ce_calls)
        wait_for(self._side, stream, self._joined)
        with torch.cuda.stream(self._side):
            target[me * n:(me + 1) * n].copy_(x)
        # Every peer has copied this rank's data of the previous ce call out of its ce buffer.
        all_gather_ce_signal_kernel[(1, )](self.pad.signals, self.ce_calls, **self._ce_meta(0))
        wait_for(self._send, stream, self._joined)
        for c in range(chunks):
            lo, hi = c * chunk, min(n, (c + 1) * chunk)
            event = self._chunk_events[c]
            with torch.cuda.stream(self._send):
                for k in range(1, self.world):
                    r = (me + k) % self.world
                    self._ce_peers[r][me * slot + lo:me * slot + hi].copy_(x[lo:hi])
                event.record(self._send)
            self._notify.wait_event(event)
            with torch.cuda.stream(self._notify):
                all_gather_ce_chunk_signal_kernel[(1, )](self.pad_ext.signals, self.ce_calls, c,
                                                         **self._chunk_signal_meta())
        # The copy-out spins on the peers' chunk signals. It is enqueued after this rank's sends and
        # signals: were launches synchronous (CUDA_LAUNCH_BLOCKING, a sanitizer), a copy-out
        # enqueued first would block every rank's host before any rank had sent anything.
        grid = (max(1, min(CE_COPY_PROGRAMS, self.max_programs, chunk // self.BLOCK)), )
        all_gather_ce_copy_out_kernel[grid](target, self.ce, self.pad_ext.signals, n, chunk, self.ce_calls,
                                            self.slot_numel // self.BLOCK,
                                            **self._copy_out_meta(n % ALIGN_ELEMENTS == 0))
        # The copy-out has read every peer's data: acknowledge (the peers' next ce call may write).
        all_gather_ce_signal_kernel[(1, )](self.pad.signals, self.ce_calls, **self._ce_meta(2))
        wait_for(stream, self._side, self._joined)
        wait_for(stream, self._send, self._joined)
        wait_for(stream, self._notify, self._joined)
        if target is not out:
            out.copy_(target)


def _symmetric_span(tensor) -> bool:
    """Whether ``tensor``'s own elements (``data_ptr()`` onwards, not its whole storage, unlike
    :func:`triton_dist.is_symmetric` - a view at an offset counts) lie in one live symmetric
    allocation."""
    import torch

    if not isinstance(tensor, torch.Tensor) or not tensor.is_cuda or not _runtime.is_initialized():
        return False
    try:
        _runtime._core().check_symmetric(tensor.data_ptr(), max(tensor.numel() * tensor.element_size(), 1),
                                         "all_gather")
        return True
    except RuntimeError:
        return False
