"""Split-K GEMM for decode-sized M: ``C[M, N] = A[M, K] @ B[N, K]^T`` with ``M <= SPLIT_K_MAX_M``,
B's rows on wgmma's M side (:func:`~triton_dist.kernels.gemm.tile.swapped_tile_product`, the K loop
GEMM+AllReduce's ``"split_k"`` runs too) and the contraction cut into slices, so that the
``(slice, n-tile)`` programs fill the SMs.

Why: a decode GEMM is bound by reading B. The persistent GEMM's skinny configs
(:data:`~triton_dist.kernels.gemm.dense.SKINNY_CONFIGS`) give an SM one 64-row tile of ``out`` and
the whole of K, so the SM streams its slice of B through one long K loop, and at 1-16 rows wgmma
multiplies mostly zeros (bench/results/h100-x1/gemm.json: their ``config_us`` beside this
kernel's at 1 and 16 rows). Here a stage holds 128 rows of B (``SPLIT_K_BN``) by
``BK``, ``out``'s rows padded to ``BM`` (16-128) are wgmma's N side, and :func:`pick_split_k` cuts K
so that more programs stream B at once.

Configs: :data:`SPLIT_K_CONFIGS` (by ``BM``; GEMM+AllReduce's table too), named ``"split_k_m16"``,
``"split_k_m32"``, ``"split_k_m64"``, ``"split_k_m128"``, and the narrower-tiled
``"split_k_m128_n64"`` (:data:`NARROW_CONFIGS`) (:data:`CONFIG_NAMES`) where
:func:`~triton_dist.kernels.gemm.dense.gemm` takes a config; its default for up to 128 rows
(:func:`~triton_dist.kernels.gemm.dense.pick_gemm_config`: on one H100, cuBLAS's time over its
was 0.96-0.99 at 1-16 rows, over the skinny persistent tiles' 0.72-0.97,
bench/results/h100-x1/gemm.json).

:func:`gemm_split_k_kernel`: persistent over ``(slice s, n-tile j)`` pairs. With one slice a
program stores its tile (transposed back) into ``out``. With several, it stores its fp32 partial
into slot ``s`` of a workspace ``partials [split_k, M, N]`` and counts itself on ticket ``j``
(:func:`~triton_dist.kernels.common.tickets.last_to_finish`); the program that completes the count
sums the ``split_k`` partials in slice order ``0, 1, ...`` and rounds once into ``out``. The order
depends neither on which program finished last nor on timing, so every call gives the same bits.
No program ever waits, so any grid is deadlock-free.

Tickets (:func:`ticket_counters`): int32 counters, zero between calls (each call's last program of
an n-tile resets its counter). Each (device, stream) has its own range of :data:`MAX_N_TILES`,
cut from a per-device slab zeroed when it is made (one memset and one synchronisation, at a
device's first split-K call), so a call launches no memset; a stream first seen while it captures
a CUDA graph (the capture stream) gets its range without any GPU work, and the graph's calls use
it. A call whose slices the rule picks, captured before the device has a slab (a user's first
small-M GEMM inside a capture), runs in one slice instead (slower, the same result): a capture
must not zero counters. Counters are shared by every call on one stream (ordered) and by every graph captured on it:
such a graph must not be replayed at the same time as another of them or as a call on that
stream. The workspace comes from ``torch.empty`` per call: the caching allocator, no kernel (in a
capture, the graph's pool).
"""

from __future__ import annotations

import functools

import triton
import triton.language as tl

from ..common.tickets import last_to_finish
from .tile import swapped_tile_product
from ..common.host_math import cdiv
from . import plain_plan as _plain_plan

SPLIT_K_MAX_M = 128
"""The most rows a split-K config takes: ``BM`` (``out``'s rows, wgmma's N side) up to 128."""

SPLIT_K_BN = 128
"""Rows of B (columns of ``out``) per tile: wgmma's M side; two warpgroups' worth more would hold
twice the accumulator for no more bytes of B in flight."""

