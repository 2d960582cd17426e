"""AllGather + grouped GEMM, the first GEMM of a tensor-parallel MoE layer: every rank holds a
sequence shard of the tokens (``x [m, K]``, the same ``m`` on every rank) and their routing
(``topk_idx [m, topk]``), and a tensor-parallel shard of every expert's weights (``w [E, N, K]``);
the result is, for every routed (token, k) pair of all ranks' tokens, ``x_token @ w[expert].T``,
in expert-major order (:class:`AGGroupGemmOutput`), the gather overlapped tile by tile.

Protocol. The tokens travel as in :class:`~triton_dist.kernels.AllGatherGemmContext` (whose
gather this context is: its producers, buffer, signals and call counter; rank ``r``'s rows land
in rows ``[r * m, (r + 1) * m)`` of ``gathered`` and ``ready[r] >= *calls`` says so). The routing
is small and travels first, with :func:`triton_dist.ops.all_gather` on the caller's stream; every
rank then sorts the same ``world * m * topk`` pairs the same way on the GPU (by expert, stably, so
by token within an expert: :meth:`AllGatherGroupGemmContext.layout`). The consumer
(:data:`ag_group_gemm_kernel`) is the grouped GEMM of :mod:`~triton_dist.kernels.moe.group_gemm`
with its A rows gathered through the sorted token index (``GATHERED``): before a tile's K loop it acquire-waits
(system scope) for ``ready[r]`` of every rank from the first to the last whose tokens the tile
holds (tokens ascend within an expert, so those ranks are a contiguous range), and its loads of
A go through ``dl.consume_token`` of the row pointers. W comes by TMA.

Why no stale rows are read and no rows are overwritten while read: the gather's own argument
(:mod:`~triton_dist.kernels.gemm.ag_gemm`); the consumer here reads ``gathered`` exactly as the
dense consumer does, only in another order, and the call ends with the same stream wait.
"""

from __future__ import annotations

from ... import timeline as _timeline
from ...distributed_jit import DistributedKernel
from ..gemm.ag_gemm import AllGatherGemmContext
from .ep_context import _describe
from .group_gemm import CONFIGS, grid_for, group_gemm_kernel, kernel_meta, launch, pick_config, weight_descriptor


ag_group_gemm_kernel = DistributedKernel(group_gemm_kernel)
""":func:`triton_dist.kernels.moe.group_gemm.group_gemm_kernel` launched with ``GATHERED=True``
(its wait links the language's support library)."""


class AGGroupGemmOutput:
    """What :func:`triton_dist.ops.ag_group_gemm` returns. ``out``: ``[world * m * topk, N]``, the
    routed (token, k) pairs in expert-major order, expert ``e``'s rows ``[offsets[e - 1],
    offsets[e])``; ``offsets``: int32 ``[E]`` cumulative ends (what
    :func:`~triton_dist.kernels.moe.group_gemm.group_gemm` takes for the next GEMM); ``token_index``
    and ``topk_slot``: int32 ``[world * m * topk]``, the gathered token (``r * m + i`` for rank
    ``r``'s token ``i``) and its routing slot behind each row. Pairs routed to ``-1`` sort last,
    past ``offsets[-1]``, and their rows are not written."""

    __slots__ = ("out", "offsets", "token_index", "topk_slot")

    def __init__(self, out, offsets, token_index, topk_slot):
        self.out, self.offsets, self.token_index, self.topk_slot = out, offsets, token_index, topk_slot


