"""Wave-tail split: the persistent GEMM with its last, partial wave of tiles cut along K.

Why: the persistent GEMM (:func:`~triton_dist.kernels.gemm.dense.gemm_kernel`) runs ``tiles``
output tiles on ``G`` programs (one per SM) in ``ceil(tiles / G)`` waves; when ``tiles % G`` is
small, the last wave leaves most SMs idle for a whole tile's K loop. On one H100 (132 SMs,
bench/results/h100-x1/gemm.json, per-config ``config_us``) at 1024 x 14336 x 8192, ``"large"`` has
448 128x256 tiles, 3.39 waves run as 4 (cuBLAS/ours 0.835), ``"small"`` 896, 6.79 waves run as 7
(0.925). Here the ``full`` tiles that fill whole waves run as in ``gemm_kernel``; each of the
``tail = tiles % G`` tiles of the last wave is cut into ``s`` slices of K (:func:`pick_tail_split`,
``tail * s <= G``), so the last wave takes about ``1 / s`` of a tile's K loop (plus its fp32
partials) instead of all of it.

:func:`gemm_wave_tail_kernel`: one persistent kernel; program ``p`` walks work units ``p, p + G,
...``: units ``[0, full)`` are whole tiles (grouped order of
:func:`~triton_dist.kernels.gemm.tile.tile_coords`, the same tile for the same unit as
``gemm_kernel``), TMA-stored; unit ``full + s * tail + j`` is slice ``s`` of tail tile ``full +
j``, K steps ``[s * k_steps // split, (s + 1) * k_steps // split)``. A slice stores its fp32
partial into slot ``(s, j)`` of a workspace ``[split, tail, BM, BN]`` and counts itself on ticket
``j`` (:func:`~triton_dist.kernels.common.tickets.last_to_finish`); the program that completes the
count sums the ``split`` partials in slice order ``0, 1, ...`` and TMA-stores the tile, so the
bits depend neither on which program finished last nor on timing. No program waits, so any grid
is deadlock-free. Every K loop is the shared
:func:`~triton_dist.kernels.gemm.tile.tile_product` (a slice through its ``k_begin``).

Tickets and the capture rule are the split-K GEMM's
(:func:`~triton_dist.kernels.gemm.split_k.ticket_counters`,
:func:`~triton_dist.kernels.gemm.split_k.tickets_available`): counters shared with it per
(device, stream), zero between calls; inside a CUDA graph capture before the device has counters
the call runs without slices. With one slice (no partial wave, a tail too wide to cut, or too short
a K) a call is ``gemm_kernel`` with the base config, the same launch and bits.

Configs: :data:`CONFIG_NAMES`, ``"large_tail_split"`` and ``"small_tail_split"`` (the tiles of
:data:`~triton_dist.kernels.gemm.dense.CONFIGS`' ``"large"`` and ``"small"``), taken by name by
:func:`~triton_dist.kernels.gemm.dense.gemm`, and by
:func:`~triton_dist.kernels.gemm.dense.pick_gemm_config` where its base config's last wave is cut
(bench/results/h200-x1/gemm.json: never slower than the base where a tile was cut).
"""

from __future__ import annotations

import functools

import triton
import triton.language as tl

from ..common.tickets import last_to_finish
from . import plain_plan as _plain_plan
from .split_k import MAX_N_TILES, ticket_counters, tickets_available
from .tile import tile_coords, tile_product
from ..common.host_math import cdiv

CONFIG_NAMES = {"large_tail_split": "large", "small_tail_split": "small"}
"""The wave-tail configs of :func:`~triton_dist.kernels.gemm.dense.gemm`: name -> the config of
:data:`~triton_dist.kernels.gemm.dense.CONFIGS` whose tiles, pipeline and warps it runs."""

TAIL_SPLIT_OF = {base: name for name, base in CONFIG_NAMES.items()}
"""A config of :data:`~triton_dist.kernels.gemm.dense.CONFIGS` -> its wave-tail config."""

MAX_TAIL_SLICES = 4
"""The most slices a tail tile is cut into: each adds a ``BM x BN`` fp32 partial to write and read
back, and the last program of a tile reads all of them."""

MIN_TAIL_SLICE_STEPS = 8
"""The fewest K steps per slice: a shorter loop is mostly its pipeline's fill and drain."""


