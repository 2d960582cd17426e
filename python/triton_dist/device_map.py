"""The host side of ``tdist/device.cuh``: the ``SymmetricMap`` a CUDA C++ kernel takes by value.

::

    from triton_dist.device_map import symmetric_map_bytes
    lib.my_launcher(..., symmetric_map_bytes(), stream)   # the launcher memcpy's it into a
                                                           # tdist::device::SymmetricMap argument

``base[pe]`` is where rank ``pe``'s symmetric heap is mapped in this process (0 when ``pe`` is on
another node and cannot be reached with loads and stores); ``symm_at`` on the device translates
an address by ``base[pe] - base[rank]``.
"""

from __future__ import annotations

import ctypes

from .runtime import _core, _require_initialized

MAX_RANKS = 64
"""``tdist::device::kMaxRanks``: the most ranks a SymmetricMap describes."""


class SymmetricMap(ctypes.Structure):
    """Byte-for-byte ``tdist::device::SymmetricMap`` (520 bytes)."""

    _fields_ = [("base", ctypes.c_uint64 * MAX_RANKS), ("rank", ctypes.c_int32), ("world_size", ctypes.c_int32)]


assert ctypes.sizeof(SymmetricMap) == 8 * MAX_RANKS + 8


def symmetric_map() -> SymmetricMap:
    """This process's view of every rank's symmetric heap, as a ``SymmetricMap`` structure.

    Raises:
        RuntimeError: triton_dist is not initialised, or the world has more than 64 ranks.
    """
    _require_initialized("symmetric_map")
    core = _core()
    rank, world = core.rank(), core.world_size()
    if world > MAX_RANKS:
        raise RuntimeError(f"triton_dist [rank {rank}] symmetric_map: the world has {world} ranks; "
                           f"tdist::device::SymmetricMap holds at most {MAX_RANKS}")
    heap = core.heap_base()
    m = SymmetricMap()
    m.rank, m.world_size = rank, world
    for pe in range(world):
        if pe == rank:
            m.base[pe] = heap
            continue
        try:
            m.base[pe] = core.peer_address(heap, pe)
        except RuntimeError:  # on another node: reachable only through put/get
            m.base[pe] = 0
    return m


def symmetric_map_bytes() -> bytes:
    """:func:`symmetric_map` as the 520 bytes of a ``tdist::device::SymmetricMap``, to pass to a
    host launcher that copies them into the kernel argument."""
    return bytes(symmetric_map())
