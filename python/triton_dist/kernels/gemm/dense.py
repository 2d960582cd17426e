"""A persistent Hopper GEMM, ``C[M, N] = A[M, K] @ B[N, K]^T`` (B row-major ``[N, K]``, the weight
layout of a tensor-parallel linear layer), bf16/fp16 in, fp32 accumulation, the input dtype out.

One tile loop (:func:`gemm_kernel`) serves every GEMM of the library; one constexpr names the
epilogue (``EPILOGUE``, one of :data:`EPILOGUES`) and one the wait (``WAIT_FOR_ROWS``):

- the plain GEMM (launched as a ``triton.jit`` kernel by :func:`gemm`; the other epilogues' pieces
  live in :mod:`~triton_dist.kernels.gemm.epilogues`);
- the GEMM+ReduceScatter producer (the ``"rows_*"`` and ``"reduce_own*"`` epilogues, see
  :mod:`triton_dist.kernels.gemm.gemm_rs`) and GEMM+AllReduce (``"all_reduce"``, see
  :mod:`triton_dist.kernels.gemm.gemm_ar`): tiles stored with ``tl.store`` into symmetric
  buffers, signalled, and (own tiles, all-reduce) summed after waiting for the peers';
- the consumer of AllGather+GEMM (``WAIT_FOR_ROWS=True``, launched through ``triton_dist.jit``
  by :mod:`triton_dist.kernels.gemm.ag_gemm`): A is the gathered ``[world * m, K]`` buffer, rank
  ``r``'s shard in rows ``[r * m, (r + 1) * m)``; before the K loop of a tile it acquire-waits
  (system scope) until ``signals[r] >= epoch`` for every rank ``r`` whose shard holds one of the
  tile's rows (``epoch = *calls``), and its TMA loads of A go through ``dl.consume_token`` of the
  A descriptor, so they are issued after the wait (with the async-proxy fence in between). Tiles
  are rotated so that rank ``r`` starts at its own rows (the seeds' swizzle):
  ``pid_m = (pid_m + (r * m) // BM) % num_m_tiles``.

Structure: a persistent grid (one program per SM at most; programs walk tiles ``pid, pid + G, ...``
in grouped order, ``GROUP_M`` m-tiles per group, for L2 reuse of B), TMA loads through host-side
``TensorDescriptor``s (out-of-range rows/columns read as zeros, out-of-range stores are clipped, so
M, N, K need not be multiples of the tile), a ``tl.range(k, num_stages=NUM_STAGES)`` software-
pipelined K loop with wgmma, and a TMA store epilogue. The K loop is flattened across tiles
(Triton's ``flatten=True``) only for the plain store of a config with ``FLATTEN`` (none shipped):
the consumer's wait and the producers' signals sit between tiles, outside the pipelined loop, and
must stay there.

Configs: :func:`gemm`'s default is :func:`pick_gemm_config`'s fixed rule (measured on one H100
and one H200): up to 128 rows the split-K kernel of :mod:`~triton_dist.kernels.gemm.split_k` (B's
rows on wgmma's M side, K cut into slices; the names of
:data:`~triton_dist.kernels.gemm.split_k.CONFIG_NAMES`), above that the one of :data:`CONFIGS`
(128x256x64 or 128x128x64 tiles) whose waves of tiles hold the least work, as its wave-tail
variant (:mod:`~triton_dist.kernels.gemm.wave_tail`) where that cuts the last wave's tiles.
``gemm(config="auto")`` asks the distributed autotuner instead. The overlapped GEMMs choose by
:func:`pick_config` (``"large"`` when there are at least as many 128x256 tiles as SMs and N >=
2048, else ``"small"``); GEMM+AllReduce's decode-sized calls by :func:`pick_skinny_config`
(:data:`SKINNY_CONFIGS`: 64-row tiles, as narrow as fills the SMs).

TMA needs 16-byte aligned row strides: ``K`` and ``N`` must be multiples of 8 (2-byte dtypes).
"""

from __future__ import annotations

import functools

import triton
import triton.language as tl

from ... import eager_calls as _eager_calls
from ... import language as dl
from ... import residency as _residency
from ...language import timeline as _timeline
from . import plain_plan as _plain_plan
from . import split_k as _split_k
from . import wave_tail as _wave_tail
from .tile import own_node_first, tile_coords, tile_product
from .shard_push import push_shard_first
from .operands import aligned_for_tma, check_operands
from .epilogues import all_reduce_tile, copy_chunk, partial_destination, publish_pending, sum_own_tile
from ..common.call_counter import call_epoch
from ..common.host_math import cdiv

DTYPES = ("bfloat16", "float16")

CONFIGS = {
    # BM x BN x BK, pipeline depth, warps. Shared memory: 3 * (128 + 256) * 64 * 2 B of operands +
    # a 128 x 256 x 2 B epilogue tile = 208 KiB (Hopper allows 227 KiB per program).
    "large": dict(BM=128, BN=256, BK=64, GROUP_M=8, NUM_STAGES=3, num_warps=8),
    # 4 * (128 + 128) * 64 * 2 B + 32 KiB = 160 KiB.
    "small": dict(BM=128, BN=128, BK=64, GROUP_M=8, NUM_STAGES=4, num_warps=8),
}
"""The GEMM configs of prefill-sized M (every overlapped AllGather/ReduceScatter GEMM's, and the
autotuner's candidates besides the skinny pick): name -> tile sizes, pipeline depth and warps."""

