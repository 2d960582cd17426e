"""The dense ops as ``torch.library`` custom ops, ``torch.ops.triton_dist.*``: what
``torch.compile`` (``fullgraph=True`` too) puts in its graph instead of tracing into the ops.

:func:`triton_dist.init` registers them. Each takes tensors and the op's method name
(contexts and ``out=`` are eager-only: the op picks its cached context by size, as
:mod:`triton_dist.ops` does without one) and the world size, and returns a new tensor; its fake
implementation gives the result's shape and dtype without running anything, so a compiled graph
can be traced with fake tensors.

Why the world size is an argument: Inductor's FX graph cache keys a graph by its code and its
inputs, not by what a custom op's fake returned. Two runs at different world sizes (a world-1 run,
then a world-2 run on the same machine, sharing ``/tmp/torchinductor_<user>``) trace the same code
for the same input shapes, and the second reused the first's compiled graph, whose size checks
expected the world-1 output (seen on the GPU: ``expected size 256==128`` in ``ag_gemm``). With the
world a literal of the call, the graphs differ and so do their keys; the eager implementation
refuses a graph traced at another world size. :mod:`triton_dist.ops` calls them itself while ``torch.compile`` traces, so a function
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


def register(world: int) -> None:
    """Register the ops (once per process) and take ``world``, the world size of the runtime
    :func:`triton_dist.init` just brought up, as the one :func:`call` passes (every call)."""
    global _registered, _is_compiling, _world
    _world = world
    if _registered:
        return
    import torch

    _is_compiling = torch.compiler.is_compiling

    from . import ops
    from .runtime import world_size

    def traced_at(op: str, world: int) -> None:
        if world != world_size():
            raise ValueError(f"triton_dist {op}: this compiled graph was traced at world size {world}, the runtime "
                             f"has {world_size()} ranks; call torch._dynamo.reset() after re-initialising at another "
                             f"world size, or call the op eagerly")

    def define(name: str, eager, fake) -> None:
        torch.library.custom_op(f"{NAMESPACE}::{name}", eager, mutates_args=()).register_fake(fake)
        _ops[name] = getattr(getattr(torch.ops, NAMESPACE), name)

    def all_reduce(x: torch.Tensor, method: str, world: int) -> torch.Tensor:
        traced_at("all_reduce", world)
        return ops.all_reduce(x, method=method)

    def all_gather(x: torch.Tensor, method: str, world: int) -> torch.Tensor:
        traced_at("all_gather", world)
        return ops.all_gather(x, method=method)

    def reduce_scatter(x: torch.Tensor, method: str, world: int) -> torch.Tensor:
        traced_at("reduce_scatter", world)
        return ops.reduce_scatter(x, method=method)

    def ag_gemm(a_shard: torch.Tensor, b: torch.Tensor, method: str, world: int) -> torch.Tensor:
        traced_at("ag_gemm", world)
        return ops.ag_gemm(a_shard, b, method=method)

    def gemm_rs(a: torch.Tensor, b: torch.Tensor, method: str, world: int) -> torch.Tensor:
        traced_at("gemm_rs", world)
        return ops.gemm_rs(a, b, method=method)

    def gemm_ar(a: torch.Tensor, b: torch.Tensor, method: str, world: int) -> torch.Tensor:
        traced_at("gemm_ar", world)
        return ops.gemm_ar(a, b, method=method)

    def rows_times(x, factor: int, divisor: int = 1):
        return x.new_empty((x.shape[0] * factor // divisor, *x.shape[1:]))

    define("all_reduce", all_reduce, lambda x, method, world: torch.empty_like(x))
    define("all_gather", all_gather, lambda x, method, world: rows_times(x, world))
    define("reduce_scatter", reduce_scatter, lambda x, method, world: rows_times(x, 1, world))
    define("ag_gemm", ag_gemm,
           lambda a_shard, b, method, world: a_shard.new_empty((world * a_shard.shape[0], b.shape[0])))
    define("gemm_rs", gemm_rs, lambda a, b, method, world: a.new_empty((a.shape[0] // world, b.shape[0])))
    define("gemm_ar", gemm_ar, lambda a, b, method, world: a.new_empty((a.shape[0], b.shape[0])))
    _registered = True


_world = None
"""The runtime's world size, from the latest :func:`register` (each :func:`triton_dist.init`)."""

_is_compiling = None
"""``torch.compiler.is_compiling``, kept by :func:`register` so that an eager call pays no import."""


def call(name: str, *args):
    """``torch.ops.triton_dist.<name>(*args, world)``: what :mod:`triton_dist.ops` calls while
    ``torch.compile`` traces. Dynamo reads ``world`` as a constant (guarded), so it is a literal of
    the graph's code (module notes: why)."""
    return _ops[name](*args, _world)


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
