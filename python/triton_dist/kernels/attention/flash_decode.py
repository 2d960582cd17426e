"""Distributed flash decoding: the KV cache of every sequence split along the sequence over the
ranks, each rank attending over its part, the partial results combined across ranks.

Each rank holds a contiguous part of every sequence's KV in its own paged cache, in rank order
(rank 0 the oldest tokens, the last rank the newest of every sequence, the ``q_tokens`` new ones
included, so the last rank's ``seq_lens`` are at least ``q_tokens``; each rank's ``seq_lens`` count
the tokens it holds, 0 allowed on the other ranks) and computes its partial output and LSE with
:func:`~triton_dist.kernels.attention.decode.paged_decode` (fp32 partials). Then one kernel,
:func:`flash_decode_combine_kernel`, on every rank:

1. stores this program's rows of the partial (``out`` and ``lse``) into slot ``me`` of every rank's
   symmetric ``parts``/``lses`` (``dl.symm_at``; the call's half, by epoch parity), then notifies
   signal ``(me, pid)`` on every rank with the call's epoch (release, system scope);
2. waits for signal ``(r, pid)`` of every rank ``r`` (acquire), so the same rows of every rank's
   partial are here (tile ``t`` is program ``t % grid``'s on every rank: the grid is the same
   everywhere);
3. combines them row by row: ``lse = logsumexp_r lse_r``, ``out = sum_r exp(lse_r - lse) out_r``
   (:func:`~triton_dist.kernels.attention.decode.combine_rows`, ranks in order 0, 1, ...: every rank
   computes the same bits), into ``out`` (the query dtype) and ``lse``.

A rank that holds no token of a sequence contributes ``lse = -inf``, weight 0. Buffers alternate
halves by the epoch's parity, and a program signals before it waits, so the argument of
:mod:`triton_dist.kernels.common.context` holds: a rank cannot write half ``e % 2`` again (call ``e + 2``)
before every rank finished reading it in call ``e``. No host synchronisation; capturable in a CUDA
graph with fixed maxima (the epoch is the context's device call counter).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ... import language as dl
from ...distributed_jit import jit
from ..common.context import CollectiveContext
from . import decode as _decode
from ..common.host_math import cdiv

ROWS_PER_TILE = 16
"""Output rows (``(batch, token, q_head)`` triples of ``head_dim`` values) a program moves at a time."""


@jit(do_not_specialize=["rows", "slot_rows", "parts_half", "lses_half", "max_programs"])
def flash_decode_combine_kernel(part_out, part_lse, parts, lses, signals, out, out_lse, rows, epoch_ptr, slot_rows,
                                parts_half, lses_half, WORLD: tl.constexpr, max_programs,
                                D: tl.constexpr, ROWS: tl.constexpr, WORLD_POW2: tl.constexpr):
    """The cross-rank combine (module notes). ``part_out``/``part_lse``: this rank's fp32 partial,
    ``rows`` rows of ``D``; ``parts``/``lses``: symmetric, two halves of ``parts_half``/``lses_half``
    elements, each ``WORLD`` slots of ``slot_rows`` rows; ``signals``: ``WORLD * max_programs`` of
    the context's pad."""
    epoch = tl.load(epoch_ptr)
    me = dl.rank()
    pid = tl.program_id(0)
    grid = tl.num_programs(0)
    half = (epoch % 2).to(tl.int64)
    slots = parts + half * parts_half
    slot_lses = lses + half * lses_half
    tiles = tl.cdiv(rows, ROWS)
    r_idx = tl.arange(0, ROWS)
    d = tl.arange(0, D)

    # 1. This program's rows of the partial into slot `me` of every rank.
    for tile in range(pid, tiles, grid):
        row = tile.to(tl.int64) * ROWS + r_idx
        ok = row < rows
        vals = tl.load(part_out + row[:, None] * D + d[None, :], mask=ok[:, None])
        lse = tl.load(part_lse + row, mask=ok)
        for i in tl.static_range(WORLD):
            peer = (me + i) % WORLD
            dst = tl.multiple_of(dl.symm_at(slots, peer), 16) + me.to(tl.int64) * slot_rows * D
            tl.store(dst + row[:, None] * D + d[None, :], vals, mask=ok[:, None])
            tl.store(dl.symm_at(slot_lses, peer) + me.to(tl.int64) * slot_rows + row, lse, mask=ok)
    for i in tl.static_range(WORLD):
        dl.notify(signals + me * max_programs + pid, (me + i) % WORLD, epoch, "set", "intra_node")

    # 2. The same rows from every rank.
    token = dl.wait(signals + pid, 1, "sys", "acquire", epoch)
    for r in tl.static_range(1, WORLD):
        token = token + dl.wait(signals + r * max_programs + pid, 1, "sys", "acquire", epoch)
    arrived = dl.consume_token(slots, token)
    arrived_lses = dl.consume_token(slot_lses, token)

    # 3. Combine, ranks in order.
    for tile in range(pid, tiles, grid):
        for j in range(ROWS):
            row = tile.to(tl.int64) * ROWS + j
            if row < rows:
                _decode.combine_rows(arrived, arrived_lses, out, out_lse, row, WORLD, slot_rows * D, slot_rows, D,
                                     WORLD_POW2)


