"""Tile bodies shared by the communication kernels: loads, stores and copies of one tile of
pointers, masked only where the tile straddles the end of the data."""

import triton
import triton.language as tl

# Masks on an unspecialised ``n`` defeat vectorisation (Triton cannot prove a
# vector's lanes share the mask), so whole tiles take the unmasked path (MASKED=False) and only
# the tile that straddles ``n`` is masked.


@triton.jit
def load_tile(ptrs, idx, n, MASKED: tl.constexpr):
    if MASKED:
        return tl.load(ptrs, mask=idx < n)
    else:
        return tl.load(ptrs)


@triton.jit
def store_tile(ptrs, value, idx, n, MASKED: tl.constexpr):
    if MASKED:
        tl.store(ptrs, value, mask=idx < n)
    else:
        tl.store(ptrs, value)


@triton.jit
def copy_tile(dst, src, idx, n, MASKED: tl.constexpr):
    """``dst[i] = src[i]`` for the tile's pointers; ``idx`` (element indices) < ``n`` when masked."""
    store_tile(dst, load_tile(src, idx, n, MASKED), idx, n, MASKED)
