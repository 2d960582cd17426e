"""Wave tail: the persistent GEMM with the tiles past its whole waves cut along K.

Why: the persistent GEMM (:func:`~triton_dist.kernels.gemm.dense.gemm_kernel`) runs ``tiles``
output tiles on ``G`` programs (one per SM) in ``ceil(tiles / G)`` waves; when ``tiles % G`` is
small, the last wave leaves most SMs idle for a whole tile's K loop. On one H100 (132 SMs,
bench/results/h100-x1/gemm.json, per-config ``config_us``) at 1024 x 14336 x 8192, ``"large"`` has
448 128x256 tiles, 3.39 waves run as 4 (cuBLAS/ours 0.835), ``"small"`` 896, 6.79 waves run as 7
(0.925). Cutting each of the last wave's ``tail = tiles % G`` tiles into ``s`` slices (``tail * s
<= G``) brought large to 3.5 waves, but no closer: on one H200 ``"large_tail_split"`` (2 slices)
ran at 0.93, as ``"small"`` (bench/results/h200-x1/gemm.json). Stream-K instead deals the last
wave's K steps evenly to all ``G`` programs (``"tail_stream"``: 3.39 waves' worth each), or the
last wave's and one whole wave's (``"wave_stream"``: each program streams one to two tiles, with
fewer programs sharing a tile).

One plan (:class:`TailPlan`, :func:`tail_plan`) serves every mode: ``full_tiles`` whole tiles,
then the other tiles' K steps counted tile after tile and cut into ``units`` contiguous runs.
:func:`gemm_wave_tail_kernel`: program ``p`` walks units ``p, p + G, ...``: units ``[0, full)``
are whole tiles (grouped order of :func:`~triton_dist.kernels.gemm.tile.tile_coords`, the same
tile for the same unit as ``gemm_kernel``), TMA-stored; unit ``full + u`` is run ``u``, a piece
of one tile or pieces of several. A tile one run covers is TMA-stored by it; a tile several runs
share gets each run's fp32 partial in a slot of a workspace and a count on its ticket
(:func:`~triton_dist.kernels.common.tickets.last_to_finish`); the program that completes the count
sums the partials in run order and TMA-stores the tile, so the bits depend neither on which
program finished last nor on timing. No program waits, so any grid is deadlock-free. Every K loop
is the shared :func:`~triton_dist.kernels.gemm.tile.tile_product` (a piece through its
``k_begin``). ``"tail_split"`` is the plan whose runs are :func:`pick_tail_split`'s slices.

Tickets and the capture rule are the split-K GEMM's
(:func:`~triton_dist.kernels.gemm.split_k.ticket_counters`,
:func:`~triton_dist.kernels.gemm.split_k.tickets_available`): counters shared with it per
(device, stream), zero between calls; inside a CUDA graph capture before the device has counters
the call runs uncut. Uncut (whole waves, a tail too wide to slice, too short a K) a call is
``gemm_kernel`` with the base config, the same launch and bits.

Configs: :data:`CONFIG_NAMES` (``"{large,small}_{tail_split,tail_stream,wave_stream}"``, the tiles
of :data:`~triton_dist.kernels.gemm.dense.CONFIGS`' ``"large"`` and ``"small"``), taken by name
by :func:`~triton_dist.kernels.gemm.dense.gemm`; the ``"tail_split"`` ones by
:func:`~triton_dist.kernels.gemm.dense.pick_gemm_config` where its base config's last wave is cut
(bench/results/h200-x1/gemm.json: never slower than the base where a tile was cut). The stream
modes are swept by bench/gemm.py beside them.
"""

from __future__ import annotations

from typing import NamedTuple

import triton
import triton.language as tl

from ..common.tickets import last_to_finish
from .split_k import MAX_N_TILES, ticket_counters, tickets_available
from .tile import tile_coords, tile_product
from ..common.host_math import cdiv

CONFIG_NAMES = {"large_tail_split": "large", "small_tail_split": "small", "large_tail_stream": "large",
                "small_tail_stream": "small", "large_wave_stream": "large", "small_wave_stream": "small"}
"""The wave-tail configs of :func:`~triton_dist.kernels.gemm.dense.gemm`: name -> the config of
:data:`~triton_dist.kernels.gemm.dense.CONFIGS` whose tiles, pipeline and warps it runs (every mode
of a base runs the same compiled kernel; :data:`TAIL_MODES` says how its units are cut)."""

TAIL_MODES = {name: name.split("_", 1)[1] for name in CONFIG_NAMES}
"""A wave-tail config -> how the tiles past the whole waves are cut (:func:`tail_plan`):
``"tail_split"``, each tile of the last wave in :func:`pick_tail_split`'s slices;
``"tail_stream"``, the last wave's K steps dealt evenly to every program (stream-K);
``"wave_stream"``, the same over the last wave and one whole wave before it, so that each program
streams one to two tiles' worth of steps."""