SKINNY_MAX_M = 64
"""The most rows :func:`pick_skinny_config` serves: one 64-row m-tile."""

SKINNY_CONFIGS = {
    # Decode-sized M: reading B bounds the GEMM, so every SM must stream a slice of it: 64-row
    # tiles (wgmma's smallest M), BN picked so that the n-tiles fill the SMs once, 128-deep K
    # steps and ~192 KiB of stages in flight per SM. A is one 64-row TMA box whose rows past M
    # are zero-filled, not read.
    "skinny_n32": dict(BM=64, BN=32, BK=128, GROUP_M=1, NUM_STAGES=8, num_warps=4),  # 8 * 24 KiB
    "skinny_n64": dict(BM=64, BN=64, BK=128, GROUP_M=1, NUM_STAGES=6, num_warps=4),  # 6 * 32 KiB
    "skinny_n128": dict(BM=64, BN=128, BK=128, GROUP_M=1, NUM_STAGES=4, num_warps=4),  # 4 * 48 KiB
}
"""Configs for ``M <= SKINNY_MAX_M`` (plain GEMM and GEMM+AllReduce), chosen by :func:`pick_skinny_config`."""


def config_names() -> list[str]:
    """Every config :func:`gemm` takes by name: :data:`CONFIGS`, :data:`SKINNY_CONFIGS`, the
    split-K configs (:data:`~triton_dist.kernels.gemm.split_k.CONFIG_NAMES`) and the wave-tail
    ones (:data:`~triton_dist.kernels.gemm.wave_tail.CONFIG_NAMES`)."""
    return sorted(CONFIGS) + sorted(SKINNY_CONFIGS) + list(_split_k.CONFIG_NAMES) + list(_wave_tail.CONFIG_NAMES)


_CONFIG_NAME_SET = frozenset(config_names())  # gemm() checks every call's config: no list built per call


def config_params(config: str) -> dict:
    """The parameters of ``config``, one of :func:`config_names` (a split-K config's: ``BM``,
    ``BN``, ``BK``, ``NUM_STAGES``, ``num_warps`` of
    :func:`~triton_dist.kernels.gemm.split_k.gemm_split_k_kernel`; a wave-tail config's: its base
    config's, :data:`~triton_dist.kernels.gemm.wave_tail.CONFIG_NAMES`)."""
    params = CONFIGS.get(config) or SKINNY_CONFIGS.get(config) or _split_k.config_params(config)
    if config in _wave_tail.CONFIG_NAMES:
        params = CONFIGS[_wave_tail.CONFIG_NAMES[config]]
    if params is None:
        raise ValueError(f"triton_dist gemm: unknown config {config!r}; the configs are {config_names()}")
    return params


def _persistent(config: str) -> dict:
    """:func:`config_params` of a config of :func:`gemm_kernel` (not a split-K or wave-tail one)."""
    if config in _split_k.CONFIG_NAMES:
        raise ValueError(f"triton_dist gemm: {config!r} is a config of the split-K kernel "
                         f"(triton_dist.kernels.gemm.split_k), not of gemm_kernel")
    if config in _wave_tail.CONFIG_NAMES:
        raise ValueError(f"triton_dist gemm: {config!r} is a config of the wave-tail kernel "
                         f"(triton_dist.kernels.gemm.wave_tail), not of gemm_kernel")
    return config_params(config)


def pick_skinny_config(m: int, n: int, num_sms: int) -> str | None:
    """The skinny config for an ``m x n`` GEMM (``m <= SKINNY_MAX_M``, else None): the narrowest
    tiles whose count fits ``num_sms``, so each SM reads one slice of B (a fixed rule, the same on
    every rank)."""
    if m > SKINNY_MAX_M:
        return None
    for name, c in SKINNY_CONFIGS.items():
        if cdiv(n, c["BN"]) <= num_sms:
            return name
    return name  # the widest: several waves of tiles


CONFIG_EFFICIENCY = {"large": 1.0, "small": 0.95}
"""Work per unit time of each of :data:`CONFIGS` relative to ``"large"``, full waves of tiles on
both: at M = 8192 "small" ran at 0.92-0.97 of "large" (bench/results/h100-x1/gemm.json)."""


