"""One output tile of a Hopper GEMM: where it sits in a grouped walk (:func:`tile_coords`) and its
software-pipelined K loop (:func:`tile_product`), shared by every GEMM kernel of the library (the
dense :func:`~triton_dist.kernels.gemm.gemm_kernel` with its overlapped epilogues, and the MoE
grouped GEMM of :mod:`triton_dist.kernels.moe.group_gemm`), so that there is one K loop to tune."""

from __future__ import annotations

import triton
import triton.language as tl

from .. import language as dl


@triton.jit
def tile_coords(tile, num_m, num_n, group_size):
    """Grouped ordering: ``group_size`` m-tiles share the n-tiles they walk, so B stays in L2
    (a constexpr ``GROUP_M`` from every caller but AllGather+GEMM's, which may shrink it)."""
    per_group = group_size * num_n
    group = tile // per_group
    first_m = group * group_size
    group_m = tl.minimum(num_m - first_m, group_size)
    pid_m = first_m + (tile % per_group) % group_m
    pid_n = (tile % per_group) // group_m
    return pid_m, pid_n


@triton.jit
def tile_product(a_desc, b_desc, off_m, off_n, k_tiles, token, BM: tl.constexpr, BN: tl.constexpr,
                 BK: tl.constexpr, NUM_STAGES: tl.constexpr, A_AFTER_TOKEN: tl.constexpr):
    """``A[off_m:off_m + BM, :] @ B[off_n:off_n + BN, :]^T`` in fp32 over ``k_tiles`` steps of
    ``BK``, TMA loads through ``a_desc`` (block ``[BM, BK]``) and ``b_desc`` (block ``[BN, BK]``)
    into a ``NUM_STAGES``-deep pipeline feeding wgmma. ``A_AFTER_TOKEN``: A's loads go through
    ``dl.consume_token(a_desc, token)``, so they are issued after the wait that made ``token``
    (with the async-proxy fence in between); the wait itself stays outside, between tiles, since
    the pipeliner would otherwise hoist the next tile's loads above it."""
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in tl.range(0, k_tiles, num_stages=NUM_STAGES):
        if A_AFTER_TOKEN:
            a = dl.consume_token(a_desc, token).load([off_m, k * BK])
        else:
            a = a_desc.load([off_m, k * BK])
        b = b_desc.load([off_n, k * BK])
        acc = tl.dot(a, b.T, acc)
    return acc