TAIL_SPLIT_OF = {base: f"{base}_tail_split" for base in set(CONFIG_NAMES.values())}
"""A config of :data:`~triton_dist.kernels.gemm.dense.CONFIGS` -> its ``"tail_split"`` config."""

MAX_TAIL_SLICES = 4
"""The most slices a tail tile is cut into: each adds a ``BM x BN`` fp32 partial to write and read
back, and the last program of a tile reads all of them."""

MIN_TAIL_SLICE_STEPS = 8
"""The fewest K steps per slice or stream unit: a shorter loop is mostly its pipeline's fill and drain."""


class TailPlan(NamedTuple):
    """How a wave-tail call cuts its work: ``full_tiles`` whole tiles first (one unit each), then
    the remaining tiles' K steps, counted tile after tile, in ``units`` contiguous runs, run ``u``
    steps ``[u * steps // units, (u + 1) * steps // units)``; ``partials``: the fp32 ``BM x BN``
    slots the runs' pieces of shared tiles need (``units + streamed tiles - 1``)."""

    full_tiles: int
    units: int
    partials: int


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


def tail_plan(tiles: int, k_steps: int, num_sms: int, mode: str) -> TailPlan | None:
    """The cut of ``tiles`` tiles of ``k_steps`` K steps on ``num_sms`` programs in ``mode`` (one of
    :data:`TAIL_MODES`' values; a fixed rule, the same on every rank), or None when nothing is cut
    (whole waves only, one slice, too few steps): the base config's kernel. ``"tail_split"``:
    :func:`pick_tail_split`'s slices of each last-wave tile as units (the same K ranges as one
    unit per slice); the stream modes: as many units as programs, each at least
    :data:`MIN_TAIL_SLICE_STEPS` steps."""
    tail = tiles % num_sms
    if tail == 0:
        return None
    if mode == "tail_split":
        split = pick_tail_split(tiles, k_steps, num_sms)
        return None if split == 1 else TailPlan(tiles - tail, tail * split, tail * split + tail - 1)
    if mode not in ("tail_stream", "wave_stream"):
        raise ValueError(f"triton_dist gemm: wave-tail mode must be one of {sorted(set(TAIL_MODES.values()))}, "
                         f"got {mode!r}")
    streamed = tail + (num_sms if mode == "wave_stream" and tiles - tail >= num_sms else 0)
    steps = streamed * k_steps
    units = min(num_sms, steps // MIN_TAIL_SLICE_STEPS)
    if units <= 1 or units * steps >= 2**31:  # the kernel's step arithmetic is int32
        return None
    return TailPlan(tiles - streamed, units, units + streamed - 1)


def plan_for(m: int, n: int, k: int, config: str, num_sms: int) -> TailPlan | None:
    """:func:`tail_plan` for an ``m x n x k`` GEMM with the wave-tail ``config`` (a key of
    :data:`CONFIG_NAMES`) on ``num_sms`` programs (bench/gemm.py records it beside the times)."""
    from . import dense  # dense imports this module: its names are needed only at call time

    if config not in CONFIG_NAMES:
        raise ValueError(f"triton_dist gemm: {config!r} is not a wave-tail config; one of {sorted(CONFIG_NAMES)}")
    c = dense.CONFIGS[CONFIG_NAMES[config]]
    return tail_plan(cdiv(m, c["BM"]) * cdiv(n, c["BN"]), cdiv(k, c["BK"]), num_sms, TAIL_MODES[config])


@triton.jit
def _unit_of(step, steps, units):
    """The run of :class:`TailPlan` holding streamed K step ``step``: the largest ``u`` with ``u *
    steps // units <= step``."""
    return ((step + 1) * units + steps - 1) // steps - 1


@triton.jit(do_not_specialize=["M", "N", "K", "full_tiles", "units"])
def gemm_wave_tail_kernel(a_desc, b_desc, c_desc, partials, tickets, M, N, K, full_tiles, units, BM: tl.constexpr,
                          BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr, NUM_STAGES: tl.constexpr):
    """``C = A @ B^T`` (module notes): descriptors as :func:`~triton_dist.kernels.gemm.dense.gemm_kernel`'s
    (``a_desc`` block ``[BM, BK]``, ``b_desc`` ``[BN, BK]``, ``c_desc`` ``[BM, BN]``). Tiles
    ``[0, full_tiles)`` whole; the ``streamed = tiles - full_tiles > 0`` others' K steps in
    ``units >= 2`` runs (:class:`TailPlan`). ``partials``: fp32 ``[units + streamed - 1, BM,
    BN]``; ``tickets``: ``streamed`` int32 counters, zero between calls (left zero)."""
    pid = tl.program_id(0)
    grid = tl.num_programs(0)
    num_m = tl.cdiv(M, BM)
    num_n = tl.cdiv(N, BN)
    k_tiles = tl.cdiv(K, BK)
    steps = (num_m * num_n - full_tiles) * k_tiles  # the streamed tiles' K steps, tile after tile
    rows = tl.arange(0, BM)
    cols = tl.arange(0, BN)
    offs = rows[:, None] * BN + cols[None, :]  # within a BM x BN partial
    for unit in range(pid, full_tiles + units, grid):
        whole = unit < full_tiles
        u = tl.maximum(unit - full_tiles, 0)
        begin = u * steps // units
        end = (u + 1) * steps // units
        first = tl.where(whole, unit, full_tiles + begin // k_tiles)
        last = tl.where(whole, unit, full_tiles + (end - 1) // k_tiles)
        for tile in range(first, last + 1):
            j = tl.maximum(tile - full_tiles, 0)  # the streamed tile (its ticket)
            base = j * k_tiles
            k_begin = tl.where(whole, 0, tl.maximum(begin, base) - base)
            k_end = tl.where(whole, k_tiles, tl.minimum(end, base + k_tiles) - base)
            pid_m, pid_n = tile_coords(tile, num_m, num_n, GROUP_M)
            off_m = pid_m * BM
            off_n = pid_n * BN
            acc = tile_product(a_desc, b_desc, off_m, off_n, k_end, None, BM, BN, BK, NUM_STAGES, False,
                               k_begin=k_begin)
            # The runs sharing this tile, in step order (one for a whole tile).
            first_run = tl.where(whole, 0, _unit_of(base, steps, units))
            last_run = tl.where(whole, 0, _unit_of(base + k_tiles - 1, steps, units))
            if first_run == last_run:
                c_desc.store([off_m, off_n], acc.to(c_desc.dtype))
            else:
                # Run u's pieces go to slots u + j: runs walk the tiles in order, so the slots of
                # successive runs never meet, and the workspace has units + streamed - 1 of them.
                tl.store(partials + (u + j).to(tl.int64) * (BM * BN) + offs, acc)
                # As in the split-K GEMM: the ticket's CTA barrier and acq_rel add (GPU scope) release
                # this program's partial; the last add acquires every earlier one, and its result
                # reaches the CTA through shared memory behind a barrier, so the loads below, issued
                # only where it came back last, see every partial.
                if last_to_finish(tickets, j, last_run - first_run + 1):
                    total = tl.zeros((BM, BN), dtype=tl.float32)
                    for q in range(first_run, last_run + 1):  # step order: the same rounding every call
                        total += tl.load(partials + (q + j).to(tl.int64) * (BM * BN) + offs)
                    c_desc.store([off_m, off_n], total.to(c_desc.dtype))


def gemm_wave_tail(a, b, out, config: str, num_sms: int) -> None:
    """``out = a @ b.T`` with the wave-tail ``config`` (a key of :data:`CONFIG_NAMES`) on
    ``num_sms`` programs, on the current stream, cut as :func:`plan_for` says. ``a [M, K]``, ``b
    [N, K]``: contiguous with 16-byte aligned bases, ``K`` and ``N`` multiples of 8; ``out [M, N]``
    16-byte aligned, of their dtype (validated by :func:`~triton_dist.kernels.gemm.dense.gemm`,
    which calls it)."""
    import torch

    from . import dense  # dense imports this module: its names are needed only at call time

    if config not in CONFIG_NAMES:
        raise ValueError(f"triton_dist gemm: {config!r} is not a wave-tail config; one of {sorted(CONFIG_NAMES)}")
    base = CONFIG_NAMES[config]
    c = dense.CONFIGS[base]
    m, k = a.shape
    n = b.shape[0]
    tiles = cdiv(m, c["BM"]) * cdiv(n, c["BN"])
    plan = tail_plan(tiles, cdiv(k, c["BK"]), num_sms, TAIL_MODES[config])
    if plan is not None and not tickets_available(a.device):
        plan = None  # a capture may not zero counters; no cut needs none (slower, the same result)
    a_desc, b_desc, c_desc = dense.descriptors(a, b, out, base)
    if plan is None:  # nothing to cut: the base config's kernel and launch
        dense.gemm_kernel[dense.grid_for(m, n, base, num_sms)](a_desc, b_desc, c_desc, m, n, k, None, None, 0, 1,
                                                               **dense.kernel_meta(base, False))
        return
    if tiles - plan.full_tiles > MAX_N_TILES:
        raise ValueError(f"triton_dist gemm: {config!r} streams at most {MAX_N_TILES} tiles, got "
                         f"{tiles - plan.full_tiles} ({num_sms} programs)")
    tickets = ticket_counters(a.device)
    partials = torch.empty((plan.partials, c["BM"], c["BN"]), dtype=torch.float32, device=a.device)
    gemm_wave_tail_kernel[(min(plan.full_tiles + plan.units, num_sms), )](
        a_desc, b_desc, c_desc, partials, tickets, m, n, k, plan.full_tiles, plan.units, BM=c["BM"], BN=c["BN"],
        BK=c["BK"], GROUP_M=c["GROUP_M"], NUM_STAGES=c["NUM_STAGES"], num_warps=c["num_warps"],
        num_stages=c["NUM_STAGES"])
