"""ag_gemm's ``"sm_push_inline"`` launches as a plan (what a repeated ``ops.ag_gemm`` call
replays): the push kernel with the call's shard in the first slot, then the GEMM consumer with its
runtime arguments in the kernel's order, A's descriptor over the gathered rows made once, B's and
the output's per call, and its constexprs. A context stood up without a GPU, its buffers named
stand-ins and descriptors recorded instead of made."""

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
def test_inline_plan_is_the_push_then_the_consumer_with_its_parameters(m, n, world, monkeypatch):
    monkeypatch.setattr(TensorDescriptor, "from_tensor",
                        staticmethod(lambda t, block: ("desc", t.name, t.shape, list(block))))
    k = 8192
    ctx = _context(world, k)
    push, consumer = ctx.inline_plan(m, n).plans

    names = [p.name for p in push.kernel.fn.params if not p.is_constexpr]
    args = dict(zip(names, push.args))
    assert len(push.args) == len(names) and push.arity == 1 and push.grid == (ctx.push_programs, )
    assert isinstance(args["shard"], Slot) and (args["shard"].index, args["shard"].block) == (0, None)
    assert [args[x].name for x in ("gathered", "signals", "calls", "tickets")] == \
        ["gathered", "signals", "calls", "tickets"]
    assert args["n"] == m * k and push.meta == dict(WORLD=world, BLOCK=ag_gemm.PUSH_BLOCK, num_warps=8)

    rows = world * m
    config = gemm_module.pick_config(rows, n, k, ctx.max_programs)
    c = gemm_module.config_params(config)
    params = consumer.kernel.fn.params
    names = [p.name for p in params][:len(consumer.args)]
    args = dict(zip(names, consumer.args))
    assert names == ["a_desc", "b_desc", "c_desc", "M", "N", "K", "signals", "calls", "rank", "m_per_rank"]
    assert args["a_desc"] == ("desc", "gathered", (rows, k), [c["BM"], c["BK"]])
    assert (args["b_desc"].index, args["b_desc"].block) == (1, [c["BN"], c["BK"]])
    assert (args["c_desc"].index, args["c_desc"].block) == (2, [c["BM"], c["BN"]])
    assert (args["M"], args["N"], args["K"], args["rank"], args["m_per_rank"]) == (rows, n, k, 1, m)
    assert args["signals"].name == "signals" and args["calls"].name == "calls"
    assert consumer.grid == gemm_module.grid_for(rows, n, config, ctx.max_programs)
    assert consumer.meta == ctx.consumer_meta(config) and consumer.meta["WAIT_FOR_ROWS"] is True
    assert ctx.inline_plan(m, n).plans == (push, consumer)  # made once per (m, n)
