"""AllGather+GEMM: ``C = allgather(A_shard) @ B^T`` with the gather overlapped by the GEMM, tile
by tile. Every rank holds ``A_shard [m, K]`` (the same ``m`` on every rank) and ``B [N, K]``; the
result is ``C [world * m, N]``, rank ``r``'s rows ``[r * m, (r + 1) * m)`` computed from its shard.

Three producers, the context's ``method`` (:data:`METHODS`); ``"ce_push"``, the default, first.
Producer (copy engine, on the context's side stream) and consumer (the persistent GEMM of
:mod:`triton_dist.kernels.gemm.dense` with ``WAIT_FOR_ROWS``, on the caller's stream) share one
symmetric buffer ``gathered`` (``world * max_m * K`` elements; a call uses its first
``world * m`` rows, rank ``r``'s shard at rows ``[r * m, (r + 1) * m)``) which the GEMM reads
directly as its A (a TMA descriptor over ``gathered[:world * m]``; no copy-out), and a signal pad
of ``3 * world`` uint64 signals: ``ready[r]`` (index ``r``) and ``ack[r]`` (index ``world + r``)
(``"ce_pull"`` uses the third ``world`` too, see below).

Call ``k`` (``k``: the context's device-side call counter ``calls``, bumped on the caller's
stream ``S`` first, so a CUDA graph replays with fresh values) on rank ``me``:

``S``: ``calls += 1``; copy ``A_shard`` into slot ``me`` of the local ``gathered`` (here, before
the GEMM, whose first tiles need it: on 2 x H200 a 64 MiB same-device copy took 94 us alone and
219 us next to a running GEMM; moving it here from ``P`` left the op's time unchanged, 2970 against
2966 us at 8192x14336x8192); the side stream ``P`` waits for ``S`` (so
everything ``S`` did before, including this rank's GEMM of call ``k - 1``, is finished before
``P`` continues).

``P``:
  1. signal kernel, phase 0: ``ready[me] = k`` locally (release; the local copy is already done); ``ack[me] =
     k - 1`` on every peer (release, system scope: "my GEMM of call ``k - 1`` has finished
     reading your slot of my buffer" - true because ``P`` waited for ``S``); then acquire-wait
     ``ack[r] >= k - 1`` from every peer (peer ``r`` no longer reads slot ``me`` of its buffer);
  2. for every peer ``r`` (ring order from ``me + 1``): copy ``A_shard`` into slot ``me`` of ``r``'s
     ``gathered`` (``peer_tensor``, a copy-engine copy over NVLink); signal kernel, phase 1:
     ``ready[me] = k`` on ``r`` (release, system scope).

Where ranks share a GPU (several per GPU under MPS), ``S`` also waits for the phase-0 kernel to
finish before the GEMM (:meth:`AllGatherGemmContext.start_gather` says why).

``S``: the GEMM consumer: before the K loop of an output tile it acquire-waits (system scope)
``ready[r] >= k`` for the one or two ranks ``r`` whose shards hold the tile's rows, and loads A
through ``dl.consume_token`` of the descriptor (ordered after the wait, with an async-proxy fence
for TMA). Tiles are rotated so each rank starts with its own rows (ready after the local copy).
Then ``S`` waits for ``P`` before the call returns (the caller may reuse ``A_shard``; the next
call's ``P`` work is ordered after this GEMM anyway).

Why ``ready[r] >= k`` means "rank ``r``'s rows of call ``k`` are in my buffer": the copy and the
signal kernel are consecutive on ``r``'s stream ``P``, so the copy engine finished writing (over
NVLink) before the kernel's release at system scope, which my acquire observes (the argument of
``ce_push`` in :mod:`~triton_dist.kernels.collectives.allgather`). ``ready`` only grows (``set`` to ``k``,
and call ``k + 1`` cannot set it before this rank acknowledged call ``k``, see next), so a value
``>= k`` is this call's.

Why no write lands in a slot a GEMM still reads: rank ``r`` writes slot ``r`` of my buffer in call
``k + 1`` only after ``ack[me] >= k`` from me, which I send in my call ``k + 1`` after my GEMM of
call ``k`` finished (stream order ``S`` -> ``P``). My own slot is rewritten only by my ``S``,
after my GEMM of call ``k``. A single region therefore suffices (no parity halves, which the host could
not follow inside a replayed CUDA graph since the copies' addresses are baked in). The acks of a
call are sent by the next call: the last call's are never needed.

``"ce_pull"`` (``method="ce_pull"``): ``gathered`` is ordinary memory that only this rank
writes, and each rank exposes its shard in a symmetric ``shard`` buffer instead. Signals:
``ready[r]`` (index ``r``, local: rank ``r``'s rows are in ``gathered``), ``pulled[r]`` (index
``world + r``: rank ``r`` has copied out this rank's shard of call ``k``) and ``published[r]``
(index ``2 * world + r``: rank ``r``'s shard of call ``k`` is in its ``shard``). ``S`` as above
(``calls += 1``, this rank's rows into ``gathered``, the GEMM); ``P``: ``ready[me] = k``, then
wait ``pulled[r] >= k - 1`` from every peer (nobody still copies the previous shard); copy
``A_shard`` into ``shard``; ``published[me] = k`` on every peer; then for each peer ``r`` in the
order the GEMM needs their rows (``me + 1``, ``me + 2``, ...): wait ``published[r] >= k``, copy
``r``'s ``shard`` into ``gathered`` (a copy-engine read over NVLink), ``ready[r] = k`` here and
``pulled[me] = k`` on ``r``. No write lands where a GEMM still reads: only this rank's own streams
write its ``gathered``, ``P`` after waiting for ``S``; a ``shard`` is rewritten only after every
peer acknowledged copying the previous one. No cycle: the first wait of call ``k`` needs only
signals of call ``k - 1``; the second, a peer's ``published`` of call ``k``, which the peer sends
right after its own first wait. What this buys: the GEMM reads A from ordinary memory, not from
the symmetric heap. What it costs: a second copy of ``A_shard`` (into ``shard``), on ``P``
before the peers can start copying.

``"sm_push"`` (``method="sm_push"``): ``ce_push``'s buffer, signals and protocol, with the
copies and signal kernels of ``P`` replaced by one kernel of ``push_programs`` programs
(:func:`ag_gemm_push_kernel`): program 0 sends phase 0's ``ready[me] = k`` here and ``ack[me] =
k - 1`` to every peer; then for each peer ``r`` (the order of ``ce_push``) every program waits for
``ack[r] >= k - 1`` and stores its share of this rank's rows (read from slot ``me`` of the local
``gathered``, where ``S`` copied them) into slot ``me`` of ``r``'s ``gathered``; the last program
to finish its share (a ticket counter per peer, :mod:`~triton_dist.kernels.common.tickets`, counted
with acq_rel at system scope so that each program's count releases its own NVLink stores) sets
``ready[me] = k`` on ``r`` (release, system scope). Same reasoning as ``ce_push``: the ready
value is released after every store of the rows it announces. What it buys: one kernel launch
instead of ``2 * world - 1`` stream operations, so the first rows land sooner than the copy
engine's (bench/results/h200-x2/allgather.json, small messages: ``sm_push`` in about a third of
``ce_push``'s time); what it costs: ``push_programs`` SMs taken from the GEMM.

``"sm_push_inline"`` (``method="sm_push_inline"``): ``sm_push``'s protocol inside the GEMM, one
kernel on the caller's stream ``S`` and no side stream. Every program of the GEMM first takes the
call's epoch from :func:`~triton_dist.kernels.common.call_counter.enter_call` (no bump); then the
running programs claim the push's shares one at a time (:mod:`~triton_dist.kernels.common.claims`):
a share is its part of this rank's rows copied from ``A_shard`` into slot ``me`` of the local
``gathered`` (the last share to finish sets ``ready[me] = k`` here), then into every peer's (each
peer after its ack, as ``sm_push``); a program walks its tiles, waiting for the peers' rows, once
no share is left (:func:`~triton_dist.kernels.gemm.shard_push.push_shard_first`). One launch a
call and no event, against ``sm_push``'s eight stream operations (bump, copy, two joins, push,
GEMM): for eager calls whose host time exceeds their GPU time (issue 21: ~9 µs of host time per
driver call with ranks sharing a GPU under MPS). What it costs: a program's first tile waits for
the push; the overlap left is across ranks (a peer's tiles beside this push). Why no deadlock: the
push waits only for acks, sent with share 0, which the first program to run claims (for the
previous call, whose kernel ended before this one on the peer's stream); a tile waits for peers'
pushes, which need no tile to finish, and for ``ready[me]``, which the running programs set
between them. Claims rather than each program's own share: a grid sized to the SMs is not always
co-resident (ranks sharing a GPU under MPS: at world 4, 7 clients on one H100, a program that
never started held the last share of ``ready[me]`` and the call waited 60 s, 2026-12-07). The
AllGather+grouped-GEMM context with this producer keeps it as a kernel of its own before its
consumer (:func:`ag_gemm_push_inline_kernel`: there ``ready[me]`` is set by program 0 before the
other programs' copies end, harmless as the consumer starts after the whole kernel on the same
stream).

SMs: the consumer spins while the producer's kernels still have to run on this GPU, so the
GEMM's persistent grid leaves SMs free (its programs use > 114 KiB of shared memory each, so at
most one per SM): :data:`RESERVED_SMS` for the copy-engine producers' signal kernels,
``push_programs`` for ``"sm_push"``. With every SM held by a spinning GEMM program, the producer
could never start - a deadlock. ``"sm_push_inline"`` leaves none: its GEMM's own push is in its
programs, and otherwise it waits only on the peers' kernels, in other processes (on other GPUs, or
in their own MPS shares where ranks share one, as every shared-GPU method assumes).

Why not :class:`~triton_dist.kernels.AllGatherContext`: its ``ce_push`` copies out of its
receive buffer and acknowledges right after that copy-out, so a GEMM reading that buffer directly
would race with the peer's next call; ``sm_push`` needs SMs of its own for a grid whose
programs all spin (co-resident with a persistent GEMM). This dedicated producer is the same
protocol as ``ce_push`` with the acknowledgement moved after the GEMM.
"""

