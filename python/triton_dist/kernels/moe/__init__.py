"""Mixture-of-experts kernels: expert-parallel AllToAll (dispatch and combine, low-latency
protocol) and its routing layout."""

from .alltoall import ep_combine_kernel, ep_dispatch_kernel
from .ep_context import EPContext, EPDispatch, EPHandle
from .layout import ep_layout_kernel

__all__ = ["EPContext", "EPDispatch", "EPHandle", "ep_combine_kernel", "ep_dispatch_kernel", "ep_layout_kernel"]
