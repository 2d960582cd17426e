"""AllReduce across nodes as ReduceScatter then AllGather, each within nodes and across (method
``"2d"`` of :class:`~triton_dist.kernels.collectives.allreduce.AllReduceContext`): the hierarchical
ReduceScatter of :mod:`~triton_dist.kernels.collectives.reduce_scatter_2d` leaves each rank the
sum of one shard, rounded once to the dtype, and the AllGather of
:mod:`~triton_dist.kernels.collectives.allgather_2d` gives every rank every shard: the same bits
on every rank. Inputs whose size the world does not divide are zero-padded to whole shards.

Across several nodes an AllReduceContext makes the two contexts when it is created (``"auto"``
takes ``"2d"`` there, and a first call may be captured in a CUDA graph); at one node its first
``"2d"`` call makes them (collective, like every call; not during capture), so contexts that never
take the method pay nothing. Their symmetric memory, for ``B`` bytes of input: the ReduceScatter's
staging ``2B``, fp32 inbox and partials (``8 (w - 1) / w`` and ``4 (nodes - 1) / w`` bytes per
element) and LL buffer; the AllGather's ``gathered`` ``2B`` and ``ce`` ``B`` (which this method
does not use) and LL buffer; and ordinary memory for a padded input and one shard
(``B (w + 1) / w``)."""

from __future__ import annotations

from ..common.context import MAX_NUMEL
from .allgather import AllGatherContext
from .reduce_scatter import ReduceScatterContext
from ..common.host_math import cdiv


class TwoLevelAllReduce:
    """The ReduceScatter and AllGather contexts of ``"2d"`` for inputs of up to ``max_numel``
    elements of ``dtype`` on ``world`` ranks, with the AllReduceContext's ``max_programs``
    (collective to create)."""

    def __init__(self, max_numel: int, dtype, world: int, max_programs: int):
        import torch

        self.world = world
        self.shard_numel = cdiv(max_numel, world)
        """Elements of the largest shard (the padded input is ``world`` of them)."""
        if world * self.shard_numel >= MAX_NUMEL:
            raise ValueError(f"triton_dist AllReduceContext: method '2d' pads {max_numel} elements to "
                             f"{world * self.shard_numel}, past the largest context ({MAX_NUMEL - 1} elements); "
                             f"make contexts of at most {(MAX_NUMEL - 1) // world * world} elements")
        self.reduce_scatter = ReduceScatterContext(world * self.shard_numel * dtype.itemsize, dtype,
                                                   max_programs=max_programs)
        self.all_gather = AllGatherContext(self.shard_numel * dtype.itemsize, dtype, max_programs=max_programs)
        device = self.all_gather.calls.device
        self._padded = torch.empty(world * self.shard_numel, dtype=dtype, device=device)
        """A padded input, then the gathered result (the ReduceScatter has read it by then: stream order)."""
        self._shard = torch.empty(self.shard_numel, dtype=dtype, device=device)

    def run(self, x, out) -> None:
        """``out = sum over ranks of x`` (1-D, contiguous, ``x.numel() <= max_numel``; ``out`` may
        be ``x``) on the current stream."""
        n = x.numel()
        m = cdiv(n, self.world)
        whole = n == self.world * m
        padded = x if whole else self._padded[:self.world * m]
        if not whole:
            padded[n:].zero_()
            padded[:n].copy_(x)
        shard = self._shard[:m]
        self.reduce_scatter.run(padded, shard, "2d")
        self.all_gather.run(shard, out if whole else padded, "2d")
        if not whole:
            out.copy_(padded[:n])
