"""A warp-specialized persistent GEMM, ``C[M, N] = A[M, K] @ B[N, K]^T``: the shared K loop
(:func:`~triton_dist.kernels.gemm.tile.tile_product`) under Triton's automatic warp specialization
for Hopper, so that a producer warpgroup keeps issuing TMA loads (the next tile's included) while
two consumer warpgroups run wgmma and the epilogue.

Why: the plain persistent GEMM (:func:`~triton_dist.kernels.gemm.dense.gemm_kernel`) runs its
loads, products and epilogue in the same warps, so a tile's epilogue stalls the next tile's loads;
cuBLAS's Hopper kernels specialize warps. Whether that pays under Triton's pass is measured, not
assumed: bench/gemm.py sweeps these configs beside the others; none is a default.

What the pass needs (Triton 3.6, seen compiling for sm_90): the loop launched with 4 warps (it
adds a producer and a second consumer warpgroup: 12 warps run; with 8 it leaves the loop as it is)
and no TMA store after it (the pass fails on a descriptor store), so the epilogue is a masked
``tl.store`` of the tile.

Configs (:data:`CONFIGS`): ``"large_ws"`` and ``"small_ws"``, the tiles of
:data:`~triton_dist.kernels.gemm.dense.CONFIGS`' ``"large"`` and ``"small"`` (no shared memory for
an epilogue tile: one stage more for ``"large"``), taken by name by
:func:`~triton_dist.kernels.gemm.dense.gemm`.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .tile import tile_coords, tile_product
from ..common.host_math import cdiv

CONFIGS = {
    # 4 * (128 + 256) * 64 * 2 B = 192 KiB of stages; each consumer warpgroup holds 64 x 256 fp32.
    "large_ws": dict(BM=128, BN=256, BK=64, GROUP_M=8, NUM_STAGES=4, num_warps=4),
    # 5 * (128 + 128) * 64 * 2 B = 160 KiB.
    "small_ws": dict(BM=128, BN=128, BK=64, GROUP_M=8, NUM_STAGES=5, num_warps=4),
}
"""The warp-specialized configs: name -> tile sizes, pipeline depth and the warps given to the
launch (the pass adds the producer and second consumer warpgroups)."""


@triton.jit(do_not_specialize=["M", "N", "K"])
def gemm_ws_kernel(a_desc, b_desc, c, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                   GROUP_M: tl.constexpr, NUM_STAGES: tl.constexpr):
    """``c [M, N] = A @ B^T`` over a persistent grid (grouped tile order, as
    :func:`~triton_dist.kernels.gemm.dense.gemm_kernel`'s). ``a_desc``: ``[M, K]`` block ``[BM,
    BK]``; ``b_desc``: ``[N, K]`` block ``[BN, BK]``; ``c``: row-major, 16-byte aligned, ``N`` a
    multiple of 8."""
    pid = tl.program_id(0)
    grid = tl.num_programs(0)
    num_m = tl.cdiv(M, BM)
    num_n = tl.cdiv(N, BN)
    k_tiles = tl.cdiv(K, BK)
    stride = (N // 8) * 8  # == N, with the divisibility fact for 16-byte stores
    rows = tl.arange(0, BM)
    cols = tl.arange(0, BN)
    for tile in range(pid, num_m * num_n, grid):
        pid_m, pid_n = tile_coords(tile, num_m, num_n, GROUP_M)
        off_m = pid_m * BM
        off_n = pid_n * BN
        acc = tile_product(a_desc, b_desc, off_m, off_n, k_tiles, None, BM, BN, BK, NUM_STAGES, False,
                           WARP_SPECIALIZE=True)
        r = off_m + rows
        cc = off_n + cols
        tl.store(c + r.to(tl.int64)[:, None] * stride + cc[None, :], acc.to(c.dtype.element_ty),
                 mask=(r < M)[:, None] & (cc < stride)[None, :])


def gemm_ws(a, b, out, config: str, num_sms: int) -> None:
    """``out = a @ b.T`` with the warp-specialized ``config`` (a key of :data:`CONFIGS`) on at most
    ``num_sms`` programs, on the current stream. ``a [M, K]``, ``b [N, K]``: contiguous with 16-byte
    aligned bases, ``K`` and ``N`` multiples of 8; ``out [M, N]`` 16-byte aligned, of their dtype
    (validated by :func:`~triton_dist.kernels.gemm.dense.gemm`, which calls it)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    c = CONFIGS.get(config)
    if c is None:
        raise ValueError(f"triton_dist gemm: {config!r} is not a warp-specialized config; one of {sorted(CONFIGS)}")
    m, k = a.shape
    n = b.shape[0]
    a_desc = TensorDescriptor.from_tensor(a, [c["BM"], c["BK"]])
    b_desc = TensorDescriptor.from_tensor(b, [c["BN"], c["BK"]])
    tiles = cdiv(m, c["BM"]) * cdiv(n, c["BN"])
    gemm_ws_kernel[(min(tiles, num_sms), )](a_desc, b_desc, out, m, n, k, BM=c["BM"], BN=c["BN"], BK=c["BK"],
                                           GROUP_M=c["GROUP_M"], NUM_STAGES=c["NUM_STAGES"],
                                           num_warps=c["num_warps"], num_stages=c["NUM_STAGES"])
