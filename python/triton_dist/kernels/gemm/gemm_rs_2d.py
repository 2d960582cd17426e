"""GEMM+ReduceScatter across nodes (method ``"2d"`` of
:class:`~triton_dist.kernels.gemm.gemm_rs.GemmReduceScatterContext`): the GEMM of every row, then
the hierarchical ReduceScatter of :mod:`~triton_dist.kernels.collectives.reduce_scatter_2d`
(within nodes over NVLink, fp32 partials across by NVSHMEM put-with-signal). Not overlapped yet:
the ReduceScatter starts when the GEMM has finished (the in-node methods overlap tile by tile). The
partials travel in the input dtype, as with the other methods; the sum is taken in fp32.

Across several nodes a GemmReduceScatterContext makes the ReduceScatter context when it is created
(``"auto"`` takes ``"2d"`` there, and a first call may be captured in a CUDA graph); at one node
its first ``"2d"`` call does (collective; not during capture)."""

from __future__ import annotations

from ..collectives.reduce_scatter import ReduceScatterContext
from . import dense as _gemm


class GemmThenReduceScatter:
    """The ReduceScatter context of ``"2d"`` for up to ``max_m`` rows of ``n`` columns of ``dtype``
    (collective to create)."""

    def __init__(self, max_m: int, n: int, dtype):
        import torch

        self.reduce_scatter = ReduceScatterContext(max_m * n * dtype.itemsize, dtype)
        self._partials = torch.empty(max_m * n, dtype=dtype, device=self.reduce_scatter.calls.device)
        """This rank's GEMM of every row (``[M, n]`` in its first ``M * n`` elements)."""

    def run(self, a, b, out) -> None:
        """``out`` = this rank's rows of the sum over ranks of ``a @ b.T`` (``a [M, K]``, ``M`` a
        multiple of the world size; ``out [M / world, n]``), on the current stream."""
        partial = self._partials[:a.shape[0] * b.shape[0]].view(a.shape[0], b.shape[0])
        _gemm.gemm(a, b, out=partial)
        self.reduce_scatter.run(partial.view(-1), out.view(-1), "2d")
