"""One contiguous chunk of the data per program, for the kernels that move a program's share to
another node in one NVSHMEM put (the ``"2d"`` methods): program ``p`` owns elements
``[p * chunk, (p + 1) * chunk)``, ``chunk`` a multiple of ``BLOCK``, the same on every rank."""

import triton
import triton.language as tl

from .tiles import copy_tile
from .host_math import cdiv


def chunk_and_grid(n: int, max_programs: int, block: int) -> tuple[int, int]:
    """``(chunk, programs)`` for ``n`` elements: at most ``max_programs`` programs, each a
    contiguous chunk of whole ``block`` tiles (the last one ends at ``n``); the same on every
    rank, since ``n`` is."""
    tiles = cdiv(n, block)
    chunk = cdiv(tiles, max(1, min(tiles, max_programs))) * block
    return chunk, cdiv(n, chunk)


@triton.jit
def program_chunk(n, chunk, BLOCK: tl.constexpr):
    """``(start, end, first, last)``: this program's elements ``[start, end)`` of ``n`` and their
    tiles ``[first, last)`` (int64)."""
    start = tl.program_id(0).to(tl.int64) * chunk
    end = tl.minimum(start + chunk, n.to(tl.int64))
    return start, end, start // BLOCK, tl.cdiv(end, BLOCK)


@triton.jit
def copy_chunk(dst, src, first, last, end, BLOCK: tl.constexpr):
    """``dst[i] = src[i]`` for the chunk's tiles ``[first, last)`` (only the one straddling
    ``end`` masked)."""
    lanes = tl.arange(0, BLOCK)
    for t in range(first, last):
        offs = t * BLOCK + lanes
        if (t + 1) * BLOCK > end:
            copy_tile(dst + offs, src + offs, offs, end, True)
        else:
            copy_tile(dst + offs, src + offs, offs, end, False)
