"""AllReduce (sum) over the ranks of one node: one-shot, two-shot, LL, copy-engine two-shot and
ring, from tiles and signals.

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
   rank (stores through ``dl.symm_at``) and notifies signal ``(me, p)`` of region 1 on rank ``s``,
   for every peer ``s`` (its own shard stays in ``x``);
2. reduce: it waits for region-1 signal ``(r, p)`` from every peer, sums its tiles of its own shard
   over the ranks (fp32, rank order; its own part read from ``x``, the peers' from the
   ``WORLD - 1`` staging slots), writes the result into its own output and into every peer's
   gather buffer, and notifies region-2 signal ``(me, p)`` on every peer;
3. gather: it waits for region-2 signal ``(r, p)`` from every peer and copies shard ``r``'s tiles
   from the gather buffer into the output.

LL (:func:`ll_reduce_kernel`), small messages (up to :attr:`AllReduceContext.LL_MAX_BYTES`
per rank), the low-latency protocol of :mod:`triton_dist.kernels.collectives.allgather`'s ``"ll"`` method:
the input is cut into 8-byte LL words of 4 payload bytes (low half) and a 4-byte flag derived
from the epoch (high half); program ``p`` owns the same ``BLOCK_W``-word tiles on every rank.

1. push: program ``p`` packs each of its tiles of the input and writes it, one 64-bit
   ``st.relaxed.sys`` store per word (single-copy atomic: a reader sees payload and flag
   together), into slot ``me`` of every rank's LL buffer, this rank's included. No signal, no
   fence: the flag inside each word is the signal;
2. reduce: for its tiles, it spins with ``ld.relaxed.sys`` on its LOCAL LL buffer, slot ``0``,
   then ``1``, ..., ``WORLD - 1``, until every word of the tile carries this call's flag, and adds
   the payloads in fp32 in that rank order (the same additions, in the same order, as one-shot:
   every rank gets the same bits, and the same bits as one-shot), then writes the output.

The LL buffer holds ``2 x WORLD`` slots (two halves); a word moves twice the payload over NVLink,
which is why LL is for latency-bound sizes only. Reuse of the LL buffer between calls:

- halves: call ``e`` writes half ``e % 2``. A rank starts call ``e + 2`` only after finishing call
  ``e + 1`` (stream order), and call ``e + 1``, of any method, does not finish before it received
  data or a signal from every peer's call ``e + 1`` (directly, or for the ring through the chain
  of ranks: its last step carries what rank ``me + 1`` sent at its first), which every peer sends
  only after finishing its call ``e`` (stream order again). So no peer still reads half ``e % 2``
  for call ``e`` when this rank writes it for call ``e + 2``, and no word of call ``e + 2`` can
  reach a rank that has not finished reading call ``e``'s.
- flags: call ``e`` writes flag ``e mod (2^32 - 1) + 1``, never 0 (the buffer is zeroed at
  creation, so a never-written word never matches). A word a receiver spins on was last written by
  an earlier ``"ll"`` call of the same parity (or never): its flag differs from this call's unless
  the two calls are a multiple of ``2^32 - 1`` calls apart (the word not rewritten for over four
  billion calls, e.g. past the end of much smaller messages: not guarded against). Words past the
  end of the message in the last tile are sent but never waited for.

Copy-engine two-shot (``"ce_two_shot"``, :meth:`AllReduceContext._run_ce_two_shot`), meant for the
largest sizes: two-shot with both transfers on copy engines, in chunks, so that the SMs only add
and the NVLink traffic of one chunk overlaps the reduction of the one before. Measured on 2 x H200
(bench/results/h200-x2/allreduce_baea078.json, 32 to 256 MiB): level with two-shot and behind
NCCL, not the win its byte count promises (each direction carries one push and one pull of a
half, 268 MB at 256 MiB); why is not yet known (the pulls' read bandwidth is the first suspect).
Later runs (bench/results/h200-x2/allreduce.json) put it level with two-shot at 256 MiB and ahead
at 1 GiB, so ``"auto"`` uses
it from :data:`~triton_dist.kernels.collectives.policy.ALL_REDUCE_CE_TWO_SHOT_MIN_BYTES` on two ranks. The shards are those of
two-shot; each is cut into ``chunks`` chunks of ``chunk_tiles`` tiles
(:meth:`AllReduceContext.ce_chunking`). Streams: the caller's ``S``, a push stream ``P`` and a pull
stream ``Q``. Signals (the context's ``ce_pad``, 0/1 flags reset by their consumer, because the
copy streams' operations carry values fixed when enqueued, which a replayed CUDA graph cannot
change): ``scattered[r][c]`` (rank ``r``'s part of my shard, chunk ``c``, is in my ``stage``),
``reduced[r][c]`` (rank ``r``'s shard, chunk ``c``, is summed in its ``gather``), and a barrier slot.

1. ``S``: bump the call counter; :func:`~triton_dist.kernels.common.rank_barrier.rank_barrier_kernel`
   (every rank has finished its previous call, of any method: nobody still reads the buffers
   written below, and every flag of the previous call was consumed and reset).
2. ``P``, chunk by chunk: copy my part of shard ``s``, chunk ``c``, into slot ``me`` of rank
   ``s``'s ``stage``; set ``scattered[me][c] = 1`` on ``s`` (``cuStreamWriteValue64``, after the
   copy on the same stream, with its system-scope barrier).
3. ``S``: :func:`all_reduce_ce_reduce_kernel`: per chunk, every program waits for
   ``scattered[r][c]`` from every peer, sums its tiles of my shard (``x`` for my own part, the
   ``stage`` slots for the peers') in fp32 in rank order into ``out`` and ``gather``; the program
   that finishes the chunk last (a ticket: CTA barrier, acq_rel add) resets the chunk's
   ``scattered`` flags and sets ``reduced[me][c] = 1`` on every peer (release, system scope).
4. ``Q``, chunk by chunk: wait for ``reduced[s][c]`` (``cuStreamWaitValue64``), reset it, copy
   chunk ``c`` of shard ``s`` from rank ``s``'s ``gather`` into ``out``.
5. ``S`` waits for ``P`` and ``Q``.

Buffers: the first half of ``stage`` and of ``gather`` (one region: the barrier of step 1
replaces the parity halves, which the copies' fixed addresses could not follow). Why a later call
of another method cannot touch what this call still uses: when my call ends, every peer has
finished reading its ``stage`` for it (my pull stream waited for every ``reduced[s][c]``, empty
chunks' included, and rank ``s`` raises that flag only after all its programs summed chunk ``c``),
and every push into my ``stage`` has landed (my reduce waited for them). What is left is the
peers' pulls from my ``gather``; two-shot, the only other method that writes ``gather``, writes
mine in its phase 2, after a scatter signal of that call from every rank, i.e. after every puller
has left this call. No deadlock: the reduce waits only for copies, which wait for nothing on the
GPU; the pulls wait only for reduces; and every copy-stream operation is queued before the kernel
that waits for its peers' counterparts.

Ring (:func:`all_reduce_ring_kernel`), for machines whose GPUs are not all linked to each other:
data moves only from rank ``r`` to rank ``r + 1``. Shards as two-shot's; two halves in one kernel:

1. reduce-scatter, ``WORLD - 1`` steps: at step ``k`` program ``p`` sends its tiles of the
   partial of shard ``(me - k - 1) mod WORLD`` (x's part, plus, after step 0, the partial of the
   same shard that arrived at step ``k - 1``) in fp32 into slot ``k`` of rank ``me + 1``'s
   ``ring_inbox``, notifies ring signal ``(k, p)`` there and waits for its own. After the last
   step slot ``WORLD - 2`` holds shard ``me`` summed over every other rank; adding x's part gives
   the result, rounded once into ``out``;
2. all-gather of the reduced shards around the same ring through ``stage`` (half ``epoch % 2``;
   :func:`~triton_dist.kernels.common.ring.ring_all_gather_steps`).

Each shard is summed by one rank and copied to the others, so every rank gets the same bits; the
order of the additions is the ring's, so not the bits of one-shot. ``ring_inbox`` (this method's
alone) has one region, not two halves. Program ``p`` of rank ``me + 1`` reads its tiles of the
inbox for the last time in a call just before it sends its reduced tiles on (all-gather step 0);
they reach program ``p`` of rank ``me`` by the last all-gather step of that call, so rank ``me``
finishes the call (every program of it) only after that read, and writes the inbox again only in
a later ring call. Calls of other methods in between change nothing: they leave the inbox alone.

Why the all-gather goes through ``stage`` and not ``gather``: its step 0 writes into rank
``me + 1``'s buffer without waiting for anyone, which is what two-shot's scatter does to
``stage`` (safe under the parity argument below, and after ``"ce_two_shot"``, whose note says
that when a call ends every peer has finished reading its ``stage``). Into ``gather`` it would not
be safe after ``"ce_two_shot"`` on three or more ranks: a third rank may still be pulling rank
``me + 1``'s ``gather`` for that call.

Reuse between calls (one-shot, two-shot, the ring's ``stage``): the epoch is the context's
device call counter and buffers alternate halves by its parity (see
:mod:`triton_dist.kernels.common.context` for why that is safe and graph-capturable). Every method
advances the same counter by one per call (the one-kernel methods in their kernel, ``"ce_two_shot"``
with a bump first), so the argument above holds across methods.

Inputs and outputs need not be symmetric; only the staging, gather and LL buffers are.
Accumulation is fp32 for every dtype; staging and gather buffers hold the input dtype.
"""

