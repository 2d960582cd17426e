"""Communication kernels built from :mod:`triton_dist.language`: each module holds a context
(symmetric buffers and signals, created collectively once and reused) and its Triton kernels.
Torch-facing entry points live in :mod:`triton_dist.ops`."""

from .allgather import AllGatherContext
from .allgather_gemm import AllGatherGemmContext, ag_gemm_consumer_kernel, ag_gemm_signal_kernel
from .allreduce import AllReduceContext, ll_reduce_kernel, all_reduce_one_shot_kernel, all_reduce_two_shot_kernel
from .context import CollectiveContext
from .gemm import gemm_kernel  # the host wrapper: triton_dist.kernels.gemm.gemm
from .reduce_scatter import ReduceScatterContext, reduce_scatter_push_kernel, reduce_scatter_ring_kernel

__all__ = ["AllGatherContext", "AllGatherGemmContext", "ag_gemm_consumer_kernel", "ag_gemm_signal_kernel",
           "gemm_kernel", "AllReduceContext", "CollectiveContext", "ReduceScatterContext",
           "ll_reduce_kernel", "all_reduce_one_shot_kernel", "all_reduce_two_shot_kernel",
           "reduce_scatter_push_kernel", "reduce_scatter_ring_kernel"]
from .gemm_reduce_scatter import GemmReduceScatterContext, gemm_rs_producer_kernel, gemm_rs_reduce_kernel  # noqa: E402

__all__ += ["GemmReduceScatterContext", "gemm_rs_producer_kernel", "gemm_rs_reduce_kernel"]
from .gemm_all_reduce import GemmAllReduceContext, gemm_ar_kernel  # noqa: E402

__all__ += ["GemmAllReduceContext", "gemm_ar_kernel"]
from .moe import EPContext, EPDispatch, EPHandle  # noqa: E402

__all__ += ["EPContext", "EPDispatch", "EPHandle"]
