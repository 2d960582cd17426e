"""The MoE grouped GEMM: for every expert ``e``, ``C_e = A_e @ W[e]^T``, where ``A_e`` are the
rows routed to ``e`` and ``W [experts, N, K]`` the experts' weights (bf16 or fp16, fp32
accumulation), one persistent Hopper kernel for all experts.

Two row layouts, the two that MoE layers hand over:

- *packed* (``offsets``): the tokens sorted by expert in one ``[T, K]`` tensor, expert ``e``'s rows
  ``[offsets[e - 1], offsets[e])`` (``offsets[-1]`` read as 0; int32 cumulative ends, the
  convention of ``torch._grouped_mm``), output ``[T, N]`` in the same rows;
- *padded* (``counts``): ``[experts, capacity, K]``, expert ``e``'s rows the first ``counts[e]`` of
  ``A[e]`` (what :meth:`~triton_dist.kernels.EPContext.dispatch` returns), output
  ``[experts, capacity, N]``, rows past ``counts[e]`` not written.

Tiles: expert ``e`` has ``cdiv(rows_e, BM) * cdiv(N, BN)`` output tiles; the experts' tiles are
numbered one after the other and program ``p`` of the persistent grid takes tiles ``p, p + G,
...`` across all experts, so a skewed routing still spreads over every SM and an empty expert
costs nothing. Each program walks the experts in order, reading two row offsets each (a few
hundred scalar loads at most, against K loops of thousands of cycles), so the schedule needs no
prefix-sum pass and no host synchronisation, and a CUDA graph replays it with new routing.
Within an expert, tiles go in the grouped order of the dense GEMM (:func:`tile_coords`) and each
tile's K loop is the dense GEMM's (:func:`tile_product`). A's TMA box may run past the expert's
rows into the next expert's (read, never used) and W's past ``N`` into the next expert's weights;
the epilogue stores with a mask on the expert's rows and on ``N``, so no tile writes rows of
another expert. Row offsets are clamped on the GPU (to ``[0, T]``; counts to ``[0, capacity]``),
so unchecked bad routing cannot write out of bounds (experts' rows may then overlap); the host
check (``check_rows``) reports it instead.

Decode has a second kernel, :mod:`~triton_dist.kernels.moe.group_gemm_swapped` (the weights' rows
on wgmma's M side, the expert's few rows on its N side), for :func:`group_gemm` by name only
(``"swapped_m16"`` ...) until a GPU measurement says where it wins.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ... import language as dl
from ... import timeline as _timeline
from ...language import timeline as _stamps
from ..gemm import dense as _gemm
from ..gemm.tile import tile_coords, tile_product
from ..common.tickets import last_to_finish
from .ep_context import _describe
from ..common.host_math import cdiv

CONFIGS = ("skinny_n128", "small", "large")
"""The dense GEMM's configs (:data:`triton_dist.kernels.gemm.dense.CONFIGS`,
:data:`~triton_dist.kernels.gemm.dense.SKINNY_CONFIGS`) the grouped GEMM runs with, chosen by
:func:`pick_group_gemm_config` (:func:`group_gemm`) or :func:`pick_config` (the overlapped grouped
GEMMs). :func:`group_gemm` also takes the swapped decode configs by name (:func:`config_names`)."""


def _swapped():
    """:mod:`~triton_dist.kernels.moe.group_gemm_swapped`, imported on first use: it imports this
    module (the row convention and walk, :func:`expert_tiles`), so it cannot be imported at this one's top."""
    from . import group_gemm_swapped

    return group_gemm_swapped


def config_names() -> list[str]:
    """Every config :func:`group_gemm` takes by name: :data:`CONFIGS` (the persistent kernel's,
    which the overlapped grouped GEMMs run too) and the swapped ones of
    :data:`~triton_dist.kernels.moe.group_gemm_swapped.CONFIG_NAMES` (the plain op only)."""
    return list(CONFIGS) + list(_swapped().CONFIG_NAMES)


