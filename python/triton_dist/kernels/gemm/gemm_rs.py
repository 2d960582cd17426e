"""GEMM+ReduceScatter: ``out = rows [me * m, (me + 1) * m) of sum over ranks r of A_r @ B_r^T``,
the GEMM's tiles reduced across ranks while the GEMM still runs. Every rank holds ``A [M, K]``
(``M = world * m``, the same ``M`` on every rank; ``K`` is the rank's shard of the contraction)
and ``B [N, K]``; the result is this rank's ``[m, N]`` rows of the sum, as a row-parallel linear
layer needs.

Methods (``method=``):

- ``"fused"``: one kernel on every SM. The GEMM computes the peers' tiles first and stores each
  into its destination's ``partials`` (slot ``me``), then computes its own tiles, and each own
  tile's epilogue waits for the peers' partials of it, adds them and stores the sum into ``out``
  (``REDUCE_OWN`` in :func:`~triton_dist.kernels.gemm.dense.gemm_kernel`, whose notes give the order
  and the no-deadlock argument).
- ``"fused_tma"``: ``"fused"`` with the peers' tiles sent by TMA stores; measured no faster.
- ``"fused_ce"`` (what ``"auto"`` runs but for eager calls too short to hide its host time, which
  take ``"fused"``: :mod:`triton_dist.kernels.gemm.policy`): ``"fused"`` with the peers'
  tiles sent by the copy engine; faster than ``"fused"`` on 7 of the 9 benchmark shapes in its
  first run on 2 x H200 (4-8 %, slower on two, within the run-to-run noise of a second run that
  had it ahead there too). Why: in ``"fused"``
  the SMs store the peers' tiles over NVLink themselves, and a program cannot go on before its
  64 KiB tile has drained at its ~1/132 share of the link; measured, the op ran 8-21 % over the
  GEMM alone on 2 x H200, about half of the transfer's time. Here the GEMM stores a peer's tile in
  local memory (fast) and counts it in its *chunk* (a group of ``GROUP_M`` m-tiles times
  ``chunk_n`` n-tiles, :func:`~triton_dist.kernels.gemm.epilogues.copy_chunk`); the program that stores
  a chunk's last tile raises the chunk's flag. The context's copy stream ``P`` holds on that flag
  (``cuStreamWaitValue64``, no SM), copies the chunk into the destination's *incoming* rows
  (one 2-D copy-engine copy, :func:`triton_dist.stream_copy_2d`) and sets the destination's
  ready flag of that chunk (``cuStreamWriteValue64``, after the copy on the same stream, with
  its system-scope barrier). Own tiles wait for every peer's ready flag of their chunk, as in
  ``"fused"``. See "Copy-engine protocol" below.
- ``"push"`` and ``"pull"``: the producer GEMM below and a separate reduce kernel on
  :data:`REDUCE_SMS` SMs of a side stream.

Producer of ``"push"``/``"pull"`` (the persistent GEMM of :mod:`triton_dist.kernels.gemm.dense` with ``SIGNAL_ROWS``, on the
caller's stream ``S``): tiles never straddle two destinations (rank ``d``'s rows are cut into
m-tiles of their own), and are walked with the destinations interleaved (tile ``i``: destination
``(me + 1 + i % world) % world``, its tile ``i // world``), so tile ``t`` of every destination is
done about ``t / T`` into the GEMM on every rank and every reduce can start early. After each
tile's stores it sets signal ``me * R + t`` on the destination ``d`` to the call's epoch
(release, system scope); ``t`` is the tile's index among ``d``'s ``T`` tiles and ``R`` the
context's fixed signals per source rank (``T`` depends on the call's M; a region that moved with
it would let a peer already on the next call set signals this call still waits for). Two methods:

- ``"pull"``: the tile goes to this rank's own symmetric ``partials`` (rows ``[d * m, (d + 1) *
  m)`` hold the partial of ``d``'s rows); ``d``'s reduce kernel reads it over NVLink
  (``dl.symm_at``).
- ``"push"`` (the "peer epilogue"): the GEMM epilogue stores the tile straight into ``d``'s
  ``partials``, slot ``me`` (rows ``[me * m, (me + 1) * m)``); ``d``'s reduce kernel reads only
  its local memory.

Consumer (:func:`gemm_rs_reduce_kernel`, on the context's side stream ``P``, concurrent with the
GEMM): :data:`REDUCE_SMS` programs walk this rank's ``T`` output tiles in the producer's order;
per tile it waits (acquire, system scope) for signal ``r * R + t >= epoch`` of every rank ``r``,
then sums the ``world`` partial tiles in fp32 in rank order 0, 1, ... (so every rank computes
its rows with the same operation order) and rounds once into ``out``.

Call ``e`` (the context's device call counter, bumped on ``S`` first, so a CUDA graph replays
with fresh values): ``S``: ``calls += 1``, then the GEMM; ``P`` waits for the bump (an event, not
the GEMM), then the reduce kernel; ``S`` waits for ``P`` before the call returns. The GEMM is
launched first so that serialised launches (CUDA_LAUNCH_BLOCKING, a sanitizer) cannot leave the
reduce waiting for a GEMM that was never launched.

Copy-engine protocol (``"fused_ce"``). Flags are 0/1 and reset by whoever consumed them, because
the copy stream's operations carry values fixed when they are enqueued (a replayed CUDA graph
replays them unchanged) and so cannot follow the device-side epoch. Buffers: ``ce_rows``
(symmetric, ``2 * max_m * n``: incoming rows, then outgoing rows; a single region, guarded by
acknowledgements instead of halves); ``ce_pad``: ``ready[r * R + c]`` (rank ``r``'s chunk ``c``
is in my incoming rows) and ``ack[r]`` (index ``world * R + r``: rank ``r`` has finished reading
what I sent it; 1 at creation); local ``chunk_flags``/``tickets`` (layout ``d * R + c``). Call on
rank ``me``, streams ``S`` (caller's) and ``P``:

- ``S``: bump ``calls`` (the methods share it, see "Buffer reuse"); ``P`` waits for ``S``;
  the GEMM.
- ``P``, chunk by chunk in the GEMM's order, for every destination ``d``: (first chunk only)
  wait ``ack[d] >= 1``, reset it to 0; wait ``chunk_flags[d * R + c] >= 1``, reset it to 0; copy
  the chunk into ``d``'s incoming rows ``[me * m, ...)``; set ``ready[me * R + c] = 1`` on ``d``.
- ``S`` after the GEMM (which consumed every ready flag of the call): zero my ready flags, then
  set ``ack[me] = 1`` on every peer; then wait for ``P``.

No write lands in rows still read: ``d`` copies into my incoming rows only after my ack, which I
send after my GEMM finished reading them. No flag is lost: ``d`` sets my ready flags of the next
call only after that ack, which follows the zeroing on ``S``; my GEMM raises a chunk flag again
only in the next call, after ``S`` waited for the ``P`` that reset it. No deadlock: my GEMM waits
only for peers' ``P``, which waits only for its own GEMM's tiles for other ranks (which never
wait) and for acks sent at the end of the previous call; no ``P`` operation needs an SM. ``P``'s
operations are fixed per shape, recorded once in a :class:`~triton_dist.StreamSchedule` and queued
with one call while the GEMM runs; with serialised launches (``CUDA_LAUNCH_BLOCKING``,
:attr:`triton_dist.config.Config.serialised_launches`) they are queued before the GEMM, whose
launch would otherwise return only after it had waited forever for the peers' copies, and so
they are where ranks share a GPU (streams of a process may share an MPS work queue, and a GEMM
ahead of its own copies in one would wait for ever).

TMA stores and the release: a TMA store (``cp.async.bulk.tensor``) is a write of the async
proxy that completes asynchronously; Triton 3.6 only waits for it to have *read* its shared
memory source (``cp.async.bulk.wait_group.read``). ``"fused"``, ``"push"`` and ``"pull"`` store
their tiles with ``tl.store`` (generic proxy, every thread, 16-byte vectors: ``N`` is a multiple
of 8 and the stride carries that fact), which ``dl.notify`` covers (CTA barrier, then the release
atomic): the plain memory model. ``"fused_tma"`` stores the peers' tiles by TMA and, before each
release, runs ``dl.wait_tma_stores`` in every thread (``cp.async.bulk.wait_group 0`` completes
the stores of whichever thread Triton elected to issue them, then an async-proxy fence), then
the CTA barrier and the release (its GPU tests pass; measured no faster than ``"fused"``).

SMs, and why this cannot deadlock (``"push"``/``"pull"``): only the consumer ever waits, and it
waits only for GEMM tiles (this rank's and the peers'); no GEMM waits for anything, so every GEMM
program finishes whatever else runs on its GPU, and the consumer then finishes. The fused
methods' own tiles do wait, for peers' tiles that come first in every GEMM's order (and, for
``"fused_ce"``, for the copy streams, which need no SM); this relies on every GEMM program being
resident (a persistent grid of at most one program per SM, on a GPU running nothing else that
holds SMs for as long). Residency decides speed, not
progress: the GEMM's persistent grid leaves :data:`REDUCE_SMS` SMs free for the consumer, or a
consumer that could not become resident next to a GEMM program (a 128x256 GEMM program holds
~208 KiB of shared memory and most registers of its SM) would only start when the GEMM ends,
and overlap nothing. Across calls: the GEMM of call ``e + 1`` on rank ``r`` is stream-ordered
after ``r``'s consumer of call ``e`` (``S`` waits for ``P``), and that consumer waits only for
GEMMs of call ``e``, which never wait: no cycle.

Buffer reuse: ``partials`` has two halves, the call's half is ``epoch % 2`` (the argument of
:mod:`triton_dist.kernels.common.context`): a rank writes half ``e % 2`` again in call ``e + 2``, after
its call ``e + 1`` finished, which needed every peer's GEMM of call ``e + 1`` to have produced
this rank's tiles, which on that peer runs after its consumer of call ``e`` (stream order) - the
only reader of what was written in call ``e`` (pull: peers read my half; push: I read my half;
in both the reader is the consumer of call ``e``). Signals only grow (set to the epoch, waited
with ``>=``): a value ``> e`` was set after the same tile of call ``e`` was written (same GEMM
stream on the producer), so ``>= e`` is enough. The half is a fixed ``max_m * n`` elements, so
calls with different ``M`` never overlap halves.

``M`` not a multiple of ``world * BM``: the last m-tile of each destination is masked (its rows
past ``m`` are computed from the next destination's A rows, or TMA's zero fill past ``M``, and
dropped).
"""

