"""GEMM+AllReduce: ``out = sum over ranks r of A_r @ B_r^T`` on every rank, in one kernel, for
the small M of decoding (a row-parallel linear layer: ``K`` is each rank's shard of the
contraction, every rank needs the whole ``[M, N]`` sum).

``"output_tiles"``: one launch of the persistent GEMM of :mod:`triton_dist.kernels.gemm.dense` with
``ALL_REDUCE``: each program computes its tile, stores the fp32 tile into slot ``me`` of every peer's symmetric
``partials`` (``dl.symm_at``, stores over NVLink), signals every rank (its own included), waits
for the same tile from every rank, and sums the ``world`` fp32 partials in rank order ``0, 1,
...`` (its own from registers), rounding once into ``out``. Every rank therefore computes the
same bits: the replicas of a tensor-parallel model stay identical. There is no separate
all-reduce launch and no host synchronisation; at decode sizes that launch and its
synchronisation are most of the cost of ``matmul`` + ``all_reduce``.

Why fp32 partials: a rank's own partial is exact in registers, so for the ranks to agree they
must all add the same exact values; bf16 partials would differ from the sender's register copy.
The traffic is ``(world - 1) * M * N * 4`` bytes per rank, small at decode sizes.

Call ``e`` (the context's device call counter, bumped on the caller's stream before the launch,
or, by ``"split_k"`` up to :data:`SPLIT_K_ENTER_MAX_BM` rows and ``"output_tiles"`` in
:data:`OUTPUT_TILES_ENTER_CONFIGS`, advanced by the kernel itself,
:func:`~triton_dist.kernels.common.call_counter.enter_call`; so a CUDA graph replays with fresh
values): the partials buffer has two halves, the call's is
``e % 2``; a rank writes half ``e % 2`` again in call ``e + 2``, after its call ``e + 1``, which
waited for every peer's tiles of call ``e + 1``, which each peer produced after its call ``e``
(stream order), the only reader of call ``e``'s half. Signals only grow (set to ``e``, waited
with ``>= e``); signal ``r * R + t`` (``R``: the context's fixed tiles per rank) is rank ``r``'s
tile ``t`` (``"split_k"``: ``t = s * cdiv(N, 128) + j`` for slice ``s`` of n-tile ``j``), written
before its signal, in the half of the signalled call. Every program of either method waits for
at least one signal of every peer's current call, so the methods may alternate on one context.

Two tile loops (``method=``, :data:`METHODS`):

- ``"output_tiles"``: the one described above, on the shared GEMM loop (:func:`~triton_dist.kernels.gemm.dense.gemm_kernel`
  with ``ALL_REDUCE``): one tile of ``out`` per program, the skinny configs up to
  ``gemm.SKINNY_MAX_M`` rows, :data:`CONFIG` past them.
- ``"split_k"`` (:func:`gemm_ar_split_k_kernel`, ``M <= SPLIT_K_MAX_M``): decode shapes are bound
  by reading B, and an ``out`` tile of 64 rows of which 1-16 are real feeds wgmma mostly zeros and
  holds few bytes of B per pipeline stage. Here B's rows are wgmma's M side (128 of them per
  tile) and ``out``'s rows its N side (``BM``, M padded to 16-128), so a stage carries 32 KiB of
  B (the K loop and the configs by ``BM`` are the plain split-K GEMM's:
  :func:`~triton_dist.kernels.gemm.tile.swapped_tile_product`,
  :data:`~triton_dist.kernels.gemm.split_k.SPLIT_K_CONFIGS`); the contraction is split into
  ``split_k`` slices (:meth:`GemmAllReduceContext.split_k`) so that ``cdiv(N, 128) * split_k``
  programs fill the SMs. Each program pushes its fp32 partial (rank ``me``, slice ``s``) to slot
  ``me * split_k + s`` of every rank's half (its own included) and signals every rank; the
  programs of slice 0 then wait for all ``world * split_k`` partials of their tile and sum them in
  the order (rank, slice): the split's sum is folded into the all-reduce's, and every rank still
  rounds the same sum. Slices are walked from the last to 0, so a waiting program (slice 0) only
  waits for tiles that come before it in every program's walk. No deadlock: with more than one slice the grid holds every tile once (``split_k``
  keeps ``cdiv(N, 128) * split_k`` within the SMs, asserted at launch), all resident, each
  signalling before it waits; with one slice, the argument of ``"output_tiles"`` below. The
  price: ``split_k`` times the partial bytes of ``"output_tiles"``. Measured on 2 x H200
  (bench/results/h200-x2/gemm_ar.json): ahead of ``"output_tiles"`` at one row (1x4096x7168,
  1x8192x14336), behind at 64 rows (:func:`triton_dist.kernels.gemm.policy.gemm_ar_method` has
  the rule).

No deadlock (``"output_tiles"``): a program signals its tile before it waits, tile ``t`` is
program ``t % grid``'s on every rank (the grid depends only on the shape and the SM count), and the grid is at most one
program per SM, so every program is resident. A waiting program waits for the program of the
same index on the other ranks, which reaches the tile after the same earlier tiles - never for a
program that waits for it. Another kernel that holds SMs on one GPU only delays the op; the wait
timeout (``Config.wait_timeout_ns``) turns a stuck peer into an error.
"""