def pick_config(rows: int, experts: int, n: int, num_sms: int) -> str:
    """The config for ``rows`` routed rows over ``experts`` experts and ``N = n`` (a fixed rule, no
    routing read): 64-row tiles when an expert averages at most 64 rows (decode: reading the
    weights bounds the GEMM, and 128-row tiles would be mostly padding), 128x256 tiles when there
    are enough of them to fill the SMs and N >= 2048, else 128x128."""
    if rows <= _gemm.SKINNY_MAX_M * experts:
        return "skinny_n128"
    big = _gemm.config_params("large")
    tiles = (cdiv(rows, big["BM"]) + experts) * cdiv(n, big["BN"])
    return "large" if n >= 2048 and tiles >= num_sms else "small"


def pick_group_gemm_config(rows: int, experts: int, n: int, num_sms: int) -> str:
    """:func:`group_gemm`'s config (the plain grouped GEMM; the overlapped ones keep
    :func:`pick_config` until measured): 64-row tiles at decode as :func:`pick_config` has them,
    above that the config whose waves of tiles hold the least work
    (:func:`~triton_dist.kernels.gemm.dense.least_wave_work`, ``(rows / BM + experts)`` m-tiles),
    with no floor on N: on one H100 the 128x256 tiles were the faster of the two on every prefill
    row, N = 1536 included, where :func:`pick_config` takes 128x128 (Qwen3-30B-A3B's up
    projection, bench/results/h100-x1/group_gemm.json)."""
    if rows <= _gemm.SKINNY_MAX_M * experts:
        return "skinny_n128"
    return _gemm.least_wave_work(lambda c: (cdiv(rows, c["BM"]) + experts) * cdiv(n, c["BN"]), num_sms)


@triton.jit
def _expert_rows(ends, e, total_rows, capacity, PADDED: tl.constexpr):
    """First row and row count of expert ``e`` (module notes), clamped to the tensor."""
    if PADDED:
        start = e * capacity
        count = tl.minimum(tl.maximum(tl.load(ends + e), 0), capacity)
    else:
        start = tl.load(ends + e - 1, mask=e > 0, other=0)
        start = tl.minimum(tl.maximum(start, 0), total_rows)
        end = tl.minimum(tl.maximum(tl.load(ends + e), start), total_rows)
        count = end - start
    return start, count


@triton.jit
def expert_tiles(ends, e, total_rows, capacity, first_tile, pid, grid, num_n, BM: tl.constexpr,
                 PADDED: tl.constexpr):
    """Expert ``e``'s share of a persistent walk over every expert's tiles, numbered one expert after
    the other from ``first_tile`` (``num_m * num_n`` tiles each, ``num_m`` row blocks of ``BM``):
    its first row, row count, row blocks, tile count, and this program's first tile of it (tiles
    ``p, p + G, ...`` of the whole numbering). Shared by the grouped kernels, which walk the same way
    and differ in the tile they compute."""
    start, count = _expert_rows(ends, e, total_rows, capacity, PADDED)
    num_m = tl.cdiv(count, BM)
    mine = first_tile + (pid - first_tile % grid + grid) % grid
    return start, count, num_m, num_m * num_n, mine


