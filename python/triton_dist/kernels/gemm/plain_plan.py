"""The plain GEMM's launches as plans (:class:`PlainGemmPlan`): what
:func:`~triton_dist.kernels.gemm.dense.gemm` launches for one shape, config and slice count,
worked out once and launched from C++ with only the call's ``a``, ``b`` and ``out``.

Why (issue 21): through Triton's path every plain GEMM call made three host TMA descriptors (2.8
µs each on the GPU host) and went through Triton's launcher, and the GEMM ops at one rank run the
plain GEMM on every call: 116-174 µs of host time a call on one H200
(bench/results/h200-x1/host_overhead.json), where their two-rank calls, replayed, took 23-33 µs.
A plan's launch is its kernel's bound C++ launch
(:class:`~triton_dist.kernels.common.launch_plan.LaunchPlan`: the C++ launcher encodes the
descriptors itself), and the GEMM ops at one rank return it, so :mod:`triton_dist.eager_calls`
replays a repeated call. The kernels are the ones Triton's path launched (the same variants, so
the prebuilt set is unchanged), wrapped in :class:`~triton_dist.eager_launch.EagerKernel`: no
NVSHMEM, no ``triton_dist.init`` needed.

A plan of several K slices (split-K, wave-tail) takes per call an fp32 workspace from
``torch.empty`` (the caching allocator; in a capture, the graph's pool: as Triton's path did) and
the current stream's ticket counters (:func:`~triton_dist.kernels.gemm.split_k.current_tickets`);
where a capture may not make them (no slab yet), the launch runs the one-slice plan of the same
shape instead, as :func:`~triton_dist.kernels.gemm.dense.gemm` would.
"""

from __future__ import annotations

from ..common.host_math import cdiv
from ..common.launch_plan import LaunchPlan, PlanCache, Slot

_plans = PlanCache(limit=512)
"""(kind, device, sizes, config, SMs, slices) -> plan. A decode loop calls with up to 128 row
counts per weight shape; the limit keeps a caller of ever new shapes bounded."""

_eager_kernels: dict = {}
"""JITFunction -> its :class:`~triton_dist.eager_launch.EagerKernel` (the variants it learnt)."""

_torch = None  # with _current_tickets, bound on the first sliced launch (triton_dist imports torch lazily)
_current_tickets = None  # split_k imports this module: its function is bound at call time


def _eager(fn):
    kernel = _eager_kernels.get(fn)
    if kernel is None:
        from ...eager_launch import EagerKernel

        kernel = _eager_kernels[fn] = EagerKernel(fn)
    return kernel


class PlainGemmPlan:
    """One plain GEMM launch with every argument fixed but ``(a, b, out)``; with
    ``partials_shape``, each launch also takes a new fp32 workspace of that shape and the current
    stream's ticket counters (``one_slice()``: the plan to run where it may not have them)."""

    __slots__ = ("kernel", "device", "partials_shape", "one_slice", "arity")

    def __init__(self, kernel: LaunchPlan, device, partials_shape: tuple | None = None, one_slice=None):
        self.kernel = kernel
        self.device = device
        self.partials_shape = partials_shape
        self.one_slice = one_slice
        self.arity = 3
        """The tensors :meth:`launch` takes (what :mod:`triton_dist.eager_calls` checks)."""

    def launch(self, a, b, out) -> None:
        """``out = a @ b.T`` on the current stream: ``a``, ``b`` and ``out`` contiguous, 16-byte
        aligned CUDA tensors of the plan's sizes and one dtype, on its device."""
        if self.partials_shape is None:
            self.kernel.launch(a, b, out)
            return
        if _torch is None:
            _bind()
        tickets = _current_tickets(self.device)
        if tickets is None:
            self.one_slice().launch(a, b, out)
            return
        partials = _torch.empty(self.partials_shape, dtype=_torch.float32, device=self.device)
        self.kernel.launch(a, b, out, partials, tickets)

    def __repr__(self) -> str:
        return f"PlainGemmPlan({self.kernel!r}, partials={self.partials_shape})"


def _bind() -> None:
    global _torch, _current_tickets
    import torch

    from .split_k import current_tickets

    _torch, _current_tickets = torch, current_tickets


