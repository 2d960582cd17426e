"""GEMMs: the persistent Hopper GEMM and its tile walk (:mod:`.dense`, :mod:`.tile`), the split-K GEMM
for decode-sized M (:mod:`.split_k`), its configs' autotuning (:mod:`.autotune`), and the overlapped
GEMMs built on the same tile loop: AllGather+GEMM (:mod:`.ag_gemm`), GEMM+ReduceScatter
(:mod:`.gemm_rs`) and GEMM+AllReduce (:mod:`.gemm_ar`); :mod:`.policy` decides every
``method="auto"``."""

from .dense import gemm, gemm_kernel
from .ag_gemm import AllGatherGemmContext, ag_gemm_consumer_kernel, ag_gemm_signal_kernel
from .gemm_ar import GemmAllReduceContext, gemm_ar_kernel
from .gemm_rs import GemmReduceScatterContext, gemm_rs_producer_kernel, gemm_rs_reduce_kernel

__all__ = ["gemm", "gemm_kernel", "AllGatherGemmContext", "ag_gemm_consumer_kernel", "ag_gemm_signal_kernel",
           "GemmAllReduceContext", "gemm_ar_kernel", "GemmReduceScatterContext", "gemm_rs_producer_kernel",
           "gemm_rs_reduce_kernel"]
