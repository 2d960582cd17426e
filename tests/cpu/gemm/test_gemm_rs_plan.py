"""gemm_rs's ``"fused"`` launch as a plan (what a repeated ``ops.gemm_rs`` call replays): the
fused GEMM alone, advancing the context's call counter itself (``ENTER_CALL``), with its runtime
arguments in the kernel's order (the epilogue's operands after the constexprs, by name on Triton's path), the operands' TMA
descriptors of the config's blocks, its grid and constexprs: what ``run`` launches for
``"fused"``. A context stood up without a GPU, its buffers named stand-ins."""

import pytest
from stand_ins import bare_context

from triton_dist.kernels.common.launch_plan import PlanCache, Slot
from triton_dist.kernels.gemm import dense as gemm_module
from triton_dist.kernels.gemm import gemm_rs


def _context(world: int, n: int):
    return bare_context(gemm_rs.GemmReduceScatterContext, ("partials", "calls"), world=world, rank=1, num_sms=132,
                        n=n, half=1 << 22, tiles_per_rank=640, _fused_plans=PlanCache())


@pytest.mark.parametrize("big_m,n,k", [(1024, 14336, 4096), (256, 8192, 1024), (8192, 4096, 7168)])
@pytest.mark.parametrize("world", [2, 8])
def test_fused_plan_is_the_gemm_alone_with_its_parameters(big_m, n, k, world):
    ctx = _context(world, n)
    gemm, = ctx.fused_plan(big_m, k).plans
    params = [p.name for p in gemm.kernel.fn.params if not p.is_constexpr]
    args = dict(zip(params, gemm.args))
    assert params[:len(gemm.args)] == ["a_desc", "b_desc", "c_desc", "M", "N", "K", "signals", "calls", "rank",
                                       "m_per_rank", "half_elems", "signal_region", "out"]
    config = gemm_module.pick_config(big_m, n, k, ctx.num_sms)
    c = gemm_module.CONFIGS[config]
    m = big_m // world
    assert (args["a_desc"].index, args["a_desc"].block) == (0, [c["BM"], c["BK"]])
    assert (args["b_desc"].index, args["b_desc"].block) == (1, [c["BN"], c["BK"]])
    assert isinstance(args["out"], Slot) and (args["out"].index, args["out"].block) == (2, None)
    assert args["c_desc"].name == "partials" and args["signals"].name == "signals" and args["calls"].name == "calls"
    assert (args["M"], args["N"], args["K"], args["rank"], args["m_per_rank"]) == (big_m, n, k, 1, m)
    assert (args["half_elems"], args["signal_region"]) == (ctx.half, ctx.tiles_per_rank)
    tiles = -(-m // c["BM"]) * -(-n // c["BN"])
    assert gemm.grid == (max(1, min(world * tiles, ctx.num_sms)), ) and gemm.arity == 3
    assert gemm.meta == dict(gemm_module.kernel_meta(config, False, epilogue="reduce_own", world=world),
                             ENTER_CALL=True)
    assert ctx.fused_plan(big_m, k).plans == (gemm, )  # made once per (M, K)
