"""gemm_ar's ``"split_k"`` launches as a plan (what a repeated ``ops.gemm_ar`` call replays): the
bump of the context's counter, then the split-K kernel with its runtime arguments in the kernel's
order, the operands' TMA descriptors of the config's blocks, and its constexprs. A context stood up
without a GPU, its buffers named stand-ins."""

import pytest
from stand_ins import bare_context

from triton_dist.kernels.common.launch_plan import PlanCache, Slot
from triton_dist.kernels.gemm import gemm_ar
from triton_dist.kernels.gemm.split_k import SPLIT_K_BN, SPLIT_K_CONFIGS


def _context(world: int, n: int):
    return bare_context(gemm_ar.GemmAllReduceContext, ("partials", "calls"), world=world, rank=0, num_sms=132, n=n,
                        half=1 << 20, tiles_max=512, _split_k_plans=PlanCache())


@pytest.mark.parametrize("m", [1, 16, 32, 100, 128])
@pytest.mark.parametrize("world", [2, 8])
def test_split_k_plan_is_the_kernel_with_its_parameters_after_a_bump_only_past_64_rows(m, world):
    """Up to ``SPLIT_K_ENTER_MAX_BM`` rows the kernel advances the call counter itself (ENTER):
    one launch a call; past them the bump goes first."""
    ctx = _context(world, 4096)
    sequence = ctx.split_k_plan(m, 7168)
    enters = ctx.split_k_block(m) <= gemm_ar.SPLIT_K_ENTER_MAX_BM
    if enters:
        kernel, = sequence.plans
    else:
        bump, kernel = sequence.plans
        assert bump.args == [ctx.calls] and bump.arity == 0 and bump.grid == (1, )
    assert kernel.meta["ENTER"] is enters
    fn = kernel.kernel.fn
    names = [p.name for p in fn.params if not p.is_constexpr]
    args = dict(zip(names, kernel.args))
    assert len(kernel.args) == len(names) and kernel.arity == 3
    bm = ctx.split_k_block(m)
    bk = SPLIT_K_CONFIGS[bm]["BK"]
    assert (args["a_desc"].index, args["a_desc"].block) == (0, [bm, bk])
    assert (args["b_desc"].index, args["b_desc"].block) == (1, [SPLIT_K_BN, bk])
    assert isinstance(args["out"], Slot) and (args["out"].index, args["out"].block) == (2, None)
    assert [args[name].name for name in ("partials", "signals", "calls")] == ["partials", "signals", "calls"]
    assert (args["M"], args["N"], args["K"], args["rank"]) == (m, 4096, 7168, 0)
    assert (args["half_elems"], args["signal_region"], args["split_k"]) == (ctx.half, ctx.tiles_max, ctx.split_k(7168))
    assert kernel.meta["BM"] == bm and kernel.meta["BK"] == bk and kernel.meta["BN"] == SPLIT_K_BN
    assert {p.name for p in fn.params if p.is_constexpr} <= set(kernel.meta)
    assert ctx.split_k_plan(m, 7168) is sequence  # made once per (m, k)