class FlashDecodeContext(CollectiveContext):
    """Symmetric partial buffers and signals for distributed flash decoding of up to ``max_batch``
    sequences of up to ``max_q_tokens`` new tokens with ``q_heads`` query heads of ``head_dim`` (module
    notes). Collective to create (every rank, same arguments, same order as its other symmetric
    allocations); creating it compiles and loads the combine kernel. Call it on every rank, in
    the same order, with the same batch and token counts (the KV each rank holds may differ).
    Memory on the symmetric heap: ``2 * world * max_rows * (head_dim + 1)`` fp32 values, ``max_rows =
    max_batch * max_q_tokens * q_heads``."""

    def __init__(self, max_batch: int, max_q_tokens: int, q_heads: int, head_dim: int):
        import torch

        op = "FlashDecodeContext"
        for name, v in (("max_batch", max_batch), ("max_q_tokens", max_q_tokens), ("q_heads", q_heads)):
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"triton_dist {op}: {name} must be a positive int, got {v!r}")
        if head_dim not in _decode.HEAD_DIMS or max_q_tokens > _decode.MAX_Q_TOKENS:
            raise ValueError(f"triton_dist {op}: head_dim must be one of {_decode.HEAD_DIMS} and max_q_tokens at most "
                             f"{_decode.MAX_Q_TOKENS}, got {head_dim} and {max_q_tokens}")
        from ... import runtime

        world = runtime.world_size()
        self.max_rows = max_batch * max_q_tokens * q_heads
        self.max_batch, self.max_q_tokens, self.q_heads, self.head_dim = max_batch, max_q_tokens, q_heads, head_dim
        super().__init__(op, torch.float32, world * self.max_rows * head_dim,
                         {"parts": world * self.max_rows * head_dim, "lses": world * self.max_rows}, world)
        self.ready()

    def preload(self) -> None:
        """Compile and load the combine kernel, for every output dtype a query may have, before any
        rank can spin in it (a variant first compiled at call time loads an NVSHMEM module while
        peers wait)."""
        import torch

        p = self.parts
        for dtype in _decode.DTYPES:
            out = torch.empty(ROWS_PER_TILE * self.head_dim, dtype=getattr(torch, dtype), device=p.device)
            flash_decode_combine_kernel.preload(p, p, p, p, self.pad.signals, out, p, 2, self.calls, 2, 2, 2,
                                                grid=(1, ), **self._meta())

    def _meta(self) -> dict:
        return dict(WORLD=self.world, max_programs=self.max_programs, D=self.head_dim, ROWS=ROWS_PER_TILE,
                    WORLD_POW2=triton.next_power_of_2(self.world), num_warps=4)

    def __call__(self, q, k_cache, v_cache, block_table, seq_lens, *, scale: float | None = None,
                 soft_cap: float | None = None, num_splits: int | None = None, out=None, lse=None,
                 check_table: bool | None = None):
        """``(out, lse)`` over every rank's part of the KV (module notes); arguments as
        :func:`~triton_dist.kernels.attention.decode.paged_decode`, with this rank's cache, table and
        lengths. ``out`` like ``q``, ``lse`` fp32 ``[batch, q_tokens, q_heads]``."""
        import torch

        op = "flash_decode"
        if q.dim() != 4 or q.shape[0] > self.max_batch or q.shape[1] > self.max_q_tokens or \
                q.shape[2] != self.q_heads or q.shape[3] != self.head_dim:
            raise ValueError(f"triton_dist {op}: q is {list(q.shape)}; this context takes [<= {self.max_batch}, <= "
                             f"{self.max_q_tokens}, {self.q_heads}, {self.head_dim}]: create a FlashDecodeContext "
                             "that fits")
        # The new tokens end the last rank's part: only there are they causal among themselves.
        part_out, part_lse = _decode.paged_decode(q, k_cache, v_cache, block_table, seq_lens, scale=scale,
                                                  soft_cap=soft_cap, num_splits=num_splits, check_table=check_table,
                                                  causal=self.rank == self.world - 1, _out_dtype=torch.float32)
        if out is None:
            out = torch.empty_like(q)
        if lse is None:
            lse = torch.empty(q.shape[:3], device=q.device, dtype=torch.float32)
        if out.shape != q.shape or out.dtype != q.dtype or not out.is_contiguous():
            raise ValueError(f"triton_dist {op}: out must be a contiguous {list(q.shape)} {q.dtype} tensor")
        if lse.shape != q.shape[:3] or lse.dtype != torch.float32 or not lse.is_contiguous():
            raise ValueError(f"triton_dist {op}: lse must be a contiguous {list(q.shape[:3])} float32 tensor")
        rows = q.shape[0] * q.shape[1] * q.shape[2]
        epoch_ptr = self.next_call()
        flash_decode_combine_kernel[self.grid(cdiv(rows, ROWS_PER_TILE))](
            part_out, part_lse, self.parts, self.lses, self.pad.signals, out, lse, rows, epoch_ptr, self.max_rows,
            self.halves["parts"], self.halves["lses"], **self._meta())
        return out, lse
