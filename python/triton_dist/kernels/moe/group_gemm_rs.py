"""Grouped GEMM + ReduceScatter, the second GEMM of a tensor-parallel MoE layer: every rank holds
the routed rows of every rank's tokens in expert-major order (``act [R, K]``, ``K`` its shard of
the experts' inner dimension, as :func:`triton_dist.ops.ag_group_gemm` returns them) and its shard
of every expert's second weights (``w [E, N, K]``); the result on each rank is its own ``m`` tokens'
outputs ``[m, N]``: for every token, the sum over its ``topk`` experts of the router weight times
the expert's output, summed over the ranks' shards. The top-k combine and the reduction across
ranks happen in the grouped GEMM's epilogue, while it runs.

Protocol (call ``e``: the context's device call counter, bumped first on the caller's stream, so a
CUDA graph replays with fresh values; half ``h = e % 2`` of the symmetric fp32 ``partial``, two
halves of ``[max_m, N]``, zeroed at creation):

1. The grouped GEMM (:func:`~triton_dist.kernels.moe.group_gemm.group_gemm_kernel` with
   ``SCATTER_ADD``) adds each weighted output row into row ``t % m`` of half ``h`` of ``partial``
   on rank ``t // m`` (relaxed fp32 reductions at system scope, fire and forget: the SMs never wait
   on the link); its last program to finish sets ``done[me] = e`` on every rank (release at system
   scope after a ticket that collects every program's reductions).
2. :func:`group_gemm_rs_finish_kernel`, after the GEMM on the same stream: acquire-waits
   ``done[r] >= e`` for every rank ``r``, rounds half ``h`` into ``out`` and zeroes it.

Why a half is never added into while it is read or before it is zero: rank ``A`` adds into ``B``'s
half ``h`` again only in call ``e + 2``, whose GEMM ``A`` starts after its finish of call ``e + 1``,
which waited for ``B``'s ``done`` of call ``e + 1``, which ``B`` sends after its GEMM of ``e + 1``,
which runs after ``B``'s finish of call ``e`` (stream order) that read and zeroed half ``h``. No
deadlock: the GEMM waits for nothing, and each finish waits only for GEMMs.

Summation order: the reductions of one output element arrive in whatever order the SMs of all
ranks produce them, so results may differ in the last bits from run to run (fp32 accumulation,
one rounding at the end).
"""

from __future__ import annotations

import triton.language as tl

from ... import language as dl
from ... import timeline as _timeline
from ...distributed_jit import DistributedKernel, jit
from ...signals import SignalPad
from ...symmetric import symm_zeros
from ..common import call_counter as _call_counter
from ..gemm import dense as _gemm
from ..gemm.context import OverlappedGemmContext
from .ep_context import _describe
from .group_gemm import grid_for, group_gemm_kernel, kernel_meta, pick_config
from ..common.host_math import cdiv

CONFIGS = ("skinny_n128", "small")
"""The grouped GEMM's configs this op runs with: not ``"large"``, whose 128x256 fp32 tile spilled
380 bytes a thread in the weighted scatter-add epilogue (sm_90 compile, tests/cpu); where the
grouped GEMM would pick it, this op takes ``"small"``."""

FINISH_BLOCK = 2048
"""Elements per tile of :func:`group_gemm_rs_finish_kernel`."""

group_gemm_rs_kernel = DistributedKernel(group_gemm_kernel)
""":func:`triton_dist.kernels.moe.group_gemm.group_gemm_kernel` launched with ``SCATTER_ADD=True``."""


