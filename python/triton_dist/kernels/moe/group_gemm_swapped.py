"""The MoE grouped GEMM at decode, swapped: for every expert ``e``, ``C_e = A_e @ W[e]^T`` (the
layouts and the clamped row convention of :mod:`~triton_dist.kernels.moe.group_gemm`) with the
weights' rows on wgmma's M side, the grouped counterpart of the dense split-K GEMM
(:mod:`~triton_dist.kernels.gemm.split_k`), without the K split.

Why: a decode grouped GEMM (a few to a few tens of rows per expert) is bound by reading the
experts' weights. The persistent kernel's 64-row tiles (``"skinny_n128"``) put the expert's rows
on wgmma's M side, 64 rows a warpgroup, so at 8-16 rows an expert most of each wgmma multiplies
padding; on one H100 the faster of ``torch._grouped_mm`` and a cuBLAS loop took 0.91-0.94 of its
time on Mixtral-8x7B's decode up projection and Qwen3-30B-A3B's skewed one
(bench/results/h100-x1/group_gemm.json).
Here a tile is ``out^T = W_e[off_n:off_n + 128, :] @ A[rows]^T``
(:func:`~triton_dist.kernels.gemm.tile.swapped_tile_product`): each pipeline stage carries 128 rows
of the weights, and the expert's rows, padded to ``BM`` (16-128), are wgmma's N side.

Tiles: expert ``e`` with ``count_e`` rows has ``cdiv(N, 128)`` n-tiles times ``cdiv(count_e, BM)``
row blocks, so an expert with more rows than ``BM`` is still computed (each row block reads the
weight tile again: pick ``BM`` at least the usual rows of an expert); an empty expert has none. The
experts' tiles are numbered one after the other and the persistent grid shares them out as in
:func:`~triton_dist.kernels.moe.group_gemm.group_gemm_kernel` (``p, p + G, ...``; the routing is
read on the GPU, so a CUDA graph replays new routing). Within an expert, the row blocks of one
n-tile are adjacent in that numbering: neighbouring programs read the same weight tile at about
the same time, and the second read comes from L2. Each tile runs the whole K loop (decode shapes
have ``experts * cdiv(N, 128)`` tiles, usually more than the SMs; a K split, with the split-K
kernel's tickets, is the next step if a measurement asks for it).

A's TMA box (``BM`` rows from the block's first row) may run past the expert's rows into the next
expert's (or, padded, into the unused rows of the expert's block) and past the tensor's end (read
as zeros); W's box past ``N`` into the next expert's weights. Column ``j`` of the transposed tile
depends only on A's row ``j``, so those rows reach only columns the store masks off: the store
writes the expert's rows and ``N``'s columns, nothing else.

Configs: ``"swapped_m16"``, ``"swapped_m32"``, ``"swapped_m64"``, ``"swapped_m128"``
(:data:`CONFIG_NAMES`), the split-K GEMM's table (:data:`~triton_dist.kernels.gemm.split_k.SPLIT_K_CONFIGS`)
by ``BM``. :func:`~triton_dist.kernels.moe.group_gemm.group_gemm` takes them by name; its default
rule does not pick them until a GPU measurement says where they win. Not yet run on a GPU.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ...language import timeline as _stamps
from ..gemm.split_k import SPLIT_K_BN, SPLIT_K_CONFIGS
from ..gemm.tile import swapped_tile_product
from .group_gemm import expert_tiles
from ..common.host_math import cdiv

CONFIG_NAMES = {f"swapped_m{bm}": bm for bm in SPLIT_K_CONFIGS}
"""The swapped configs of :func:`~triton_dist.kernels.moe.group_gemm.group_gemm`: name -> ``BM``
(an expert's rows per tile, wgmma's N side)."""


def config_params(config: str) -> dict:
    """``BM``, ``BN`` (128 weight rows), ``BK``, ``NUM_STAGES`` and ``num_warps`` of a name of
    :data:`CONFIG_NAMES`; a ValueError naming the configs for any other name."""
    bm = CONFIG_NAMES.get(config)
    if bm is None:
        raise ValueError(f"triton_dist group_gemm: {config!r} is not a swapped config; one of {list(CONFIG_NAMES)}")
    return dict(BM=bm, BN=SPLIT_K_BN, **SPLIT_K_CONFIGS[bm])


@triton.jit(do_not_specialize=["num_experts", "total_rows", "capacity", "N", "K"])
def group_gemm_swapped_kernel(a_desc, w_desc, c, ends, num_experts, total_rows, capacity, N, K, BM: tl.constexpr,
                              BN: tl.constexpr, BK: tl.constexpr, NUM_STAGES: tl.constexpr, PADDED: tl.constexpr,
                              timeline=None, TIMELINE: tl.constexpr = False):
    """``c[rows of e] = A[rows of e] @ W[e]^T`` for every expert ``e < num_experts`` (module notes).
    ``a_desc``: ``[total_rows, K]``, block ``[BM, BK]``; ``w_desc``: ``[num_experts * N, K]``, block
    ``[BN, BK]``; ``c``: ``[total_rows, N]``, 16-byte aligned (``N`` a multiple of 8). ``ends``:
    int32 ``[num_experts]``, cumulative row ends (packed) or row counts with expert ``e`` at row ``e *
    capacity`` (``PADDED``). ``TIMELINE``: a tile's start, K loop end and epilogue end stamped into
    ``timeline``, as the persistent grouped kernel does."""
    pid = tl.program_id(0)
    grid = tl.num_programs(0)
    num_n = tl.cdiv(N, BN)
    k_tiles = tl.cdiv(K, BK)
    stride = (N // 8) * 8  # == N (a multiple of 8), with the divisibility fact for 16-byte stores
    cols = tl.arange(0, BN)  # out's columns within the tile: the weight rows
    lanes = tl.arange(0, BM)  # out's rows within the row block
    first_tile = pid * 0  # this expert's first tile in the numbering of every expert's tiles
    if TIMELINE:
        cursor = pid * 0
    for e in range(0, num_experts):
        start, count, num_m, tiles, mine = expert_tiles(ends, e, total_rows, capacity, first_tile, pid, grid, num_n,
                                                        BM, PADDED)
        for tile in range(mine, first_tile + tiles, grid):
            if TIMELINE:
                cursor = _stamps.stamp(timeline, cursor, _stamps.TILE)
            local = tile - first_tile
            off_n = (local // num_m) * BN  # the row blocks of one n-tile adjacent: its weights from L2
            rows = (local % num_m) * BM + lanes  # the expert's rows in this block
            acc = swapped_tile_product(a_desc, w_desc, e * N + off_n, 0, k_tiles, BM, BN, BK, NUM_STAGES,
                                       off_m=start + (local % num_m) * BM)
            if TIMELINE:
                cursor = _stamps.stamp(timeline, cursor, _stamps.COMPUTED)
            mask = (off_n + cols < stride)[:, None] & (rows < count)[None, :]
            offs = (start + rows).to(tl.int64)[None, :] * stride + (off_n + cols)[:, None]
            tl.store(c + offs, acc.to(c.dtype.element_ty), mask=mask)
            if TIMELINE:
                cursor = _stamps.stamp(timeline, cursor, _stamps.DONE)
        first_tile += tiles


def kernel_meta(config: str, padded: bool = False) -> dict:
    """Launch keywords of :func:`group_gemm_swapped_kernel` for ``config``: tiles, pipeline depth, warps."""
    p = config_params(config)
    return dict(BM=p["BM"], BN=p["BN"], BK=p["BK"], NUM_STAGES=p["NUM_STAGES"], num_warps=p["num_warps"],
                num_stages=p["NUM_STAGES"], PADDED=padded)


def grid_for(rows: int, experts: int, n: int, config: str, max_programs: int) -> tuple[int]:
    """The persistent grid: one program per tile there can be (at most ``cdiv(rows, BM) + experts``
    row blocks, each expert rounding up once, times the n-tiles), at most ``max_programs``."""
    tiles = (cdiv(rows, config_params(config)["BM"]) + experts) * cdiv(n, SPLIT_K_BN)
    return (max(1, min(tiles, max_programs)), )


def launch(a2, w, c, ends, *, padded: bool, capacity: int, config: str, num_sms: int, timeline_args: dict) -> None:
    """Launch :func:`group_gemm_swapped_kernel` on the current stream for checked tensors (called
    by :func:`~triton_dist.kernels.moe.group_gemm.launch`): ``a2`` the rows as ``[T, K]``
    (padded: ``[E * capacity, K]``), ``w [E, N, K]``, ``c`` the output of ``a2``'s rows, ``ends``
    int32 ``[E]``; TMA-aligned bases."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    p = config_params(config)
    experts, n, k = w.shape
    rows = a2.shape[0]
    a_desc = TensorDescriptor.from_tensor(a2, [p["BM"], p["BK"]])
    w_desc = TensorDescriptor.from_tensor(w.reshape(experts * n, k), [p["BN"], p["BK"]])
    group_gemm_swapped_kernel[grid_for(rows, experts, n, config, num_sms)](
        a_desc, w_desc, c, ends, experts, rows, capacity, n, k, **kernel_meta(config, padded), **timeline_args)