class AllGatherGroupGemmContext(AllGatherGemmContext):
    """The gather (an :class:`~triton_dist.kernels.AllGatherGemmContext` of ``max_m_per_rank``
    rows of ``k`` columns, the same ``method`` choices: its producers) and the grouped consumer for
    ``num_experts`` experts and ``topk`` experts per token. Collective to create and to call, as
    its base."""

    def __init__(self, max_m_per_rank: int, k: int, dtype, num_experts: int, topk: int, *,
                 method: str = "ce_push", push_programs: int | None = None, protocol_on_one_rank: bool = False,
                 producer: str | None = None):
        for name, v in (("num_experts", num_experts), ("topk", topk)):
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"triton_dist AllGatherGroupGemmContext: {name} must be a positive int, got {v!r}")
        if topk > num_experts:
            raise ValueError(f"triton_dist AllGatherGroupGemmContext: topk ({topk}) exceeds num_experts "
                             f"({num_experts})")
        self.num_experts, self.topk = num_experts, topk
        super().__init__(max_m_per_rank, k, dtype, method=method, push_programs=push_programs,
                         protocol_on_one_rank=protocol_on_one_rank, producer=producer)

    def preload(self) -> None:
        """The gather's kernels and the grouped consumer in each config (every int unspecialised)."""
        import torch

        w = torch.empty((1, 8, self.k), dtype=self.dtype, device=self.device)  # only the type and block matter
        index = torch.zeros(1, dtype=torch.int32, device=self.device)
        for config in CONFIGS:
            ag_group_gemm_kernel.preload(None, weight_descriptor(w, config), self.gathered, index, 2, 2, 0, 8, 8,
                                         grid=(1, ), **self._consumer_args(index, 2), **kernel_meta(config))
        self.preload_producer()

    def layout(self, topk_idx_all):
        """The expert-major order of the routed pairs of every rank (``topk_idx_all [world * m,
        topk]`` int32, ``-1`` for none): ``(offsets, token_index, topk_slot)`` on the GPU, without
        a host synchronisation, the same on every rank."""
        import torch

        flat = topk_idx_all.reshape(-1).long()
        key = torch.where((flat >= 0) & (flat < self.num_experts), flat, self.num_experts)  # -1 sorts last
        order = torch.argsort(key, stable=True)
        counts = torch.zeros(self.num_experts + 1, dtype=torch.int32, device=flat.device)
        counts.scatter_add_(0, key, torch.ones_like(key, dtype=torch.int32))
        offsets = torch.cumsum(counts[:self.num_experts], 0, dtype=torch.int32)
        return offsets, (order // self.topk).to(torch.int32), (order % self.topk).to(torch.int32)

    def run(self, x, topk_idx_all, w, out) -> AGGroupGemmOutput:
        """The grouped GEMM over the gathered tokens (checked by
        :func:`triton_dist.ops.ag_group_gemm`, not here): ``x [m, k]`` this rank's tokens,
        ``topk_idx_all`` every rank's routing (already gathered), ``w [E, N, k]``, ``out [world *
        m * topk, N]``."""
        offsets, token_index, topk_slot = self.layout(topk_idx_all)
        m, (experts, n, k) = x.shape[0], w.shape
        result = AGGroupGemmOutput(out, offsets, token_index, topk_slot)
        if m == 0 or n == 0:
            return result
        if not self._protocol:
            launch(x[token_index.long()], w, out, offsets, padded=False)
            return result
        stream = self.start_gather(x)
        rows = out.shape[0]
        config = pick_config(rows, experts, n, self.max_programs)
        ag_group_gemm_kernel[grid_for(rows, experts, n, config, self.max_programs)](
            None, weight_descriptor(w, config), out, offsets, experts, rows, 0, n, k,
            **self._consumer_args(token_index, m), **kernel_meta(config), **_timeline.kernel_args())
        self.finish_gather(stream)
        return result

    def _consumer_args(self, token_index, m_per_rank: int) -> dict:
        """The consumer's keywords beyond the tile config: the gather's buffer and signals."""
        return dict(GATHERED=True, gathered=self.gathered, token_index=token_index, signals=self.pad.signals,
                    calls=self.calls, m_per_rank=m_per_rank)

    def check_call(self, x, topk_idx, w, out) -> tuple[int, int]:
        """``(m, N)`` of a valid call of :func:`triton_dist.ops.ag_group_gemm`; raises naming the
        bad argument otherwise."""
        import torch

        op = "ag_group_gemm"
        if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.dtype != self.dtype or not x.is_contiguous() or \
                x.shape[1] != self.k or x.shape[0] > self.max_m or x.device != self.device:
            raise ValueError(f"triton_dist {op}: x must be a contiguous [m <= {self.max_m}, {self.k}] {self.dtype} "
                             f"tensor on {self.device} (the context's), got {_describe(x)}")
        m = x.shape[0]
        if not isinstance(topk_idx, torch.Tensor) or tuple(topk_idx.shape) != (m, self.topk) or \
                topk_idx.dtype not in (torch.int32, torch.int64) or topk_idx.device != self.device:
            raise ValueError(f"triton_dist {op}: topk_idx must be an int32 or int64 [{m}, {self.topk}] tensor on "
                             f"{self.device}, got {_describe(topk_idx)}")
        if not isinstance(w, torch.Tensor) or w.dim() != 3 or w.dtype != self.dtype or not w.is_contiguous() or \
                w.shape[0] != self.num_experts or w.shape[2] != self.k or w.shape[1] % 8 or w.device != self.device \
                or w.data_ptr() % 16:
            raise ValueError(f"triton_dist {op}: w must be a contiguous, 16-byte aligned [{self.num_experts}, N, "
                             f"{self.k}] {self.dtype} tensor on {self.device} with N a multiple of 8, got "
                             f"{_describe(w)}")
        shape = (self.world * m * self.topk, w.shape[1])
        if out is not None and (not isinstance(out, torch.Tensor) or tuple(out.shape) != shape or
                                out.dtype != self.dtype or not out.is_contiguous() or out.device != self.device or
                                out.data_ptr() % 16):
            raise ValueError(f"triton_dist {op}: out must be a contiguous, 16-byte aligned {list(shape)} {self.dtype} "
                             f"tensor on {self.device}, got {_describe(out)}")
        return m, w.shape[1]


