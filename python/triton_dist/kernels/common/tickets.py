"""Tickets: the last of several programs to finish a piece of shared work publishes it.

Each program that finishes its part calls :func:`last_to_finish`: a CTA barrier (every thread's
stores of the part precede the count), then one acq_rel add on the piece's counter (GPU scope;
system scope when the parts are stores into a peer's memory).
The release half of each add carries that program's stores, the acquire half of the last add
collects every earlier one, so the program that sees the count complete may publish the whole
piece with a single release of its own (at system scope when a copy engine or a peer reads it).
It also resets the counter, so every piece starts the next call at zero.
"""

import triton
import triton.language as tl

from ... import language as dl


@triton.jit
def last_to_finish(tickets, index, parts, scope: tl.constexpr = tl.constexpr("gpu")):
    """Count one finished part of piece ``index`` (``tickets``: int32 or int64 counters, zero between
    calls); true in the one program whose part completed the ``parts`` of them. ``scope``:
    ``"sys"`` when the parts are stores to a peer GPU's memory, so that each program's own
    release already covers its stores at the scope of the peer that reads them."""
    dl.barrier()
    done = dl.atomic_add(tickets + index, 1, scope=scope, semantic="acq_rel")
    last = done == parts - 1
    if last:
        dl.atomic_xchg(tickets + index, 0, scope="gpu", semantic="relaxed")
    return last
