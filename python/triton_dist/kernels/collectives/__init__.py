"""Collectives on symmetric memory: AllGather, AllReduce and ReduceScatter, each a context (created
collectively once, reused) and its kernels; :mod:`.policy` decides every ``method="auto"``."""

from .allgather import AllGatherContext
from .allreduce import AllReduceContext, all_reduce_one_shot_kernel, all_reduce_two_shot_kernel, ll_reduce_kernel
from .reduce_scatter import ReduceScatterContext, reduce_scatter_push_kernel, reduce_scatter_ring_kernel

__all__ = ["AllGatherContext", "AllReduceContext", "ReduceScatterContext", "all_reduce_one_shot_kernel",
           "all_reduce_two_shot_kernel", "ll_reduce_kernel", "reduce_scatter_push_kernel",
           "reduce_scatter_ring_kernel"]
