"""What ``method="auto"`` runs, for every overlapped GEMM: the only place that decides it. The rules
come from the benchmarks that time every method side by side (bench/gemm_rs.py, bench/gemm_ar.py on
2 x H200, CUDA-graph timing). The contexts validate and run a method; they ask this module which
one ``"auto"`` means."""

from __future__ import annotations

from .dense import SKINNY_MAX_M

GEMM_RS_METHOD = "fused_ce"
"""``gemm_rs``: the fused producer with the peers' partial tiles moved by the copy engines, at every
shape; bench/gemm_rs.py logs every method's time and records this one against NCCL and torch
SymmetricMemory in bench/results/h200-x2/gemm_rs.json."""


def ag_gemm_method(nodes: int) -> str:
    """``ag_gemm(method="auto")``'s producer for a world of ``nodes`` nodes: the copy engine's
    ``"ce_push"`` within one node (bench/results/h200-x2/ag_gemm.json), ``"sm_2d"`` across nodes
    (the one producer whose loads and stores stay within a node; not timed across nodes)."""
    return "sm_2d" if nodes > 1 else "ce_push"


def gemm_rs_method(m: int, nodes: int = 1) -> str:
    """``gemm_rs(method="auto")`` for ``m`` rows per rank in a world of ``nodes`` nodes: ``"2d"``
    across nodes (the one method whose loads and stores stay within a node), else
    :data:`GEMM_RS_METHOD`."""
    del m  # one answer at every shape measured so far (GEMM_RS_METHOD)
    return "2d" if nodes > 1 else GEMM_RS_METHOD


def gemm_ar_method(m: int, split_k_max_m: int) -> str:
    """``gemm_ar(method="auto")`` for ``m`` rows, where ``"split_k"`` takes at most ``split_k_max_m``:
    ``"output_tiles"`` where its 64-row skinny tile is more than half full (33-64 rows) or ``m`` is
    past ``split_k_max_m``, else ``"split_k"``. bench/gemm_ar.py's per-method times: split_k ahead at
    1 and 16 rows on the 8b, 70b and 405b shapes; output_tiles ahead at 64 rows (its tile full,
    split_k's partials four times the bytes); at 128 rows, where output_tiles has only 128x128
    tiles, split_k ahead on 70b and 405b and level on 8b."""
    return "output_tiles" if m > split_k_max_m or SKINNY_MAX_M // 2 < m <= SKINNY_MAX_M else "split_k"
