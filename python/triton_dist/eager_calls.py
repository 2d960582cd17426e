"""Repeated eager calls of the ops, replayed: a call of ``ops.all_reduce``, ``ops.all_gather``,
``ops.reduce_scatter``, ``ops.gemm_ar``, ``ops.ag_gemm``, ``ops.gemm_rs`` or the plain
``kernels.gemm.gemm`` (its ``config`` as the method) like an earlier one (the
same op, input shapes, dtype, method, and ``out`` given or not) launches the earlier call's
:class:`~triton_dist.kernels.common.launch_plan.LaunchPlan` (a ``LaunchSequence``: gemm_ar's
``"split_k"``, its kernel, after a bump past 64 rows; gemm_rs's ``"fused"``, its one GEMM;
ag_gemm's ``"sm_push_inline"``, its one GEMM that pushes first; a GEMM op at one rank, the plain
GEMM's :class:`~triton_dist.kernels.gemm.plain_plan.PlainGemmPlan`) after checking only what may
differ between two such
calls: the tensors' device, contiguity and alignment, and ``out``'s shape and dtype.

Why (issue 21): the op's full path (validation, context lookup, method choice, the context's
checks, the kernel's keyword lookup) cost 35-50 µs of host time per call on the GPU machine, several
times the launch it ends in. Every value it works out is a function of the recorded key, with the
context's state read by the kernel on the device, so a call with the same key launches the same
plan; what the key does not fix is checked here, and a call that fails a check takes the full
path, which raises the op's own errors.

A call is recorded after the full path ran it, and only when the context says its launches do not
depend on the tensors (its ``run`` returned the plan: a fixed launch or two, not ``"auto"``'s choice by ``out``'s
memory; at one rank the collectives return their copy, ``OneRankCopy``, and the GEMM ops the
plain GEMM's plan). A call with ``context=`` is recorded on that context
(its ``eager_plans``, a :class:`ContextPlans`), not here: the plan holds the context's buffers,
which must be freed when the caller drops the context, and a call with another context or none
never takes it. With
:attr:`Config.check_collective_calls <triton_dist.config.Config.check_collective_calls>` nothing is
recorded, nor with ``Config.eager_replay`` off, and plans recorded under another Config object
are dropped, so every call is checked.
:func:`clear` (``ops.clear_contexts``, ``finalize``) forgets every plan, those kept on contexts too
(finalize frees the memory they name).
"""

from __future__ import annotations

from . import config as _config
from . import timeline as _timeline

MAX_PLANS = 1024
"""Plans kept before all are forgotten (a caller of ever new shapes)."""

_PLANS: dict = {}
"""(op, shape, dtype, method, out is None) -> :class:`CallPlan`; a GEMM op's key holds both
operands' shapes."""

# torch.Tensor, torch._C and the allocators, bound by the first record (triton_dist imports torch lazily)
_Tensor = None
_torch_c = None
_empty = None
_empty_like = None
_contiguous = None  # torch.contiguous_format

_generation = 0
"""Bumped by :func:`clear`: plans kept on contexts are replayed only in the generation they were
recorded in."""

_recorded_under = None
"""The Config object (``config._current``) the plans were recorded under: under another one (a new
``init``, or ``check_collective_calls`` switched on) they are forgotten, as its settings may change
what a call does (the cross-rank check, the support library's timeouts)."""


class CallPlan:
    """What a recorded call launches, on which device, and its output's shape, dtype and device
    (``like_shaped``: the output has the input's shape)."""

    __slots__ = ("launch", "device", "out_shape", "out_dtype", "out_device", "like_shaped")

    def __init__(self, launch, x, out):
        self.launch = launch
        self.device = x.get_device()
        self.out_shape, self.out_dtype, self.out_device = out.shape, out.dtype, out.device
        self.like_shaped = out.shape == x.shape and out.dtype == x.dtype


class ContextPlans:
    """The recorded calls made with one caller's context (the context's ``eager_plans``), kept on
    the context so that they go with it; valid under the Config and :func:`clear` generation they
    were recorded in."""

    __slots__ = ("plans", "config", "generation")

    def __init__(self):
        self.plans: dict = {}
        self.config = _config._current
        self.generation = _generation


def _held(context) -> ContextPlans | None:
    """``context``'s plans, if it has any recorded under the current Config since the last
    :func:`clear`."""
    held = getattr(context, "eager_plans", None)
    if held is None or held.config is not _config._current or held.generation != _generation:
        return None
    return held


def _plan_for(key: tuple, context):
    """The plan recorded under ``key`` for calls with ``context`` (None: the ops' own cached
    contexts), or None (plans of another Config or an earlier :func:`clear` are dropped first)."""
    if context is None:
        if _config._current is not _recorded_under:  # another Config (init, or a test's switch): full paths
            _PLANS.clear()
            return None
        return _PLANS.get(key)
    held = _held(context)
    return None if held is None else held.plans.get(key)


def _fits(t, device: int) -> bool:
    """A plain CUDA tensor on ``device``, contiguous and 16-byte aligned (what a plan assumes)."""
    return type(t) is _Tensor and t.get_device() == device and t.is_contiguous() and t.data_ptr() % 16 == 0