from __future__ import annotations

import triton.language as tl

from ... import config as _config
from ... import language as dl
from ... import residency as _residency
from ... import runtime as _runtime
from ...distributed_jit import DistributedKernel, jit
from ...renamed import method_or_old_name
from ...signals import SignalPad
from ...symmetric import symm_empty
from . import dense as _gemm
from .ag_gemm_2d import ag_gemm_push_2d_kernel
from .context import OverlappedGemmContext
from .shard_push import PUSH_BLOCK, push_rows
from .plain_plan import PlainGemmPlan
from ..common import call_counter as _call_counter
from ..common.call_counter import enter_call
from ..common.launch_plan import LaunchPlan, PlanCache, Slot
from ..common import reach as _reach
from ..common.streams import side_stream, wait_for
from ... import timeline as _timeline
from ..common.tiles import copy_program_tiles

RESERVED_SMS = 1
"""SMs the consumer GEMM leaves free for the producer's signal kernels (see the module notes)."""

METHODS = ("ce_push", "ce_pull", "sm_push", "sm_2d", "sm_push_inline")
"""The producers a context may use (``method=``; the module notes; ``"sm_2d"``: across nodes,
:mod:`~triton_dist.kernels.gemm.ag_gemm_2d`)."""
"""How the shards travel: ``"ce_push"`` (each rank's copy engine writes its shard into every peer's
symmetric ``gathered``, which the GEMM reads) or ``"ce_pull"`` (each rank publishes its shard in
a symmetric ``shard`` buffer, and every rank's copy engine copies the peers' shards into an
ordinary ``gathered`` buffer, which the GEMM reads) or ``"sm_push"`` (``ce_push`` with the copies
made by a kernel of a few SMs; see the module notes) or ``"sm_push_inline"`` (the GEMM's programs
push first, one launch a call on the caller's stream, for host-bound eager calls)."""

