"""Mixture-of-experts kernels: expert-parallel AllToAll (dispatch and combine, low-latency
protocol), its routing layout, the grouped GEMM of the experts, and AllGather + grouped GEMM
and grouped GEMM + ReduceScatter (tensor parallelism)."""

from .ag_group_gemm import AGGroupGemmOutput, AllGatherGroupGemmContext, ag_group_gemm_kernel
from .alltoall import ep_combine_kernel, ep_dispatch_kernel
from .ep_context import EPContext, EPDispatch, EPHandle
from .group_gemm import group_gemm_kernel  # host function: triton_dist.kernels.moe.group_gemm.group_gemm
from .group_gemm_rs import GroupGemmReduceScatterContext, group_gemm_rs_finish_kernel
from .layout import ep_layout_kernel

__all__ = ["AGGroupGemmOutput", "AllGatherGroupGemmContext", "ag_group_gemm_kernel", "EPContext", "EPDispatch",
           "EPHandle", "ep_combine_kernel", "ep_dispatch_kernel", "ep_layout_kernel", "group_gemm_kernel",
           "GroupGemmReduceScatterContext", "group_gemm_rs_finish_kernel"]