SPLIT_K_CONFIGS = {
    # BM (the call's rows padded) -> K step, pipeline depth and warps. Shared memory per stage:
    # (128 + BM) * BK * 2 bytes; about 200 KiB in flight per SM. 8 warps from 64 rows: with 4,
    # GEMM+AllReduce's epilogue (the fp32 accumulator, the sum and a loaded partial) spilled
    # (ptxas, sm_90a: 64 rows at 8 ranks, 128 rows at 2).
    16: dict(BK=128, NUM_STAGES=6, num_warps=4),  # 6 * 36 KiB
    32: dict(BK=128, NUM_STAGES=5, num_warps=4),  # 5 * 40 KiB
    64: dict(BK=128, NUM_STAGES=4, num_warps=8),  # 4 * 48 KiB
    128: dict(BK=64, NUM_STAGES=6, num_warps=8),  # 6 * 32 KiB
}
"""The swapped split-K loop's configs by ``BM`` (plain GEMM and GEMM+AllReduce's ``"split_k"``):
:func:`block_for` picks the smallest ``BM`` holding the call's rows."""

NARROW_CONFIGS = {
    # 64 rows of B per tile (one warpgroup's wgmma M): twice the n-tiles of SPLIT_K_BN, so half
    # the slices fill the SMs and 128-row calls write half the fp32 partials. For 128 rows,
    # whose partials (slices x 128 x N x 4 bytes) are the split-K kernel's largest. Shared
    # memory per stage (64 + 128) * 128 * 2 bytes; 4 stages, 192 KiB.
    "split_k_m128_n64": dict(BM=128, BN=64, BK=128, NUM_STAGES=4, num_warps=4),
}
"""Split-K configs of :func:`~triton_dist.kernels.gemm.dense.gemm` with another tile width than
:data:`SPLIT_K_BN` (plain GEMM only; chosen by name, and swept by bench/gemm.py)."""

CONFIG_NAMES = {**{f"split_k_m{bm}": bm for bm in SPLIT_K_CONFIGS},
                **{name: c["BM"] for name, c in NARROW_CONFIGS.items()}}
"""The split-K configs of :func:`~triton_dist.kernels.gemm.dense.gemm`: name -> ``BM``."""

MAX_SLICES = 8
"""The most slices :func:`pick_split_k` cuts K into: each adds an fp32 partial of ``out`` to write
and read back."""

MIN_SLICE_STEPS = 4
"""The fewest K steps per slice: a shorter loop is mostly its pipeline's fill and drain."""

TILE_OVERHEAD_STEPS = 2
"""A tile's fixed cost in K steps (pipeline fill, epilogue) in :func:`pick_split_k`'s estimate: a
guess until a GPU measurement replaces it."""

STREAMING_SHARE = {16: 0.5, 32: 0.5, 64: 0.5, 128: 1.0}
"""By ``BM``: the share of the SMs whose programs, each streaming its own part of B, already draw
all of HBM's bandwidth in :func:`pick_split_k`'s estimate; more programs than that only divide it.
Measured on one H100 (bench/results/h100-x1/gemm.json, ``slices_us``): at 1 and 16 rows 64
programs (2 slices of 32 n-tiles, or 1 of 64) ran 2-4 % faster than 128 (4 or 2 slices), the
extra slices' partials and shorter loops buying nothing. At 128 rows A's tile is as large as B's
and the products 8 times longer: there slices that fill every SM paid (128 x 4096 x 7168: 2
slices of 64-row tiles, cuBLAS/ours 0.855 against 0.806 with one)."""

SLICE_TIE = 1.05
""":func:`pick_split_k` takes the fewest slices whose estimate is within this factor of the
least: the estimate does not resolve a few percent, and each slice adds partials to write."""

MAX_N_TILES = 4096
"""Ticket counters per stream: n-tiles of a call, so ``N <= MAX_N_TILES * SPLIT_K_BN`` (the
wave-tail GEMM of :mod:`~triton_dist.kernels.gemm.wave_tail` counts its last wave's tiles, fewer
than its programs, in the same range)."""

STREAMS_PER_SLAB = 32
"""Streams' ticket ranges per device slab (``STREAMS_PER_SLAB * MAX_N_TILES`` int32, 512 KiB)."""


