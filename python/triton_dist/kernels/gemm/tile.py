"""One output tile of a Hopper GEMM: where it sits in a grouped walk (:func:`tile_coords`; across
nodes, AllGather+GEMM's node order :func:`own_node_first`) and its
software-pipelined K loop (:func:`tile_product`), shared by every GEMM kernel of the library (the
dense :func:`~triton_dist.kernels.gemm.dense.gemm_kernel` with its overlapped epilogues, and the MoE
grouped GEMM of :mod:`triton_dist.kernels.moe.group_gemm`), so that there is one K loop to tune.

Decode-sized M has a second loop, :func:`swapped_tile_product`: B's rows on wgmma's M side and a
slice of K, shared by the split-K kernels (the plain GEMM's
:func:`~triton_dist.kernels.gemm.split_k.gemm_split_k_kernel` and GEMM+AllReduce's
:func:`~triton_dist.kernels.gemm.gemm_ar.gemm_ar_split_k_kernel`) and the MoE grouped GEMM's
swapped configs (:mod:`triton_dist.kernels.moe.group_gemm_swapped`)."""

from __future__ import annotations

import triton
import triton.language as tl

from ... import language as dl


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
                 BK: tl.constexpr, NUM_STAGES: tl.constexpr, A_AFTER_TOKEN: tl.constexpr, a_rows=None, a_mask=None,
                 K=None, k_begin=0):
    """``A[off_m:off_m + BM, :] @ B[off_n:off_n + BN, :]^T`` in fp32 over K steps ``[k_begin,
    k_tiles)`` of ``BK`` (``k_begin`` left 0, a constant, by every caller but the wave-tail GEMM's
    slices of K, :mod:`~triton_dist.kernels.gemm.wave_tail`: their code is unchanged), TMA loads
    through ``a_desc`` (block ``[BM, BK]``) and ``b_desc`` (block ``[BN, BK]``) into a
    ``NUM_STAGES``-deep pipeline feeding wgmma. ``A_AFTER_TOKEN``: A's loads go through
    ``dl.consume_token(..., token)``, so they are issued after the wait that made ``token`` (with
    the async-proxy fence in between for a descriptor); the wait itself stays outside, between
    tiles, since the pipeliner would otherwise hoist the next tile's loads above it.

    Gathered rows (``a_rows`` given, ``a_desc`` and ``off_m`` unused): A's tile is the rows whose
    first elements ``a_rows`` points at (``[BM, 1]`` pointers into a row-major ``[*, K]`` tensor),
    loaded with ``tl.load`` where ``a_mask`` (``[BM, 1]``) holds and zero elsewhere or past ``K``:
    the rows of a grouped GEMM whose tokens are not stored in expert order. To order these loads
    after a wait, bind its token to the row indices the caller builds ``a_rows`` from
    (``A_AFTER_TOKEN`` is for the descriptor): bound to the pointers, the token's unknown value
    would hide their 16-byte alignment and the loads would neither vectorise nor pipeline."""
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    if a_rows is not None:
        cols = tl.arange(0, BK)[None, :]
        a_ptrs = a_rows + cols
    for k in tl.range(k_begin, k_tiles, num_stages=NUM_STAGES):
        if a_rows is not None:
            a = tl.load(a_ptrs + k * BK, mask=a_mask & (cols < K - k * BK), other=0.0)
        elif A_AFTER_TOKEN:
            a = dl.consume_token(a_desc, token).load([off_m, k * BK])
        else:
            a = a_desc.load([off_m, k * BK])
        b = b_desc.load([off_n, k * BK])
        acc = tl.dot(a, b.T, acc)
    return acc


@triton.jit
def swapped_tile_product(a_desc, b_desc, off_n, k_begin, k_end, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                         NUM_STAGES: tl.constexpr, off_m=0):
    """``B[off_n:off_n + BN, :] @ A[off_m:off_m + BM, :]^T`` in fp32 over K steps ``[k_begin,
    k_end)`` of ``BK`` (an empty range gives zeros): ``out``'s tile transposed, ``[BN, BM]``.
    ``b_desc``: block ``[BN, BK]``; ``a_desc``: block ``[BM, BK]`` (TMA reads rows past A's end as
    zeros). The split-K GEMMs take all of A's rows (``off_m`` left 0, a constant: their code is
    unchanged); the swapped grouped GEMM (:mod:`~triton_dist.kernels.moe.group_gemm_swapped`) one
    expert's block of rows. Why swapped: wgmma's M side is 64 rows per warpgroup, so with A there
    a decode GEMM of 1-16 rows would multiply mostly zeros; with B's rows there (``BN`` = 128) and
    A's rows as wgmma's N (``BM``: any multiple of 8 up to 256), each pipeline stage carries ``BN *
    BK`` elements of B, the operand whose read bounds a decode GEMM."""
    acc = tl.zeros((BN, BM), dtype=tl.float32)
    for k in tl.range(k_begin, k_end, num_stages=NUM_STAGES):
        w = b_desc.load([off_n, k * BK])
        x = a_desc.load([off_m, k * BK])
        acc = tl.dot(w, x.T, acc)
    return acc


@triton.jit
def own_node_first(pid_m, num_m, rank, m_per_rank, BM: tl.constexpr, LOCAL: tl.constexpr):
    """The m-tile at place ``pid_m`` of AllGather+GEMM's walk across nodes of ``LOCAL`` ranks (rank
    ``r``'s rows at ``[r * m_per_rank, (r + 1) * m_per_rank)``, node ``r // LOCAL``): first this
    rank's node, from this rank's own rows on; then the following nodes in order, each from the
    rows of its rank at this rank's local index, which come straight across (``"sm_2d"``; the
    node's other ranks' rows are forwarded after them). A tile belongs to the node of its first
    row. A bijection of ``[0, num_m)``: a rotation that puts this node first, then a rotation
    inside the node the tile belongs to. At one node (``LOCAL`` = world) it is the rotation by the
    tile of this rank's first row, the one-node walk."""
    node_rows = LOCAL * m_per_rank
    own_start = tl.cdiv((rank // LOCAL) * node_rows, BM)
    p = (pid_m + own_start) % num_m
    node = (p * BM) // node_rows
    start = tl.cdiv(node * node_rows, BM)
    end = tl.minimum(tl.cdiv((node + 1) * node_rows, BM), num_m)
    first = ((node * LOCAL + rank % LOCAL) * m_per_rank) // BM  # the tile of that rank's first row
    return start + (p - start + tl.maximum(first - start, 0)) % (end - start)