def pick_tail_split(tiles: int, k_steps: int, num_sms: int) -> int:
    """Slices of K for each tile of the last, partial wave of ``tiles`` tiles of ``k_steps`` K steps
    on ``num_sms`` programs (a fixed rule, the same on every rank): 1 when the tiles fill whole
    waves; else as many as the idle SMs of that wave take, ``tail * s <= num_sms`` (``tail = tiles
    % num_sms``, so every program runs at most one slice), at most :data:`MAX_TAIL_SLICES`, each
    slice at least :data:`MIN_TAIL_SLICE_STEPS` K steps."""
    tail = tiles % num_sms
    if tail == 0:
        return 1
    return max(1, min(MAX_TAIL_SLICES, num_sms // tail, k_steps // MIN_TAIL_SLICE_STEPS))


@functools.lru_cache(maxsize=4096)  # a fixed rule of ints, asked on every gemm() call
def tail_split_for(m: int, n: int, k: int, config: str, num_sms: int) -> int:
    """:func:`pick_tail_split`'s slices for an ``m x n x k`` GEMM with the wave-tail ``config`` (a
    key of :data:`CONFIG_NAMES`) on ``num_sms`` programs (bench/gemm.py records them beside the
    times)."""
    from . import dense  # dense imports this module: its names are needed only at call time

    if config not in CONFIG_NAMES:
        raise ValueError(f"triton_dist gemm: {config!r} is not a wave-tail config; one of {sorted(CONFIG_NAMES)}")
    c = dense.CONFIGS[CONFIG_NAMES[config]]
    tiles = cdiv(m, c["BM"]) * cdiv(n, c["BN"])
    return pick_tail_split(tiles, cdiv(k, c["BK"]), num_sms)


@triton.jit(do_not_specialize=["M", "N", "K", "full_tiles", "split"])
def gemm_wave_tail_kernel(a_desc, b_desc, c_desc, partials, tickets, M, N, K, full_tiles, split, BM: tl.constexpr,
                          BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr, NUM_STAGES: tl.constexpr):
    """``C = A @ B^T`` (module notes): descriptors as :func:`~triton_dist.kernels.gemm.dense.gemm_kernel`'s
    (``a_desc`` block ``[BM, BK]``, ``b_desc`` ``[BN, BK]``, ``c_desc`` ``[BM, BN]``). Tiles
    ``[0, full_tiles)`` whole; each of the ``tail = tiles - full_tiles > 0`` others in ``split >=
    2`` slices. ``partials``: fp32 ``[split, tail, BM, BN]``; ``tickets``: ``tail`` int32 counters,
    zero between calls (left zero)."""
    pid = tl.program_id(0)
    grid = tl.num_programs(0)
    num_m = tl.cdiv(M, BM)
    num_n = tl.cdiv(N, BN)
    k_tiles = tl.cdiv(K, BK)
    tail = num_m * num_n - full_tiles
    rows = tl.arange(0, BM)
    cols = tl.arange(0, BN)
    offs = rows[:, None] * BN + cols[None, :]  # within a BM x BN partial
    for unit in range(pid, full_tiles + tail * split, grid):
        whole = unit < full_tiles
        part = tl.maximum(unit - full_tiles, 0)
        s = part // tail  # the slice (0 for a whole tile)
        j = part % tail  # the tail tile (its ticket)
        tile = tl.where(whole, unit, full_tiles + j)
        k_begin = tl.where(whole, 0, s * k_tiles // split)
        k_end = tl.where(whole, k_tiles, (s + 1) * k_tiles // split)
        pid_m, pid_n = tile_coords(tile, num_m, num_n, GROUP_M)
        off_m = pid_m * BM
        off_n = pid_n * BN
        acc = tile_product(a_desc, b_desc, off_m, off_n, k_end, None, BM, BN, BK, NUM_STAGES, False, k_begin=k_begin)
        if whole:
            c_desc.store([off_m, off_n], acc.to(c_desc.dtype))
        else:
            tl.store(partials + (s * tail + j).to(tl.int64) * (BM * BN) + offs, acc)
            # As in the split-K GEMM: the ticket's CTA barrier and acq_rel add (GPU scope) release
            # this program's partial; the last add acquires every earlier one, and its result
            # reaches the CTA through shared memory behind a barrier, so the loads below, issued
            # only where it came back last, see every partial.
            if last_to_finish(tickets, j, split):
                total = tl.zeros((BM, BN), dtype=tl.float32)
                for t in range(0, split):  # slice order: the same rounding every call
                    total += tl.load(partials + (t * tail + j).to(tl.int64) * (BM * BN) + offs)
                c_desc.store([off_m, off_n], total.to(c_desc.dtype))


def gemm_wave_tail(a, b, out, config: str, num_sms: int, *, split: int | None = None):
    """``out = a @ b.T`` with the wave-tail config ``config`` (a key of :data:`CONFIG_NAMES`) on
    ``num_sms`` programs, on the current stream; ``split``: the tail tiles' slices (None:
    :func:`pick_tail_split`'s; another count is for measuring the rule, 1 to the K steps). ``a [M,
    K]``, ``b [N, K]``: contiguous with 16-byte aligned bases, ``K`` and ``N`` multiples of 8;
    ``out [M, N]`` 16-byte aligned, of their dtype (validated by
    :func:`~triton_dist.kernels.gemm.dense.gemm`, which calls it). Returns the launched
    :class:`~triton_dist.kernels.gemm.plain_plan.PlainGemmPlan`."""
    from . import dense  # dense imports this module: its names are needed only at call time

    if config not in CONFIG_NAMES:
        raise ValueError(f"triton_dist gemm: {config!r} is not a wave-tail config; one of {sorted(CONFIG_NAMES)}")
    c = dense.CONFIGS[CONFIG_NAMES[config]]
    m, k = a.shape
    n = b.shape[0]
    k_steps = cdiv(k, c["BK"])
    tail = cdiv(m, c["BM"]) * cdiv(n, c["BN"]) % num_sms
    asked = split is not None
    if split is None:
        split = tail_split_for(m, n, k, config, num_sms)
        if split > 1 and not tickets_available(a.device):
            split = 1  # a capture may not zero counters; one slice needs none (slower, the same result)
    elif not 1 <= split <= k_steps:
        raise ValueError(f"triton_dist gemm: split must be 1 to the {k_steps} K steps of {config!r} at K = {k}, "
                         f"got {split}")
    if split > 1 and tail:
        if tail > MAX_N_TILES:
            raise ValueError(f"triton_dist gemm: {config!r} takes at most {MAX_N_TILES} programs, got {num_sms}")
        if asked:
            ticket_counters(a.device)  # slices asked for: a capture that cannot make counters raises, as it says
    plan = _plain_plan.wave_tail_plan(m, n, k, config, num_sms, split, a.device)
    plan.launch(a, b, out)
    return plan
