"""Communication kernels built from :mod:`triton_dist.language`: each module holds a context
(symmetric buffers and signals, created collectively once and reused) and its Triton kernels.
Torch-facing entry points live in :mod:`triton_dist.ops`."""

from .allreduce import AllReduceContext, all_reduce_one_shot_kernel, all_reduce_two_shot_kernel

__all__ = ["AllReduceContext", "all_reduce_one_shot_kernel", "all_reduce_two_shot_kernel"]