def block_for(m: int) -> int:
    """The ``BM`` of :data:`SPLIT_K_CONFIGS` for ``m <= SPLIT_K_MAX_M`` rows: the smallest holding them."""
    for bm in sorted(SPLIT_K_CONFIGS):
        if m <= bm:
            return bm
    raise ValueError(f"triton_dist split-K GEMM: M = {m} rows; the split-K configs take at most {SPLIT_K_MAX_M}")


def default_config(m: int, n: int, num_sms: int) -> str:
    """The split-K config :func:`~triton_dist.kernels.gemm.dense.gemm` takes by default for an ``m x
    n`` output (``m <= SPLIT_K_MAX_M``) on ``num_sms`` SMs, from bench/results/h200-x1/gemm.json's
    per-config times: the smallest ``BM`` holding the rows (at 1-16 rows 16-row blocks beat 32-row
    ones on 7 of the 8 H200 rows, cuBLAS/ours 0.985-1.087 against 0.925-1.07; on one H100 they were
    within 2 %); from 65 rows ``"split_k_m128_n64"`` while its 64-wide n-tiles fit in one wave of the SMs
    (cuBLAS/ours 0.91-0.958 against 0.781-0.882), else ``"split_k_m128"`` (N = 14336: 224 narrow
    tiles take two waves, 0.865, where 112 wide ones take one, 1.0)."""
    bm = block_for(m)
    if bm < 128:
        return f"split_k_m{bm}"
    narrow = NARROW_CONFIGS["split_k_m128_n64"]
    return "split_k_m128_n64" if cdiv(n, narrow["BN"]) <= num_sms else "split_k_m128"


def config_params(config: str) -> dict | None:
    """The parameters (``BM``, ``BN``, ``BK``, ``NUM_STAGES``, ``num_warps``) of a split-K config
    name of :data:`CONFIG_NAMES`, None for any other name."""
    if config in NARROW_CONFIGS:
        return dict(NARROW_CONFIGS[config])
    bm = CONFIG_NAMES.get(config)
    return None if bm is None else dict(BM=bm, BN=SPLIT_K_BN, **SPLIT_K_CONFIGS[bm])


