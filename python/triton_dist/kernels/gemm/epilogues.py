"""The epilogues of :func:`~triton_dist.kernels.gemm.dense.gemm_kernel` beyond the plain store, one
tile at a time: GEMM+ReduceScatter's destinations, signals (sent one tile late) and copy-engine chunk counts,
the fused method's sum of an own tile, and GEMM+AllReduce's push, signal and sum. The tile loop and
its notes (what each ``EPILOGUE`` means, the orders, why nothing deadlocks) stay in
:mod:`~triton_dist.kernels.gemm.dense`."""

from __future__ import annotations

import triton
import triton.language as tl

from ... import language as dl
from ..common.tickets import last_to_finish


@triton.jit
def partial_destination(rank, dest, WORLD: tl.constexpr, NODE_RANKS: tl.constexpr):
    """``(target, slot)``: the rank whose buffer takes this rank's partial of destination
    ``dest``'s rows, and the slot (of rows and of signal regions) there. At one node (``NODE_RANKS``
    0 or None): ``dest`` itself, slot ``rank``. Across nodes of ``NODE_RANKS`` ranks: the rank of
    this node at ``dest``'s local index, slot ``local * NODES + dest's node``, where the node's
    partials of ``dest``'s rows meet to be summed and sent across once
    (:mod:`~triton_dist.kernels.gemm.gemm_rs_2d`)."""
    if NODE_RANKS:
        NODES: tl.constexpr = WORLD // NODE_RANKS
        return (rank // NODE_RANKS) * NODE_RANKS + dest % NODE_RANKS, (rank % NODE_RANKS) * NODES + dest // NODE_RANKS
    else:
        return dest, rank


@triton.jit
def signal_pending(signals, pending_tile, pending_dest, epoch):
    """The signal of this program's previous GEMM+ReduceScatter tile (``pending_tile`` < 0: none)
    on ``pending_dest`` (``dl.notify``: a CTA barrier orders every thread's stores of that tile
    before the one release atomic)."""
    if pending_tile >= 0:
        dl.notify(signals + pending_tile, pending_dest, epoch, "set", "intra_node")


@triton.jit
def copy_chunk(pid_m, pid_n, local_m, num_n, chunk_n, GROUP_M: tl.constexpr):
    """The copy-engine chunk holding tile ``(pid_m, pid_n)`` of a destination's ``local_m x num_n``
    tiles, and that chunk's tile count: group ``g`` (``GROUP_M`` m-tiles, :func:`~triton_dist.kernels.gemm.tile.tile_coords`)
    times n-tiles ``[j * chunk_n, (j + 1) * chunk_n)``, numbered ``g * cdiv(num_n, chunk_n) + j``,
    the order in which the grouped walk finishes them."""
    group = pid_m // GROUP_M
    j = pid_n // chunk_n
    chunk = group * tl.cdiv(num_n, chunk_n) + j
    group_m = tl.minimum(local_m - group * GROUP_M, GROUP_M)
    return chunk, group_m * (tl.minimum(num_n, (j + 1) * chunk_n) - j * chunk_n)


@triton.jit
def count_chunk_tile(chunk_flags, tickets, index, tiles_in_chunk):
    """One more tile of copy-engine chunk ``index`` (< 0: none) is stored here: the program that
    stores the chunk's last tile (:func:`~triton_dist.kernels.common.tickets.last_to_finish`) raises
    ``chunk_flags[index]`` to 1 for the copy stream, with a system-scope release (the copy engine
    reads the chunk)."""
    if index >= 0:
        if last_to_finish(tickets, index, tiles_in_chunk):
            dl.atomic_xchg(chunk_flags + index, 1, scope="sys", semantic="release")


@triton.jit
def publish_pending(signals, chunk_flags, tickets, pending_tile, pending_dest, pending_count, epoch,
                     PEER_TMA: tl.constexpr, PEER_COPY_ENGINE: tl.constexpr):
    """Publish this program's previous GEMM+ReduceScatter tile, held back one tile so that its
    stores drained meanwhile: the chunk count of ``PEER_COPY_ENGINE`` (``pending_tile`` is then the
    chunk's flag, ``pending_count`` its tiles), else the tile's signal (after ``PEER_TMA``'s bulk
    stores have completed)."""
    if PEER_TMA:
        dl.wait_tma_stores()
    if PEER_COPY_ENGINE:
        count_chunk_tile(chunk_flags, tickets, pending_tile, pending_count)
    else:
        signal_pending(signals, pending_tile, pending_dest, epoch)


@triton.jit
def sum_own_tile(acc, partials, out, signals, rows, cols, mask, stride, m_per_rank, rank, tile, signal_region, epoch,
                  WORLD: tl.constexpr):
    """The fused GEMM+ReduceScatter's own tile: wait for each peer's partial of it, add them to
    ``acc`` (rank order from ``rank + 1``), store the sum into ``out``."""
    offs = rows.to(tl.int64)[:, None] * stride + cols[None, :]
    if WORLD <= 2:
        for i in tl.static_range(1, WORLD):
            acc = _add_peer_partial(acc, partials, offs, mask, stride, m_per_rank, signals, signal_region, tile,
                                    (rank + i) % WORLD, epoch)
    else:
        # A loop, not unrolled, and not pipelined (each load must follow its wait): unrolled, the
        # compiler kept several peers' partial tiles live at once and ptxas spilled (3.3 KB a
        # thread for the 128x256 tile at 8 ranks, 0.8 KB at 4; none at 2, which stays unrolled).
        for i in tl.range(1, WORLD, num_stages=1, loop_unroll_factor=1):
            acc = _add_peer_partial(acc, partials, offs, mask, stride, m_per_rank, signals, signal_region, tile,
                                    (rank + i) % WORLD, epoch)
    tl.store(out + offs, acc.to(out.dtype.element_ty), mask=mask)


@triton.jit
def _add_peer_partial(acc, partials, offs, mask, stride, m_per_rank, signals, signal_region, tile, r, epoch):
    """``acc`` plus peer ``r``'s partial of this rank's tile, loaded after its signal."""
    token = dl.wait(signals + r * signal_region + tile, 1, "sys", "acquire", epoch)
    src = partials + (r * m_per_rank).to(tl.int64) * stride + offs
    return acc + tl.load(dl.consume_token(src, token), mask=mask).to(tl.float32)


@triton.jit
def all_reduce_tile(acc, partials, partials_base, half, out, signals, off_m, off_n, M, stride, rank, tile,
                     signal_region, epoch, WORLD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    """GEMM+AllReduce's epilogue of one tile: ``acc`` (fp32) to slot ``rank`` of every peer's half
    (``partials``: this rank's half; ``partials_base + half``: the same through ``dl.symm_at``),
    signalled; then the sum of every rank's partial in rank order into ``out``."""
    rows = off_m + tl.arange(0, BM)
    cols = off_n + tl.arange(0, BN)
    mask = (rows < M)[:, None] & (cols < stride)[None, :]
    offs = rows.to(tl.int64)[:, None] * stride + cols[None, :]
    slot = M.to(tl.int64) * stride
    for i in tl.static_range(1, WORLD):
        peer = tl.multiple_of(dl.symm_at(partials_base, (rank + i) % WORLD), 16) + half  # symm_at loses alignment
        tl.store(peer + rank * slot + offs, acc, mask=mask)
    # Every rank's signal, this rank's own included, so that the waits below are uniform; they are
    # ordinary (not predicated, hence not pure) waits, which the compiler keeps after the notifies.
    for i in tl.static_range(WORLD):
        dl.notify(signals + rank * signal_region + tile, (rank + i) % WORLD, epoch, "set", "intra_node")
    total = tl.zeros((BM, BN), tl.float32)
    if WORLD <= 2:
        # Unrolled: at two ranks the loop below made ptxas spill more (28 against 4 bytes a thread
        # for the 128x128 tile, 64 against 32 for skinny_n128).
        for r in tl.static_range(WORLD):
            total = _add_rank_partial(total, acc, partials, slot, offs, mask, signals, signal_region, tile, rank, r,
                                      epoch)
    else:
        # A loop, as in sum_own_tile: unrolled, the partials of several ranks stayed live and ptxas
        # spilled ~3 KB a thread at 8 ranks.
        for r in tl.range(0, WORLD, num_stages=1, loop_unroll_factor=1):
            total = _add_rank_partial(total, acc, partials, slot, offs, mask, signals, signal_region, tile, rank, r,
                                      epoch)
    tl.store(out + offs, total.to(out.dtype.element_ty), mask=mask)


@triton.jit
def _add_rank_partial(total, acc, partials, slot, offs, mask, signals, signal_region, tile, rank, r, epoch):
    """``total`` plus rank ``r``'s partial of this tile (``acc`` itself for this rank), after its signal."""
    token = dl.wait(signals + r * signal_region + tile, 1, "sys", "acquire", epoch)
    theirs = tl.load(dl.consume_token(partials + r * slot + offs, token), mask=mask & (r != rank))
    return total + tl.where(r == rank, acc, theirs)