PUSH_METHODS = ("sm_push", "sm_2d", "sm_push_inline")
"""The methods whose rows SMs push (``"sm_push"``, ``"sm_2d"``: a kernel of ``push_programs``
programs beside the GEMM; ``"sm_push_inline"``: the GEMM's own programs, or that kernel before the
grouped GEMM's consumer)."""

PUSH_PROGRAMS = 8
"""``"sm_push"``'s programs (and SMs taken from the GEMM) by default. Only 8 was measured
(bench/results/h200-x2/ag_gemm.json): ahead of ``ce_push`` at M=1024, 1-10 % behind from M=2048
up, where the 8 SMs cost the GEMM more than the copy engine's latency.
With fewer SMs (ranks sharing a GPU under MPS) the default is at most half of those the shared-GPU
headroom (:func:`triton_dist.residency.headroom_sms`) leaves, so that the GEMM keeps the rest."""

ag_gemm_consumer_kernel = DistributedKernel(_gemm.gemm_kernel)
""":func:`triton_dist.kernels.gemm.dense.gemm_kernel` launched with ``WAIT_FOR_ROWS=True`` and the
language's libraries linked in."""


@jit(do_not_specialize=["n"])
def ag_gemm_push_kernel(gathered, signals, calls, tickets, n, WORLD: tl.constexpr, BLOCK: tl.constexpr):
    """``"sm_push"``'s producer (module notes): this rank's ``n`` elements in slot ``me`` of the
    local ``gathered`` (at ``me * n``) into the same slot of every peer's, ``ready``/``ack`` as
    :func:`ag_gemm_signal_kernel` phases 0 and 1. ``tickets``: ``WORLD`` int32 counters, zero
    between calls. ``n``: a multiple of 8."""
    slot = dl.rank().to(tl.int64) * ((n // 8) * 8)  # == me * n, with the divisibility fact for 16-byte vectors
    push_rows(gathered + slot, gathered, signals, tickets, tl.load(calls), n, tl.program_id(0), WORLD, BLOCK)


@jit(do_not_specialize=["n"])
def ag_gemm_push_inline_kernel(shard, gathered, signals, calls, tickets, n, WORLD: tl.constexpr,
                               BLOCK: tl.constexpr):
    """``"sm_push_inline"``'s producer (module notes), the call's first kernel: its epoch from
    :func:`~triton_dist.kernels.common.call_counter.enter_call` (``calls``: two int64), ``n``
    elements of ``shard`` (16-byte aligned) into slot ``me`` of the local ``gathered``, then as
    :func:`ag_gemm_push_kernel` from ``shard`` into every peer's."""
    k = enter_call(calls)
    slot = dl.rank().to(tl.int64) * ((n // 8) * 8)
    copy_program_tiles(gathered + slot, shard, n, tl.cdiv(n, BLOCK), BLOCK)
    push_rows(shard, gathered, signals, tickets, k, n, tl.program_id(0), WORLD, BLOCK)


@jit(do_not_specialize=["peer"])
def ag_gemm_signal_kernel(signals, calls, peer, PHASE: tl.constexpr, WORLD: tl.constexpr):
    """One program. ``calls``: the context's device call counter (this call's ``k``). ``signals``:
    ``ready`` at ``[0, WORLD)``, ``ack`` (push) or ``pulled`` (pull) at ``[WORLD, 2 * WORLD)``,
    ``published`` (pull) at ``[2 * WORLD, 3 * WORLD)``.

    ``"ce_push"``: ``PHASE`` 0: ``ready[me] = k`` here, ``ack[me] = k - 1`` on every peer, then
    wait for ``ack[r] >= k - 1`` from every peer. ``PHASE`` 1: ``ready[me] = k`` on ``peer``.

    ``"ce_pull"``: ``PHASE`` 2: ``ready[me] = k`` here, then wait for ``pulled[r] >= k - 1`` from
    every peer (they have copied out this rank's previous shard). ``PHASE`` 3: ``published[me] =
    k`` on every peer. ``PHASE`` 4: wait for ``published[peer] >= k``. ``PHASE`` 5: ``ready[peer]
    = k`` here, ``pulled[me] = k`` on ``peer``."""
    k = tl.load(calls)
    me = dl.rank()
    if PHASE == 0:
        dl.notify(signals + me, me, k, "set", "gpu")
        for r in tl.static_range(1, WORLD):
            dl.notify(signals + WORLD + me, (me + r) % WORLD, k - 1, "set", "intra_node")
        for r in tl.static_range(1, WORLD):
            dl.wait(signals + WORLD + (me + r) % WORLD, 1, "sys", "acquire", k - 1)
    elif PHASE == 1:
        dl.notify(signals + me, peer, k, "set", "intra_node")
    elif PHASE == 2:
        dl.notify(signals + me, me, k, "set", "gpu")
        for r in tl.static_range(1, WORLD):
            dl.wait(signals + WORLD + (me + r) % WORLD, 1, "sys", "acquire", k - 1)
    elif PHASE == 3:
        for r in tl.static_range(1, WORLD):
            dl.notify(signals + 2 * WORLD + me, (me + r) % WORLD, k, "set", "intra_node")
    elif PHASE == 4:
        dl.wait(signals + 2 * WORLD + peer, 1, "sys", "acquire", k)
    else:
        dl.notify(signals + peer, me, k, "set", "gpu")
        dl.notify(signals + WORLD + me, peer, k, "set", "intra_node")


def _aligned(shard):
    """``shard``, cloned if its base is not 16-byte aligned: the preloaded inline push reads 16-byte
    vectors, and a misaligned view would compile another variant, possibly while a peer spins."""
    return shard if shard.data_ptr() % 16 == 0 else shard.clone()


class AllGatherGemmContext(OverlappedGemmContext):
    """Symmetric buffer, signals, side stream and loaded kernels for AllGather+GEMM of up to
    ``max_m_per_rank`` rows of ``k`` columns per rank, ``dtype`` bfloat16 or float16.

    Collective: every rank creates it with the same arguments, in the same order as its other
    symmetric allocations; creating it compiles and loads every kernel (both GEMM configs, since
    N is per call) and ends with a barrier. Symmetric memory: ``world * max_m_per_rank * k``
    elements (``"ce_pull"``: ``max_m_per_rank * k``, and ``world * max_m_per_rank * k`` of ordinary
    memory) plus ``3 * world`` signals. Call with :meth:`run` (or :func:`triton_dist.ops.ag_gemm`);
    every rank makes the same calls in the same order with the same ``m`` and ``N``, each rank all
    on one stream (the side stream's wait for the caller's stream is what orders a call after the
    previous call's GEMM). Calls may be captured in a CUDA graph and replayed.

    ``method``: the producer, one of :data:`METHODS` (``"ce_pull"`` keeps ``gathered`` in ordinary
    memory and allocates a symmetric ``max_m_per_rank * k`` shard buffer instead); ``producer``:
    its name before every op said ``method`` (deprecated).
    ``push_programs``: ``"sm_push"``'s programs, SMs the GEMM leaves to them (default
    :data:`PUSH_PROGRAMS`).
    ``protocol_on_one_rank``: with a single rank, still run the gather-and-signal protocol (the
    side stream, the signal kernels, the waiting GEMM) instead of the plain GEMM, so that one GPU
    can test it.
    """

    METHODS = METHODS

    def __init__(self, max_m_per_rank: int, k: int, dtype, *, method: str = "ce_push",
                 push_programs: int | None = None, protocol_on_one_rank: bool = False, producer: str | None = None):
        import torch

        method = method_or_old_name(type(self).__name__, method, "ce_push", "producer", producer)

        super().__init__("AllGatherGemmContext", dtype, aligned="k", protocol_on_one_rank=protocol_on_one_rank,
                         max_m_per_rank=max_m_per_rank, k=k)
        if method not in METHODS:
            raise ValueError(f"triton_dist AllGatherGemmContext: method must be one of {METHODS}, got {method!r}")
        _reach.check_reach("AllGatherGemmContext", method, ("sm_2d", ), self.unmapped, self.rank)  # before any allocation
        self.method = method
        """The producer (:data:`METHODS`)."""
        if self.world * max_m_per_rank * k >= 2**31:
            raise ValueError(f"triton_dist AllGatherGemmContext: world * max_m_per_rank * k = "
                             f"{self.world * max_m_per_rank * k} elements is too large (< 2**31)")
        self.max_m = max_m_per_rank
        self.k = k
        if push_programs is None:  # at most half of what the headroom leaves (all of an H200's: 8 of 132)
            push_programs = max(1, min(PUSH_PROGRAMS, (self.num_sms - _residency.headroom_sms()) // 2))
        if isinstance(push_programs, bool) or not isinstance(push_programs, int) or \
                not 0 < push_programs < self.num_sms:
            raise ValueError(f"triton_dist AllGatherGemmContext: push_programs must be an int in [1, "
                             f"{self.num_sms - 1}], got {push_programs!r}")
        self.push_programs = push_programs
        if method == "sm_push_inline":  # its own push is in its programs; beside it, only other processes
            self.max_programs = _residency.max_waiting_programs(self.device, what="AllGatherGemmContext")
        elif method in PUSH_METHODS:  # the GEMM waits on the push kernel's programs beside it
            self.max_programs = _residency.max_waiting_programs(self.device, reserved=push_programs,
                                                                what="AllGatherGemmContext")
        else:  # the GEMM waits for copies, which need SMs of their own when ranks share a GPU
            self.max_programs = _residency.max_waiting_programs(self.device, reserved=RESERVED_SMS,
                                                                what="AllGatherGemmContext", waits_for_copies=True)
        pull = method == "ce_pull"
        gathered_elems = self.world * max_m_per_rank * k
        self.gathered = (torch.empty((gathered_elems, ), dtype=dtype, device=self.device) if pull else
                         symm_empty((gathered_elems, ), dtype))
        """The GEMM's A: rank ``r``'s shard of a call with ``m`` rows at elements ``[r * m * k, (r + 1) *
        m * k)``; symmetric for ``"ce_push"`` (peers write it), ordinary for ``"ce_pull"``."""
        self.shard = symm_empty((max_m_per_rank * k, ), dtype) if pull else None
        """``"ce_pull"``: this rank's shard, published for the peers to copy."""
        w = self.world
        self.pad = SignalPad(3 * w, owner="AllGatherGemmContext",
                             regions=[("ready", 0, w), ("ack or pulled", w, w), ("published", 2 * w, w)])
        self.tickets = torch.zeros(self.world * self.world + 1, dtype=torch.int32, device=self.device)
        """``"sm_push"`` and ``"sm_push_inline"``: per peer, ``"sm_2d"``: per (rows of rank, peer),
        the push shares that finished (zero between calls); the last, ``"sm_push_inline"``'s
        claims of the push's shares."""
        self.local_world = _runtime.local_world_size()
        """Ranks per node (``"sm_2d"``'s ``LOCAL``)."""
        exposed = self.shard if pull else self.gathered
        mapped = _reach.mapped_peer_tensors(exposed, self.unmapped)
        self._peers = [exposed if r == self.rank else mapped.get(r) for r in range(self.world)]
        self._side = side_stream(self.device)
        self._joined = torch.cuda.Event()  # streams.wait_for's
        # Where ranks share a GPU, the caller's stream waits for the copy-engine producers' first
        # signal kernel (phase 0 or 2) before the GEMM (start_gather says why); None elsewhere.
        copy_engine = method in ("ce_push", "ce_pull")
        self._first_signal = torch.cuda.Event() if copy_engine and _config.get().ranks_per_gpu > 1 else None
        if pull:  # ordinary memory written on the side stream: its release must wait for that stream too
            self.gathered.record_stream(self._side)
        self._inline_plans = PlanCache()
        """(m, n) -> ``"sm_push_inline"``'s :class:`LaunchPlan` (:meth:`inline_plan`)."""
        self.ready()

    def preload(self) -> None:
        """Compile and load every kernel with the specialisation of real calls (descriptors of this
        dtype and each config's blocks; every int unspecialised)."""
        a = self.gathered[:self.world * self.max_m * self.k].view(self.world * self.max_m, self.k)
        for config in _gemm.CONFIGS:
            a_desc, b_desc, c_desc = _gemm.descriptors(a, a, a, config)  # only types and blocks matter
            ag_gemm_consumer_kernel.preload(a_desc, b_desc, c_desc, 2, 2, 2, self.pad.signals, self.calls, 2, 2,
                                            grid=(1, ), **self._push_shard_args(self.gathered),
                                            **self.consumer_meta(config))
        if self.method != "sm_push_inline":  # its GEMM pushes (the grouped consumer's context loads the kernel)
            self.preload_producer()

    def preload_producer(self) -> None:
        """Compile and load the gather's kernels (the call counter's and the producer's)."""
        if self.method == "sm_push_inline":  # its own epoch: no bump
            ag_gemm_push_inline_kernel.preload(self.gathered, self.gathered, self.pad.signals, self.calls,
                                               self.tickets, 2, grid=(1, ), **self._push_meta())
            return
        _call_counter.preload(self.calls)
        if self.method == "sm_push":
            ag_gemm_push_kernel.preload(self.gathered, self.pad.signals, self.calls, self.tickets, 2, grid=(1, ),
                                        **self._push_meta())
            return
        if self.method == "sm_2d":
            ag_gemm_push_2d_kernel.preload(self.gathered, self.pad.signals, self.calls, self.tickets, 2, grid=(1, ),
                                           **self._push_2d_meta())
            return
        for phase in ((2, 3, 4, 5) if self.method == "ce_pull" else (0, 1)):
            ag_gemm_signal_kernel.preload(self.pad.signals, self.calls, 2, grid=(1, ), PHASE=phase,
                                          WORLD=self.world, num_warps=1)

    def run(self, a_shard, b, out) -> LaunchPlan | PlainGemmPlan | None:
        """``out = allgather(a_shard) @ b.T`` on the current stream. ``a_shard [m, k]``, ``b [N, k]``
        and ``out [world * m, N]``: contiguous CUDA tensors of this dtype, ``m <= max_m_per_rank``,
        ``N % 8 == 0``, ``b`` and ``out`` 16-byte aligned (validated by
        :func:`triton_dist.ops.ag_gemm`, not here). Returns the launch of ``"sm_push_inline"``
        (:meth:`inline_plan`: a call of the same sizes with any aligned tensors makes it again,
        :mod:`triton_dist.eager_calls`) or, at one rank, the plain GEMM's plan
        (:meth:`~.context.OverlappedGemmContext.plain_gemm`), else None."""
        m, n = a_shard.shape[0], b.shape[0]
        if m == 0 or n == 0:
            return None
        plain = self.plain_gemm(a_shard, b, out)
        if plain is not False:
            return plain
        if self.method == "sm_push_inline" and not _timeline.kernel_args():
            plan = self.inline_plan(m, n)
            plan.launch(_aligned(a_shard), b, out)
            return plan
        k = self.k
        inline = self.method == "sm_push_inline"  # one kernel: the GEMM pushes first (module notes)
        stream = None if inline else self.start_gather(a_shard)
        rows = self.world * m
        config = _gemm.pick_config(rows, n, k, self.max_programs)
        a = self.gathered[:rows * k].view(rows, k)
        a_desc, b_desc, c_desc = _gemm.descriptors(a, b, out, config)
        ag_gemm_consumer_kernel[_gemm.grid_for(rows, n, config, self.max_programs)](
            a_desc, b_desc, c_desc, rows, n, k, self.pad.signals, self.calls, self.rank, m,
            **self._push_shard_args(_aligned(a_shard)), **self.consumer_meta(config), **_timeline.kernel_args())
        if not inline:
            self.finish_gather(stream)
        return None

    def inline_plan(self, m: int, n: int) -> LaunchPlan:
        """``"sm_push_inline"``'s launch for ``m`` rows per rank and ``N = n``, made once per
        ``(m, n)``: the GEMM over the first ``world * m`` rows of ``gathered`` (its descriptor
        fixed) that pushes the shard first; :meth:`~LaunchPlan.launch` takes ``(a_shard, b, out)``."""
        return self._inline_plans.get((m, n), lambda: self._make_inline_plan(m, n))

    def _make_inline_plan(self, m: int, n: int) -> LaunchPlan:
        from triton.tools.tensor_descriptor import TensorDescriptor

        k, rows = self.k, self.world * m
        config = _gemm.pick_config(rows, n, k, self.max_programs)
        c = _gemm.config_params(config)
        a_desc = TensorDescriptor.from_tensor(self.gathered[:rows * k].view(rows, k), [c["BM"], c["BK"]])
        return LaunchPlan(ag_gemm_consumer_kernel, _gemm.grid_for(rows, n, config, self.max_programs),
                          (a_desc, Slot(1, "b", (c["BN"], c["BK"])), Slot(2, "out", (c["BM"], c["BN"])), rows, n, k,
                           self.pad.signals, self.calls, self.rank, m), self.consumer_meta(config), arity=3,
                          named=self._push_shard_args(Slot(0, "a_shard")))

    def _push_shard_args(self, shard) -> dict:
        """The GEMM's push arguments with ``shard`` as this rank's rows (``"sm_push_inline"``; none
        for the other producers, whose push or copies run beside the GEMM)."""
        if self.method != "sm_push_inline":
            return {}
        return dict(tickets=self.tickets, shard=shard, gathered=self.gathered)

    def consumer_meta(self, config: str) -> dict:
        """The GEMM consumer's constexprs and options for ``config``: with ``"sm_2d"`` across nodes,
        its tiles of this rank's node first (rows of the rest arrive later: put across, then
        forwarded within), else rotated to start at this rank's rows."""
        across = self.method == "sm_2d" and self.local_world < self.world
        return _gemm.kernel_meta(config, True, node_ranks=self.local_world if across else 0, world=self.world,
                                 push_shard=self.method == "sm_push_inline")

    def start_gather(self, a_shard):
        """The gather's half of a call (module notes): bump the call counter, this rank's rows into
        ``gathered``, the producer on the side stream (``"sm_push_inline"``: its one kernel, on
        the current stream). A consumer launched next on the returned (current) stream may read
        rank ``r``'s rows ``[r * m, (r + 1) * m)`` of ``gathered`` once ``pad.signals[r] >=
        *calls``; the call then ends with :meth:`finish_gather`."""
        import torch

        m, k, me = a_shard.shape[0], self.k, self.rank
        x = a_shard.reshape(-1)
        stream = torch.cuda.current_stream()
        if self.method == "sm_push_inline":  # the whole gather, on this stream (module notes)
            ag_gemm_push_inline_kernel[(self.push_programs, )](_aligned(x), self.gathered, self.pad.signals, self.calls,
                                                               self.tickets, m * k, **self._push_meta())
            return stream
        _call_counter.bump(self.calls)
        self.gathered[me * m * k:(me + 1) * m * k].copy_(x)
        wait_for(self._side, stream, self._joined)
        with torch.cuda.stream(self._side):
            if self.method == "ce_pull":
                self._pull(x, m)
            elif self.method == "sm_push":
                ag_gemm_push_kernel[(self.push_programs, )](self.gathered, self.pad.signals, self.calls, self.tickets,
                                                            m * k, **self._push_meta())
            elif self.method == "sm_2d":
                ag_gemm_push_2d_kernel[(self.push_programs, )](self.gathered, self.pad.signals, self.calls,
                                                               self.tickets, m * k, **self._push_2d_meta())
            else:
                self._push(x, m)
        if self._first_signal is not None:
            # The consumer's own rows wait for the first signal kernel (ready[me]), and every
            # peer's rows for its acks. Where ranks share a GPU that one-program kernel once never
            # started beside a spinning GEMM (world 4 on one H200), so there the GEMM starts only
            # after it has run. That costs the overlap of this rank's own rows with the peers'
            # previous call, in a mode that proves correctness and measures no speed.
            stream.wait_event(self._first_signal)
        return stream

    def finish_gather(self, stream) -> None:
        """The end of a call whose consumer :meth:`start_gather`'s ``stream`` runs: that stream
        waits for the side stream (nothing with ``"sm_push_inline"``, which has none)."""
        if self.method != "sm_push_inline":
            wait_for(stream, self._side, self._joined)

    def _push_meta(self) -> dict:
        return dict(WORLD=self.world, BLOCK=PUSH_BLOCK, num_warps=8)

    def _push_2d_meta(self) -> dict:
        return dict(self._push_meta(), LOCAL=self.local_world, ELEMENT_BYTES=self.dtype.itemsize)

    def _signal(self, phase: int, peer: int = 0) -> None:
        ag_gemm_signal_kernel[(1, )](self.pad.signals, self.calls, peer, PHASE=phase, WORLD=self.world, num_warps=1)

    def _push(self, x, m: int) -> None:
        """``"ce_push"``, on the side stream: acknowledge and wait (phase 0), then this rank's shard
        into every peer's ``gathered``, each followed by its ready signal (phase 1)."""
        world, me, k = self.world, self.rank, self.k
        self._signal(0)
        if self._first_signal is not None:
            self._first_signal.record(self._side)
        for i in range(1, world):
            # Rank r's GEMM walks its own rows, then rank r + 1's, r + 2's, ...: rank me's rows are
            # needed (me - r) % world blocks in, so ranks me - 1, me - 2, ... get them first.
            r = (me - i) % world
            self._peers[r][me * m * k:(me + 1) * m * k].copy_(x)
            self._signal(1, r)

    def _pull(self, x, m: int) -> None:
        """``"ce_pull"``, on the side stream: this rank's rows ready for its GEMM, and wait until every
        peer copied out the previous shard (phase 2); publish this call's shard (copy, phase 3);
        then each peer's shard, in the order this rank's GEMM needs them: wait for it (phase 4),
        copy it into ``gathered``, mark its rows ready here and tell the peer (phase 5)."""
        world, me, k = self.world, self.rank, self.k
        self._signal(2)
        if self._first_signal is not None:
            self._first_signal.record(self._side)
        self.shard[:m * k].copy_(x)
        self._signal(3)
        for i in range(1, world):
            r = (me + i) % world  # this rank's GEMM walks its own rows, then rank me + 1's, me + 2's, ...
            self._signal(4, r)
            self.gathered[r * m * k:(r + 1) * m * k].copy_(self._peers[r][:m * k])
            self._signal(5, r)
