"""What ``method="auto"`` runs, for every overlapped GEMM: the only place that decides it. The rules
come from the benchmarks that time every method side by side (bench/gemm_rs.py, bench/gemm_ar.py on
2 x H200, CUDA-graph timing) and, for eager calls, the host time each method takes to issue a call
(bench/host_overhead.py ``--methods``). The contexts validate and run a method; they ask this
module which one ``"auto"`` means."""

from __future__ import annotations

from .dense import SKINNY_MAX_M

EAGER_GEMM_TFLOPS = 600.0
"""The dense GEMM's rate in :func:`host_bound_eager`'s estimate of a call's GPU time:
bench/results/h200-x2/gemm_rs.json's GEMM ran 1024x28672x4096 at 613-645 TFLOPS (bf16, 2 x
H200); smaller GEMMs run slower, so the estimate errs towards host-bound."""

COPY_ENGINE_HOST_US = {"ag_gemm": 325.0, "gemm_rs": 355.0}
"""Host µs to issue one eager call of the copy-engine producer ``"auto"`` runs under a CUDA graph
(``ag_gemm``'s ``"ce_push"``, ``gemm_rs``'s ``"fused_ce"``): bench/host_overhead.py ``--methods``,
world 2 on one H100 under MPS, the higher of two runs on two machines of the same kind
(2026-12-07: 274.8 and 324.6 µs; 191.1 and 355.0 µs; a third run,
bench/results/h100-x2/host_overhead_shared_gemm_methods.json, 223.3 and 218.0),
against 52-65 for ``"sm_push_inline"`` when it was two launches (24.7 as one, the third run) and
27-39 for ``"fused"`` (one). The higher one, because the two mistakes cost
differently: taking the few-launch producer for a GEMM that would have hidden the host time costs
a few percent of its GPU time, taking the copy engine's for one that does not leaves the GPU
idle for the difference. A copy-engine call issues a launch, a copy or a stream-memory operation
per peer, and events; Python issues each. The rule must give every rank the same answer, so it
reads these constants, not a time measured in the process."""

GEMM_RS_METHOD = "fused_ce"
"""``gemm_rs``: the fused producer with the peers' partial tiles moved by the copy engines, at every
shape; bench/gemm_rs.py logs every method's time and records this one against NCCL and torch
SymmetricMemory in bench/results/h200-x2/gemm_rs.json."""


def host_bound_eager(op: str, flops: float, eager: bool) -> bool:
    """Whether an eager call (``eager``: not under CUDA graph capture) of ``op`` (``"ag_gemm"`` or
    ``"gemm_rs"``) whose GEMM does ``flops`` would wait on the host with the copy-engine producer:
    its estimated GPU time (:data:`EAGER_GEMM_TFLOPS`) below that producer's host time per call
    (:data:`COPY_ENGINE_HOST_US`). Eager calls issue one after another, so such a call costs its
    host time, and the producer of one launch is the faster one, though its GPU time is
    longer (``"fused"``: 1-6 % over ``"fused_ce"``, gemm_rs.json; ``"sm_push_inline"``: each
    program's push before its tiles instead of beside the GEMM, not yet timed on two GPUs). In a graph the host
    time is paid once, at capture."""
    return eager and flops / (EAGER_GEMM_TFLOPS * 1e6) < COPY_ENGINE_HOST_US[op]


def ag_gemm_method(nodes: int, flops: float = 0.0, eager: bool = False) -> str:
    """``ag_gemm(method="auto")``'s producer for a world of ``nodes`` nodes and a GEMM of ``flops``
    (all ranks' rows): ``"sm_2d"`` across nodes (the one producer whose loads and stores stay
    within a node; not timed across nodes); within one node ``"sm_push_inline"`` for an eager call
    that would wait on the host (:func:`host_bound_eager`), else the copy engine's ``"ce_push"``
    (bench/results/h200-x2/ag_gemm.json)."""
    if nodes > 1:
        return "sm_2d"
    return "sm_push_inline" if host_bound_eager("ag_gemm", flops, eager) else "ce_push"


def gemm_rs_method(m: int, nodes: int = 1, flops: float = 0.0, eager: bool = False) -> str:
    """``gemm_rs(method="auto")`` for ``m`` rows per rank in a world of ``nodes`` nodes and a GEMM of
    ``flops`` (this rank's ``a @ b.T``): ``"2d"`` across nodes (the one method whose loads and
    stores stay within a node); within one node ``"fused"`` for an eager call that would wait on
    the host (:func:`host_bound_eager`), else :data:`GEMM_RS_METHOD`."""
    del m  # one answer at every shape measured so far (GEMM_RS_METHOD)
    if nodes > 1:
        return "2d"
    return "fused" if host_bound_eager("gemm_rs", flops, eager) else GEMM_RS_METHOD


def gemm_ar_method(m: int, split_k_max_m: int) -> str:
    """``gemm_ar(method="auto")`` for ``m`` rows, where ``"split_k"`` takes at most ``split_k_max_m``:
    ``"output_tiles"`` where its 64-row skinny tile is more than half full (33-64 rows) or ``m`` is
    past ``split_k_max_m``, else ``"split_k"``. bench/gemm_ar.py's per-method times: split_k ahead at
    1 and 16 rows on the 8b, 70b and 405b shapes; output_tiles ahead at 64 rows (its tile full,
    split_k's partials four times the bytes); at 128 rows, where output_tiles has only 128x128
    tiles, split_k ahead on 70b and 405b and level on 8b."""
    return "output_tiles" if m > split_k_max_m or SKINNY_MAX_M // 2 < m <= SKINNY_MAX_M else "split_k"
