"""Timeline stamps: a program's ``%globaltimer`` readings, tagged, into a buffer that
:mod:`triton_dist.timeline` turns into a trace (one track per program and rank).

A kernel takes a ``timeline`` pointer (int64, ``programs * CAPACITY * 2`` slots: per program,
``CAPACITY`` records of ``(nanoseconds, tag)``) and a ``TIMELINE`` constexpr; every stamp sits under
``if TIMELINE:``, so a kernel launched without one compiles to the code it had before. A program
counts its own records (``cursor``, a register it threads through its stamps) and drops those past
``CAPACITY``: a long run keeps its first records, never writes past its region.

Tags: :data:`TILE`, :data:`WAIT`, :data:`WAITED`, :data:`COMPUTED`, :data:`DONE`, :data:`SIGNAL`
and user tags from :data:`USER` up. The host pairs them into spans (a tile from ``TILE`` to
``DONE``; its wait from ``WAIT`` to ``WAITED``; its K loop from ``WAITED`` (or ``TILE``) to
``COMPUTED``; its epilogue from ``COMPUTED`` to ``DONE``).
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language import core

TILE = tl.constexpr(1)
"""A tile starts (before any wait for its inputs)."""
WAIT = tl.constexpr(2)
"""The program starts waiting for a signal."""
WAITED = tl.constexpr(3)
"""The wait is satisfied."""
COMPUTED = tl.constexpr(4)
"""The tile's K loop is done (its epilogue starts)."""
DONE = tl.constexpr(5)
"""The tile's epilogue is done."""
SIGNAL = tl.constexpr(6)
"""The program notifies a peer."""
USER = tl.constexpr(16)
"""The first tag a user kernel may use for its own stamps."""

CAPACITY = tl.constexpr(512)
"""Records per program: 64 tiles of 5 stamps and some to spare at 8 KiB per program."""


@core.builtin
def globaltimer(_semantic=None):
    """The GPU's nanosecond clock (``%globaltimer``)."""
    return core.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.uint64, is_pure=False,
                                       pack=1, _semantic=_semantic)


@triton.jit
def stamp(timeline, cursor, tag):
    """Record ``(now, tag)`` as this program's next record; returns the advanced ``cursor`` (start
    at 0). No barrier: the stamp is when the program's instruction stream gets here, and a stamp
    must not change the schedule it records."""
    if cursor < CAPACITY:
        slot = timeline + (tl.program_id(0).to(tl.int64) * CAPACITY + cursor) * 2
        tl.store(slot, globaltimer().to(tl.int64))
        tl.store(slot + 1, tag)
    return cursor + 1