from __future__ import annotations

import triton.language as tl

from ... import language as dl
from ... import timeline as _timeline
from ...distributed_jit import DistributedKernel, jit
from ...signals import SignalPad
from ...symmetric import symm_empty
from . import dense as _gemm
from .context import OverlappedGemmContext
from .split_k import SPLIT_K_BN, SPLIT_K_CONFIGS, SPLIT_K_MAX_M, block_for
from .tile import swapped_tile_product
from . import policy as _policy
from .plain_plan import PlainGemmPlan
from ..common import call_counter as _call_counter
from ..common.call_counter import call_epoch
from ..common import reach as _reach
from ..common.host_math import cdiv
from ..common.launch_plan import LaunchPlan, LaunchSequence, PlanCache, Slot

CONFIG = "small"
"""The GEMM config of calls with more than ``gemm.SKINNY_MAX_M`` rows (128x128 tiles): with 128x256
tiles the all-reduce epilogue (the accumulator, a peer's fp32 tile and the sum) spills about 1.3 KB
of registers per thread (ptxas, sm_90a). Calls with fewer rows take ``gemm.pick_skinny_config``'s
(64-row tiles that spread the read of B over every SM: decode shapes are bound by that read)."""

METHODS = ("auto", "split_k", "output_tiles")
"""``method=`` of :meth:`GemmAllReduceContext.run` (module notes); ``"auto"``:
:func:`triton_dist.kernels.gemm.policy.gemm_ar_method`."""

SPLIT_K_MAX = 4
"""The most slices ``"split_k"`` cuts the contraction into; the context's symmetric buffer holds
``world * SPLIT_K_MAX`` fp32 slots of ``min(max_m, SPLIT_K_MAX_M) x n``."""

gemm_ar_kernel = DistributedKernel(_gemm.gemm_kernel)
""":func:`triton_dist.kernels.gemm.dense.gemm_kernel` launched with ``EPILOGUE="all_reduce"`` and the
language's libraries linked in (``"output_tiles"``)."""


