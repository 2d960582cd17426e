"""The ReduceScatter kernels (push, ring) compile for sm_90 for fp32 and bf16 and worlds of 2 and 4,
spin with acquire loads (one wait per peer or ring step), publish with release atomics, read
x's shards with 16-byte vectors when the shard size allows it, and accumulate bf16 in fp32."""

import re

import pytest

from triton_dist.kernels.collectives import reduce_scatter
from triton_dist.tools.compile_check import compile_for_hopper, ptx_calls

_SPIN = "ld.acquire.sys.global.u64"
_RELEASE = r"atom\.global\.sys\.release\.exch\.b64|atom\.release\.sys\.global\.exch"
_LD_V4 = r"ld\.global(\.[a-z0-9]+)*\.v4\.b32"
_ST_V4 = r"st\.global(\.[a-z0-9]+)*\.v4\.b32"
_VEC = {"fp32": 4, "bf16": 8}


def _meta(world, vec):
    return {"WORLD": world, "BLOCK": 2048, "VEC": vec}


def _push(dt, world=2, vec=None):
    return compile_for_hopper(reduce_scatter.reduce_scatter_push_kernel,
                              {"x": f"*{dt}", "out": f"*{dt}", "stage": f"*{dt}", "signals": "*u64",
                               "shard_vecs": "i32", "shard_tiles": "i32", "calls": "*i64", "half_tiles": "i32",
                               "max_programs": "i32"},
                              _meta(world, _VEC[dt] if vec is None else vec),
                              num_warps=8).asm["ptx"]


def _ring(dt, world=2, vec=None):
    return compile_for_hopper(reduce_scatter.reduce_scatter_ring_kernel,
                              {"x": f"*{dt}", "out": f"*{dt}", "inbox": "*fp32", "signals": "*u64",
                               "shard_vecs": "i32", "shard_tiles": "i32", "calls": "*i64", "half_tiles": "i32",
                               "max_programs": "i32"},
                              _meta(world, _VEC[dt] if vec is None else vec),
                              num_warps=8).asm["ptx"]


def _check(ptx, waits, notifies):
    assert ".target sm_90" in ptx
    assert not [c for c in ptx_calls(ptx) if c.startswith("nvshmem")], ptx_calls(ptx)
    # Each dl.wait spins with two acquire loads (the first try, then the timed loop).
    assert ptx.count(_SPIN) == 2 * waits, ptx.count(_SPIN)
    assert len(re.findall(_RELEASE, ptx)) == notifies
    assert re.search(_LD_V4, ptx)
    assert re.search(_ST_V4, ptx)


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("dt", ["fp32", "bf16"])
def test_push_compiles(dt, world):
    _check(_push(dt, world), waits=world - 1, notifies=world - 1)


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("dt", ["fp32", "bf16"])
def test_ring_compiles(dt, world):
    _check(_ring(dt, world), waits=world - 1, notifies=world - 1)


def test_shard_divisibility_vectorises_x():
    """With VEC = 16 // itemsize the shards of x are read with 16-byte vectors; with VEC = 1 (an
    odd shard size) only the tile-aligned staging buffer can be."""
    aligned = len(re.findall(_LD_V4, _push("bf16", vec=8)))
    odd = len(re.findall(_LD_V4, _push("bf16", vec=1)))
    assert aligned > odd, (aligned, odd)


@pytest.mark.parametrize("kernel", [_push, _ring])
def test_bf16_accumulates_in_fp32(kernel):
    ptx = kernel("bf16")
    assert re.search(r"add(\.rn)?\.f32", ptx)
    assert "cvt.rn.bf16" in ptx  # rounded once, at the end
    assert not re.search(r"add(\.rn)?\.bf16", ptx)


def test_methods():
    from triton_dist.kernels import ReduceScatterContext

    assert ReduceScatterContext.METHODS == ("auto", "push", "ring", "ll", "2d")
    # An input of LL_MAX_BYTES fits the LL slots of any world size (each holds one shard).
    assert ReduceScatterContext.LL_MAX_BYTES % (4 * 8) == 0


def test_reduce_scatter_needs_init():
    from triton_dist import ops

    with pytest.raises(RuntimeError, match="init"):
        ops.reduce_scatter(object())
