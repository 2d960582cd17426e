"""Repeated eager calls of the collective ops, replayed: a call of ``ops.all_reduce``,
``ops.all_gather`` or ``ops.reduce_scatter`` like an earlier one (the same op, input shape, dtype,
method, and ``out`` given or not) launches the earlier call's
:class:`~triton_dist.kernels.common.launch_plan.LaunchPlan` after checking only what may differ
between two such calls: the tensors' device, contiguity and alignment, and ``out``'s shape and
dtype.

Why (issue 21): the op's full path (validation, context lookup, method choice, the context's
checks, the kernel's keyword lookup) cost 35-50 µs of host time per call on the GPU machine, several
times the launch it ends in. Every value it works out is a function of the recorded key, with the
context's state read by the kernel on the device, so a call with the same key launches the same
plan; what the key does not fix is checked here, and a call that fails a check takes the full
path, which raises the op's own errors.

A call is recorded after the full path ran it, and only when the context says its launch does not
depend on the tensors (:meth:`run` returned the plan: one kernel, every rank more than one, not
``"auto"``'s choice by ``out``'s memory). Calls with ``context=`` are not recorded: the plan holds
the context's buffers, which must be freed when the caller drops the context. With
:attr:`Config.check_collective_calls <triton_dist.config.Config.check_collective_calls>` nothing is
recorded, and plans recorded under another Config object are dropped, so every call is checked.
:func:`clear` (``ops.clear_contexts``, ``finalize``) forgets every plan.
"""

from __future__ import annotations

from . import config as _config

MAX_PLANS = 1024
"""Plans kept before all are forgotten (a caller of ever new shapes)."""

_PLANS: dict = {}
"""(op, shape, dtype, method, out is None) -> :class:`CallPlan`."""

_Tensor = None  # torch.Tensor and torch._C, bound by the first record (triton_dist imports torch lazily)
_torch_c = None

_recorded_under = None
"""The Config object (``config._current``) the plans were recorded under: under another one (a new
``init``, or ``check_collective_calls`` switched on) they are forgotten, as its settings may change
what a call does (the cross-rank check, the support library's timeouts)."""


class CallPlan:
    """What a recorded call launches, on which device, and the shape of its output."""

    __slots__ = ("launch", "device", "out_shape")

    def __init__(self, launch, device: int, out_shape):
        self.launch = launch
        self.device = device
        self.out_shape = out_shape


def replay(op: str, x, out, method: str):
    """``op``'s result (``out``, or a new tensor) from a recorded plan, launched on the current
    stream; None, with nothing launched, when no plan fits: the caller takes the full path."""
    if not _PLANS or type(x) is not _Tensor or type(method) is not str:
        return None
    if _config._current is not _recorded_under:  # another Config (init, or a test's switch): full paths
        _PLANS.clear()
        return None
    plan = _PLANS.get((op, x.shape, x.dtype, method, out is None))
    if plan is None:
        return None
    device = plan.device
    if _torch_c._cuda_getDevice() != device or x.get_device() != device or not x.is_contiguous() or x.data_ptr() % 16:
        return None
    if out is None:
        out = x.new_empty(plan.out_shape)
    elif (type(out) is not _Tensor or out.shape != plan.out_shape or out.dtype != x.dtype or
          out.get_device() != device or not out.is_contiguous() or out.data_ptr() % 16):
        return None
    plan.launch.launch(x, out)
    return out


def record(op: str, x, out, out_given: bool, method: str, launched) -> None:
    """Remember that ``op(x, out=out if out_given else None, method=method)`` (no ``context=``),
    just run by the full path, launched ``launched`` (what the context's ``run`` returned: a
    LaunchPlan, or None when the call may not be replayed)."""
    global _Tensor, _torch_c, _recorded_under
    if launched is None or _config.get().check_collective_calls:
        return
    if _Tensor is None:
        import torch

        _Tensor, _torch_c = torch.Tensor, torch._C
    if _config._current is not _recorded_under:
        _PLANS.clear()
        _recorded_under = _config._current
    key = (op, x.shape, x.dtype, method, not out_given)
    if key not in _PLANS and len(_PLANS) >= MAX_PLANS:
        _PLANS.clear()
    _PLANS[key] = CallPlan(launched, x.get_device(), out.shape)


def clear() -> None:
    """Forget every plan (their contexts' buffers are freed once nothing else holds them)."""
    _PLANS.clear()


def plans() -> int:
    """How many calls are recorded."""
    return len(_PLANS)
