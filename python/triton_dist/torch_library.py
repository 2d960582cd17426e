"""The dense ops as ``torch.library`` custom ops, ``torch.ops.triton_dist.*``: what
``torch.compile`` (``fullgraph=True`` too) puts in its graph instead of tracing into the ops.

:func:`triton_dist.init` registers them. Each takes tensors and the op's method name
(contexts and ``out=`` are eager-only: the op picks its cached context by size, as
:mod:`triton_dist.ops` does without one) and returns a new tensor; its fake implementation gives
the result's shape and dtype without running anything, so a compiled graph can be traced with fake
tensors. :mod:`triton_dist.ops` calls them itself while ``torch.compile`` traces, so a function
written with ``ops.*`` compiles as it is. Inside the compiled graph each runs the eager op: the same
kernels, the same CUDA-graph capture.

The MoE and decode ops take contexts and handles (Python objects, not tensors) and are not
registered: a compiled function calls them eagerly, with a graph break.
"""

# No "from __future__ import annotations": torch.library reads the ops' schemas from their
# annotations, which must be the objects, not strings.

NAMESPACE = "triton_dist"

_registered = False

_ops = {}
"""name -> ``torch.ops.triton_dist.<name>``, filled by :func:`register` (a dict read is all that
``torch.compile`` traces on the way to an op: no import inside the traced code)."""


def register() -> None:
    """Register the ops (once per process; later calls do nothing)."""
    global _registered, _is_compiling
    if _registered:
        return
    import torch

    _is_compiling = torch.compiler.is_compiling

    from . import ops
    from .runtime import world_size

    def define(name: str, eager, fake) -> None:
        torch.library.custom_op(f"{NAMESPACE}::{name}", eager, mutates_args=()).register_fake(fake)
        _ops[name] = getattr(getattr(torch.ops, NAMESPACE), name)

    def all_reduce(x: torch.Tensor, method: str = "auto") -> torch.Tensor:
        return ops.all_reduce(x, method=method)

    def all_gather(x: torch.Tensor, method: str = "auto") -> torch.Tensor:
        return ops.all_gather(x, method=method)

    def reduce_scatter(x: torch.Tensor, method: str = "auto") -> torch.Tensor:
        return ops.reduce_scatter(x, method=method)

    def ag_gemm(a_shard: torch.Tensor, b: torch.Tensor, method: str = "auto") -> torch.Tensor:
        return ops.ag_gemm(a_shard, b, method=method)

    def gemm_rs(a: torch.Tensor, b: torch.Tensor, method: str = "auto") -> torch.Tensor:
        return ops.gemm_rs(a, b, method=method)

    def gemm_ar(a: torch.Tensor, b: torch.Tensor, method: str = "auto") -> torch.Tensor:
        return ops.gemm_ar(a, b, method=method)

    def rows_times(x, factor: int, divisor: int = 1):
        return x.new_empty((x.shape[0] * factor // divisor, *x.shape[1:]))

    define("all_reduce", all_reduce, lambda x, method="auto": torch.empty_like(x))
    define("all_gather", all_gather, lambda x, method="auto": rows_times(x, world_size()))
    define("reduce_scatter", reduce_scatter, lambda x, method="auto": rows_times(x, 1, world_size()))
    define("ag_gemm", ag_gemm,
           lambda a_shard, b, method="auto": a_shard.new_empty((world_size() * a_shard.shape[0], b.shape[0])))
    define("gemm_rs", gemm_rs, lambda a, b, method="auto": a.new_empty((a.shape[0] // world_size(), b.shape[0])))
    define("gemm_ar", gemm_ar, lambda a, b, method="auto": a.new_empty((a.shape[0], b.shape[0])))
    _registered = True


_is_compiling = None
"""``torch.compiler.is_compiling``, kept by :func:`register` so that an eager call pays no import."""


def op(name: str):
    """``torch.ops.triton_dist.<name>`` (after :func:`register`)."""
    return _ops[name]


def compiling() -> bool:
    """True while ``torch.compile`` traces (the ops then call their registered op); False before
    :func:`register` (before init the ops raise anyway)."""
    return _is_compiling is not None and _is_compiling()


def eager_only(op: str, **given) -> None:
    """Raise if an eager-only argument was given while ``torch.compile`` traces ``op``."""
    named = [name for name, value in given.items() if value is not None]
    if named:
        raise ValueError(f"triton_dist {op}: {', '.join(named)} cannot be given inside torch.compile (the compiled "
                         f"op allocates its output and picks its context by size); call it without them")
