"""Every rank calls a collective with the same arguments: a check to switch on while debugging.

A rank that calls an op with another shape, dtype or method than its peers gets no error from the
op itself (each rank checks only its own arguments): it waits for signals of a call its peers
never make, until the wait times out, or it reads their buffers as if they held its layout and
returns wrong data. With ``check_collective_calls`` (``TRITON_DIST_CHECK_COLLECTIVE_CALLS=1``)
every op first gathers each rank's call signature through the host process group and raises, on
every rank alike, naming the ranks whose call differs. It costs a host collective per call, so
it is off by default.
"""

from __future__ import annotations

from . import config as _config
from . import runtime as _runtime


def describe(value):
    """What of an argument must agree across ranks: a tensor's shape and dtype, else the value."""
    shape = getattr(value, "shape", None)
    if shape is not None and hasattr(value, "dtype"):
        return (tuple(shape), str(value.dtype).replace("torch.", ""))
    return value


def differing(signatures: list) -> list[int]:
    """The ranks whose signature differs from rank 0's."""
    return [r for r, s in enumerate(signatures) if s != signatures[0]]


def check(op: str, *, rows_may_differ: tuple[str, ...] = (), **arguments) -> None:
    """With ``check_collective_calls`` on: raise ValueError on every rank if any rank calls ``op``
    with other ``arguments`` (described by :func:`describe`) than rank 0. Collective then. The
    tensors named in ``rows_may_differ`` are compared without their first dimension (token counts
    that ranks may choose freely)."""
    if not _config.get().check_collective_calls:
        return
    import torch.distributed as dist

    mine = {name: describe(value) for name, value in arguments.items()}
    for name in rows_may_differ:
        shape, dtype = mine[name] if isinstance(mine[name], tuple) else ((), mine[name])
        mine[name] = (shape[1:], dtype)
    every = [None] * _runtime.world_size()
    dist.all_gather_object(every, mine, group=_runtime.process_group())
    odd = differing(every)
    if odd:
        shown = "; ".join(f"rank {r}: {every[r]}" for r in [0] + odd[:3])
        raise ValueError(f"triton_dist {op}: the ranks called it with different arguments ({shown}); every rank "
                         f"must make the same calls with the same shapes, dtypes and methods")