def _output(plan: CallPlan, out, like):
    """``out`` if the plan fits it (shape, ``like``'s dtype, device, layout), a new output when
    ``out`` is None, else None."""
    if out is None:
        # The cheapest of torch's allocations from Python on the GPU host (host_overhead
        # --breakdown, bench/results/h200-x2/host_overhead_shared_methods.json: empty_like 6.0 µs,
        # torch.empty 7.0, new_empty 8.8; empty_like timed without memory_format), where an 8 KiB
        # all_reduce's launch costs 10.7.
        if plan.like_shaped:  # the full path's strides, not those of like's size-1 dimensions
            return _empty_like(like, memory_format=_contiguous)
        return _empty(plan.out_shape, dtype=plan.out_dtype, device=plan.out_device)
    if _fits(out, plan.device) and out.shape == plan.out_shape and out.dtype == like.dtype:
        return out
    return None


def replay(op: str, x, out, method: str, context=None):
    """``op``'s result (``out``, or a new tensor) from a plan recorded with ``context`` (None: the
    op's cached one), launched on the current stream; None, with nothing launched, when no plan
    fits: the caller takes the full path."""
    if type(x) is not _Tensor or type(method) is not str:  # _Tensor: None until the first record
        return None
    plan = _plan_for((op, x.shape, x.dtype, method, out is None), context)
    if plan is None or _torch_c._cuda_getDevice() != plan.device or not _fits(x, plan.device):
        return None
    out = _output(plan, out, x)
    if out is not None:
        plan.launch.launch(x, out)
    return out


def replay_gemm(op: str, a, b, out, method: str, context=None):
    """:func:`replay` for a GEMM op of ``a [M, K]`` and ``b [N, K]``; None while a timeline records
    (:mod:`triton_dist.timeline`: the GEMMs' full paths launch instrumented variants, the plans
    do not), and for ``"auto"`` while the stream captures a CUDA graph: ag_gemm's and gemm_rs's
    ``"auto"`` choose a one-kernel method for an eager call, whose plan is what gets recorded, and
    the copy-engine producer under capture (:mod:`~triton_dist.kernels.gemm.policy`)."""
    if (type(a) is not _Tensor or type(b) is not _Tensor or type(method) is not str
            or _timeline._current is not None or (method == "auto" and _torch_c._cuda_isCurrentStreamCapturing())):
        return None
    plan = _plan_for((op, a.shape, b.shape, a.dtype, method, out is None), context)
    if (plan is None or b.dtype != a.dtype or _torch_c._cuda_getDevice() != plan.device or
            not _fits(a, plan.device) or not _fits(b, plan.device)):
        return None
    out = _output(plan, out, a)
    if out is not None:
        plan.launch.launch(a, b, out)
    return out


def record(op: str, x, out, out_given: bool, method: str, launched, context=None) -> None:
    """Remember that ``op(x, out=out if out_given else None, method=method, context=context)``,
    just run by the full path, launched ``launched`` (what the context's ``run`` returned: a
    LaunchPlan, at one rank a ``OneRankCopy``, or None when the call may not be replayed)."""
    _record((op, x.shape, x.dtype, method, not out_given), x, out, launched, 2, context)


def record_gemm(op: str, a, b, out, out_given: bool, method: str, launched, context=None) -> None:
    """:func:`record` for a GEMM op of ``a`` and ``b`` (``launched``: a LaunchPlan or LaunchSequence
    taking ``(a, b, out)``, at one rank a ``PlainGemmPlan``, or None)."""
    _record((op, a.shape, b.shape, a.dtype, method, not out_given), a, out, launched, 3, context)


def _record(key: tuple, x, out, launched, tensors: int, context) -> None:
    global _Tensor, _torch_c, _empty, _empty_like, _contiguous, _recorded_under
    config = _config.get()
    if launched is None or config.check_collective_calls or not config.eager_replay:
        return
    if launched.arity != tensors:
        raise ValueError(f"triton_dist eager_calls: {key[0]}'s plan takes {launched.arity} tensors, its replay "
                         f"{tensors}: {launched!r}")
    if _Tensor is None:
        import torch

        _Tensor, _torch_c, _empty, _empty_like = torch.Tensor, torch._C, torch.empty, torch.empty_like
        _contiguous = torch.contiguous_format
    if context is None:
        if _config._current is not _recorded_under:
            _PLANS.clear()
            _recorded_under = _config._current
        plans = _PLANS
    else:
        held = _held(context)
        if held is None:
            held = context.eager_plans = ContextPlans()
        plans = held.plans
    if key not in plans and len(plans) >= MAX_PLANS:
        plans.clear()
    plans[key] = CallPlan(launched, x, out)


def clear() -> None:
    """Forget every plan, those kept on callers' contexts too (their contexts' buffers are freed
    once nothing else holds them)."""
    global _generation
    _PLANS.clear()
    _generation += 1


def plans(context=None) -> int:
    """How many calls are recorded (with ``context``: on it, and still valid)."""
    if context is None:
        return len(_PLANS)
    held = _held(context)
    return 0 if held is None else len(held.plans)
