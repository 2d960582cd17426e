"""Each collective context's one-kernel launch plans (``_make_launch_plan``) pass the kernel its
runtime arguments in the kernel's own order and every constexpr it declares without a default: a
context stood up without a GPU, whose buffers are named stand-ins (``stage``, ``signals``, ...)
matched against the kernel's parameter names. A kernel whose parameters change fails here, before
a GPU run would pass it a buffer in another's place."""

import types

import pytest

from triton_dist.kernels.collectives.allgather import AllGatherContext
from triton_dist.kernels.collectives.allreduce import AllReduceContext
from triton_dist.kernels.collectives.reduce_scatter import ReduceScatterContext
from triton_dist.kernels.common.launch_plan import OUT, X


class Buffer:
    """A named symmetric buffer; a slice of it (a pad's region) keeps the name."""

    def __init__(self, name: str):
        self.name = name

    def __getitem__(self, _):
        return self


BUFFER_OF_PARAMETER = {"inbox": "inbox", "gathered": "gathered", "stage": "stage", "gather": "gather", "ll": "ll",
                       "partials": "partials", "signals": "signals", "calls": "calls"}


def _context(cls, world: int, local_world: int):
    ctx = cls.__new__(cls)
    ctx.world, ctx.local_world, ctx.rank = world, local_world, 0
    ctx.dtype = types.SimpleNamespace(itemsize=2)
    ctx.max_programs, ctx.copy_wait_programs = 32, 16
    ctx.half = ctx.ring_half = ctx.slot_numel = 64 * cls.BLOCK
    ctx.ll_slot, ctx.vec = 4096, 8
    for name in ("stage", "gather", "gathered", "inbox", "partials", "ll", "calls"):
        setattr(ctx, name, Buffer(name))
    ctx.ring_inbox = Buffer("inbox")
    ctx.pad = types.SimpleNamespace(signals=Buffer("signals"))
    ctx.pad_ext = types.SimpleNamespace(signals=Buffer("signals"))
    ctx.layout = {"ring": 64}
    ctx.ext_layout = {"node_ready": 8}
    return ctx


_PLANS = [(AllReduceContext, m) for m in ("one_shot", "two_shot", "ring", "ll")] + \
         [(AllGatherContext, m) for m in ("sm_push", "2d", "ring", "ll", "ll_2d")] + \
         [(ReduceScatterContext, m) for m in ("push", "ring", "2d", "ll")]


@pytest.mark.parametrize("world,local_world", [(2, 2), (8, 8), (8, 4)])
@pytest.mark.parametrize("cls,method", _PLANS, ids=[f"{c.__name__}-{m}" for c, m in _PLANS])
def test_a_plan_passes_the_kernels_parameters_in_order(cls, method, world, local_world):
    plan = _context(cls, world, local_world)._make_launch_plan(world * 3000, method)
    fn = plan.kernel.fn
    runtime = [p for p in fn.params if not p.is_constexpr]
    assert len(plan.args) == len(runtime), f"{fn.__name__}: {plan.args} for {[p.name for p in runtime]}"
    for param, arg in zip(runtime, plan.args):
        if arg is X or arg is OUT:
            assert param.name == ("x" if arg is X else "out"), f"{fn.__name__}: {arg!r} passed as {param.name}"
        elif isinstance(arg, Buffer):
            assert BUFFER_OF_PARAMETER.get(param.name) == arg.name, f"{fn.__name__}: {arg.name} passed as {param.name}"
        else:
            assert isinstance(arg, int) and not isinstance(arg, bool) and param.name not in BUFFER_OF_PARAMETER, \
                f"{fn.__name__}: {arg!r} passed as {param.name}"
    constexprs = {p.name for p in fn.params if p.is_constexpr}
    required = {p.name for p in fn.params if p.is_constexpr and not p.has_default}
    given = set(plan.meta) - {"num_warps", "num_stages"}
    assert given <= constexprs and required <= given, \
        f"{fn.__name__}: meta {sorted(given)}, constexprs {sorted(constexprs)}"
    assert 1 <= plan.grid[0] <= 32


@pytest.mark.parametrize("cls,method", [(AllReduceContext, "ce_two_shot"), (AllReduceContext, "2d"),
                                        (AllGatherContext, "ce_push"), (AllGatherContext, "sm_zero_copy"),
                                        (AllGatherContext, "ce_zero_copy")])
def test_methods_of_several_launches_or_host_state_have_no_plan(cls, method):
    assert _context(cls, 4, 4)._make_launch_plan(12000, method) is None


def test_rings_plan_waits_for_its_inbox():
    ctx = _context(AllReduceContext, 4, 4)
    ctx.ring_inbox = None
    assert ctx._make_launch_plan(12000, "ring") is None
