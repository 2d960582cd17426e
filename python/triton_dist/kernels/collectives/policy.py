"""What ``method="auto"`` runs, for every collective: the only place that decides it. Each threshold
cites the result file it was read from (measured on 2 x H200, CUDA-graph timing); a threshold
beyond two GPUs is scaled by the bytes each method moves, not measured. The contexts validate and
run a method; they ask this module which one ``"auto"`` means."""

from __future__ import annotations

ALL_GATHER_LL_MAX_BYTES = 64 << 10
"""``all_gather``: ``"ll"`` up to this many bytes per rank (all of ``AllGatherContext``'s LL range;
bench/results/h200-x2/allgather.json has ll ahead of sm_push at 8 and 32 KiB)."""

ALL_GATHER_SM_MAX_BYTES = 32 << 20
"""``all_gather``: ``"sm_push"`` up to this many bytes per rank, a copy-engine method above
(bench/results/h200-x2/allgather.json: sm_push ahead up to 32 MiB, ce_push from 128 MiB)."""

ALL_GATHER_CE_CHUNKED = False
"""``all_gather`` above :data:`ALL_GATHER_SM_MAX_BYTES` with a non-symmetric ``out``: ``"ce_chunked"``
(True) or ``"ce_push"`` (False). False: bench/results/h200-x2/allgather.json has ce_chunked ahead of
ce_push at 8 and 128 MiB per rank and behind at 32 and 256 MiB."""

ALL_GATHER_ZERO_COPY = False
"""``all_gather`` above :data:`ALL_GATHER_SM_MAX_BYTES` with a symmetric ``out``: ``"ce_zero_copy"``
(True) or as for a plain ``out`` (False). False although the zero-copy methods are the fastest
there (bench/results/h200-x2/allgather.json): ``auto`` would decide from the calling rank's ``out``
alone, and ranks passing different kinds of ``out`` would pick different protocols and wait for
each other. Ask for ``method="sm_zero_copy"`` explicitly."""

ALL_REDUCE_LL_MAX_BYTES = 32 << 10
"""``all_reduce``: ``"ll"`` up to this many bytes per rank (capped by the context's LL range):
bench/results/h200-x2/allreduce.json has ll ahead of one-shot at 8 and 32 KiB; 32-64 KiB not
measured."""

ALL_REDUCE_ONE_SHOT_MAX_BYTES = 16 << 20
"""``all_reduce``: one-shot up to this many bytes (on two ranks), two-shot above.
bench/results/h200-x2/allreduce.json: one-shot ahead up to 512 KiB, the two trading places at 2 and
8 MiB (inside the run-to-run spread), two-shot ahead at 32 MiB since it reads its own shard in
place; 16 MiB lies between the tie and the loss. One-shot moves ``w / 2`` times the bytes of
two-shot on ``w`` ranks, so the threshold is scaled by ``2 / w``."""

ALL_REDUCE_CE_TWO_SHOT_MIN_BYTES = 512 << 20
"""``all_reduce`` on two ranks: ``"ce_two_shot"`` (copy engines; its transfers leave the SMs to
concurrent kernels) from this many bytes. bench/results/h200-x2/allreduce.json: behind or level
with two-shot at 256 MiB, ahead at 1 GiB; 512 MiB not measured. Not above two ranks: each call
queues ``5 (w - 1)`` copy-stream operations per chunk from Python, not measured."""

REDUCE_SCATTER_METHOD = "push"
"""``reduce_scatter``: push at every size. Every machine measured so far is a full NVLink mesh,
where push moves the fewest bytes in the fewest dependent steps; ``"ll"`` was ahead by less than the
run-to-run spread up to 128 KiB (bench/results/h200-x2/reduce_scatter.json), so it is not chosen."""


def all_gather_method(nbytes: int, ll_max_bytes: int, symmetric_out: bool = False, nodes: int = 1) -> str:
    """``all_gather(method="auto")`` for ``nbytes`` per rank, with a context whose ``"ll"`` takes up
    to ``ll_max_bytes``; ``symmetric_out``: every rank's ``out`` is symmetric. A world of several
    ``nodes`` takes ``"ll_2d"`` (small inputs) or ``"2d"``, the methods whose loads and stores stay
    within a node."""
    small = nbytes <= min(ALL_GATHER_LL_MAX_BYTES, ll_max_bytes)
    if nodes > 1:
        return "ll_2d" if small else "2d"
    if small:
        return "ll"
    if nbytes <= ALL_GATHER_SM_MAX_BYTES:
        return "sm_push"
    if symmetric_out and ALL_GATHER_ZERO_COPY:
        return "ce_zero_copy"
    return "ce_chunked" if ALL_GATHER_CE_CHUNKED else "ce_push"


def all_reduce_method(nbytes: int, world: int, ll_max_bytes: int, nodes: int = 1) -> str:
    """``all_reduce(method="auto")`` for ``nbytes`` per rank on ``world`` ranks in ``nodes`` nodes,
    with a context whose ``"ll"`` takes up to ``ll_max_bytes``: ``"2d"`` across nodes (the one
    method whose loads and stores stay within a node)."""
    if nodes > 1:
        return "2d"
    if nbytes <= min(ALL_REDUCE_LL_MAX_BYTES, ll_max_bytes):
        return "ll"
    if nbytes <= ALL_REDUCE_ONE_SHOT_MAX_BYTES * 2 // max(2, world):
        return "one_shot"
    if world == 2 and nbytes >= ALL_REDUCE_CE_TWO_SHOT_MIN_BYTES:
        return "ce_two_shot"
    return "two_shot"


def reduce_scatter_method(nbytes: int, world: int, nodes: int = 1) -> str:
    """``reduce_scatter(method="auto")`` for ``nbytes`` of input per rank on ``world`` ranks in
    ``nodes`` nodes: ``"2d"`` across nodes (the one method whose loads and stores stay within a
    node), else :data:`REDUCE_SCATTER_METHOD`."""
    del nbytes, world  # one answer on every single-node machine measured so far
    return "2d" if nodes > 1 else REDUCE_SCATTER_METHOD