@triton.jit(do_not_specialize=["num_experts", "total_rows", "capacity", "N", "K", "m_per_rank", "half_elems"])
def group_gemm_kernel(a_desc, w_desc, c, ends, num_experts, total_rows, capacity, N, K, BM: tl.constexpr,
                      BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr, NUM_STAGES: tl.constexpr,
                      PADDED: tl.constexpr, GATHERED: tl.constexpr = False, gathered=None, token_index=None,
                      signals=None, calls=None, m_per_rank=1, SCATTER_ADD: tl.constexpr = False, topk_slot=None,
                      weights=None, TOPK: tl.constexpr = 1, half_elems=0, tickets=None, WORLD: tl.constexpr = 1,
                      timeline=None, TIMELINE: tl.constexpr = False):
    """``c[rows of e] = A[rows of e] @ W[e]^T`` for every expert ``e < num_experts``. ``a_desc``:
    ``[total_rows, K]``, block ``[BM, BK]``; ``w_desc``: ``[num_experts * N, K]``, block ``[BN,
    BK]``; ``c``: ``[total_rows, N]`` (``N`` a multiple of 8). ``ends``: int32 ``[num_experts]``,
    cumulative row ends (packed) or row counts with expert ``e`` at row ``e * capacity``
    (``PADDED``).

    ``GATHERED`` (the consumer of AllGather + grouped GEMM,
    :mod:`~triton_dist.kernels.moe.ag_group_gemm`, launched through ``triton_dist.jit``; packed
    rows, ``a_desc`` unused): row ``i`` of A is row ``token_index[i]`` of ``gathered`` (``[world *
    m_per_rank, K]``, ``K`` a multiple of 8), and rank ``r``'s rows ``[r * m_per_rank, ...)`` may
    be read once ``signals[r] >= *calls``. Before a tile's K loop the program acquire-waits
    (system scope) for every rank from the first to the last whose rows the tile holds (tokens
    ascend within an expert, so those ranks are consecutive).

    ``SCATTER_ADD`` (grouped GEMM + ReduceScatter, :mod:`~triton_dist.kernels.moe.group_gemm_rs`;
    packed rows): row ``i`` is routed pair ``(t, s) = (token_index[i], topk_slot[i])`` of gathered
    token ``t``; the tile, scaled per row by ``weights[t * TOPK + s]`` (fp32), is added (relaxed
    fp32 reductions at system scope) into row ``t % m_per_rank`` of the symmetric fp32 ``c`` (half
    ``*calls % 2`` of ``2 * half_elems``) on rank ``t // m_per_rank``. The program that finishes
    last (a ticket, acq_rel at system scope, so every program's reductions precede it) then sets
    ``signals[me] = *calls`` on every rank: "all my rows of this call are in your buffer".

    ``TIMELINE``: stamps into ``timeline`` (:mod:`triton_dist.language.timeline`) for each tile:
    its start, the end of its wait (``GATHERED``), of its K loop and of its epilogue."""
    pid = tl.program_id(0)
    grid = tl.num_programs(0)
    num_n = tl.cdiv(N, BN)
    k_tiles = tl.cdiv(K, BK)
    stride = (N // 8) * 8  # == N (a multiple of 8), with the divisibility fact for 16-byte stores
    if GATHERED or SCATTER_ADD:
        epoch = tl.load(calls)
    if GATHERED:
        k_stride = (K // 8) * 8  # == K, likewise for the gathered rows' loads
    if SCATTER_ADD:
        half = (epoch % 2).to(tl.int64) * ((half_elems // 8) * 8)  # == half_elems, a multiple of 8
    first_tile = pid * 0  # this expert's first tile in the numbering of every expert's tiles
    if TIMELINE:
        cursor = pid * 0
    for e in range(0, num_experts):
        start, count, num_m, tiles, mine = expert_tiles(ends, e, total_rows, capacity, first_tile, pid, grid, num_n,
                                                        BM, PADDED)
        for tile in range(mine, first_tile + tiles, grid):
            pid_m, pid_n = tile_coords(tile - first_tile, num_m, num_n, GROUP_M)
            if TIMELINE:
                cursor = _stamps.stamp(timeline, cursor, _stamps.TILE)
            rows = pid_m * BM + tl.arange(0, BM)
            if GATHERED:
                valid = rows < count
                tokens = tl.load(token_index + start + rows, mask=valid, other=0)
                first = tl.min(tl.where(valid, tokens, 2**31 - 1), 0) // m_per_rank
                last = tl.max(tl.where(valid, tokens, 0), 0) // m_per_rank
                token = dl.wait(signals + first, last - first + 1, "sys", "acquire", epoch)
                if TIMELINE:
                    cursor = _stamps.stamp(timeline, cursor, _stamps.WAITED)
                # The token on the row indices, not the pointers: the loads depend on the wait and
                # keep their 16-byte alignment (k_stride), so they vectorise and pipeline.
                a_rows = gathered + dl.consume_token(tokens, token).to(tl.int64)[:, None] * k_stride
                acc = tile_product(None, w_desc, 0, e * N + pid_n * BN, k_tiles, None, BM, BN, BK, NUM_STAGES,
                                   False, a_rows=a_rows, a_mask=valid[:, None], K=k_stride)
            else:
                acc = tile_product(a_desc, w_desc, start + pid_m * BM, e * N + pid_n * BN, k_tiles, None, BM, BN,
                                   BK, NUM_STAGES, False)
            if TIMELINE:
                cursor = _stamps.stamp(timeline, cursor, _stamps.COMPUTED)
            cols = pid_n * BN + tl.arange(0, BN)
            mask = (rows < count)[:, None] & (cols < stride)[None, :]
            if SCATTER_ADD:
                _scatter_add_tile(acc, c, half, token_index, topk_slot, weights, start + rows, rows < count, cols,
                                  mask, stride, m_per_rank, TOPK, WORLD)
            else:
                ptrs = c + (start + rows).to(tl.int64)[:, None] * stride + cols[None, :]
                tl.store(ptrs, acc.to(c.dtype.element_ty), mask=mask)
            if TIMELINE:
                cursor = _stamps.stamp(timeline, cursor, _stamps.DONE)
        first_tile += tiles
    if SCATTER_ADD:
        if last_to_finish(tickets, 0, grid, "sys"):
            me = dl.rank()
            for r in tl.static_range(WORLD):
                dl.notify(signals + me, (me + r) % WORLD, epoch, "set", "intra_node")


@triton.jit
def _scatter_add_tile(acc, partial, half, token_index, topk_slot, weights, index, valid, cols, mask, stride,
                      m_per_rank, TOPK: tl.constexpr, WORLD: tl.constexpr):
    """``SCATTER_ADD``'s epilogue (see :func:`group_gemm_kernel`): the tile's rows, weighted, into
    their tokens' rows on the tokens' ranks (consecutive ranks: tokens ascend within an expert).
    A token index outside ``[0, WORLD * m_per_rank)`` (a layout not made by ``ag_group_gemm``)
    adds nothing, so no rank or row out of range is written."""
    tokens = tl.load(token_index + index, mask=valid, other=0)
    valid = valid & (tokens >= 0) & (tokens < WORLD * m_per_rank)
    mask = mask & valid[:, None]
    slots = tl.load(topk_slot + index, mask=valid, other=0)
    scale = tl.load(weights + tokens.to(tl.int64) * TOPK + slots, mask=valid, other=0.0)
    value = acc * scale[:, None]
    dest = tokens // m_per_rank
    offs = (tokens - dest * m_per_rank).to(tl.int64)[:, None] * stride + cols[None, :]
    first = tl.min(tl.where(valid, dest, WORLD), 0)
    last = tl.max(tl.where(valid, dest, 0), 0)
    for d in range(first, last + 1):
        base = tl.multiple_of(dl.symm_at(partial, d), 16) + half  # symm_at loses the alignment fact
        tl.atomic_add(base + offs, value, mask=mask & (dest == d)[:, None], sem="relaxed", scope="sys")


def kernel_meta(config: str, **modes) -> dict:
    """Launch keywords of :func:`group_gemm_kernel` for ``config`` (its tiles, pipeline depth and
    warps) and the mode constexprs ``modes`` (``PADDED`` defaults to False)."""
    cfg = _gemm.config_params(config)
    return dict(BM=cfg["BM"], BN=cfg["BN"], BK=cfg["BK"], GROUP_M=cfg["GROUP_M"], NUM_STAGES=cfg["NUM_STAGES"],
                num_warps=cfg["num_warps"], num_stages=cfg["NUM_STAGES"], PADDED=False) | modes


def grid_for(rows: int, experts: int, n: int, config: str, max_programs: int) -> tuple[int]:
    """The persistent grid: one program per output tile there can be, at most ``max_programs``.
    Whatever the routing there are at most ``cdiv(rows, BM) + experts`` m-tiles (each expert
    rounds up once)."""
    cfg = _gemm.config_params(config)
    tiles = (cdiv(rows, cfg["BM"]) + experts) * cdiv(n, cfg["BN"])
    return (max(1, min(tiles, max_programs)), )


def weight_descriptor(w, config: str):
    """The TMA descriptor of ``w [E, N, K]`` seen as ``[E * N, K]``, block ``[BN, BK]`` of ``config``."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    cfg = _gemm.config_params(config)
    experts, n, k = w.shape
    return TensorDescriptor.from_tensor(w.reshape(experts * n, k), [cfg["BN"], cfg["BK"]])


def launch(a, w, c, ends, *, padded: bool, config: str | None = None) -> None:
    """Launch :func:`group_gemm_kernel` on the current stream for already checked tensors: ``a``
    ``[T, K]`` (padded: ``[E, capacity, K]``), ``w`` ``[E, N, K]``, ``c`` the output of ``a``'s
    rows, ``ends`` int32 ``[E]``. ``config``: one of :func:`config_names` (a swapped one launches
    :func:`~triton_dist.kernels.moe.group_gemm_swapped.group_gemm_swapped_kernel` instead), default
    :func:`pick_group_gemm_config`'s."""
    experts, n, k = w.shape
    capacity = a.shape[1] if padded else 0
    a2 = a.reshape(-1, k)
    rows = a2.shape[0]
    sms = _gemm.num_sms(a.device)
    config = config or pick_group_gemm_config(rows, experts, n, sms)
    swapped = _swapped()
    if config in swapped.CONFIG_NAMES:
        swapped.launch(a2, w, c, ends, padded=padded, capacity=capacity, config=config, num_sms=sms,
                       timeline_args=_timeline.kernel_args())
        return
    a_desc, w_desc = _gemm.operand_descriptors(a2, w.reshape(experts * n, k), config)
    group_gemm_kernel[grid_for(rows, experts, n, config, sms)](a_desc, w_desc, c, ends, experts, rows, capacity, n,
                                                               k, **kernel_meta(config, PADDED=padded),
                                                               **_timeline.kernel_args())


def _check(x, w, ends, padded: bool, out):
    """The output shape of a valid call; raises naming the bad argument otherwise."""
    import torch

    op = "group_gemm"
    if not isinstance(w, torch.Tensor) or w.dim() != 3 or w.dtype not in (torch.bfloat16, torch.float16) or \
            not w.is_cuda or not w.is_contiguous():
        raise ValueError(f"triton_dist {op}: w must be a contiguous [experts, N, K] bfloat16 or float16 CUDA tensor, "
                         f"got {_describe(w)}")
    experts, n, k = w.shape
    rank = 3 if padded else 2
    layout = "[experts, capacity, K] (with counts)" if padded else "[tokens, K] (with offsets)"
    if not isinstance(x, torch.Tensor) or x.dim() != rank or not x.is_contiguous():
        raise ValueError(f"triton_dist {op}: x must be a contiguous {layout} tensor, got {_describe(x)}")
    if x.dtype != w.dtype:
        raise TypeError(f"triton_dist {op}: x is {x.dtype} but w is {w.dtype}")
    if x.device != w.device:
        raise ValueError(f"triton_dist {op}: x is on {x.device} but w is on {w.device}")
    if x.shape[-1] != k:
        raise ValueError(f"triton_dist {op}: x has K = {x.shape[-1]} but w is [experts, N, K] = {list(w.shape)}")
    if padded and x.shape[0] != experts:
        raise ValueError(f"triton_dist {op}: x is {list(x.shape)}, one block per expert, but w has {experts} experts")
    if k % 8 or n % 8 or k == 0:
        raise ValueError(f"triton_dist {op}: K ({k}) and N ({n}) must be multiples of 8, K positive (TMA needs "
                         f"16-byte aligned rows)")
    name = "counts" if padded else "offsets"
    if not isinstance(ends, torch.Tensor) or ends.dtype != torch.int32 or tuple(ends.shape) != (experts, ) or \
            ends.device != w.device or not ends.is_contiguous():
        raise ValueError(f"triton_dist {op}: {name} must be a contiguous int32 [{experts}] tensor on {w.device}, "
                         f"got {_describe(ends)}")
    shape = (*x.shape[:-1], n)
    if out is not None and (not isinstance(out, torch.Tensor) or tuple(out.shape) != shape or out.dtype != x.dtype
                            or out.device != x.device or not out.is_contiguous() or out.data_ptr() % 16):
        raise ValueError(f"triton_dist {op}: out must be a contiguous, 16-byte aligned {list(shape)} {x.dtype} tensor "
                         f"on {x.device}, got {_describe(out)}")
    return shape


def _check_rows(ends: list[int], padded: bool, rows: int, capacity: int) -> None:
    """Offsets non-decreasing and ending at most at the token count, or counts in ``[0,
    capacity]`` (``ends``: the values, read on the host)."""
    if padded:
        if ends and (min(ends) < 0 or max(ends) > capacity):
            raise ValueError(f"triton_dist group_gemm: counts must be in [0, {capacity}] (x's capacity), got counts "
                             f"from {min(ends)} to {max(ends)}")
        return
    for e, (before, end) in enumerate(zip([0] + ends, ends)):
        if end < before:
            raise ValueError(f"triton_dist group_gemm: offsets must be non-decreasing cumulative row ends from 0; "
                             f"offsets[{e}] = {end} is below {before}")
    if ends and ends[-1] > rows:
        raise ValueError(f"triton_dist group_gemm: offsets must end at most at x's {rows} rows, got offsets[-1] = "
                         f"{ends[-1]}")


def group_gemm(x, w, *, offsets=None, counts=None, out=None, config: str | None = None,
               check_rows: bool | None = None):
    """Every expert's rows of ``x`` times its weights: ``out[rows of e] = x[rows of e] @ w[e].T``
    (``w [experts, N, K]``, bf16 or fp16) on the current stream; returns ``out`` (new when None).
    Local to this GPU, not collective.

    Give exactly one of ``offsets`` (``x [T, K]`` sorted by expert, int32 cumulative row ends,
    ``out [T, N]``, rows past ``offsets[-1]`` left as they were: the dropped pairs that
    :func:`triton_dist.ops.ag_group_gemm` sorts last) or ``counts`` (``x [experts, capacity, K]``,
    int32 rows used per expert, ``out [experts, capacity, N]``, rows past the counts left as they
    were). Empty experts and ``T = 0`` are fine. ``config``: one of :func:`config_names` (default:
    :func:`pick_group_gemm_config`; the swapped decode configs, ``"swapped_m<BM>"``, take experts
    of any size, every ``BM`` rows of an expert reading its weights once more). ``check_rows``:
    check the offsets or counts on the host (one synchronisation); default: when not capturing a
    CUDA graph. Unchecked bad rows are clamped on the GPU, never written out of bounds."""
    if (offsets is None) == (counts is None):
        raise ValueError("triton_dist group_gemm: give exactly one of offsets (x [tokens, K] sorted by expert) or "
                         "counts (x [experts, capacity, K])")
    import torch

    padded = counts is not None
    ends = counts if padded else offsets
    shape = _check(x, w, ends, padded, out)
    if config is not None and config not in config_names():
        raise ValueError(f"triton_dist group_gemm: config must be None or one of {config_names()}, got {config!r}")
    if out is None:
        out = torch.empty(shape, dtype=x.dtype, device=x.device)
    rows = x.shape[0] * (x.shape[1] if padded else 1)
    if rows == 0 or w.shape[1] == 0:
        return out
    if check_rows is None:
        check_rows = not torch.cuda.is_current_stream_capturing()
    if check_rows:
        _check_rows(ends.tolist(), padded, rows, x.shape[1] if padded else 0)
    launch(_gemm.aligned_for_tma(x), _gemm.aligned_for_tma(w), out, ends, padded=padded, config=config)
    return out

