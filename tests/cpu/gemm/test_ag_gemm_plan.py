"""ag_gemm's ``"sm_push_inline"`` launch as a plan (what a repeated ``ops.ag_gemm`` call
replays): one GEMM consumer that pushes the call's shard first, its runtime arguments in the
kernel's order (the shard, by name after the constexprs, in the first slot), A's descriptor over
the gathered rows made once, B's and the output's per call, and its constexprs (the push and the
call's entry switched on). A context stood up without a GPU, its buffers named stand-ins and
descriptors recorded instead of made."""

import pytest
from stand_ins import bare_context
from triton.tools.tensor_descriptor import TensorDescriptor

from triton_dist.kernels.common.launch_plan import PlanCache, Slot
from triton_dist.kernels.gemm import ag_gemm
from triton_dist.kernels.gemm import dense as gemm_module


def _context(world: int, k: int):
    return bare_context(ag_gemm.AllGatherGemmContext, ("gathered", "calls", "tickets"), world=world, rank=1, k=k,
                        num_sms=132, max_programs=124, push_programs=8, method="sm_push_inline", local_world=world,
                        _inline_plans=PlanCache())


@pytest.mark.parametrize("m,n", [(1, 4096), (128, 14336 // 2), (1024, 1024)])
@pytest.mark.parametrize("world", [2, 8])
def test_inline_plan_is_one_consumer_that_pushes_with_its_parameters(m, n, world, monkeypatch):
    monkeypatch.setattr(TensorDescriptor, "from_tensor",
                        staticmethod(lambda t, block: ("desc", t.name, t.shape, list(block))))
    k = 8192
    ctx = _context(world, k)
    plan = ctx.inline_plan(m, n)

    rows = world * m
    config = gemm_module.pick_config(rows, n, k, ctx.max_programs)
    c = gemm_module.config_params(config)
    names = [p.name for p in plan.kernel.fn.params if not p.is_constexpr]
    assert len(plan.args) == len(names) and plan.arity == 3
    args = dict(zip(names, plan.args))
    assert names[:10] == ["a_desc", "b_desc", "c_desc", "M", "N", "K", "signals", "calls", "rank", "m_per_rank"]
    assert args["a_desc"] == ("desc", "gathered", (rows, k), [c["BM"], c["BK"]])
    assert (args["b_desc"].index, args["b_desc"].block) == (1, [c["BN"], c["BK"]])
    assert (args["c_desc"].index, args["c_desc"].block) == (2, [c["BM"], c["BN"]])
    assert (args["M"], args["N"], args["K"], args["rank"], args["m_per_rank"]) == (rows, n, k, 1, m)
    assert [args[x].name for x in ("signals", "calls", "tickets", "gathered")] == \
        ["signals", "calls", "tickets", "gathered"]
    assert isinstance(args["shard"], Slot) and (args["shard"].index, args["shard"].block) == (0, None)
    assert args["out"] is None and args["timeline"] is None  # the other epilogues' operands keep their defaults
    assert plan.grid == gemm_module.grid_for(rows, n, config, ctx.max_programs)
    assert plan.meta == ctx.consumer_meta(config)
    assert plan.meta["WAIT_FOR_ROWS"] and plan.meta["PUSH_SHARD"] and plan.meta["ENTER_CALL"]
    assert plan.meta["WORLD"] == world
    assert ctx.inline_plan(m, n) is plan  # made once per (m, n)


def test_only_the_inline_producer_pushes_from_the_gemm():
    ctx = _context(2, 4096)
    assert set(ctx._push_shard_args("x")) == {"tickets", "shard", "gathered"}
    ctx.method = "sm_push"
    assert ctx._push_shard_args("x") == {} and "PUSH_SHARD" not in ctx.consumer_meta("large")
    with pytest.raises(ValueError, match="push_shard"):
        gemm_module.kernel_meta("large", False, push_shard=True)
