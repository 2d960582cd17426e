"""GEMM+AllReduce: ``out = sum over ranks r of A_r @ B_r^T`` on every rank, in one kernel, for
the small M of decoding (a row-parallel linear layer: ``K`` is each rank's shard of the
contraction, every rank needs the whole ``[M, N]`` sum).

One launch of the persistent GEMM of :mod:`triton_dist.kernels.gemm` with ``ALL_REDUCE``: each
program computes its tile, stores the fp32 tile into slot ``me`` of every peer's symmetric
``partials`` (``dl.symm_at``, stores over NVLink), signals every rank (its own included), waits
for the same tile from every rank, and sums the ``world`` fp32 partials in rank order ``0, 1,
...`` (its own from registers), rounding once into ``out``. Every rank therefore computes the
same bits: the replicas of a tensor-parallel model stay identical. There is no separate
all-reduce launch and no host synchronisation; at decode sizes that launch and its
synchronisation are most of the cost of ``matmul`` + ``all_reduce``.

Why fp32 partials: a rank's own partial is exact in registers, so for the ranks to agree they
must all add the same exact values; bf16 partials would differ from the sender's register copy.
The traffic is ``(world - 1) * M * N * 4`` bytes per rank, small at decode sizes.

Call ``e`` (the context's device call counter, bumped on the caller's stream before the launch,
so a CUDA graph replays with fresh values): the partials buffer has two halves, the call's is
``e % 2``; a rank writes half ``e % 2`` again in call ``e + 2``, after its call ``e + 1``, which
waited for every peer's tiles of call ``e + 1``, which each peer produced after its call ``e``
(stream order), the only reader of call ``e``'s half. Signals only grow (set to ``e``, waited
with ``>= e``); signal ``r * R + t`` (``R``: the context's fixed tiles per rank) is rank ``r``'s
tile ``t``, written before its signal, in the half of the signalled call.

No deadlock: a program signals its tile before it waits, tile ``t`` is program ``t % grid``'s on
every rank (the grid depends only on the shape and the SM count), and the grid is at most one
program per SM, so every program is resident. A waiting program waits for the program of the
same index on the other ranks, which reaches the tile after the same earlier tiles - never for a
program that waits for it. Another kernel that holds SMs on one GPU only delays the op; the wait
timeout (``Config.wait_timeout_ns``) turns a stuck peer into an error.
"""

from __future__ import annotations

import triton

from .. import runtime as _runtime
from ..distributed_jit import DistributedKernel
from ..signals import SignalPad
from ..symmetric import symm_empty
from . import gemm as _gemm

CONFIG = "small"
"""The GEMM config of calls with more than ``gemm.SKINNY_MAX_M`` rows (128x128 tiles): with 128x256
tiles the all-reduce epilogue (the accumulator, a peer's fp32 tile and the sum) spills about 1.3 KB
of registers per thread (ptxas, sm_90a). Calls with fewer rows take ``gemm.pick_skinny_config``'s
(64-row tiles that spread the read of B over every SM: decode shapes are bound by that read)."""

gemm_ar_kernel = DistributedKernel(_gemm.gemm_kernel)
""":func:`triton_dist.kernels.gemm.gemm_kernel` launched with ``ALL_REDUCE=True`` and the
language's libraries linked in."""