from __future__ import annotations

import triton.language as tl

from ... import language as dl
from ... import config as _config
from ... import residency as _residency
from ... import runtime as _runtime
from ...distributed_jit import DistributedKernel, jit
from ...signals import SignalPad
from ...stream_schedule import StreamSchedule
from ...symmetric import symm_empty
from . import dense as _gemm
from .context import OverlappedGemmContext
from .gemm_rs_2d import GemmThenReduceScatter, PushAcrossNodes
from . import policy as _policy
from . import tile as _gemm_tile
from .plain_plan import PlainGemmPlan
from ..common import call_counter as _call_counter
from ..common.launch_plan import LaunchPlan, LaunchSequence, PlanCache, Slot
from ..common import reach as _reach
from ... import timeline as _timeline
from ..common.scratch import GlobalScratch
from ..common.streams import side_stream, wait_for
from ..common.host_math import cdiv

REDUCE_SMS = 8
"""SMs the producer GEMM leaves free for the consumer (its programs): the GEMM loses
``REDUCE_SMS / num_sms`` of its SMs (6 % of an H200's 132 at 8), the consumer must keep up with
the GEMM's output (at most ``M * N`` elements per rank read over NVLink for ``"pull"``). A
constructor argument overrides it; to be tuned on the GPU (``bench/gemm_rs.py --reduce-sms``)."""