@jit(do_not_specialize=["numel", "half_elems"])
def group_gemm_rs_finish_kernel(partial, out, done, calls, numel, half_elems, WORLD: tl.constexpr,
                                BLOCK: tl.constexpr):
    """Step 2 of the module notes: wait for every rank's ``done``, then ``out = half`` of ``partial``
    (``numel`` fp32 elements) in ``out``'s dtype, and the half zeroed."""
    epoch = tl.load(calls)
    half = (epoch % 2).to(tl.int64) * ((half_elems // 8) * 8)  # == half_elems, a multiple of 8
    token = dl.wait(done, WORLD, "sys", "acquire", epoch)
    src = dl.consume_token(partial, token) + half
    for start in range(tl.program_id(0) * BLOCK, numel, tl.num_programs(0) * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < numel
        tl.store(out + offs, tl.load(src + offs, mask=mask).to(out.dtype.element_ty), mask=mask)
        # The zeros depend on no loaded value, so Triton lays them out over the threads unlike the
        # loads (4 elements a thread against 8): without the barrier another thread's zeros could
        # land before an element is read (seen on H200: whole 512-element runs of the output read
        # as 0 once a finish block took a few microseconds).
        dl.barrier()
        tl.store(src + offs, tl.zeros((BLOCK, ), tl.float32), mask=mask)


class GroupGemmReduceScatterContext(OverlappedGemmContext):
    """Buffers, signals and loaded kernels for grouped GEMM + ReduceScatter of up to
    ``max_m_per_rank`` tokens per rank, ``n`` output columns, ``num_experts`` experts, ``topk``
    experts per token, ``dtype`` bfloat16 or float16 (the weights' and the output's; accumulation
    and the exchange are fp32). Collective to create (symmetric ``2 * max_m_per_rank * n`` fp32
    and ``world`` signals; ends with a barrier) and to call."""

    def __init__(self, max_m_per_rank: int, n: int, dtype, num_experts: int, topk: int):
        op = "GroupGemmReduceScatterContext"
        import torch

        # The protocol runs on one rank too: the GEMM adds into the fp32 partial either way.
        super().__init__(op, dtype, aligned="n", protocol_on_one_rank=True, max_m_per_rank=max_m_per_rank, n=n)
        for name, v in (("num_experts", num_experts), ("topk", topk)):
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"triton_dist {op}: {name} must be a positive int, got {v!r}")
        if max_m_per_rank * n >= 2**31:
            raise ValueError(f"triton_dist {op}: max_m_per_rank * n = {max_m_per_rank * n} is too large (< 2**31)")
        self.max_m, self.n, self.num_experts, self.topk = max_m_per_rank, n, num_experts, topk
        self.half_elems = max_m_per_rank * n
        self.partial = symm_zeros((2 * self.half_elems, ), torch.float32)
        """Two halves of ``[max_m, n]`` fp32 sums that the ranks' GEMMs add into (module notes)."""
        self.done = SignalPad(self.world, owner="GroupGemmReduceScatterContext", regions=[("done", 0, self.world)])
        self.tickets = torch.zeros(1, dtype=torch.int32, device=self.device)
        self.ready()  # every rank's partial and signals are zero before any rank adds into them

    def preload(self) -> None:
        """Compile and load the GEMM in each config and the finish kernel (every int unspecialised)."""
        import torch

        _call_counter.preload(self.calls)
        a = torch.empty((8, 8), dtype=self.dtype, device=self.device)
        index = torch.zeros(1, dtype=torch.int32, device=self.device)
        weights = torch.zeros(1, dtype=torch.float32, device=self.device)
        for config in CONFIGS:
            a_desc, w_desc = _gemm.operand_descriptors(a, a, config)
            group_gemm_rs_kernel.preload(a_desc, w_desc, self.partial, index, 2, 2, 0, 8, 8, grid=(1, ),
                                         **self._args(index, index, weights, 2), **self._meta(config))
        group_gemm_rs_finish_kernel.preload(self.partial, a, self.done.signals, self.calls, 2, 2, grid=(1, ),
                                            **self._finish_meta())

    def _args(self, token_index, topk_slot, weights, m: int) -> dict:
        return dict(token_index=token_index, topk_slot=topk_slot, weights=weights, signals=self.done.signals,
                    calls=self.calls, m_per_rank=m, half_elems=self.half_elems, tickets=self.tickets,
                    WORLD=self.world)

    def _meta(self, config: str) -> dict:
        return kernel_meta(config, SCATTER_ADD=True, TOPK=self.topk)

    def _finish_meta(self) -> dict:
        return dict(WORLD=self.world, BLOCK=FINISH_BLOCK, num_warps=4)

    def check_call(self, act, w, offsets, token_index, topk_slot, weights, out) -> int:
        """``m`` (this rank's tokens) of a valid call of :func:`triton_dist.ops.group_gemm_rs`;
        raises naming the bad argument otherwise."""
        import torch

        op = "group_gemm_rs"
        if not isinstance(weights, torch.Tensor) or weights.dim() != 2 or weights.shape[1] != self.topk or \
                weights.shape[0] > self.max_m or weights.dtype != torch.float32 or weights.device != self.device:
            raise ValueError(f"triton_dist {op}: topk_weights must be a float32 [m <= {self.max_m}, {self.topk}] "
                             f"tensor on {self.device}, got {_describe(weights)}")
        m = weights.shape[0]
        rows = self.world * m * self.topk
        if not isinstance(w, torch.Tensor) or w.dim() != 3 or tuple(w.shape[:2]) != (self.num_experts, self.n) or \
                w.dtype != self.dtype or not w.is_contiguous() or w.shape[2] % 8 or not w.shape[2] or \
                w.device != self.device or w.data_ptr() % 16:
            raise ValueError(f"triton_dist {op}: w must be a contiguous, 16-byte aligned [{self.num_experts}, "
                             f"{self.n}, K] {self.dtype} tensor on {self.device} with K a positive multiple of 8, got "
                             f"{_describe(w)}")
        if not isinstance(act, torch.Tensor) or tuple(act.shape) != (rows, w.shape[2]) or act.dtype != self.dtype or \
                not act.is_contiguous() or act.device != self.device:
            raise ValueError(f"triton_dist {op}: act must be a contiguous [{rows}, {w.shape[2]}] {self.dtype} tensor "
                             f"(world * m * topk routed rows) on {self.device}, got {_describe(act)}")
        for name, t, shape in (("offsets", offsets, (self.num_experts, )), ("token_index", token_index, (rows, )),
                               ("topk_slot", topk_slot, (rows, ))):
            if not isinstance(t, torch.Tensor) or t.dtype != torch.int32 or tuple(t.shape) != shape or \
                    t.device != self.device or not t.is_contiguous():
                raise ValueError(f"triton_dist {op}: {name} must be a contiguous int32 {list(shape)} tensor on "
                                 f"{self.device} (the routing's layout from ops.ag_group_gemm), got {_describe(t)}")
        if out is not None and (not isinstance(out, torch.Tensor) or tuple(out.shape) != (m, self.n) or
                                out.dtype != self.dtype or not out.is_contiguous() or out.device != self.device):
            raise ValueError(f"triton_dist {op}: out must be a contiguous [{m}, {self.n}] {self.dtype} tensor on "
                             f"{self.device}, got {_describe(out)}")
        return m

    def run(self, act, w, offsets, token_index, topk_slot, weights_all, out, m: int) -> None:
        """The call (checked by :func:`triton_dist.ops.group_gemm_rs`): ``weights_all`` every rank's
        router weights, ``[world * m, topk]`` fp32."""
        experts, n, k = w.shape
        rows = act.shape[0]
        _call_counter.bump(self.calls)
        sms = self.num_sms  # every rank's smallest
        config = pick_config(rows, experts, n, sms)
        config = config if config in CONFIGS else "small"
        a_desc, w_desc = _gemm.operand_descriptors(_gemm.aligned_for_tma(act), w.reshape(experts * n, k), config)
        # The GEMM waits for nothing: any grid is safe; every program counts itself on the ticket.
        group_gemm_rs_kernel[grid_for(rows, experts, n, config, sms)](
            a_desc, w_desc, self.partial, offsets, experts, rows, 0, n, k,
            **self._args(token_index, topk_slot, weights_all, m), **self._meta(config), **_timeline.kernel_args())
        numel = m * n
        group_gemm_rs_finish_kernel[(max(1, min(cdiv(numel, FINISH_BLOCK), sms)), )](
            self.partial, out, self.done.signals, self.calls, numel, self.half_elems, **self._finish_meta())