class GemmAllReduceContext:
    """Symmetric fp32 partials, signals and loaded kernels for GEMM+AllReduce of up to ``max_m`` rows
    and ``n`` columns, ``dtype`` bfloat16 or float16; any ``K``.

    Collective: every rank creates it with the same arguments, in the same order as its other
    symmetric allocations; creating it compiles and loads the kernel (each config of
    :attr:`configs`) and ends with a barrier. Symmetric memory: ``2 * world * max_m * n`` fp32
    elements plus ``world`` times :attr:`tiles_max` signals. Call with :meth:`run` (or
    :func:`triton_dist.ops.gemm_ar`); every rank makes the same calls in the same order with the
    same ``M`` and ``K``. Calls may be captured in a CUDA graph and replayed.

    ``protocol_on_one_rank``: with a single rank, still run the signalling kernel (stores, signal
    and wait on its own rank) instead of the plain GEMM, so that one GPU can test it.
    """

    def __init__(self, max_m: int, n: int, dtype, *, protocol_on_one_rank: bool = False):
        _runtime._require_initialized("GemmAllReduceContext")
        import torch

        op = "triton_dist GemmAllReduceContext"
        _gemm.check_context_args("GemmAllReduceContext", dtype, aligned="n", max_m=max_m, n=n)
        self.world = _runtime.world_size()
        self.rank = _runtime.rank()
        if 2 * self.world * max_m * n >= 2**31:
            raise ValueError(f"{op}: 2 * world * max_m * n = {2 * self.world * max_m * n} elements is too large "
                             f"(< 2**31); GEMM+AllReduce is meant for small M")
        self.max_m = max_m
        self.n = n
        self.dtype = dtype
        self.device = torch.device("cuda", torch.cuda.current_device())
        self.num_sms = _gemm.num_sms(self.device)
        # A config's tile count grows with M: the largest M of each config bounds its calls.
        largest = {min(max_m, _gemm.SKINNY_MAX_M), max_m}
        self.configs = sorted({self._config(m) for m in largest})
        """The configs calls can take (all preloaded): this N's skinny one and, past
        ``gemm.SKINNY_MAX_M`` rows, :data:`CONFIG`."""
        self.tiles_max = max(self._tiles(m) for m in largest)
        """The most tiles of a call (signals per source rank)."""
        self.half = self.world * max_m * n
        self.partials = symm_empty((2 * self.half, ), torch.float32)
        self.pad = SignalPad(self.world * self.tiles_max)
        self.calls = torch.zeros(1, dtype=torch.int64, device=self.device)
        """The device-side call counter (this call's epoch once bumped)."""
        self._protocol = self.world > 1 or bool(protocol_on_one_rank)
        if self._protocol:
            self.preload()
        torch.cuda.synchronize()
        _runtime.barrier()  # every rank's pad is zeroed before any rank can signal it

    def _config(self, m: int) -> str:
        """The config of an ``m``-row call: the same on every rank (the tile count decides which
        program owns which tile)."""
        return _gemm.pick_skinny_config(m, self.n, self.num_sms) or CONFIG

    def _tiles(self, m: int) -> int:
        c = _gemm.config_params(self._config(m))
        return triton.cdiv(m, c["BM"]) * triton.cdiv(self.n, c["BN"])

    def _meta(self, config: str) -> dict:
        return _gemm.kernel_meta(config, False, world=self.world, all_reduce=True)

    def preload(self) -> None:
        """Compile and load the kernel with the specialisation of real calls (descriptors of this
        dtype and each config's blocks, 16-byte aligned output; every int unspecialised)."""
        import torch

        a = torch.empty((self.max_m, 8), dtype=self.dtype, device=self.device)  # only dtype and blocks matter
        for config in self.configs:
            a_desc, b_desc = _gemm.operand_descriptors(a, a, config)
            gemm_ar_kernel.preload(a_desc, b_desc, self.partials, 2, 2, 2, self.pad.signals, self.calls, 2, 2,
                                   half_elems=2, signal_region=2, out=a, grid=(1, ), **self._meta(config))

    def run(self, a, b, out) -> None:
        """``out = sum over ranks of a @ b.T`` on the current stream. ``a [M, K]``, ``b [n, K]``,
        ``out [M, n]``: contiguous, 16-byte aligned CUDA tensors of this dtype, ``M <= max_m``,
        ``K`` a multiple of 8 (validated by :func:`triton_dist.ops.gemm_ar`, not here)."""
        import torch

        m, k = a.shape
        n = b.shape[0]
        if n != self.n or m > self.max_m:
            raise ValueError(f"triton_dist GemmAllReduceContext.run: a is {list(a.shape)} and b {list(b.shape)}; the "
                             f"context takes M <= {self.max_m} and N = {self.n}")
        if m == 0:
            return
        if not self._protocol:
            _gemm.gemm(a, b, out=out)
            return
        config = self._config(m)
        a_desc, b_desc = _gemm.operand_descriptors(a, b, config)
        # The preloaded variant assumes a 16-byte aligned output: another would load here, possibly
        # while a peer spins.
        target = out if out.data_ptr() % 16 == 0 else torch.empty_like(out)
        self.calls.add_(1)
        grid = _gemm.grid_for(m, n, config, self.num_sms)
        gemm_ar_kernel[grid](a_desc, b_desc, self.partials, m, n, k, self.pad.signals, self.calls, self.rank, m,
                             half_elems=self.half, signal_region=self.tiles_max, out=target, **self._meta(config))
        if target is not out:
            out.copy_(target)