REDUCE_TILE_ELEMS = 4096
"""Elements of a partial tile the consumer loads per rank at once (rows of ``REDUCE_TILE_ELEMS //
BN``): 16 per thread at 8 warps, two 16-byte vectors."""

CE_CHUNK_BYTES = 8 << 20
"""``"fused_ce"``: the copy engine's chunk size to aim for. Each chunk costs the copy stream three
operations besides the copy (flag wait and reset, the peer's ready flag), a few µs of the stream's
time: 8 MiB take ~23 µs over NVLink (354 GB/s)."""

CE_MIN_CHUNKS = 8
"""``"fused_ce"``: at least this many chunks per destination (smaller chunks where the peers'
rows are few), so that a destination's first chunk leaves early and its last one lands soon after
the GEMM finishes the peers' tiles."""

CE_SCHEDULES_KEPT = 64
"""``"fused_ce"``: the copy-stream schedules a context keeps, one per ``M`` seen (a few KiB each;
the driver copies a schedule's operations when they are enqueued or captured, so dropping one is
safe at any time)."""

METHODS = ("auto", "fused", "fused_tma", "fused_ce", "push", "pull", "2d", "push_2d")
"""Across nodes (:mod:`~triton_dist.kernels.gemm.gemm_rs_2d`): ``"2d"``, the plain GEMM then the
hierarchical ReduceScatter; ``"push_2d"``, ``"push"`` made node-aware, overlapped."""
PRODUCER_EPILOGUES = {"fused": "reduce_own", "fused_tma": "reduce_own_tma", "fused_ce": "reduce_own_ce",
                      "push": "rows_to_peer", "pull": "rows_here", "push_2d": "rows_to_peer"}
"""The GEMM's ``EPILOGUE`` (:data:`triton_dist.kernels.gemm.dense.EPILOGUES`) for each method."""

gemm_rs_producer_kernel = DistributedKernel(_gemm.gemm_kernel)
""":func:`triton_dist.kernels.gemm.dense.gemm_kernel` launched with a ReduceScatter ``EPILOGUE`` and the
language's libraries linked in."""


