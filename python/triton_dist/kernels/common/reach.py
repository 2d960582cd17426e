"""Which ranks' memory this process can map, and the refusal of a method that needs more.

Every method but the ``"2d"`` family loads and stores in other ranks' memory (``dl.symm_at`` in
its kernels, copy-engine copies through :func:`~triton_dist.peer_tensor`), which works only for
ranks whose symmetric heap NVSHMEM mapped into this process: those on this host (one NVLink
domain). Ranks on other hosts are reached by NVSHMEM's put and get only. Nodes declared on one
host (``TRITON_DIST_LOCAL_WORLD_SIZE``) stay mapped, so every method still runs there."""

from __future__ import annotations

from ... import runtime as _runtime
from ...symmetric import peer_tensor

_ON_ANOTHER_NODE = "is on another node"
"""The C++ heap's message for a rank whose memory is not mapped here (symmetric_heap.cc)."""


def unmapped_ranks() -> tuple[int, ...]:
    """The ranks whose symmetric memory this process cannot map (on other hosts); empty within a
    host. Ask once per context: it asks the heap about every rank."""
    core = _runtime._core()
    me, heap = core.rank(), core.heap_base()
    unmapped = []
    for pe in range(core.world_size()):
        if pe == me:
            continue
        try:
            core.peer_address(heap, pe)
        except RuntimeError as e:
            if _ON_ANOTHER_NODE not in str(e):
                raise
            unmapped.append(pe)
    return tuple(unmapped)


def mapped_peer_tensors(tensor, unmapped: tuple[int, ...]) -> dict:
    """Rank -> :func:`~triton_dist.peer_tensor` view of the symmetric ``tensor`` for every other
    rank not in ``unmapped``."""
    me, world = _runtime.rank(), _runtime.world_size()
    return {r: peer_tensor(tensor, r) for r in range(world) if r != me and r not in unmapped}


def check_reach(op: str, method: str, across_hosts: tuple[str, ...], unmapped: tuple[int, ...], rank: int) -> None:
    """Raise ValueError on ``rank`` if ``method`` (resolved, not ``"auto"``) needs the memory of the
    ``unmapped`` ranks, i.e. is not one of ``across_hosts``. Every rank of a world that spans
    hosts has unmapped ranks, so every rank raises alike."""
    if unmapped and method not in across_hosts:
        fix = (f"across hosts use {', '.join(repr(m) for m in across_hosts)} (or 'auto')" if across_hosts else
               "no method of this op crosses hosts yet")
        raise ValueError(f"triton_dist [rank {rank}] {op}: method {method!r} loads and stores in "
                         f"other ranks' memory, and ranks {list(unmapped)} are on other hosts; {fix}")
