"""Kernel families built from :mod:`triton_dist.language`, one subpackage each: :mod:`.collectives`,
:mod:`.gemm`, :mod:`.moe`, :mod:`.attention`; what they share is in :mod:`.common`. A family's
contexts derive from a shared base (:class:`~triton_dist.kernels.common.context.CollectiveContext`,
or :class:`~triton_dist.kernels.gemm.context.OverlappedGemmContext` around the persistent GEMM), and
where an op has an ``"auto"`` choice its family's ``policy`` module decides it (collectives, gemm;
moe's grouped GEMM picks its tile config in ``group_gemm.pick_config``). Torch-facing entry points live
in :mod:`triton_dist.ops`; docs/adding_a_kernel_family.md shows how a new family fits in."""

from .collectives import (AllGatherContext, AllReduceContext, ReduceScatterContext, all_reduce_one_shot_kernel,
                          all_reduce_two_shot_kernel, ll_reduce_kernel, reduce_scatter_push_kernel,
                          reduce_scatter_ring_kernel)
from .common.context import CollectiveContext
from .gemm import (AllGatherGemmContext, GemmAllReduceContext, GemmReduceScatterContext, ag_gemm_consumer_kernel,
                   ag_gemm_signal_kernel, gemm_ar_kernel, gemm_kernel, gemm_rs_producer_kernel, gemm_rs_reduce_kernel)
from .moe import EPContext, EPDispatch, EPHandle

__all__ = ["AllGatherContext", "AllGatherGemmContext", "ag_gemm_consumer_kernel", "ag_gemm_signal_kernel",
           "gemm_kernel", "AllReduceContext", "CollectiveContext", "ReduceScatterContext",
           "ll_reduce_kernel", "all_reduce_one_shot_kernel", "all_reduce_two_shot_kernel",
           "reduce_scatter_push_kernel", "reduce_scatter_ring_kernel", "GemmReduceScatterContext",
           "gemm_rs_producer_kernel", "gemm_rs_reduce_kernel", "GemmAllReduceContext", "gemm_ar_kernel",
           "EPContext", "EPDispatch", "EPHandle"]
