"""Mixture-of-experts kernels: expert-parallel AllToAll (dispatch and combine, low-latency
protocol), its routing layout, and the grouped GEMM of the experts."""

from .alltoall import ep_combine_kernel, ep_dispatch_kernel
from .ep_context import EPContext, EPDispatch, EPHandle
from .group_gemm import group_gemm_kernel  # host function: triton_dist.kernels.moe.group_gemm.group_gemm
from .layout import ep_layout_kernel

__all__ = ["EPContext", "EPDispatch", "EPHandle", "ep_combine_kernel", "ep_dispatch_kernel", "ep_layout_kernel",
           "group_gemm_kernel"]
