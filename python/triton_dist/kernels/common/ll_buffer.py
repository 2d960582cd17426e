"""The LL protocol's host side: the buffer an LL method receives into (:mod:`.ll_protocol` is
the device side), allocated zeroed and named for the wait-timeout report."""

from __future__ import annotations

import weakref

from .ll_protocol import LL_BLOCK
from .host_math import cdiv


def ll_buffer(owner: str, world: int, slot_bytes: int):
    """``(buffer, slot)``: a symmetric int64 buffer of two halves (epoch parity) of ``world`` slots
    of ``slot`` 8-byte words, enough for ``slot_bytes`` of payload per rank in whole ``LL_BLOCK``
    tiles, zeroed on the current stream (flags are never 0; the context's ``ready`` synchronises
    and barriers before a peer can write it).

    Receivers wait on these words, not on a signal pad, so a timed-out LL wait would report a bare
    address: the words are named here (``owner`` LL's buffer, ``half<h>.from_rank<r>[word]``)
    for as long as the buffer lives."""
    import torch

    from ...runtime import _core
    from ...symmetric import symm_empty

    slot = cdiv(cdiv(slot_bytes, 4), LL_BLOCK) * LL_BLOCK
    buffer = symm_empty((2 * world * slot, ), torch.int64)
    buffer.zero_()
    regions = [(f"half{h}.from_rank{r}", (h * world + r) * slot, slot) for h in range(2) for r in range(world)]
    core = _core()
    naming = core.name_signals(buffer.data_ptr(), buffer.numel(), 8, f"{owner} LL", regions)
    forget = weakref.finalize(buffer, core.forget_signals, buffer.data_ptr(), naming)
    # Not at interpreter exit: the report watcher's last look comes after, in a C atexit handler.
    forget.atexit = False
    return buffer, slot