@functools.lru_cache(maxsize=4096)  # a fixed rule of ints, asked on every gemm() call
def pick_gemm_config(m: int, n: int, k: int, num_sms: int) -> str:
    """:func:`gemm`'s config for an ``m x n x k`` GEMM on ``num_sms`` SMs (a fixed rule, the same
    on every rank for the same shape), from the per-config times of bench/gemm.py
    (bench/results/h100-x1/gemm.json, bench/results/h200-x1/gemm.json): up to
    :data:`~triton_dist.kernels.gemm.split_k.SPLIT_K_MAX_M` rows the split-K GEMM,
    :func:`~triton_dist.kernels.gemm.split_k.default_config`'s block (at 1-16 rows cuBLAS's time
    over its was 0.96-0.99 on one H100, over the 64-row skinny tiles' 0.72-0.97); above,
    the config of :data:`CONFIGS` with the least work in its waves, ``ceil(tiles / SMs)`` times a
    tile's area over :data:`CONFIG_EFFICIENCY` (1024 x 14336: "large" has 3.4 waves of 128x256
    tiles, run as 4: cuBLAS/ours 0.84; "small" 6.8 as 7: 0.93), as its wave-tail config
    (:mod:`~triton_dist.kernels.gemm.wave_tail`) where that cuts the last wave's tiles (on one H200
    at 8192 x 14336 x 8192, a last wave of 20 tiles in 4 slices: 1.009 against 0.975; where no
    tile is cut it is the base config's launch). The overlapped GEMMs keep :func:`pick_config`:
    their tiles are walked per rank, and this rule is measured on the plain GEMM only."""
    if m <= _split_k.SPLIT_K_MAX_M:
        return _split_k.default_config(m, n, num_sms)
    def tiles_of(c: dict) -> int:
        return cdiv(m, c["BM"]) * cdiv(n, c["BN"])

    base = least_wave_work(tiles_of, num_sms)
    split = _wave_tail.pick_tail_split(tiles_of(CONFIGS[base]), cdiv(k, CONFIGS[base]["BK"]), num_sms)
    return _wave_tail.TAIL_SPLIT_OF[base] if split > 1 else base


def least_wave_work(tiles_of, num_sms: int) -> str:
    """The config of :data:`CONFIGS` whose persistent waves hold the least work: ``ceil(tiles /
    num_sms)`` times a tile's area over :data:`CONFIG_EFFICIENCY`, where ``tiles_of(params)``
    counts a config's tiles (:func:`pick_gemm_config`; the grouped GEMM's rule too). A tie keeps
    ``"large"``, the first."""
    def work(name: str) -> float:
        c = CONFIGS[name]
        return cdiv(tiles_of(c), num_sms) * c["BM"] * c["BN"] / CONFIG_EFFICIENCY[name]

    return min(CONFIG_EFFICIENCY, key=work)  # the shipped configs, not bench/gemm.py's trial ones


def pick_config(m: int, n: int, k: int, num_sms: int) -> str:
    """The config for an ``m x n x k`` GEMM on ``num_sms`` SMs (a fixed rule, the same on every
    rank for the same shape): ``"large"`` when N >= 2048 and the 128x256 tiles fill the SMs, else
    ``"small"``."""
    big = CONFIGS["large"]
    tiles = cdiv(m, big["BM"]) * cdiv(n, big["BN"])
    return "large" if n >= 2048 and tiles >= num_sms else "small"


EPILOGUES = ("store", "rows_here", "rows_to_peer", "reduce_own", "reduce_own_tma", "reduce_own_ce", "all_reduce")
"""What :func:`gemm_kernel`'s ``EPILOGUE`` can name: the plain (and AllGather+GEMM) TMA store; the
GEMM+ReduceScatter producer storing each destination's rows here (``"pull"``) or into the
destination (``"push"``), or summing its own tiles in the epilogue with the peers' tiles stored
(``"fused"``), TMA-stored (``"fused_tma"``) or staged for the copy engine (``"fused_ce"``); and
GEMM+AllReduce."""


def kernel_meta(config: str, wait_for_rows: bool, *, epilogue: str = "store", world: int = 1,
                node_ranks: int = 0, enter_call: bool = False, push_shard: bool = False) -> dict:
    """Launch keyword arguments (constexprs and options) of :func:`gemm_kernel` for ``config``, with
    the ``epilogue`` of :data:`EPILOGUES` (for ``world`` ranks) and ``wait_for_rows`` (the
    AllGather+GEMM consumer's wait; ``node_ranks`` > 0: its walk, or ``"rows_to_peer"``'s
    destinations, across nodes of that many ranks; ``enter_call``: the kernel advances the call
    counter itself, ``ENTER_CALL``; ``push_shard``: the consumer pushes this rank's rows to the
    ``world`` ranks first, ``PUSH_SHARD``, entering the call). The plain store passes no
    ``EPILOGUE``, so the plain GEMM's launch keeps its key."""
    if epilogue not in EPILOGUES:
        raise ValueError(f"triton_dist gemm: epilogue must be one of {EPILOGUES}, got {epilogue!r}")
    c = _persistent(config)
    meta = dict(BM=c["BM"], BN=c["BN"], BK=c["BK"], GROUP_M=c["GROUP_M"], NUM_STAGES=c["NUM_STAGES"],
                WAIT_FOR_ROWS=wait_for_rows, num_warps=c["num_warps"], num_stages=c["NUM_STAGES"])
    if epilogue != "store":
        meta.update(EPILOGUE=epilogue, WORLD=world)
    elif c.get("FLATTEN") and not wait_for_rows:  # the fused loop takes no wait or signal between tiles
        meta.update(FLATTEN=True)
    if node_ranks:
        if not wait_for_rows and epilogue != "rows_to_peer":
            raise ValueError(f"triton_dist gemm: node_ranks walks AllGather+GEMM's consumer or sends "
                             f"'rows_to_peer' partials across nodes, not epilogue {epilogue!r}")
        meta.update(NODE_RANKS=node_ranks)
    if push_shard:  # AllGather+GEMM in one kernel: the push's side of the call is its own prologue
        if not wait_for_rows:
            raise ValueError("triton_dist gemm: push_shard is AllGather+GEMM's consumer (wait_for_rows=True)")
        meta.update(PUSH_SHARD=True, ENTER_CALL=True, WORLD=world)
    elif enter_call:  # the call's only kernel: no reduce kernel or producer beside it reads the counter
        if epilogue not in ("all_reduce", "reduce_own", "reduce_own_tma") or wait_for_rows:
            raise ValueError(f"triton_dist gemm: enter_call is for a call's only kernel (epilogue all_reduce, "
                             f"reduce_own or reduce_own_tma, no wait for rows), not epilogue {epilogue!r} with "
                             f"wait_for_rows={wait_for_rows}")
        meta.update(ENTER_CALL=True)
    return meta


