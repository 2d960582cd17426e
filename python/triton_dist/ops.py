"""Torch-facing collective ops: thin wrappers that validate, pick a method and a context, and
launch the kernels of :mod:`triton_dist.kernels`. torch is imported inside the functions.

    import triton_dist as tdist
    from triton_dist.ops import all_reduce
    tdist.init()
    y = all_reduce(x)                  # a new tensor: the sum of x over all ranks
    all_reduce(x, out=x)               # in place
"""

from __future__ import annotations

from .runtime import _require_initialized

AUTO_ONE_SHOT_MAX_BYTES = 256 * 1024
"""``method="auto"`` uses one-shot up to this many bytes, two-shot above. A placeholder until
the crossover is measured (bench/allreduce.py)."""

MIN_CONTEXT_BYTES = 1 << 20
"""Contexts created by :func:`all_reduce` hold at least this many bytes (then powers of two)."""

_METHODS = ("auto", "one_shot", "two_shot")
_CONTEXTS: dict = {}
"""(dtype, max_bytes) -> AllReduceContext, created on first use."""


def _supported_dtypes():
    import torch

    return (torch.float32, torch.bfloat16, torch.float16)


def _context_for(dtype, nbytes: int):
    """The smallest cached context of ``dtype`` that fits ``nbytes``, else a new one (collective)."""
    fitting = [ctx for (dt, size), ctx in _CONTEXTS.items() if dt == dtype and size >= nbytes]
    if fitting:
        return min(fitting, key=lambda c: c.max_bytes)
    from .kernels.allreduce import AllReduceContext

    size = MIN_CONTEXT_BYTES
    while size < nbytes:
        size *= 2
    ctx = AllReduceContext(size, dtype)
    _CONTEXTS[(dtype, size)] = ctx
    return ctx


def clear_contexts() -> None:
    """Forget the cached contexts (their symmetric memory is freed once nothing else holds it).
    Call on every rank, before :func:`triton_dist.finalize` if init will run again."""
    _CONTEXTS.clear()


def all_reduce(x, *, out=None, method: str = "auto", context=None):
    """Sum ``x`` over all ranks; returns ``out`` (a new tensor like ``x`` when ``out`` is None;
    ``out=x`` reduces in place). Runs on the current stream.

    ``x``: a contiguous CUDA tensor on the current device, float32, bfloat16 or float16, of the
    same shape on every rank (bf16/fp16 are summed in fp32, rounded once). ``method``:
    ``"one_shot"`` (every rank reads every rank's data; lowest latency), ``"two_shot"`` (reduce-
    scatter then all-gather; moves ``2 (w-1)/w`` of the bytes per rank) or ``"auto"`` (one-shot up
    to :data:`AUTO_ONE_SHOT_MAX_BYTES`, a placeholder until measured). Every rank gets
    bit-identical results.

    Collective: every rank must make the same calls, in the same order, with the same shapes,
    dtypes and methods. Without ``context``, contexts are cached per (dtype, size) and created on
    first use, which is itself collective (symmetric allocation, kernel load, barrier): the first
    call for a new dtype or a larger size must also be made by all ranks in the same order.
    ``context``: an :class:`~triton_dist.kernels.AllReduceContext` of ``x``'s dtype to use instead.
    """
    _require_initialized("all_reduce")
    import torch

    if not isinstance(x, torch.Tensor):
        raise TypeError(f"triton_dist all_reduce: x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in _supported_dtypes():
        raise TypeError(f"triton_dist all_reduce: dtype {x.dtype} is not supported; use torch.float32, "
                        f"torch.bfloat16 or torch.float16 (cast x first)")
    if not x.is_cuda:
        raise ValueError(f"triton_dist all_reduce: x is on {x.device}; move it to the current CUDA device "
                         f"(x.cuda())")
    current = torch.cuda.current_device()
    if x.device.index != current:
        raise ValueError(f"triton_dist all_reduce: x is on {x.device} but the current device is cuda:{current}; "
                         f"call torch.cuda.set_device() or move x")
    if not x.is_contiguous():
        raise ValueError("triton_dist all_reduce: x must be contiguous; pass x.contiguous()")
    if method not in _METHODS:
        raise ValueError(f"triton_dist all_reduce: method must be one of {_METHODS}, got {method!r}")
    if out is None:
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
    else:
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"triton_dist all_reduce: out must be a torch.Tensor, got {type(out).__name__}")
        if out.dtype != x.dtype or out.shape != x.shape or out.device != x.device:
            raise ValueError(f"triton_dist all_reduce: out must match x (shape {tuple(x.shape)}, {x.dtype}, "
                             f"{x.device}), got shape {tuple(out.shape)}, {out.dtype}, {out.device}")
        if not out.is_contiguous():
            raise ValueError("triton_dist all_reduce: out must be contiguous")
    nbytes = x.numel() * x.element_size()
    if context is not None:
        from .kernels.allreduce import AllReduceContext

        if not isinstance(context, AllReduceContext):
            raise TypeError(f"triton_dist all_reduce: context must be an AllReduceContext, got "
                            f"{type(context).__name__}")
        if context.dtype != x.dtype:
            raise TypeError(f"triton_dist all_reduce: x is {x.dtype} but the context is for {context.dtype}; "
                            f"create an AllReduceContext for {x.dtype}")
        if x.numel() > context.max_numel:
            raise ValueError(f"triton_dist all_reduce: x has {x.numel()} elements ({nbytes} bytes), more than the "
                             f"context's {context.max_numel} ({context.max_bytes} bytes); create an "
                             f"AllReduceContext(max_bytes>={nbytes}, ...) or pass context=None")
    if x.numel() == 0:
        return out
    if method == "auto":
        method = "one_shot" if nbytes <= AUTO_ONE_SHOT_MAX_BYTES else "two_shot"
    if context is None:
        context = _context_for(x.dtype, nbytes)
    context.run(x.view(-1), out.view(-1), method)
    return out