@jit(do_not_specialize=["M", "K", "rank", "half_elems", "signal_region", "split_k"])
def gemm_ar_split_k_kernel(a_desc, b_desc, partials, out, signals, calls, M, N, K, rank, half_elems, signal_region,
                           split_k, WORLD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                           NUM_STAGES: tl.constexpr, ENTER: tl.constexpr = False):
    """``"split_k"`` GEMM+AllReduce (module notes): ``out [M, N]`` = the sum over ranks and slices
    of ``A [M, K] @ B [N, K]^T``. ``a_desc`` block ``[BM, BK]`` (rows past ``M`` read as zeros),
    ``b_desc`` block ``[BN, BK]``. ``partials``: this rank's symmetric fp32 buffer, two halves of
    ``half_elems`` (the call's half ``*calls % 2``), each ``WORLD * split_k`` slots of ``[M, N]``.
    ``signals``: ``WORLD`` regions of ``signal_region``; rank ``r``'s slice ``s`` of n-tile ``j``
    is signal ``r * signal_region + s * cdiv(N, BN) + j``, set to the call's epoch. ``N`` is a
    multiple of 8 (specialised: the context's ``n``). ``ENTER``: the call's only kernel, its epoch
    from :func:`~triton_dist.kernels.common.call_counter.enter_call` (``calls``: two int64), else
    the bumped counter's value."""
    pid = tl.program_id(0)
    grid = tl.num_programs(0)
    epoch = call_epoch(calls, ENTER)
    half = (epoch % 2).to(tl.int64) * ((half_elems // 8) * 8)  # == half_elems, a multiple of 8
    stride = (N // 8) * 8  # == N, with the divisibility fact for 16-byte stores
    num_n = tl.cdiv(N, BN)
    k_tiles = tl.cdiv(K, BK)
    per_slice = tl.cdiv(k_tiles, split_k)
    slot = M.to(tl.int64) * stride
    for tile in range(pid, num_n * split_k, grid):
        s = split_k - 1 - tile // num_n  # the last slice first: slice 0's programs wait, and come last
        j = tile % num_n
        off_n = j * BN
        # out's tile, transposed: B's rows by A's
        acc = swapped_tile_product(a_desc, b_desc, off_n, s * per_slice, tl.minimum((s + 1) * per_slice, k_tiles), BM,
                                   BN, BK, NUM_STAGES)
        cols = off_n + tl.arange(0, BN)  # out's columns
        rows = tl.arange(0, BM)  # out's rows
        mask = (cols < stride)[:, None] & (rows < M)[None, :]
        offs = rows.to(tl.int64)[None, :] * stride + cols[:, None]
        mine = (rank * split_k + s).to(tl.int64) * slot
        for i in tl.static_range(WORLD):
            peer = tl.multiple_of(dl.symm_at(partials, (rank + i) % WORLD), 16) + half  # symm_at loses alignment
            tl.store(peer + mine + offs, acc, mask=mask)
        for i in tl.static_range(WORLD):
            dl.notify(signals + rank * signal_region + s * num_n + j, (rank + i) % WORLD, epoch, "set", "intra_node")
        if s == 0:
            total = tl.zeros((BN, BM), dtype=tl.float32)
            # Loops, not unrolled: each load must follow its own wait.
            for r in tl.range(0, WORLD, num_stages=1, loop_unroll_factor=1):
                for t in tl.range(0, split_k, num_stages=1, loop_unroll_factor=1):
                    token = dl.wait(signals + r * signal_region + t * num_n + j, 1, "sys", "acquire", epoch)
                    src = partials + half + (r * split_k + t).to(tl.int64) * slot + offs
                    total += tl.load(dl.consume_token(src, token), mask=mask)
            tl.store(out + offs, total.to(out.dtype.element_ty), mask=mask)


SPLIT_K_ENTER_MAX_BM = 64
"""The widest ``"split_k"`` block whose kernel takes its epoch itself (``ENTER``: one launch a call,
no bump; :func:`~triton_dist.kernels.common.call_counter.enter_call`). At 128 rows the entry grew
the kernel's spills at 8 ranks from 96 to 144 bytes (ptxas, sm_90a), so there the bump stays; at
16-64 rows neither variant spills at 1-8 ranks (tests/cpu/gemm/test_compile_gemm_ar.py)."""


OUTPUT_TILES_ENTER_CONFIGS = frozenset(("small", "skinny_n32", "skinny_n64"))
"""``"output_tiles"``' configs whose kernel takes its epoch itself (``ENTER_CALL``: one launch a
call, no bump). ``"skinny_n128"`` keeps the bump: the entry grew its spills at 2 ranks from 32 to
72 bytes (ptxas, sm_90a); the others' spills are the same with and without it at 2-8 ranks
(tests/cpu/gemm/test_compile_gemm_ar.py)."""


class GemmAllReduceContext(OverlappedGemmContext):
    """Symmetric fp32 partials, signals and loaded kernels for GEMM+AllReduce of up to ``max_m`` rows
    and ``n`` columns, ``dtype`` bfloat16 or float16; any ``K``.

    Collective: every rank creates it with the same arguments, in the same order as its other
    symmetric allocations; creating it compiles and loads the kernel (each config of
    :attr:`configs`, and ``"split_k"``'s for every ``BM`` a call of at most ``max_m`` rows can take)
    and ends with a barrier.
    Symmetric memory: :attr:`half` times 2 fp32 elements (``2 * world * max(max_m, SPLIT_K_MAX *
    min(max_m, SPLIT_K_MAX_M)) * n``) plus ``world`` times :attr:`tiles_max` signals. Call with :meth:`run` (or
    :func:`triton_dist.ops.gemm_ar`); every rank makes the same calls in the same order with the
    same ``M``, ``K`` and method. Calls may be captured in a CUDA graph and replayed.

    ``protocol_on_one_rank``: with a single rank, still run the signalling kernel (stores, signal
    and wait on its own rank) instead of the plain GEMM, so that one GPU can test it.
    """

    METHODS = METHODS

    def __init__(self, max_m: int, n: int, dtype, *, protocol_on_one_rank: bool = False):
        import torch

        op = "triton_dist GemmAllReduceContext"
        super().__init__("GemmAllReduceContext", dtype, aligned="n", protocol_on_one_rank=protocol_on_one_rank,
                         max_m=max_m, n=n)
        self.half = self.world * n * max(max_m, SPLIT_K_MAX * min(max_m, SPLIT_K_MAX_M))
        """fp32 elements of each half of :attr:`partials`: ``world`` slots of ``max_m x n`` for
        ``"output_tiles"``, ``world * SPLIT_K_MAX`` of ``min(max_m, SPLIT_K_MAX_M) x n`` for
        ``"split_k"``."""
        if 2 * self.half >= 2**31:
            raise ValueError(f"{op}: its buffer would hold {2 * self.half} fp32 elements (2 * world * n * "
                             f"max(max_m, {SPLIT_K_MAX} * min(max_m, {SPLIT_K_MAX_M}))), too many (< 2**31); "
                             f"GEMM+AllReduce is meant for small M")
        self.max_m = max_m
        self.n = n
        # A config's tile count grows with M: the largest M of each config bounds its calls.
        largest = {min(max_m, _gemm.SKINNY_MAX_M), max_m}
        self.configs = sorted({self._config(m) for m in largest})
        """The configs calls can take (all preloaded): this N's skinny one and, past
        ``gemm.SKINNY_MAX_M`` rows, :data:`CONFIG`."""
        widest = self.split_k_block(min(max_m, SPLIT_K_MAX_M))
        self.split_k_blocks = [bm for bm in sorted(SPLIT_K_CONFIGS) if bm <= widest]
        """``"split_k"``'s ``BM`` values calls can take (all preloaded)."""
        self.tiles_max = max(max(self._tiles(m) for m in largest), SPLIT_K_MAX * cdiv(n, SPLIT_K_BN))
        """The most tiles of a call (signals per source rank)."""
        self.partials = symm_empty((2 * self.half, ), torch.float32)
        self.pad = SignalPad(self.world * self.tiles_max, owner="GemmAllReduceContext")
        self._split_k_plans = PlanCache()
        """(m, k) -> ``"split_k"``'s :class:`LaunchSequence` (:meth:`split_k_plan`)."""
        self.ready()

    def _config(self, m: int) -> str:
        """The config of an ``m``-row call: the same on every rank (the tile count decides which
        program owns which tile)."""
        return _gemm.pick_skinny_config(m, self.n, self.num_sms) or CONFIG

    def _tiles(self, m: int) -> int:
        c = _gemm.config_params(self._config(m))
        return cdiv(m, c["BM"]) * cdiv(self.n, c["BN"])

    def _meta(self, config: str) -> dict:
        return _gemm.kernel_meta(config, False, epilogue="all_reduce", world=self.world,
                                 enter_call=config in OUTPUT_TILES_ENTER_CONFIGS)

    @staticmethod
    def split_k_block(m: int) -> int:
        """``"split_k"``'s ``BM`` for ``m <= SPLIT_K_MAX_M`` rows: the smallest of
        :data:`~triton_dist.kernels.gemm.split_k.SPLIT_K_CONFIGS` holding them."""
        return block_for(m)

    def split_k(self, k: int) -> int:
        """Slices of a ``K``-deep contraction for ``"split_k"`` (a fixed rule, the same on every
        rank): as many as keep ``cdiv(n, SPLIT_K_BN)`` tiles per slice within the SMs, at most
        :data:`SPLIT_K_MAX`, each at least four K steps of the widest block deep."""
        k_steps = cdiv(k, max(c["BK"] for c in SPLIT_K_CONFIGS.values()))
        return max(1, min(SPLIT_K_MAX, self.num_sms // cdiv(self.n, SPLIT_K_BN), k_steps // 4))

    def _split_k_meta(self, bm: int) -> dict:
        c = SPLIT_K_CONFIGS[bm]
        return dict(WORLD=self.world, BM=bm, BN=SPLIT_K_BN, BK=c["BK"], NUM_STAGES=c["NUM_STAGES"],
                    ENTER=bm <= SPLIT_K_ENTER_MAX_BM, num_warps=c["num_warps"])

    @staticmethod
    def _split_k_descriptors(a, b, bm: int):
        from triton.tools.tensor_descriptor import TensorDescriptor

        bk = SPLIT_K_CONFIGS[bm]["BK"]
        return TensorDescriptor.from_tensor(a, [bm, bk]), TensorDescriptor.from_tensor(b, [SPLIT_K_BN, bk])

    def preload(self) -> None:
        """Compile and load the kernel with the specialisation of real calls (descriptors of this
        dtype and each config's blocks, 16-byte aligned output; every int unspecialised but
        ``"split_k"``'s ``N``, which is always the context's ``n``)."""
        _call_counter.preload(self.calls)
        import torch

        a = torch.empty((self.max_m, 8), dtype=self.dtype, device=self.device)  # only dtype and blocks matter
        for config in self.configs:
            a_desc, b_desc = _gemm.operand_descriptors(a, a, config)
            gemm_ar_kernel.preload(a_desc, b_desc, self.partials, 2, 2, 2, self.pad.signals, self.calls, 2, 2,
                                   half_elems=2, signal_region=2, out=a, grid=(1, ), **self._meta(config))
        w = torch.empty((SPLIT_K_BN, 8), dtype=self.dtype, device=self.device)
        for bm in self.split_k_blocks:
            a_desc, b_desc = self._split_k_descriptors(a, w, bm)
            gemm_ar_split_k_kernel.preload(a_desc, b_desc, self.partials, a, self.pad.signals, self.calls, 2, self.n,
                                           2, 2, 2, 2, 2, grid=(1, ), **self._split_k_meta(bm))

    def run(self, a, b, out, method: str = "auto") -> LaunchSequence | PlainGemmPlan | None:
        """``out = sum over ranks of a @ b.T`` on the current stream. ``a [M, K]``, ``b [n, K]``,
        ``out [M, n]``: contiguous, 16-byte aligned CUDA tensors of this dtype, ``M <= max_m``,
        ``K`` a multiple of 8 (validated by :func:`triton_dist.ops.gemm_ar`, not here).
        ``method``: one of :data:`METHODS` (module notes); every rank passes the same. Returns the
        launches of ``"split_k"`` (:meth:`split_k_plan`: a call of the same sizes and method with
        any aligned tensors makes them again: :mod:`triton_dist.eager_calls`) or, at one rank, the
        plain GEMM's plan (:meth:`~.context.OverlappedGemmContext.plain_gemm`), else None."""
        import torch

        self.check_method(method)
        m, k = a.shape
        n = b.shape[0]
        if n != self.n or m > self.max_m:
            raise ValueError(f"triton_dist GemmAllReduceContext.run: a is {list(a.shape)} and b {list(b.shape)}; the "
                             f"context takes M <= {self.max_m} and N = {self.n}")
        if method == "split_k" and m > SPLIT_K_MAX_M:
            raise ValueError(f"triton_dist GemmAllReduceContext.run: method 'split_k' takes M <= {SPLIT_K_MAX_M}, "
                             f"got M = {m}; use 'output_tiles' or 'auto'")
        if m == 0:
            return None
        plain = self.plain_gemm(a, b, out)
        if plain is not False:
            return plain
        if method == "auto":
            method = _policy.gemm_ar_method(m, SPLIT_K_MAX_M)
        _reach.check_reach("gemm_ar", method, (), self.unmapped, self.rank)
        # The preloaded kernels assume a 16-byte aligned output: another would load here, possibly
        # while a peer spins.
        target = out if out.data_ptr() % 16 == 0 else torch.empty_like(out)
        plan = None
        if method == "split_k":
            plan = self.split_k_plan(m, k)
            plan.launch(a, b, target)
        else:
            self._run_output_tiles(a, b, target)
        if target is not out:
            out.copy_(target)
        return plan

    def split_k_plan(self, m: int, k: int) -> LaunchSequence:
        """``"split_k"``'s launches for ``m`` rows and depth ``k``, made once per ``(m, k)``: the
        kernel, which up to :data:`SPLIT_K_ENTER_MAX_BM` rows advances the call counter itself,
        and past them the bump first; :meth:`~LaunchSequence.launch` takes ``(a, b, out)``."""
        return self._split_k_plans.get((m, k), lambda: self._make_split_k_plan(m, k))

    def _make_split_k_plan(self, m: int, k: int) -> LaunchSequence:
        bm = self.split_k_block(m)
        bk = SPLIT_K_CONFIGS[bm]["BK"]
        split_k = self.split_k(k)
        tiles = cdiv(self.n, SPLIT_K_BN) * split_k
        # The no-deadlock argument of several slices (module notes) needs one resident program per tile.
        assert split_k == 1 or tiles <= self.num_sms, (split_k, tiles, self.num_sms)
        kernel = LaunchPlan(gemm_ar_split_k_kernel, (min(tiles, self.num_sms), ),
                            (Slot(0, "a", (bm, bk)), Slot(1, "b", (SPLIT_K_BN, bk)), self.partials, Slot(2, "out"),
                             self.pad.signals, self.calls, m, self.n, k, self.rank, self.half, self.tiles_max, split_k),
                            self._split_k_meta(bm))
        plans = (kernel, ) if bm <= SPLIT_K_ENTER_MAX_BM else (_call_counter.bump_plan(self.calls), kernel)
        return LaunchSequence(*plans)

    def _run_output_tiles(self, a, b, target) -> None:
        m, k = a.shape
        n = b.shape[0]
        config = self._config(m)
        a_desc, b_desc = _gemm.operand_descriptors(a, b, config)
        if config not in OUTPUT_TILES_ENTER_CONFIGS:  # else the kernel advances the counter itself
            _call_counter.bump(self.calls)
        grid = _gemm.grid_for(m, n, config, self.num_sms)
        gemm_ar_kernel[grid](a_desc, b_desc, self.partials, m, n, k, self.pad.signals, self.calls, self.rank, m,
                             half_elems=self.half, signal_region=self.tiles_max, out=target, **self._meta(config),
                             **_timeline.kernel_args())