@triton.jit(do_not_specialize=["M", "N", "K", "rank", "m_per_rank", "half_elems", "signal_region", "chunk_n"])
def gemm_kernel(a_desc, b_desc, c_desc, M, N, K, signals, calls, rank, m_per_rank, BM: tl.constexpr,
                BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr, NUM_STAGES: tl.constexpr,
                WAIT_FOR_ROWS: tl.constexpr, half_elems=0, EPILOGUE: tl.constexpr = "store",
                WORLD: tl.constexpr = 1, signal_region=0, out=None, chunk_n=1,
                chunk_flags=None, tickets=None, timeline=None, TIMELINE: tl.constexpr = False,
                NODE_RANKS: tl.constexpr = 0, ENTER_CALL: tl.constexpr = False, shard=None, gathered=None,
                PUSH_SHARD: tl.constexpr = False, FLATTEN: tl.constexpr = False):
    """``C = A @ B^T`` over a persistent grid. ``a_desc``: ``[M, K]`` block ``[BM, BK]``;
    ``b_desc``: ``[N, K]`` block ``[BN, BK]``; ``c_desc``: ``[M, N]`` block ``[BM, BN]``.

    ``EPILOGUE`` (one of :data:`EPILOGUES`) names what a tile's epilogue does; the notes below
    speak of the properties each mode has: ``SIGNAL_ROWS`` (every GEMM+ReduceScatter mode),
    ``PEER_EPILOGUE`` (``"rows_to_peer"``, ``"reduce_own"``, ``"reduce_own_tma"``), ``REDUCE_OWN``
    (the three ``"reduce_own*"`` modes), ``PEER_TMA`` (``"reduce_own_tma"``), ``PEER_COPY_ENGINE``
    (``"reduce_own_ce"``) and ``ALL_REDUCE`` (``"all_reduce"``). ``"store"``: a TMA store of ``C``.

    ``WAIT_FOR_ROWS`` (the AllGather+GEMM consumer): rows ``[r * m_per_rank, (r + 1) * m_per_rank)``
    of A are rank ``r``'s and may be read once ``signals[r] >= *calls`` (uint64 signals on this
    GPU, published with release semantics at system scope); this program's rank is ``rank``.
    ``NODE_RANKS`` > 0: the world is nodes of that many ranks, walked own node first
    (:func:`~triton_dist.kernels.gemm.tile.own_node_first`). Unused otherwise (pass None).
    ``PUSH_SHARD`` (with ``ENTER_CALL``, ``"sm_push_inline"``'s one launch): every program first
    pushes its share of this rank's rows (``shard``, ``m_per_rank * K`` elements) into
    ``gathered`` here and on every peer, ``WORLD`` ranks, ``tickets`` as the push's
    (:func:`~triton_dist.kernels.gemm.shard_push.push_shard_first`).

    ``SIGNAL_ROWS`` (the GEMM+ReduceScatter producer, :mod:`~triton_dist.kernels.gemm.gemm_rs`):
    ``M = WORLD * m_per_rank``, rows ``[d * m_per_rank, (d + 1) * m_per_rank)`` of C go to rank
    ``d``. ``c_desc`` is then a plain pointer to a symmetric buffer of two halves of
    ``half_elems`` elements (the half is ``*calls % 2``), ``N`` a multiple of 8. Tiles never
    straddle two destinations: destination ``d``'s rows are cut into ``cdiv(m_per_rank, BM)``
    m-tiles of their own (the last one masked), ``T = cdiv(m_per_rank, BM) * cdiv(N, BN)`` tiles per
    destination, walked with the destinations interleaved (tile ``i`` goes to destination
    ``(rank + 1 + i % WORLD) % WORLD``, its tile ``i // WORLD``). Each tile is stored with
    ``tl.store`` (generic-proxy stores; ``PEER_TMA`` below is the TMA alternative) to the half's
    ``[M, N]`` rows ``d * m_per_rank + i``
    here (``PEER_EPILOGUE=False``), or to rows ``rank * m_per_rank + i`` of rank ``d``'s buffer
    (``PEER_EPILOGUE=True``, ``dl.symm_at``), and then signal ``rank * T + t`` (``t``: the tile's
    index among ``d``'s) on rank ``d`` is set to ``*calls`` with release semantics at system
    scope (``dl.notify``: a CTA barrier, then one release atomic). The signal goes out one tile
    late, after the program's next K loop (or after its last tile), when the stores have drained:
    a release waits for the program's earlier stores, so sent at once it would hold the program
    for its tile's trip over NVLink. The producer never waits (except ``REDUCE_OWN``'s own tiles,
    below, after sending its pending signal).
    ``signal_region``: signals per source rank, fixed for the context (not ``T``, which depends on
    the call's M: a region that moved with M would let a peer already on the next call set the
    signals of tiles this rank's reduce still waits for in this one).
    With ``NODE_RANKS`` (``"rows_to_peer"`` across nodes, :mod:`~triton_dist.kernels.gemm.gemm_rs_2d`)
    a tile of destination ``d`` goes to this node's rank of ``d``'s local index instead, in slot
    ``local * NODES + d // NODE_RANKS`` of its rows and signals
    (:func:`~triton_dist.kernels.gemm.epilogues.partial_destination`).

    ``REDUCE_OWN`` (with ``SIGNAL_ROWS``, the ``"fused"`` GEMM+ReduceScatter): the peers' tiles come
    first (``(WORLD - 1) * T`` of them, destinations interleaved from ``rank + 1``), stored into the
    destination's buffer as with ``PEER_EPILOGUE``; this rank's own ``T`` tiles come last, and
    their epilogue waits (acquire, system scope) for signal ``r * signal_region + t >= *calls`` of
    every peer ``r``, adds the peers' partials (local rows ``[r * m_per_rank, ...)`` of the half)
    to the fp32 accumulator in rank order from ``rank + 1``, and stores the sum into ``out``
    (``[m_per_rank, N]``, 16-byte aligned). No separate reduce kernel runs. ``PEER_TMA``: a peer's
    tile goes out as a TMA store through a descriptor built on the device over its slot (shape
    ``[m_per_rank, N]``, so rows past the slot are clipped), which returns the program to its next
    tile while the tile crosses NVLink (132 SMs storing to a peer reached 354 GB/s, about 2.7 GB/s
    each, in bench/results/h200-x2/language_floors.json: a 64 KiB tile then takes about half of a
    128x256 tile's K loop at K = 4096); the deferred signal then waits for the store to complete
    (``dl.wait_tma_stores``) before its release. Needs a global-scratch allocator at launch (the
    descriptors live there).

    ``PEER_COPY_ENGINE`` (with ``REDUCE_OWN``, the ``"fused_ce"`` GEMM+ReduceScatter): no halves
    and no epochs. ``c_desc`` points to ``2 * half_elems`` elements: the first ``half_elems`` are
    the symmetric *incoming* rows (peer ``r``'s partial of this rank's rows at rows
    ``[r * m_per_rank, ...)``), the rest this rank's *outgoing* rows (its partial of destination
    ``d``'s rows at rows ``[d * m_per_rank, ...)``). A peer's tile is stored (``tl.store``, local
    memory: no NVLink stall) into the outgoing rows and counted in its chunk
    (:func:`copy_chunk`); the chunk's last tile sets ``chunk_flags[d * signal_region + chunk]``
    to 1 (``tickets``: int32 counters of the same layout, zero between calls; counted one tile
    late, like the signals above, so the count's release does not hold the program while its
    stores drain), and a copy stream holds on that flag, copies the chunk into ``d``'s incoming
    rows with the copy engine and sets ``signals[rank * signal_region + chunk]`` to 1 on ``d``. An own tile waits for
    ``signals[r * signal_region + chunk] >= 1`` from every peer ``r``, then sums as
    ``REDUCE_OWN``. The host resets the flags between calls
    (:mod:`~triton_dist.kernels.gemm.gemm_rs`). ``chunk_n``: n-tiles per chunk.

    ``ALL_REDUCE`` (GEMM+AllReduce, :mod:`~triton_dist.kernels.gemm.gemm_ar`): ``c_desc`` is a
    pointer to a symmetric fp32 buffer of two halves of ``half_elems`` elements (the half is
    ``*calls % 2``), each ``WORLD`` slots of ``[M, N]``; ``out`` is ``[M, N]``, ``N`` a multiple of
    8, 16-byte aligned. Each tile (plain order) goes to slot ``rank`` of every peer's half, is
    signalled on every rank (signal ``rank * signal_region + tile``, set to ``*calls``, release at
    system scope), then the program waits for the same tile from every peer and sums the
    ``WORLD`` fp32 partials in rank order ``0, 1, ...`` (its own from registers), so every rank
    rounds the same sum: the results are bit-identical across ranks. A program signals its tile
    before it waits, and tile ``t`` is program ``t % grid``'s on every rank (same grid
    everywhere), so no program waits for one that waits for it.

    ``TIMELINE``: stamps into ``timeline`` (:mod:`triton_dist.language.timeline`) for each tile: its
    start, the end of its wait (``WAIT_FOR_ROWS``), the end of its K loop and of its epilogue.

    ``FLATTEN`` (a config's ``FLATTEN``, the plain store only): the tile loop and the K loop fused
    into one pipelined loop (Triton's ``flatten``), the next tile's loads issued during this
    tile's epilogue.

    ``ENTER_CALL`` (``"all_reduce"``, ``"reduce_own"``, ``"reduce_own_tma"``, ``PUSH_SHARD``): the kernel is its
    call's only one and takes the epoch from
    :func:`~triton_dist.kernels.common.call_counter.enter_call` (``calls``: two int64) instead of
    reading a counter bumped before it."""
    REDUCE_OWN: tl.constexpr = EPILOGUE == "reduce_own" or EPILOGUE == "reduce_own_tma" or EPILOGUE == "reduce_own_ce"
    SIGNAL_ROWS: tl.constexpr = EPILOGUE == "rows_here" or EPILOGUE == "rows_to_peer" or REDUCE_OWN
    PEER_EPILOGUE: tl.constexpr = EPILOGUE == "rows_to_peer" or EPILOGUE == "reduce_own" or EPILOGUE == "reduce_own_tma"
    PEER_TMA: tl.constexpr = EPILOGUE == "reduce_own_tma"
    PEER_COPY_ENGINE: tl.constexpr = EPILOGUE == "reduce_own_ce"
    ALL_REDUCE: tl.constexpr = EPILOGUE == "all_reduce"
    pid = tl.program_id(0)
    grid = tl.num_programs(0)
    num_m = tl.cdiv(M, BM)
    num_n = tl.cdiv(N, BN)
    k_tiles = tl.cdiv(K, BK)
    num_tiles = num_m * num_n
    if WAIT_FOR_ROWS:
        epoch = call_epoch(calls, ENTER_CALL)
        if PUSH_SHARD:
            push_shard_first(shard, gathered, signals, tickets, epoch, m_per_rank * K, WORLD)
        shift = (rank * m_per_rank) // BM  # the m-tile holding this rank's first row
    if ALL_REDUCE:
        epoch = call_epoch(calls, ENTER_CALL)
        half = (epoch % 2).to(tl.int64) * ((half_elems // 8) * 8)  # == half_elems, a multiple of 8
        stride = (N // 8) * 8  # == N (a multiple of 8), with the divisibility fact for 16-byte stores
    if SIGNAL_ROWS:
        if PEER_COPY_ENGINE:
            epoch = 1  # the copy streams set ready flags to 1; the host resets them between calls
            half = 0  # incoming rows; the outgoing ones follow
            outgoing = (half_elems // 8) * 8  # == half_elems, a multiple of 8
        else:
            epoch = call_epoch(calls, ENTER_CALL)
            half = (epoch % 2).to(tl.int64) * ((half_elems // 8) * 8)  # == half_elems, a multiple of 8
        stride = (N // 8) * 8  # == N (a multiple of 8), with the divisibility fact for 16-byte stores
        local_m = tl.cdiv(m_per_rank, BM)  # m-tiles per destination
        per_dest = local_m * num_n
        num_tiles = WORLD * per_dest
        # A tile's signal is sent one tile late, after the next tile's K loop: by then its stores
        # (over NVLink for the peer epilogue) have drained, and the release does not stall the
        # program on them.
        pending_tile = pid * 0 - 1  # signal index (region offset included); < 0: none
        pending_dest = pid * 0
        pending_count = pid * 0  # PEER_COPY_ENGINE: pending_tile is a chunk's flag, this its tile count
    if TIMELINE:
        cursor = pid * 0
    # FLATTEN (the plain store only, kernel_meta): Triton fuses the tile loop with the K loop and
    # pipelines the result, so the next tile's first loads are in flight during this tile's
    # epilogue instead of after it.
    for tile in tl.range(pid, num_tiles, grid, flatten=FLATTEN):
        if TIMELINE:
            cursor = _timeline.stamp(timeline, cursor, _timeline.TILE)
        if SIGNAL_ROWS:
            if REDUCE_OWN:
                # Peers' tiles first, so that every peer's partial of this rank's tile t is
                # produced long before this rank sums tile t at the end of its GEMM.
                dest = rank
                local_tile = tile
                if WORLD > 1:
                    peer_tiles = (WORLD - 1) * per_dest
                    if tile < peer_tiles:
                        dest = (rank + 1 + tile % (WORLD - 1)) % WORLD
                        local_tile = tile // (WORLD - 1)
                    else:
                        local_tile = tile - peer_tiles
            else:
                # Destinations interleaved tile by tile: tile t of every destination is done about
                # t/T into the GEMM everywhere, so every rank's reduce can start early (had each
                # rank walked whole destinations, one producer would reach any destination last).
                dest = (rank + 1 + tile % WORLD) % WORLD
                local_tile = tile // WORLD
            pid_m, pid_n = tile_coords(local_tile, local_m, num_n, GROUP_M)
            off_m = dest * m_per_rank + pid_m * BM
            target, target_slot = partial_destination(rank, dest, WORLD, NODE_RANKS)
        elif WAIT_FOR_ROWS:
            # Groups no taller than one rank's rows: the first group is then this rank's own rows
            # for every n, as the rotation by `shift` intends. A group spanning two ranks' rows
            # (M = 1024 on two GPUs: 4 m-tiles a rank, GROUP_M = 8) put the peer's rows into the
            # first wave, whose programs then all waited for the transfer. The price is reading B
            # once per group instead of once per GROUP_M m-tiles; below GROUP_M / 2 m-tiles a rank
            # the GEMM is short enough for that to cost more than the (short) transfer it waits
            # for, so full groups stay. Measured at M = 1024 (bench/results/h200-x2/ag_gemm.json):
            # 0.93 of the bound, up from 0.84; the threshold itself is an estimate.
            tiles_per_rank = m_per_rank // BM
            group_size = GROUP_M
            if tiles_per_rank >= GROUP_M // 2:
                group_size = tl.minimum(tiles_per_rank, GROUP_M)
            pid_m, pid_n = tile_coords(tile, num_m, num_n, group_size)
            if NODE_RANKS:  # a constexpr; None where a compile check leaves it out
                pid_m = own_node_first(pid_m, num_m, rank, m_per_rank, BM, NODE_RANKS)
            else:
                pid_m = (pid_m + shift) % num_m
            off_m = pid_m * BM
        else:
            pid_m, pid_n = tile_coords(tile, num_m, num_n, GROUP_M)
            off_m = pid_m * BM
        off_n = pid_n * BN
        if WAIT_FOR_ROWS:
            # Every rank whose shard holds a row of this tile (consecutive ranks, consecutive signals).
            first = off_m // m_per_rank
            last = (tl.minimum(off_m + BM, M) - 1) // m_per_rank
            token = dl.wait(signals + first, last - first + 1, "sys", "acquire", epoch)
            if TIMELINE:
                cursor = _timeline.stamp(timeline, cursor, _timeline.WAITED)
        else:
            token = None
        acc = tile_product(a_desc, b_desc, off_m, off_n, k_tiles, token, BM, BN, BK, NUM_STAGES, WAIT_FOR_ROWS)
        if TIMELINE:
            cursor = _timeline.stamp(timeline, cursor, _timeline.COMPUTED)
        if SIGNAL_ROWS:
            rows = pid_m * BM + tl.arange(0, BM)  # within the destination's m_per_rank rows
            cols = off_n + tl.arange(0, BN)
            mask = (rows < m_per_rank)[:, None] & (cols < stride)[None, :]
            if PEER_EPILOGUE:
                base = tl.multiple_of(dl.symm_at(c_desc, target), 16) + half  # symm_at loses alignment
                first = target_slot * m_per_rank
            elif PEER_COPY_ENGINE:
                base = c_desc + outgoing
                first = dest * m_per_rank
            else:
                base = c_desc + half
                first = dest * m_per_rank
            ptrs = base + (first + rows).to(tl.int64)[:, None] * stride + cols[None, :]
            # Before any wait below: a program never waits while holding back a signal.
            publish_pending(signals, chunk_flags, tickets, pending_tile, pending_dest, pending_count, epoch,
                             PEER_TMA, PEER_COPY_ENGINE)
            signal = target_slot * signal_region + local_tile
            if REDUCE_OWN:
                if PEER_COPY_ENGINE:
                    chunk, chunk_tiles = copy_chunk(pid_m, pid_n, local_m, num_n, chunk_n, GROUP_M)
                    ready_index = chunk
                else:
                    ready_index = local_tile
                if dest == rank:
                    sum_own_tile(acc, c_desc + half, out, signals, rows, cols, mask, stride, m_per_rank, rank,
                                  ready_index, signal_region, epoch, WORLD)
                elif PEER_COPY_ENGINE:
                    tl.store(ptrs, acc.to(c_desc.dtype.element_ty), mask=mask)
                elif PEER_TMA:
                    peer = tl.multiple_of(dl.symm_at(c_desc, dest), 16)  # symm_at loses alignment
                    slot = peer + half + (rank * m_per_rank).to(tl.int64) * stride
                    slot_desc = tl.make_tensor_descriptor(slot, shape=[m_per_rank, stride], strides=[stride, 1],
                                                          block_shape=[BM, BN])
                    slot_desc.store([pid_m * BM, off_n], acc.to(c_desc.dtype.element_ty))
                else:
                    tl.store(ptrs, acc.to(c_desc.dtype.element_ty), mask=mask)
                if PEER_COPY_ENGINE:  # counted one tile late, as signals are sent
                    pending_tile = tl.where(dest == rank, -1, dest * signal_region + chunk)
                    pending_count = chunk_tiles
                else:
                    pending_tile = tl.where(dest == rank, -1, signal)
            else:
                tl.store(ptrs, acc.to(c_desc.dtype.element_ty), mask=mask)
                pending_tile = signal
            pending_dest = target
        elif ALL_REDUCE:
            all_reduce_tile(acc, c_desc + half, c_desc, half, out, signals, off_m, off_n, M, stride, rank, tile,
                             signal_region, epoch, WORLD, BM, BN)
        else:
            c_desc.store([off_m, off_n], acc.to(c_desc.dtype))
        if TIMELINE:
            cursor = _timeline.stamp(timeline, cursor, _timeline.DONE)
    if SIGNAL_ROWS:
        publish_pending(signals, chunk_flags, tickets, pending_tile, pending_dest, pending_count, epoch, PEER_TMA,
                         PEER_COPY_ENGINE)


def num_sms(device=None) -> int:
    """SMs this process may use (an MPS share lowers it): persistent grids are sized from it
    (:mod:`triton_dist.residency`)."""
    return _residency.sm_count(device)


def operand_descriptors(a, b, config: str):
    """Host TMA descriptors of the operands ``a [M, K]`` and ``b [N, K]`` for ``config``."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    cfg = config_params(config)
    return (TensorDescriptor.from_tensor(a, [cfg["BM"], cfg["BK"]]),
            TensorDescriptor.from_tensor(b, [cfg["BN"], cfg["BK"]]))


def descriptors(a, b, c, config: str):
    """Host TMA descriptors of ``a [M, K]``, ``b [N, K]`` and ``c [M, N]`` for ``config``."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    cfg = config_params(config)
    return (*operand_descriptors(a, b, config), TensorDescriptor.from_tensor(c, [cfg["BM"], cfg["BN"]]))


def grid_for(m: int, n: int, config: str, max_programs: int) -> tuple[int]:
    """One program per output tile of ``config``, at most ``max_programs`` (the persistent grid)."""
    cfg = _persistent(config)
    tiles = cdiv(m, cfg["BM"]) * cdiv(n, cfg["BN"])
    return (max(1, min(tiles, max_programs)), )


def gemm(a, b, *, out=None, config: str | None = None):
    """``a @ b.T`` (``a [M, K]``, ``b [N, K]``, bf16 or fp16) on the current stream; returns ``out``
    (a new ``[M, N]`` tensor when None). ``config``: one of :func:`config_names` (a split-K
    one, ``"split_k_m<BM>"``, takes at most ``BM`` rows: a ValueError past them); None (the
    default): :func:`pick_gemm_config`'s fixed rule, which needs no triton_dist runtime; ``"auto"``: the
    distributed autotuner's choice for this shape (:mod:`~triton_dist.kernels.gemm.autotune`),
    collective on the first call per shape and dtype (every rank, same shape, at the same time),
    and not inside a CUDA graph capture (it times candidates). The split-K and wave-tail configs
    (the default's up to 128 rows, and above where the last wave is cut) count on the stream's
    ticket counters (:func:`~triton_dist.kernels.gemm.split_k.ticket_counters`: the first call on a
    device makes them and synchronises once; a graph captured on a stream must not replay at the
    same time as another captured there or a call on it; a capture before any uncaptured call
    runs in one slice). A shape's launch is worked out once and then launched from C++
    (:mod:`~triton_dist.kernels.gemm.plain_plan`); a call like an earlier one (shapes, dtype,
    ``config``, ``out`` given or not) launches it after checking only what may differ
    (:mod:`triton_dist.eager_calls`)."""
    key = config or "default"
    replayed = _eager_calls.replay_gemm("gemm", a, b, out, key)
    if replayed is not None:
        return replayed
    result, plan = launch_gemm(a, b, out, config)
    _eager_calls.record_gemm("gemm", a, b, result, out is not None, key, plan)
    return result


def launch_gemm(a, b, out, config: str | None = None) -> tuple:
    """:func:`gemm`'s work: ``(out, plan)``, ``plan`` the
    :class:`~triton_dist.kernels.gemm.plain_plan.PlainGemmPlan` it launched (a call of the same
    sizes with aligned tensors may launch it again: the GEMM ops at one rank return it for
    :mod:`triton_dist.eager_calls`), None where nothing launched or the call was captured in a
    CUDA graph (its slice count may be one that the capture forced)."""
    import torch

    check_operands(a, b, out)
    m, k = a.shape
    n = b.shape[0]
    if out is None:
        out = torch.empty((m, n), dtype=a.dtype, device=a.device)
    if m == 0 or n == 0:
        return out, None
    if k == 0:
        return out.zero_(), None
    sms = num_sms(a.device)
    if config == "auto":
        from .autotune import tuned_gemm_config

        config = tuned_gemm_config(m, n, k, a.dtype)
    config = config or pick_gemm_config(m, n, k, sms)
    if config not in _CONFIG_NAME_SET and config not in config_names():  # the list: bench/gemm.py's trial configs
        raise ValueError(f"triton_dist gemm: config must be None, \"auto\" or one of {config_names()}, got "
                         f"{config!r}")
    target = out if out.data_ptr() % 16 == 0 else torch.empty_like(out)
    a, b = aligned_for_tma(a), aligned_for_tma(b)
    if config in _split_k.CONFIG_NAMES:
        plan = _split_k.gemm_split_k(a, b, target, config, sms)
    elif config in _wave_tail.CONFIG_NAMES:
        plan = _wave_tail.gemm_wave_tail(a, b, target, config, sms)
    else:
        plan = _plain_plan.persistent_plan(m, n, k, config, sms, a.device)
        plan.launch(a, b, target)
    if target is not out:
        out.copy_(target)
    return out, None if torch.cuda.is_current_stream_capturing() else plan