@jit(do_not_specialize=["m", "half_elems", "signal_region"])
def gemm_rs_reduce_kernel(partials, out, signals, calls, m, N, half_elems, signal_region, WORLD: tl.constexpr,
                          BM: tl.constexpr,
                          BN: tl.constexpr, GROUP_M: tl.constexpr, ROWS: tl.constexpr,
                          PEER_EPILOGUE: tl.constexpr):
    """``out [m, N]`` = this rank's rows of the sum of every rank's partial, tile by tile as the
    producers signal them. ``partials``: the symmetric buffer (two halves of ``half_elems``
    elements, the call's half ``*calls % 2``), each ``[WORLD * m, N]`` rows: for ``PEER_EPILOGUE``
    rank ``r``'s partial of this rank's rows is local rows ``[r * m, (r + 1) * m)``; else it is
    rows ``[me * m, (me + 1) * m)`` of rank ``r``'s buffer. ``signals``: ``WORLD`` regions of
    ``signal_region`` signals (region ``r``: rank ``r``'s tiles, the first
    ``T = cdiv(m, BM) * cdiv(N, BN)`` of it used). ``N``: a multiple of 8 (specialised: the
    context's ``n``)."""
    epoch = tl.load(calls)
    me = dl.rank()
    half = (epoch % 2).to(tl.int64) * ((half_elems // 8) * 8)  # == half_elems, a multiple of 8
    stride = (N // 8) * 8  # == N, with the divisibility fact for 16-byte loads
    local_m = tl.cdiv(m, BM)
    num_n = tl.cdiv(N, BN)
    per_dest = local_m * num_n
    sub_rows = tl.arange(0, ROWS)
    for t in range(tl.program_id(0), per_dest, tl.num_programs(0)):
        pid_m, pid_n = _gemm_tile.tile_coords(t, local_m, num_n, GROUP_M)
        token = dl.wait(signals + me * signal_region + t, 1, "sys", "acquire", epoch)
        for i in tl.static_range(1, WORLD):
            token = token + dl.wait(signals + ((me + i) % WORLD) * signal_region + t, 1, "sys", "acquire", epoch)
        cols = pid_n * BN + tl.arange(0, BN)
        for r0 in range(0, BM, ROWS):
            rows = pid_m * BM + r0 + sub_rows
            mask = (rows < m)[:, None] & (cols < stride)[None, :]
            offs = rows.to(tl.int64)[:, None] * stride + cols[None, :]
            acc = tl.zeros((ROWS, BN), tl.float32)
            for r in tl.static_range(WORLD):
                if PEER_EPILOGUE:
                    src = partials + half + (r * m).to(tl.int64) * stride
                else:
                    src = tl.multiple_of(dl.symm_at(partials, r), 16) + half + (me * m).to(tl.int64) * stride
                v = tl.load(dl.consume_token(src + offs, token), mask=mask)
                acc += v.to(tl.float32)
            tl.store(out + offs, acc.to(out.dtype.element_ty), mask=mask)


def copy_engine_chunking(m: int, n: int, itemsize: int, config: str) -> tuple[int, int]:
    """``(chunk_n, chunks)`` of ``"fused_ce"`` for ``m`` rows per rank and ``n`` columns: n-tiles
    per chunk (a fixed rule, the same on every rank: about :data:`CE_CHUNK_BYTES` a chunk, and at
    least :data:`CE_MIN_CHUNKS` chunks per destination where there are that many tiles) and the
    chunks per destination, numbered as :func:`~triton_dist.kernels.gemm.epilogues.copy_chunk` does."""
    c = _gemm.CONFIGS[config]
    num_n = cdiv(n, c["BN"])
    groups = cdiv(cdiv(m, c["BM"]), c["GROUP_M"])
    ntile_bytes = min(m, c["GROUP_M"] * c["BM"]) * c["BN"] * itemsize
    chunk_n = max(1, min(num_n, CE_CHUNK_BYTES // ntile_bytes, groups * num_n // CE_MIN_CHUNKS))
    return chunk_n, groups * cdiv(num_n, chunk_n)


def copy_engine_chunk_region(chunk: int, m: int, n: int, chunk_n: int, config: str) -> tuple[int, int, int, int]:
    """Rows ``[r0, r1)`` and columns ``[c0, c1)`` (within a destination's ``m x n`` rows) of
    ``"fused_ce"`` chunk ``chunk``: the tiles :func:`~triton_dist.kernels.gemm.epilogues.copy_chunk` numbers
    so, clipped to ``m`` and ``n``."""
    c = _gemm.CONFIGS[config]
    per_group = cdiv(cdiv(n, c["BN"]), chunk_n)
    r0 = (chunk // per_group) * c["GROUP_M"] * c["BM"]
    c0 = (chunk % per_group) * chunk_n * c["BN"]
    return r0, min(r0 + c["GROUP_M"] * c["BM"], m), c0, min(c0 + chunk_n * c["BN"], n)


def _config_blocks() -> tuple[int, int]:
    bms = {c["BM"] for c in _gemm.CONFIGS.values()}
    assert len(bms) == 1, "gemm_reduce_scatter assumes one BM across the GEMM configs"
    return bms.pop(), min(c["BN"] for c in _gemm.CONFIGS.values())


class GemmReduceScatterContext(OverlappedGemmContext):
    """Symmetric partials buffer, signals, side stream and loaded kernels for GEMM+ReduceScatter of
    up to ``max_m`` rows in total (``M``, all ranks' output rows; ``M / world`` per rank) and ``n``
    columns, ``dtype`` bfloat16 or float16; any ``K``.

    Collective: every rank creates it with the same arguments, in the same order as its other
    symmetric allocations; creating it compiles and loads every kernel (every method's, for both GEMM
    configs, since ``K`` is per call) and ends with a barrier. Symmetric memory: ``4 * max_m * n``
    elements (``partials`` and ``"fused_ce"``'s ``ce_rows``) plus ``2 * world * cdiv(max_m /
    world, 128) * cdiv(n, 128) + world`` signals; across nodes (or from the first call of either
    method at one node) also ``"2d"``'s ReduceScatter context and ``"push_2d"``'s pad (``(world +
    nodes - 1) * cdiv(max_m / world, 128) * cdiv(n, 128)`` signals), fp32 inbox (two halves of
    ``nodes - 1`` slots of about ``max_m / world * n``) and staging tiles (``reduce_sms * 128 *
    256`` fp32, :class:`~triton_dist.kernels.gemm.gemm_rs_2d.PushAcrossNodes`). ``reduce_sms``: SMs
    left to the reduce kernel (default :data:`REDUCE_SMS`). Call with :meth:`run` (or
    :func:`triton_dist.ops.gemm_rs`); every rank makes the same calls in the same order with the
    same ``M``, ``K`` and method. Calls may be captured in a CUDA graph and replayed.

    ``protocol_on_one_rank``: with a single rank, still run the signalling GEMM and the reduce
    kernel instead of the plain GEMM, so that one GPU can test them.
    """

    METHODS = METHODS

    def __init__(self, max_m: int, n: int, dtype, *, reduce_sms: int | None = None,
                 protocol_on_one_rank: bool = False):
        import torch

        op = "triton_dist GemmReduceScatterContext"
        super().__init__("GemmReduceScatterContext", dtype, aligned="n", protocol_on_one_rank=protocol_on_one_rank,
                         max_m=max_m, n=n)
        if 2 * max_m * n >= 2**31:
            raise ValueError(f"{op}: 2 * max_m * n = {2 * max_m * n} elements is too large (< 2**31)")
        self.max_m = max_m
        self.n = n
        if reduce_sms is None:  # at most half the SMs the headroom leaves (ranks sharing a GPU)
            reduce_sms = max(1, min(REDUCE_SMS, (self.num_sms - _residency.headroom_sms()) // 2))
        if isinstance(reduce_sms, bool) or not isinstance(reduce_sms, int) or not 0 < reduce_sms < self.num_sms:
            raise ValueError(f"{op}: reduce_sms must be an int in [1, {self.num_sms - 1}], got {reduce_sms!r}")
        self.reduce_sms = reduce_sms
        # "push"/"pull": the reduce spins beside this process's GEMM, which under an MPS cap needs
        # the same headroom as ag_gemm's push (world 8 on one H100, 2026-12-07: every rank's reduce
        # timed out in the 500-call back-to-back "push" test with the GEMM on all the other SMs).
        self.max_programs = _residency.max_waiting_programs(self.device, reserved=reduce_sms, what=op)
        # "fused_ce"'s GEMM waits for the peers' copies, which need SMs when ranks share a GPU.
        self.ce_programs = _residency.max_waiting_programs(self.device, what=op, waits_for_copies=True)
        bm, bn_min = _config_blocks()
        self.tiles_per_rank = cdiv(cdiv(max_m, self.world), bm) * cdiv(n, bn_min)
        """The most tiles of one rank's rows (signals per source rank)."""
        self.half = max_m * n
        self.partials = symm_empty((2 * self.half, ), dtype)
        self.pad = SignalPad(self.world * self.tiles_per_rank, owner="GemmReduceScatterContext")
        # "fused_ce" (module notes, "Copy-engine protocol"): its own rows and flags, so that calls
        # of different methods never share a buffer.
        self.ce_rows = symm_empty((2 * self.half, ), dtype)
        self.ce_pad = SignalPad(self.world * self.tiles_per_rank + self.world,
                                owner="GemmReduceScatterContext fused_ce")
        self._ack = self.world * self.tiles_per_rank  # ce_pad index of ack[0]
        self.ce_pad.signals.view(torch.int64)[self._ack:].fill_(1)  # nothing sent yet, nothing to read
        self.chunk_flags = torch.zeros(self.world * self.tiles_per_rank, dtype=torch.int64, device=self.device)
        self.tickets = torch.zeros(self.world * self.tiles_per_rank, dtype=torch.int32, device=self.device)
        self._peer_ce_rows = _reach.mapped_peer_tensors(self.ce_rows, self.unmapped)
        self._peer_ce_pad = _reach.mapped_peer_tensors(self.ce_pad.signals, self.unmapped)
        self._ce_schedules: dict[tuple[int, str], StreamSchedule] = {}  # (M, GEMM config) -> copy stream's work
        self._acks = StreamSchedule()  # after my GEMM: every peer may send me the next call's rows
        for i in range(1, self.world if not self.unmapped else 1):  # fused_ce within a host only
            d = (self.rank + i) % self.world
            self._acks.write(self._peer_ce_pad[d], self._ack + self.rank, 1)
        self._side = side_stream(self.device)
        self._joined = torch.cuda.Event()  # streams.wait_for's
        self._bumped = torch.cuda.Event()  # re-recorded each call: a wait takes the latest record
        self._scratch = GlobalScratch(self.device)  # the fused_tma method's device-built descriptors
        self._fused_plans = PlanCache()
        """(M, K) -> ``"fused"``'s :class:`LaunchSequence` (:meth:`fused_plan`)."""
        self.gemm_then_reduce_scatter = None
        """``"2d"``'s ReduceScatter (:class:`~triton_dist.kernels.gemm.gemm_rs_2d.GemmThenReduceScatter`):
        made here across several nodes, else by the first ``"2d"`` call."""
        self.push_across_nodes = None
        """``"push_2d"``'s buffers (:class:`~triton_dist.kernels.gemm.gemm_rs_2d.PushAcrossNodes`):
        made here across several nodes, else by the first ``"push_2d"`` call."""
        self.nodes = self.world // _runtime.local_world_size()
        if self.nodes > 1:
            self._across_nodes("2d")
            self._across_nodes("push_2d")
        self.ready()

    def reduce_meta(self, config: str, peer_epilogue: bool) -> dict:
        """The reduce kernel's constexprs and options for GEMM ``config``."""
        c = _gemm.CONFIGS[config]
        return dict(WORLD=self.world, BM=c["BM"], BN=c["BN"], GROUP_M=c["GROUP_M"],
                    ROWS=max(1, REDUCE_TILE_ELEMS // c["BN"]), PEER_EPILOGUE=peer_epilogue, num_warps=8)

    def preload(self) -> None:
        """Compile and load every kernel with the specialisation of real calls (descriptors of this
        dtype and each config's blocks, 16-byte aligned tensors, the context's ``n``; every other
        int unspecialised)."""
        _call_counter.preload(self.calls)
        p = self.partials
        a = p[:self.max_m * self.n].view(self.max_m, self.n)  # only dtype and blocks matter
        for config in _gemm.CONFIGS:
            a_desc, b_desc = _gemm.operand_descriptors(a, a, config)
            for peer, epilogue in ((False, "rows_here"), (True, "rows_to_peer")):
                meta = _gemm.kernel_meta(config, False, epilogue=epilogue, world=self.world)
                gemm_rs_producer_kernel.preload(a_desc, b_desc, p, 2, 2, 2, self.pad.signals, self.calls, 2, 2,
                                                half_elems=2, signal_region=2, out=p, grid=(1, ), **meta)
                gemm_rs_reduce_kernel.preload(p, p, self.pad.signals, self.calls, 2, self.n, 2, 2, grid=(1, ),
                                              **self.reduce_meta(config, peer))
            for epilogue in ("reduce_own", "reduce_own_tma"):
                meta = _gemm.kernel_meta(config, False, epilogue=epilogue, world=self.world)
                compiled = gemm_rs_producer_kernel.preload(a_desc, b_desc, p, 2, 2, 2, self.pad.signals, self.calls,
                                                           2, 2, half_elems=2, signal_region=2, out=p, grid=(1, ),
                                                           **meta)
                if compiled is not None:  # None while preload_in_parallel records
                    self._scratch.reserve(compiled, self.num_sms)
            gemm_rs_producer_kernel.preload(a_desc, b_desc, p, 2, 2, 2, self.pad.signals, self.calls, 2, 2,
                                            half_elems=2, signal_region=2, out=p, grid=(1, ),
                                            **self.fused_meta(config))  # fused_plan's
            meta = _gemm.kernel_meta(config, False, epilogue="reduce_own_ce", world=self.world)
            gemm_rs_producer_kernel.preload(a_desc, b_desc, self.ce_rows, 2, 2, 2, self.ce_pad.signals, self.calls,
                                            2, 2, half_elems=2, signal_region=2, out=p, chunk_n=2,
                                            chunk_flags=self.chunk_flags, tickets=self.tickets, grid=(1, ), **meta)

    def run(self, a, b, out, method: str = "auto") -> LaunchSequence | PlainGemmPlan | None:
        """``out`` = this rank's rows of the sum over ranks of ``a @ b.T`` on the current stream.
        ``a [M, K]``, ``b [n, K]``, ``out [M / world, n]``: contiguous, 16-byte aligned CUDA
        tensors of this dtype, ``M <= max_m`` a multiple of the world size, ``K`` a multiple of 8
        (validated by :func:`triton_dist.ops.gemm_rs`, not here). ``method``: one of
        :data:`METHODS` (see the module notes; ``"auto"``: :func:`triton_dist.kernels.gemm.policy.gemm_rs_method`).
        Returns the launches of ``"fused"`` (:meth:`fused_plan`: a call of the same sizes and
        method with any aligned tensors makes them again, :mod:`triton_dist.eager_calls`) or, at
        one rank, the plain GEMM's plan (:meth:`~.context.OverlappedGemmContext.plain_gemm`), else
        None."""
        import torch

        self.check_method(method)
        big_m, k = a.shape
        n = b.shape[0]
        if n != self.n or big_m > self.max_m or big_m % self.world:
            raise ValueError(f"triton_dist GemmReduceScatterContext.run: a is {list(a.shape)} and b {list(b.shape)}; "
                             f"the context takes M <= {self.max_m}, a multiple of {self.world}, and N = {self.n}")
        if big_m == 0:
            return None
        plain = self.plain_gemm(a, b, out)
        if plain is not False:
            return plain
        if method == "auto":
            method = _policy.gemm_rs_method(big_m // self.world, self.nodes, flops=2.0 * big_m * n * k,
                                            eager=not torch.cuda.is_current_stream_capturing())
        _reach.check_reach("gemm_rs", method, ("2d", "push_2d"), self.unmapped, self.rank)
        if method == "2d":
            self._across_nodes("2d").run(a, b, out)
            return None
        if method == "fused_ce":
            self._run_fused_ce(a, b, out)
            return None
        if method == "fused" and out.data_ptr() % 16 == 0 and not _timeline.kernel_args():
            plan = self.fused_plan(big_m, k)
            plan.launch(a, b, out)
            return plan
        fused = method in ("fused", "fused_tma")
        peer = method in ("push", "push_2d")
        across = self._across_nodes("push_2d") if method == "push_2d" else None
        signals = across.pad.signals if across else self.pad.signals
        m = big_m // self.world
        max_programs = self.num_sms if fused else self.max_programs
        config = _gemm.pick_config(big_m, n, k, max_programs)
        c = _gemm.CONFIGS[config]
        a_desc, b_desc = _gemm.operand_descriptors(a, b, config)
        tiles = cdiv(m, c["BM"]) * cdiv(n, c["BN"])
        stream = torch.cuda.current_stream()
        # The preloaded reduce kernels assume a 16-byte aligned output: another variant would load
        # here, possibly while a peer spins.
        target = out if out.data_ptr() % 16 == 0 else torch.empty_like(out)
        _call_counter.bump(self.calls)
        # The GEMM is launched before the reduce that waits for it: were kernels serialised
        # (CUDA_LAUNCH_BLOCKING, a sanitizer), a reduce launched first would wait for a GEMM that
        # cannot start. The side stream waits only for the bump, not for the GEMM. The fused
        # methods have no side stream: no event (a driver call, ~9 us of host time under MPS).
        if not fused:
            self._bumped.record(stream)
        grid = (max(1, min(self.world * tiles, max_programs)), )
        with self._scratch.installed():
            meta = (across.producer_meta(self, config) if across else
                    _gemm.kernel_meta(config, False, epilogue=PRODUCER_EPILOGUES[method], world=self.world))
            gemm_rs_producer_kernel[grid](a_desc, b_desc, self.partials, big_m, n, k, signals, self.calls,
                                          self.rank, m, half_elems=self.half,  # after the constexprs: by name
                                          signal_region=self.tiles_per_rank, out=target, **meta,
                                          **_timeline.kernel_args())
        if fused:
            if target is not out:
                out.copy_(target)
            return None
        self._side.wait_event(self._bumped)
        with torch.cuda.stream(self._side):
            if across:
                across.reduce(self, config, target, m, min(tiles, self.reduce_sms))
            else:
                gemm_rs_reduce_kernel[(min(tiles, self.reduce_sms), )](self.partials, target, self.pad.signals,
                                                                       self.calls, m, n, self.half,
                                                                       self.tiles_per_rank,
                                                                       **self.reduce_meta(config, peer))
        wait_for(stream, self._side, self._joined)
        if target is not out:
            out.copy_(target)
        return None

    def fused_plan(self, big_m: int, k: int) -> LaunchSequence:
        """``"fused"``'s launch for ``big_m`` rows of depth ``k``, made once per ``(big_m, k)``: the
        one GEMM of :meth:`run`'s, advancing the call counter itself (``ENTER_CALL``: no bump, so
        one launch a call; its reduce-own epilogue builds no descriptor on the device, so it needs
        no global scratch); :meth:`~LaunchSequence.launch` takes ``(a, b, out)``, ``out`` 16-byte
        aligned."""
        return self._fused_plans.get((big_m, k), lambda: self._make_fused_plan(big_m, k))

    def _make_fused_plan(self, big_m: int, k: int) -> LaunchSequence:
        n, m = self.n, big_m // self.world
        config = _gemm.pick_config(big_m, n, k, self.num_sms)
        c = _gemm.CONFIGS[config]
        tiles = cdiv(m, c["BM"]) * cdiv(n, c["BN"])
        gemm = LaunchPlan(gemm_rs_producer_kernel, (max(1, min(self.world * tiles, self.num_sms)), ),
                          (Slot(0, "a", (c["BM"], c["BK"])), Slot(1, "b", (c["BN"], c["BK"])), self.partials, big_m, n,
                           k, self.pad.signals, self.calls, self.rank, m),
                          self.fused_meta(config),
                          named=dict(half_elems=self.half, signal_region=self.tiles_per_rank, out=Slot(2, "out")))
        return LaunchSequence(gemm)

    def fused_meta(self, config: str) -> dict:
        """The constexprs and options of :meth:`fused_plan`'s GEMM (``"fused"``, entering its call)."""
        return _gemm.kernel_meta(config, False, epilogue=PRODUCER_EPILOGUES["fused"], world=self.world,
                                 enter_call=True)

    def _fused_ce_schedule(self, big_m: int, config: str) -> StreamSchedule:
        """The copy stream's operations of ``"fused_ce"`` for ``big_m`` rows and GEMM ``config``
        (module notes, "Copy-engine protocol"): fixed per shape, recorded once."""
        n, world, me, region = self.n, self.world, self.rank, self.tiles_per_rank
        m = big_m // world
        chunk_n, chunks = copy_engine_chunking(m, n, self.dtype.itemsize, config)
        outgoing = self.ce_rows[self.half:self.half + big_m * n].view(big_m, n)
        incoming = {d: rows[:big_m * n].view(big_m, n) for d, rows in self._peer_ce_rows.items()}
        schedule = StreamSchedule()
        for chunk in range(chunks):
            r0, r1, c0, c1 = copy_engine_chunk_region(chunk, m, n, chunk_n, config)
            for i in range(1, world):
                d = (me + i) % world
                if chunk == 0:  # d has read what I sent it last time
                    schedule.wait(self.ce_pad.signals, self._ack + d, 1).write(self.ce_pad.signals, self._ack + d, 0)
                schedule.wait(self.chunk_flags, d * region + chunk, 1).write(self.chunk_flags, d * region + chunk, 0)
                schedule.copy_2d(incoming[d][me * m + r0:me * m + r1, c0:c1], outgoing[d * m + r0:d * m + r1, c0:c1])
                schedule.write(self._peer_ce_pad[d], me * region + chunk, 1)
        return schedule

    def _across_nodes(self, method: str):
        """:attr:`gemm_then_reduce_scatter` (``"2d"``) or :attr:`push_across_nodes` (``"push_2d"``),
        made on first use (collective, like every call)."""
        made = self.gemm_then_reduce_scatter if method == "2d" else self.push_across_nodes
        if made is None:
            import torch

            if torch.cuda.is_current_stream_capturing():
                raise RuntimeError(f"triton_dist gemm_rs: the first method={method!r} call of a context makes its "
                                   "buffers across nodes, which cannot happen during CUDA graph capture; make one "
                                   f"uncaptured {method!r} call first")
            if method == "2d":
                made = self.gemm_then_reduce_scatter = GemmThenReduceScatter(self.max_m, self.n, self.dtype)
            else:
                made = self.push_across_nodes = PushAcrossNodes(self, gemm_rs_producer_kernel)
        return made

    def _run_fused_ce(self, a, b, out) -> None:
        """``"fused_ce"`` (module notes, "Copy-engine protocol"); arguments as :meth:`run`."""
        import torch

        big_m, k = a.shape
        n, world, me, region = self.n, self.world, self.rank, self.tiles_per_rank
        m = big_m // world
        config = _gemm.pick_config(big_m, n, k, self.num_sms)
        c = _gemm.CONFIGS[config]
        chunk_n, _ = copy_engine_chunking(m, n, self.dtype.itemsize, config)
        schedule = self._ce_schedules.get((big_m, config))
        if schedule is None:
            if len(self._ce_schedules) >= CE_SCHEDULES_KEPT:  # the oldest shape goes first
                self._ce_schedules.pop(next(iter(self._ce_schedules)))
            schedule = self._ce_schedules[(big_m, config)] = self._fused_ce_schedule(big_m, config)
        a_desc, b_desc = _gemm.operand_descriptors(a, b, config)
        stream = torch.cuda.current_stream()
        target = out if out.data_ptr() % 16 == 0 else torch.empty_like(out)
        _call_counter.bump(self.calls)
        self._bumped.record(stream)
        side = self._side
        side.wait_event(self._bumped)
        # The copy stream's operations only wait on the device, so they may be queued while the
        # GEMM runs, hiding their host time. They go first where that could deadlock: a serialised
        # GEMM launch (CUDA_LAUNCH_BLOCKING, a sanitizer) returns only when the GEMM has finished,
        # which needs every peer's copies; and where ranks share a GPU, two streams of a process
        # may share one MPS work queue, so a GEMM queued ahead of this rank's copies holds them
        # back while it waits for the peers', whose GEMMs hold theirs: a ring (the back-to-back
        # test hung so at world 4 on one H200; the device.cuh fresh-tile GPU test met the same
        # queue sharing, with a consumer queued ahead of its own producer).
        cfg = _config.get()
        copies_first = cfg.serialised_launches or cfg.ranks_per_gpu > 1
        if copies_first:
            schedule.enqueue(side)
        tiles = world * cdiv(m, c["BM"]) * cdiv(n, c["BN"])
        gemm_rs_producer_kernel[(max(1, min(tiles, self.ce_programs)), )](
            a_desc, b_desc, self.ce_rows, big_m, n, k, self.ce_pad.signals, self.calls, me, m, half_elems=self.half,
            signal_region=region, out=target, chunk_n=chunk_n, chunk_flags=self.chunk_flags, tickets=self.tickets,
            **_gemm.kernel_meta(config, False, epilogue="reduce_own_ce", world=world), **_timeline.kernel_args())
        if not copies_first:
            schedule.enqueue(side)
        # The GEMM consumed every ready flag of this call: zero them before any peer may set the
        # next call's, which it does only after the acks below.
        self.ce_pad.signals.view(torch.int64)[:self._ack].zero_()
        self._acks.enqueue(stream)
        wait_for(stream, side, self._joined)
        if target is not out:
            out.copy_(target)