def persistent_plan(m: int, n: int, k: int, config: str, num_sms: int, device) -> PlainGemmPlan:
    """:func:`~triton_dist.kernels.gemm.dense.gemm_kernel`'s launch for ``config`` (of
    :data:`~triton_dist.kernels.gemm.dense.CONFIGS` or the skinny ones) on ``device``."""
    def make():
        from . import dense

        c = dense.config_params(config)
        args = (Slot(0, "a", (c["BM"], c["BK"])), Slot(1, "b", (c["BN"], c["BK"])), Slot(2, "out", (c["BM"], c["BN"])),
                m, n, k, None, None, 0, 1)
        return PlainGemmPlan(LaunchPlan(_eager(dense.gemm_kernel), dense.grid_for(m, n, config, num_sms), args,
                                        dense.kernel_meta(config, False)), device)

    return _plans.get(("persistent", device, m, n, k, config, num_sms), make)


def split_k_plan(m: int, n: int, k: int, config: str, num_sms: int, split: int, device) -> PlainGemmPlan:
    """:func:`~triton_dist.kernels.gemm.split_k.gemm_split_k_kernel`'s launch for the split-K
    ``config`` in ``split`` slices (validated by its caller)."""
    def make():
        from . import split_k as sk

        c = sk.config_params(config)
        grid = (min(cdiv(n, c["BN"]) * split, num_sms), )
        meta = dict(BM=c["BM"], BN=c["BN"], BK=c["BK"], NUM_STAGES=c["NUM_STAGES"], num_warps=c["num_warps"])
        operands = (Slot(0, "a", (c["BM"], c["BK"])), Slot(1, "b", (c["BN"], c["BK"])), Slot(2, "out"))
        kernel = _eager(sk.gemm_split_k_kernel)
        if split == 1:  # partials and tickets untouched: the device's placeholders, fixed
            tickets, partials = sk.placeholders(device)
            return PlainGemmPlan(LaunchPlan(kernel, grid, (*operands, partials, tickets, m, n, k, 1), meta), device)
        slices = (*operands, Slot(3, "partials"), Slot(4, "tickets"), m, n, k, split)
        return PlainGemmPlan(LaunchPlan(kernel, grid, slices, meta), device, (split, m, n),
                             lambda: split_k_plan(m, n, k, config, num_sms, 1, device))

    return _plans.get(("split_k", device, m, n, k, config, num_sms, split), make)


def wave_tail_plan(m: int, n: int, k: int, config: str, num_sms: int, split: int, device) -> PlainGemmPlan:
    """:func:`~triton_dist.kernels.gemm.wave_tail.gemm_wave_tail_kernel`'s launch for the
    wave-tail ``config`` with the last wave's tiles in ``split`` slices; where nothing is cut
    (one slice, or no partial last wave) the base config's :func:`persistent_plan`."""
    from . import dense
    from . import wave_tail as wt

    base = wt.CONFIG_NAMES[config]
    c = dense.CONFIGS[base]
    tiles = cdiv(m, c["BM"]) * cdiv(n, c["BN"])
    tail = tiles % num_sms
    if split == 1 or tail == 0:
        return persistent_plan(m, n, k, base, num_sms, device)

    def make():
        full = tiles - tail
        args = (Slot(0, "a", (c["BM"], c["BK"])), Slot(1, "b", (c["BN"], c["BK"])), Slot(2, "out", (c["BM"], c["BN"])),
                Slot(3, "partials"), Slot(4, "tickets"), m, n, k, full, split)
        meta = dict(BM=c["BM"], BN=c["BN"], BK=c["BK"], GROUP_M=c["GROUP_M"], NUM_STAGES=c["NUM_STAGES"],
                    num_warps=c["num_warps"], num_stages=c["NUM_STAGES"])
        return PlainGemmPlan(LaunchPlan(_eager(wt.gemm_wave_tail_kernel), (min(full + tail * split, num_sms), ), args,
                                        meta), device, (split, tail, c["BM"], c["BN"]),
                             lambda: persistent_plan(m, n, k, base, num_sms, device))

    return _plans.get(("wave_tail", device, m, n, k, config, num_sms, split), make)

