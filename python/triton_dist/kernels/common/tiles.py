"""Tile bodies shared by the communication kernels: loads, stores and copies of one tile of
pointers, masked only where the tile straddles the end of the data."""

import triton
import triton.language as tl

# Masks on an unspecialised ``n`` defeat vectorisation (Triton cannot prove a
# vector's lanes share the mask), so whole tiles take the unmasked path (MASKED=False) and only
# the tile that straddles ``n`` is masked.


@triton.jit
def load_tile(ptrs, idx, n, MASKED: tl.constexpr):
    """Load through ``ptrs``, masked to ``idx < n`` only when ``MASKED``."""
    if MASKED:
        return tl.load(ptrs, mask=idx < n)
    else:
        return tl.load(ptrs)


@triton.jit
def store_tile(ptrs, value, idx, n, MASKED: tl.constexpr):
    """Store ``value`` through ``ptrs``, masked to ``idx < n`` only when ``MASKED``."""
    if MASKED:
        tl.store(ptrs, value, mask=idx < n)
    else:
        tl.store(ptrs, value)


@triton.jit
def copy_tile(dst, src, idx, n, MASKED: tl.constexpr):
    """``dst[i] = src[i]`` for the tile's pointers; ``idx`` (element indices) < ``n`` when masked."""
    store_tile(dst, load_tile(src, idx, n, MASKED), idx, n, MASKED)


@triton.jit
def program_share(BLOCK: tl.constexpr):
    """``(pid, grid, lanes)``: this program, the grid's size and a tile's element offsets
    ``0 .. BLOCK``, for a kernel whose program ``pid`` takes tiles ``pid, pid + grid, ...``."""
    return tl.program_id(0), tl.num_programs(0), tl.arange(0, BLOCK)


@triton.jit
def each_tile(tile_fn: tl.constexpr, args, start, stop, step, n, WORLD: tl.constexpr, BLOCK: tl.constexpr):
    """``tile_fn(args, offs, n, WORLD, MASKED)`` for tiles ``start, start + step, ... < stop`` of
    ``BLOCK`` elements (``offs``: the tile's int64 element indices): ``MASKED=False`` for whole
    tiles, so that they compile without predicates, True for the one straddling ``n``. ``args``: a
    tuple the tile function unpacks (Triton tuples drop constexpr-ness, hence ``WORLD`` apart)."""
    lanes = tl.arange(0, BLOCK)
    for t in range(start, stop, step):
        offs = t.to(tl.int64) * BLOCK + lanes
        if (t.to(tl.int64) + 1) * BLOCK <= n:
            tile_fn(args, offs, n, WORLD, False)
        else:
            tile_fn(args, offs, n, WORLD, True)


@triton.jit
def copy_program_tiles(dst, src, n, tiles, BLOCK: tl.constexpr):
    """``dst[i] = src[i]`` for ``i < n`` over this program's share of ``tiles`` ``BLOCK``-element
    tiles (tiles ``pid, pid + grid, ...``; whole tiles unmasked, only the one straddling ``n``
    masked)."""
    copy_share_tiles(dst, src, n, tiles, tl.program_id(0), BLOCK)


@triton.jit
def copy_share_tiles(dst, src, n, tiles, share, BLOCK: tl.constexpr):
    """:func:`copy_program_tiles` of share ``share`` of the grid's (tiles ``share, share + grid,
    ...``), whichever program runs it (:mod:`~triton_dist.kernels.common.claims`)."""
    each_tile(_copy_offsets, (dst, src), share, tiles, tl.num_programs(0), n, 1, BLOCK)


@triton.jit
def _copy_offsets(args, offs, n, WORLD: tl.constexpr, MASKED: tl.constexpr):
    dst, src = args
    copy_tile(dst + offs, src + offs, offs, n, MASKED)