@functools.lru_cache(maxsize=4096)  # a fixed rule of ints, asked on every gemm() call
def pick_split_k(m: int, n: int, k: int, num_sms: int, config: str | None = None) -> int:
    """Slices of K for an ``m x n x k`` GEMM on ``num_sms`` SMs with ``config`` (default:
    :func:`default_config`'s): a fixed rule, from 1 to :data:`MAX_SLICES`, each slice at least
    :data:`MIN_SLICE_STEPS` K steps (so one slice when K is short). Among those, the fewest slices
    whose estimated time is within :data:`SLICE_TIE` of the least, in K steps of B: a program's
    work is its tile's K steps plus :data:`TILE_OVERHEAD_STEPS` plus its fp32 partial (``2 * m /
    BK`` steps' worth of bytes); the programs take the larger of their waves (``ceil(programs /
    SMs)`` times that work) and their total work over the programs that saturate HBM
    (:data:`STREAMING_SHARE` of the SMs); the last program adds its read of ``split_k`` partials.
    So a few rows cut K only until enough programs stream B, 128 rows until the SMs are full,
    without a second wave that costs more than it saves."""
    params = config_params(config or default_config(m, n, num_sms))
    if params is None:
        raise ValueError(f"triton_dist split-K GEMM: unknown config {config!r}; one of {sorted(CONFIG_NAMES)}")
    steps = cdiv(k, params["BK"])
    tiles = cdiv(n, params["BN"])
    most = max(1, min(MAX_SLICES, steps // MIN_SLICE_STEPS))
    partial = 2.0 * m / params["BK"]  # m x BN fp32 over a K step's BN x BK 2-byte elements

    streams = STREAMING_SHARE[params["BM"]] * num_sms

    def cost(s: int) -> float:
        programs = tiles * s
        work = cdiv(steps, s) + TILE_OVERHEAD_STEPS + (partial if s > 1 else 0.0)
        busiest = max(cdiv(programs, num_sms) * work, programs * work / streams)
        return busiest + (s * partial if s > 1 else 0.0)

    costs = {s: cost(s) for s in range(1, most + 1)}
    least = min(costs.values())
    return min(s for s, c in costs.items() if c <= SLICE_TIE * least)


@triton.jit(do_not_specialize=["M", "N", "K", "split_k"])
def gemm_split_k_kernel(a_desc, b_desc, out, partials, tickets, M, N, K, split_k, BM: tl.constexpr, BN: tl.constexpr,
                        BK: tl.constexpr, NUM_STAGES: tl.constexpr):
    """``out [M, N] = A [M, K] @ B [N, K]^T`` (module notes). ``a_desc`` block ``[BM, BK]`` (``M <=
    BM``; rows past ``M`` read as zeros), ``b_desc`` block ``[BN, BK]``; ``out``: 16-byte aligned,
    ``N`` a multiple of 8. ``split_k`` slices, slice ``s`` K steps ``[s * k_steps // split_k, (s +
    1) * k_steps // split_k)``. With ``split_k > 1``: ``partials``, fp32 ``[split_k, M, N]``;
    ``tickets``, ``cdiv(N, BN)`` int32 counters, zero between calls (left zero). Unused with one
    slice."""
    pid = tl.program_id(0)
    grid = tl.num_programs(0)
    stride = (N // 8) * 8  # == N, with the divisibility fact for 16-byte stores
    num_n = tl.cdiv(N, BN)
    k_tiles = tl.cdiv(K, BK)
    slot = M.to(tl.int64) * stride
    cols = tl.arange(0, BN)  # out's columns within the tile
    rows = tl.arange(0, BM)  # out's rows
    for tile in range(pid, num_n * split_k, grid):
        s = tile // num_n
        j = tile % num_n
        off_n = j * BN
        acc = swapped_tile_product(a_desc, b_desc, off_n, s * k_tiles // split_k, (s + 1) * k_tiles // split_k, BM,
                                   BN, BK, NUM_STAGES)
        mask = (off_n + cols < stride)[:, None] & (rows < M)[None, :]
        offs = rows.to(tl.int64)[None, :] * stride + (off_n + cols)[:, None]
        if split_k == 1:
            tl.store(out + offs, acc.to(out.dtype.element_ty), mask=mask)
        else:
            tl.store(partials + s * slot + offs, acc, mask=mask)
            # The ticket's CTA barrier and acq_rel add (GPU scope) release this program's stores;
            # the last add acquires every earlier program's, and Triton hands a scalar atomic's
            # result to the CTA through shared memory behind a barrier, so the loads below, issued
            # only where it came back last, see every partial.
            if last_to_finish(tickets, j, split_k):
                total = tl.zeros((BN, BM), dtype=tl.float32)
                for t in range(0, split_k):  # slice order: the same rounding every call
                    total += tl.load(partials + t * slot + offs, mask=mask)
                tl.store(out + offs, total.to(out.dtype.element_ty), mask=mask)


_slabs: dict[int, list] = {}
_ranges: dict[tuple[int, int], object] = {}


def _needs_slab(device) -> bool:
    """Whether :func:`ticket_counters` would have to make (zero) a new slab for the current stream."""
    import torch

    if (device.index, torch.cuda.current_stream(device).cuda_stream) in _ranges:
        return False
    used = sum(1 for d, _ in _ranges if d == device.index)
    return used == len(_slabs.get(device.index, ())) * STREAMS_PER_SLAB


def tickets_available(device) -> bool:
    """Whether :func:`ticket_counters` can serve the current stream of ``device`` now: always
    outside a CUDA graph capture; inside one only if it needs no new slab, since a capture may not
    zero counters. A caller that gets False runs without tickets (the split-K GEMM and the
    wave-tail GEMM of :mod:`~triton_dist.kernels.gemm.wave_tail`: in one slice)."""
    import torch

    return not (torch.cuda.is_current_stream_capturing() and _needs_slab(device))


_placeholder_tensors: dict[int, tuple] = {}


def placeholders(device) -> tuple:
    """An int32 and an fp32 tensor on ``device`` for a one-slice launch's unused tickets and
    partials (two allocations a call otherwise, on a path that decode calls per token)."""
    import torch

    pair = _placeholder_tensors.get(device.index)
    if pair is None:
        pair = _placeholder_tensors[device.index] = (torch.empty((1, ), dtype=torch.int32, device=device),
                                                      torch.empty((4, ), dtype=torch.float32, device=device))
    return pair


def ticket_counters(device):
    """This (device, current stream)'s :data:`MAX_N_TILES` int32 ticket counters, zero between
    calls (module notes). The first call on a device makes its slab (a memset and a
    synchronisation) and cannot be inside a CUDA graph capture; later streams, capture streams
    included, get a range of it on the host only."""
    import torch

    stream = torch.cuda.current_stream(device)
    key = (device.index, stream.cuda_stream)
    counters = _ranges.get(key)
    if counters is not None:
        return counters
    slabs = _slabs.setdefault(device.index, [])
    used = sum(1 for d, _ in _ranges if d == device.index)
    if _needs_slab(device):
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"triton_dist gemm: a split-K call on {device} while capturing a CUDA graph needs the "
                               f"device's ticket counters, made (zeroed) by an uncaptured call; make one uncaptured "
                               f"split-K gemm call on {device} first")
        slab = torch.zeros(STREAMS_PER_SLAB * MAX_N_TILES, dtype=torch.int32, device=device)
        # Another stream may take a range of it next: the zeros must be there before any stream reads them.
        stream.synchronize()
        slabs.append(slab)  # kept for good: captured graphs hold its address
    first = (used % STREAMS_PER_SLAB) * MAX_N_TILES
    counters = _ranges[key] = slabs[used // STREAMS_PER_SLAB][first:first + MAX_N_TILES]
    return counters


def current_tickets(device):
    """:func:`ticket_counters` of the current stream of ``device``, or None where a capture may
    not make them (:func:`tickets_available`); a stream seen before costs one dictionary lookup
    (a plan's launch asks every call)."""
    import torch

    counters = _ranges.get((device.index, torch._C._cuda_getCurrentRawStream(device.index)))
    if counters is not None:
        return counters
    return ticket_counters(device) if tickets_available(device) else None


def gemm_split_k(a, b, out, config: str, num_sms: int, *, split_k: int | None = None):
    """``out = a @ b.T`` with the split-K config ``config`` (a key of :data:`CONFIG_NAMES`) on the
    current stream, in ``split_k`` slices (None: :func:`pick_split_k`'s; another count is for
    measuring the rule, 1 to the K steps). ``a [M, K]``, ``b [N, K]``: contiguous with 16-byte
    aligned bases, ``K`` and ``N`` multiples of 8; ``out [M, N]`` 16-byte aligned, of their dtype
    (validated by :func:`~triton_dist.kernels.gemm.dense.gemm`, which calls it). Returns the
    launched :class:`~triton_dist.kernels.gemm.plain_plan.PlainGemmPlan`."""
    params = config_params(config)
    m, k = a.shape
    n = b.shape[0]
    if params is None:
        raise ValueError(f"triton_dist gemm: {config!r} is not a split-K config; one of {sorted(CONFIG_NAMES)}")
    if m > params["BM"]:
        wider = [name for name, bm in CONFIG_NAMES.items() if m <= bm]
        raise ValueError(f"triton_dist gemm: config {config!r} takes M <= {params['BM']} rows, got M = {m}; use "
                         + (f"one of {wider}" if wider else f"a config of more rows (split-K takes M <= "
                            f"{SPLIT_K_MAX_M})") + " or config=None")
    tiles = cdiv(n, params["BN"])
    if split_k is None:
        split_k = pick_split_k(m, n, k, num_sms, config)
        if split_k > 1 and not tickets_available(a.device):
            split_k = 1  # one slice needs no counters (slower, the same result)
    elif not 1 <= split_k <= cdiv(k, params["BK"]):
        raise ValueError(f"triton_dist gemm: split_k must be 1 to the {cdiv(k, params['BK'])} K steps of "
                         f"{config!r} at K = {k}, got {split_k}")
    elif split_k > 1:
        ticket_counters(a.device)  # slices asked for: a capture that cannot make counters raises, as it says
    if split_k > 1 and tiles > MAX_N_TILES:
        raise ValueError(f"triton_dist gemm: config {config!r} takes N <= {MAX_N_TILES * params['BN']}, got N = {n}")
    plan = _plain_plan.split_k_plan(m, n, k, config, num_sms, split_k, a.device)
    plan.launch(a, b, out)
    return plan
