"""The plain GEMM's launches as plans (kernels/gemm/plain_plan.py, what gemm() launches from C++ and
what the GEMM ops replay at one rank): each kernel's runtime arguments in its order with the
operands' TMA descriptors of the config's blocks, its constexprs, the slots a call fills, the
workspace shape of a sliced plan and the plan it falls back to, one plan per shape. Built without
a GPU (no launch)."""

import pytest

from triton_dist.kernels.common.launch_plan import Slot
from triton_dist.kernels.gemm import dense, plain_plan, split_k, wave_tail

DEVICE = "cuda:0"  # a plan keeps its device only to allocate and compare; no GPU is touched here
SMS = 132


def _arguments(plan) -> dict:
    """The plan's kernel arguments by parameter name, checked to be every runtime parameter in
    order, with every constexpr in its keywords."""
    launch = plan.kernel
    fn = launch.kernel.fn
    names = [p.name for p in fn.params if not p.is_constexpr]
    assert len(launch.args) <= len(names)
    missing = [p for p in fn.params if not p.is_constexpr][len(launch.args):]
    assert all(p.has_default for p in missing), [p.name for p in missing]
    assert {p.name for p in fn.params if p.is_constexpr and not p.has_default} <= set(launch.meta)
    return dict(zip(names, launch.args))


def _slot(value, index, block):
    assert isinstance(value, Slot) and value.index == index
    assert value.block == (None if block is None else list(block))


@pytest.mark.parametrize("config", ["large", "small", *dense.SKINNY_CONFIGS])
def test_persistent_plan_is_gemm_kernel_with_three_descriptor_slots(config):
    m, n, k = 256, 1024, 520
    plan = plain_plan.persistent_plan(m, n, k, config, SMS, DEVICE)
    c = dense.config_params(config)
    args = _arguments(plan)
    assert plan.kernel.kernel.fn is dense.gemm_kernel and plan.arity == 3 and plan.partials_shape is None
    _slot(args["a_desc"], 0, (c["BM"], c["BK"]))
    _slot(args["b_desc"], 1, (c["BN"], c["BK"]))
    _slot(args["c_desc"], 2, (c["BM"], c["BN"]))
    assert (args["M"], args["N"], args["K"], args["signals"], args["calls"]) == (m, n, k, None, None)
    assert plan.kernel.grid == dense.grid_for(m, n, config, SMS)
    assert plan.kernel.meta == dense.kernel_meta(config, False)
    assert plain_plan.persistent_plan(m, n, k, config, SMS, DEVICE) is plan


@pytest.mark.parametrize("config", list(split_k.CONFIG_NAMES))
def test_sliced_split_k_plan_takes_a_workspace_and_the_tickets(config):
    m, n, k, slices = 16, 4096, 7168, 4
    plan = plain_plan.split_k_plan(m, n, k, config, SMS, slices, DEVICE)
    c = split_k.config_params(config)
    args = _arguments(plan)
    assert plan.kernel.kernel.fn is split_k.gemm_split_k_kernel and plan.arity == 3
    _slot(args["a_desc"], 0, (c["BM"], c["BK"]))
    _slot(args["b_desc"], 1, (c["BN"], c["BK"]))
    _slot(args["out"], 2, None)
    _slot(args["partials"], 3, None)
    _slot(args["tickets"], 4, None)
    assert (args["M"], args["N"], args["K"], args["split_k"]) == (m, n, k, slices)
    assert plan.partials_shape == (slices, m, n) and plan.kernel.arity == 5
    assert plan.kernel.grid == (min(-(-n // c["BN"]) * slices, SMS), )


def test_wave_tail_plan_cuts_only_a_partial_last_wave():
    c = dense.CONFIGS["small"]
    n = 81 * c["BN"]
    m = 4 * c["BM"]  # 324 tiles on 132 SMs: a last wave of 60
    plan = plain_plan.wave_tail_plan(m, n, 1032, "small_tail_split", SMS, 2, DEVICE)
    args = _arguments(plan)
    assert plan.kernel.kernel.fn is wave_tail.gemm_wave_tail_kernel
    tiles = 4 * 81
    tail = tiles % SMS
    assert (args["full_tiles"], args["split"]) == (tiles - tail, 2)
    assert plan.partials_shape == (2, tail, c["BM"], c["BN"])
    assert plan.one_slice() is plain_plan.persistent_plan(m, n, 1032, "small", SMS, DEVICE)
    # Nothing to cut (one slice, or whole waves): the base config's plan.
    base = plain_plan.persistent_plan(m, n, 1032, "small", SMS, DEVICE)
    assert plain_plan.wave_tail_plan(m, n, 1032, "small_tail_split", SMS, 1, DEVICE) is base
    whole = plain_plan.wave_tail_plan(m, n, 1032, "small_tail_split", tiles // 4, 2, DEVICE)
    assert whole.kernel.kernel.fn is dense.gemm_kernel and whole.partials_shape is None
