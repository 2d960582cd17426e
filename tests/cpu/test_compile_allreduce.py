"""The AllReduce kernels (one-shot, two-shot) compile for sm_90 for fp32 and bf16, spin with
acquire loads, publish with release atomics, and copy with 16-byte vectors; ops.all_reduce
validates its arguments before touching the GPU."""

import re

import pytest

from triton_dist.kernels import allreduce
from triton_dist.tools.compile_check import compile_for_hopper, ptx_calls

_META = {"WORLD": 2, "HALF": 4 * 2048, "MAX_PROGRAMS": 128, "BLOCK": 2048}
_SPIN = "ld.acquire.sys.global.u64"
_RELEASE = r"atom\.global\.sys\.release\.exch\.b64|atom\.release\.sys\.global\.exch"


def _one_shot(dt, world=2):
    return compile_for_hopper(allreduce.all_reduce_one_shot_kernel,
                              {"x": f"*{dt}", "out": f"*{dt}", "stage": f"*{dt}", "signals": "*u64", "n": "i32",
                               "epoch_ptr": "*i64"}, dict(_META, WORLD=world), num_warps=8).asm["ptx"]


def _two_shot(dt, world=2):
    return compile_for_hopper(allreduce.all_reduce_two_shot_kernel,
                              {"x": f"*{dt}", "out": f"*{dt}", "stage": f"*{dt}", "gather": f"*{dt}",
                               "signals": "*u64", "n": "i32", "epoch_ptr": "*i64", "shard_tiles": "i32"},
                              dict(_META, WORLD=world), num_warps=8).asm["ptx"]


def _check(ptx, waits, notifies):
    assert ".target sm_90" in ptx
    assert not [c for c in ptx_calls(ptx) if c.startswith("nvshmem")], ptx_calls(ptx)
    # Each dl.wait spins with two acquire loads (the first try, then the timed loop).
    assert ptx.count(_SPIN) == 2 * waits, ptx.count(_SPIN)
    assert len(re.findall(_RELEASE, ptx)) == notifies
    # Whole tiles are copied with 16-byte vectors (the masked tail tile may use scalars).
    assert re.search(r"ld\.global(\.[a-z0-9]+)*\.v4\.b32", ptx)
    assert re.search(r"st\.global(\.[a-z0-9]+)*\.v4\.b32", ptx)


@pytest.mark.parametrize("dt", ["fp32", "bf16"])
def test_one_shot_compiles(dt):
    _check(_one_shot(dt), waits=1, notifies=1)


@pytest.mark.parametrize("dt", ["fp32", "bf16"])
def test_two_shot_compiles(dt):
    _check(_two_shot(dt), waits=2, notifies=2)


def test_world_of_four_waits_and_notifies_per_peer():
    _check(_one_shot("bf16", world=4), waits=3, notifies=3)
    _check(_two_shot("bf16", world=4), waits=6, notifies=6)


def test_bf16_accumulates_in_fp32():
    ptx = _one_shot("bf16")
    assert re.search(r"cvt\.f32\.bf16|cvt\.rn\.f32\.bf16|mov\.b32 .*\{.*\}", ptx) or "add.f32" in ptx
    assert re.search(r"add(\.rn)?\.f32", ptx)
    assert "cvt.rn.bf16" in ptx  # rounded once, at the end


def test_all_reduce_needs_init():
    from triton_dist import ops

    with pytest.raises(RuntimeError, match="init"):
        ops.all_reduce(object())