from __future__ import annotations

from ... import runtime as _runtime
from ...signals import SignalPad, stream_wait_value64, stream_write_value64
from ...symmetric import symm_empty
from .allreduce_kernels import (all_reduce_ce_reduce_kernel, all_reduce_one_shot_kernel, all_reduce_ring_kernel,
                                all_reduce_two_shot_kernel, ll_reduce_kernel)
from . import policy as _policy
from .allreduce_2d import TwoLevelAllReduce
from ..common.context import CollectiveContext, OneRankCopy
from ..common.ll_buffer import ll_buffer
from ..common.launch_plan import OUT, X, LaunchPlan
from ..common.ll_protocol import LL_BLOCK
from ..common import reach as _reach
from ..common.rank_barrier import rank_barrier_kernel
from ..common.streams import side_stream, wait_for
from ..common.host_math import cdiv


def _refuse_during_capture(method: str, what: str) -> None:
    """A method's first call that allocates (collective, symmetric) cannot be captured."""
    import torch

    if torch.cuda.is_current_stream_capturing():
        raise RuntimeError(f"triton_dist all_reduce: the first method={method!r} call of a context {what}, which "
                           f"cannot happen during CUDA graph capture; make one uncaptured {method!r} call first")


class AllReduceContext(CollectiveContext):
    """Symmetric staging, gather and LL buffers and signals for AllReduce (sum) of up to
    ``max_bytes`` bytes of ``dtype`` (float32, bfloat16 or float16), reused across calls.

    Methods (:attr:`METHODS`; :func:`triton_dist.ops.all_reduce` resolves ``"auto"`` with :meth:`method_for`):
    ``"one_shot"``, ``"two_shot"``, ``"ll"`` (low-latency protocol, flags inside the data, up to
    :attr:`ll_max_bytes` = ``min(max_bytes, LL_MAX_BYTES)`` per rank), ``"ce_two_shot"``
    (copy engines, in chunks), ``"ring"`` (for machines without a full mesh; never chosen by
    ``"auto"``) and ``"2d"`` (ReduceScatter then AllGather, each within nodes and across,
    :mod:`~triton_dist.kernels.collectives.allreduce_2d`: ``"auto"``'s choice for a world of
    several nodes; its contexts are made by its first call). See the module notes.

    Collective: every rank creates it with the same arguments, in the same order as its other
    symmetric allocations; creating it compiles and loads every kernel. Ranks must have the same
    GPU model (the grid is sized from the SM count). Memory on the symmetric heap: ``4 *
    max_bytes`` (stage and gather, rounded up to whole tiles) plus the LL buffer, ``2 * world * 2 *
    ll_max_bytes`` (rounded up to whole LL tiles), plus ``(5 * world - 2) * max_programs`` signals
    and ``2 * world * CE_MAX_CHUNKS + world`` more (``ce_pad``); the first ``"ring"`` call adds the
    ring's fp32 inbox, ``4 (world - 1) / world * max_numel`` bytes (rounded up to whole tiles),
    a symmetric allocation like the ones above: collective, in the same order on every rank, which
    holds because every rank makes the same calls in the same order; ``"2d"``'s two contexts add
    theirs (:mod:`~triton_dist.kernels.collectives.allreduce_2d`), at creation across nodes.

    Call with :meth:`run` (or use :func:`triton_dist.ops.all_reduce`). Every call must be made by
    every rank, in the same order, with the same ``numel`` and method. Calls may be captured in a
    CUDA graph and replayed.
    """

    METHODS = ("auto", "one_shot", "two_shot", "ll", "ce_two_shot", "ring", "2d")

    CE_MAX_CHUNKS = 16
    """``"ce_two_shot"``: the most chunks a shard is cut into (signals per peer)."""

    CE_MIN_CHUNK_BYTES = 2 << 20
    """``"ce_two_shot"``: the smallest chunk worth its copy-stream operations (a few µs each)."""

    LL_MAX_BYTES = 64 * 1024
    """The largest input (bytes per rank) the ``"ll"`` method takes; ``"auto"`` uses ``"ll"`` up to
    :data:`~triton_dist.kernels.collectives.policy.ALL_REDUCE_LL_MAX_BYTES`."""

    def __init__(self, max_bytes: int, dtype, *, max_programs: int | None = None):
        import torch

        max_numel, world = self.numel_and_world("AllReduceContext", max_bytes, dtype)
        half = world * cdiv(max_numel, world * self.BLOCK) * self.BLOCK
        # Signals per program slot: one-shot's region, two-shot's two, the ring's 2 (world - 1) steps.
        super().__init__("AllReduceContext", dtype, max_numel, {"stage": half, "gather": half},
                         3 * world + 2 * (world - 1), max_programs)
        self.half = self.halves["stage"]
        self.ll_max_bytes = min(self.max_bytes, self.LL_MAX_BYTES)
        """The largest input (bytes per rank) this context's ``"ll"`` method takes."""
        self.ll, self.ll_slot = ll_buffer("AllReduceContext", self.world, self.ll_max_bytes)
        """The LL buffer (:func:`~triton_dist.kernels.common.ll_buffer.ll_buffer`) and its 8-byte
        words per rank slot."""
        # "ce_two_shot" (module notes): scattered/reduced flags, then the barrier's slot.
        self.ce_pad = SignalPad(2 * self.world * self.CE_MAX_CHUNKS + self.world, owner="AllReduceContext ce_two_shot")
        self._ce_barrier = 2 * self.world * self.CE_MAX_CHUNKS
        self.ce_tickets = torch.zeros(self.CE_MAX_CHUNKS, dtype=torch.int32, device=self.calls.device)
        self._peer_stage = _reach.mapped_peer_tensors(self.stage, self.unmapped)
        self._peer_gather = _reach.mapped_peer_tensors(self.gather, self.unmapped)
        self._peer_ce_pad = _reach.mapped_peer_tensors(self.ce_pad.signals, self.unmapped)
        self._push = side_stream(self.calls.device)
        self._pull = side_stream(self.calls.device)
        self._joined = torch.cuda.Event()  # streams.wait_for's
        self._started = torch.cuda.Event()
        self.local_world = _runtime.local_world_size()
        """Ranks per node (several nodes make ``"2d"`` ``"auto"``'s choice)."""
        self.two_level = None
        """``"2d"``'s ReduceScatter and AllGather contexts
        (:class:`~triton_dist.kernels.collectives.allreduce_2d.TwoLevelAllReduce`): made here across
        several nodes, else by the first ``"2d"`` call."""
        self.ring_inbox = None
        """``"ring"``'s fp32 partials (symmetric, one region of ``world - 1`` shards), allocated by
        the first ``"ring"`` call: the other methods need no fp32 buffer."""
        if self.world > self.local_world:
            self._two_level()
        self.ready()

    def method_for(self, nbytes: int) -> str:
        """The method ``"auto"`` picks for ``nbytes`` bytes per rank
        (:func:`triton_dist.kernels.collectives.policy.all_reduce_method`)."""
        return _policy.all_reduce_method(nbytes, self.world, self.ll_max_bytes, self.world // self.local_world)

    def _meta(self) -> dict:
        return self.meta()

    def _ll_meta(self) -> dict:
        return dict(WORLD=self.world, ll_slot=self.ll_slot, BLOCK_W=LL_BLOCK, ELEMS=4 // self.dtype.itemsize,
                    num_warps=self.NUM_WARPS)

    def preload(self) -> None:
        """Compile and load every kernel with the specialisation of real calls (16-byte aligned
        tensors of this dtype; ``n``, ``words``, ``shard_tiles`` and ``half_tiles`` unspecialised
        32-bit ints: one compiled kernel serves contexts of every size)."""
        n = max(2, self.max_numel)  # the int type (i32) real calls have
        half_tiles = self.half // self.BLOCK
        all_reduce_one_shot_kernel.preload(self.stage, self.gather, self.stage, self.pad.signals, n, self.calls,
                                           half_tiles, grid=(1, ), **self._meta())
        all_reduce_two_shot_kernel.preload(self.stage, self.gather, self.stage, self.gather, self.pad.signals, n,
                                           self.calls, 3, half_tiles, grid=(1, ), **self._meta())
        ll_reduce_kernel.preload(self.stage, self.gather, self.ll, n, n, self.calls, grid=(1, ), **self._ll_meta())
        rank_barrier_kernel.preload(self.ce_pad.signals, self.calls, grid=(1, ), **self._barrier_meta())
        all_reduce_ce_reduce_kernel.preload(self.stage, self.gather, self.stage, self.gather, self.ce_pad.signals,
                                            self.ce_tickets, n, n, n, n, grid=(1, ), **self._ce_meta())
        import torch

        fp32 = torch.empty(4, dtype=torch.float32, device=self.calls.device)  # the ring inbox's type
        all_reduce_ring_kernel.preload(self.stage, self.gather, fp32, self.stage, self._ring_signals(), n,
                                       self.calls, 3, half_tiles, grid=(1, ), **self._meta())

    def _ring_signals(self):
        """The ring's ``2 (world - 1) * max_programs`` signals, after two-shot's regions."""
        return self.pad.signals[3 * self.world * self.max_programs:]

    def _ring_inbox(self):
        """:attr:`ring_inbox`, allocated on first use (collective, like every call)."""
        if self.ring_inbox is None:
            import torch

            _refuse_during_capture("ring", "allocates its symmetric inbox")
            self.ring_inbox = symm_empty(((self.world - 1) * (self.half // self.world), ), torch.float32)
        return self.ring_inbox

    def _two_level(self):
        """:attr:`two_level`, made on first use (collective, like every call)."""
        if self.two_level is None:
            _refuse_during_capture("2d", "makes its ReduceScatter and AllGather contexts")
            self.two_level = TwoLevelAllReduce(self.max_numel, self.dtype, self.world, self.max_programs)
        return self.two_level

    def _barrier_meta(self) -> dict:
        return dict(PHASE=0, PHASES=1, WORLD=self.world, num_warps=1)

    def _ce_meta(self) -> dict:
        return dict(WORLD=self.world, MAX_CHUNKS=self.CE_MAX_CHUNKS, BLOCK=self.BLOCK, num_warps=self.NUM_WARPS)

    def ce_chunking(self, shard_tiles: int) -> tuple[int, int]:
        """``(chunk_tiles, chunks)`` of ``"ce_two_shot"`` for shards of ``shard_tiles`` tiles: as
        many chunks as :attr:`CE_MAX_CHUNKS` allows, none under :attr:`CE_MIN_CHUNK_BYTES` (a
        fixed rule: the same on every rank)."""
        tile_bytes = self.BLOCK * self.dtype.itemsize
        most = max(1, min(self.CE_MAX_CHUNKS, shard_tiles * tile_bytes // self.CE_MIN_CHUNK_BYTES))
        chunk_tiles = cdiv(shard_tiles, most)
        return chunk_tiles, cdiv(shard_tiles, chunk_tiles)

    def run(self, x, out, method: str) -> LaunchPlan | OneRankCopy | None:
        """``out = sum over ranks of x`` with ``method`` ``"one_shot"``, ``"two_shot"``, ``"ll"``
        (at most :attr:`ll_max_bytes`), ``"ce_two_shot"`` or ``"ring"``, on the current stream.
        ``x`` and ``out``: contiguous CUDA tensors of this dtype, ``x.numel() <= max_numel``
        elements (validated by :func:`triton_dist.ops.all_reduce`, not here); ``out`` may be
        ``x``. Returns the :class:`LaunchPlan` it launched when the call was that one launch (a
        call of as many elements by the same method, with any 16-byte aligned tensors, launches it
        again: :mod:`triton_dist.eager_calls`), with one rank the copy (``OneRankCopy``), else
        None."""
        n = x.numel()
        if method not in self.METHODS[1:]:
            raise ValueError(f"triton_dist AllReduceContext.run: method must be one of {self.METHODS[1:]}, got "
                             f"{method!r}")
        _reach.check_reach("all_reduce", method, ("2d", ), self.unmapped, self.rank)
        if n == 0:
            return
        nbytes = n * self.dtype.itemsize
        if method == "ll" and nbytes > self.ll_max_bytes:
            raise ValueError(f"triton_dist all_reduce: method 'll' takes at most {self.ll_max_bytes} bytes per rank, "
                             f"got {nbytes}; use 'one_shot', 'two_shot' or 'auto'")
        copied = self.ran_on_one_rank(x, out)
        if copied:
            return copied
        if method in ("2d", "ce_two_shot"):
            x, target = self.aligned(x, out)
            if method == "2d":
                self._two_level().run(x.view(-1), target.view(-1))
            else:
                self._run_ce_two_shot(x, target, n)
            if target is not out:
                out.copy_(target)
            return None
        if method == "ring":
            self._ring_inbox()
        return self.launch_aligned(n, method, x, out)

    def _make_launch_plan(self, n: int, method: str) -> LaunchPlan | None:
        """``"one_shot"``, ``"two_shot"``, ``"ll"``, and ``"ring"`` once its inbox exists: one
        kernel each, which advances the call counter itself."""
        meta = self._meta()
        half_tiles = self.half // self.BLOCK
        if method == "one_shot":
            return LaunchPlan(all_reduce_one_shot_kernel, self.grid(cdiv(n, self.BLOCK)),
                              (X, OUT, self.stage, self.pad.signals, n, self.calls, half_tiles), meta)
        if method == "two_shot":
            shard_tiles = cdiv(n, self.world * self.BLOCK)
            return LaunchPlan(all_reduce_two_shot_kernel, self.grid(shard_tiles),
                              (X, OUT, self.stage, self.gather, self.pad.signals, n, self.calls, shard_tiles,
                               half_tiles), meta)
        if method == "ring" and self.ring_inbox is not None:
            shard_tiles = cdiv(n, self.world * self.BLOCK)
            return LaunchPlan(all_reduce_ring_kernel, self.grid(shard_tiles),
                              (X, OUT, self.ring_inbox, self.stage, self._ring_signals(), n, self.calls, shard_tiles,
                               half_tiles), meta)
        if method == "ll":
            return self.ll_plan(ll_reduce_kernel, n, self._ll_meta())
        return None

    def _run_ce_two_shot(self, x, out, n: int) -> None:
        """``"ce_two_shot"`` (module notes: the steps and why they are safe)."""
        import torch

        x, out = x.view(-1), out.view(-1)  # the copies slice elements
        me, world = self.rank, self.world
        stream = torch.cuda.current_stream()
        shard_tiles = cdiv(n, world * self.BLOCK)
        shard = shard_tiles * self.BLOCK
        chunk_tiles, chunks = self.ce_chunking(shard_tiles)
        chunk = chunk_tiles * self.BLOCK
        epoch_ptr = self.next_call()  # several kernels and copies share the call's epoch
        rank_barrier_kernel[(1, )](self.ce_pad.signals[self._ce_barrier:], epoch_ptr, **self._barrier_meta())
        self._started.record(stream)
        self._push.wait_event(self._started)
        self._pull.wait_event(self._started)
        max_chunks = self.CE_MAX_CHUNKS

        def part(s: int, c: int) -> tuple[int, int]:  # chunk c of shard s, as elements of the tensor
            lo = min(s * shard + c * chunk, n)
            return lo, min(s * shard + min((c + 1) * chunk, shard), n)

        with torch.cuda.stream(self._push):
            for c in range(chunks):
                for i in range(1, world):
                    s = (me + i) % world
                    lo, hi = part(s, c)
                    if hi > lo:
                        dst = me * shard + lo - s * shard
                        self._peer_stage[s][dst:dst + hi - lo].copy_(x[lo:hi])
                    stream_write_value64(self._peer_ce_pad[s], me * max_chunks + c, 1, self._push)
        grid = self.grid(chunk_tiles, waits_for_copies=True)
        all_reduce_ce_reduce_kernel[grid](x, out, self.stage, self.gather, self.ce_pad.signals, self.ce_tickets, n,
                                          shard_tiles, chunk_tiles, chunks, **self._ce_meta())
        with torch.cuda.stream(self._pull):
            for c in range(chunks):
                for i in range(1, world):
                    s = (me + i) % world
                    flag = (world + s) * max_chunks + c
                    stream_wait_value64(self.ce_pad.signals, flag, 1, self._pull)
                    stream_write_value64(self.ce_pad.signals, flag, 0, self._pull)
                    lo, hi = part(s, c)
                    if hi > lo:
                        out[lo:hi].copy_(self._peer_gather[s][lo:hi])
        wait_for(stream, self._push, self._joined)
        wait_for(stream, self._pull, self._joined)
