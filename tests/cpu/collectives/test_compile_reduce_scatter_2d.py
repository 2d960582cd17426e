"""ReduceScatter within nodes, then across (method "2d", kernels/collectives/reduce_scatter_2d.py)
compiles for sm_90 at every declared topology the GPU tests run; only NVSHMEM's put-with-signal
crosses nodes (its transfer path called once per other node), NVLink notifies go only to the
node's ranks, and a rank waits once for each of its node's ranks and once per other node."""

import re

import pytest

from triton_dist.kernels.collectives import policy, reduce_scatter_2d
from triton_dist.tools.compile_check import compile_for_hopper, ptx_calls, put_signal_paths

_SPIN = "ld.acquire.sys.global.u64"
_RELEASE = r"atom\.global\.sys\.release\.exch\.b64|atom\.release\.sys\.global\.exch"


def _ptx(world, local, dt="bf16", vec=8):
    return compile_for_hopper(reduce_scatter_2d.reduce_scatter_2d_kernel,
                              {"x": f"*{dt}", "out": f"*{dt}", "stage": f"*{dt}", "inbox": "*fp32",
                               "partials": "*fp32", "signals": "*u64", "shard_vecs": "i32", "chunk": "i32",
                               "shard_tiles": "i32", "calls": "*i64", "half_tiles": "i32",
                               "inbox_half_tiles": "i32", "max_programs": "i32"},
                              dict(WORLD=world, LOCAL=local, BLOCK=2048, VEC=vec),
                              num_warps=8).asm["ptx"]


@pytest.mark.parametrize("world,local", [(2, 2), (4, 2), (4, 1), (8, 4), (8, 2), (2, 1)])
def test_only_puts_cross_nodes(world, local):
    ptx = _ptx(world, local)
    nodes = world // local
    assert put_signal_paths(ptx) == nodes - 1, ptx_calls(ptx)
    assert len(re.findall(_RELEASE, ptx)) == local - 1  # step 1: one notify per other rank of the node
    assert ptx.count(_SPIN) == 2 * ((local - 1) + (nodes - 1)), ptx.count(_SPIN)


def test_fp32_without_vectors_compiles():
    assert ".target sm_90" in _ptx(4, 2, "fp32", vec=1)


def test_auto_takes_2d_across_nodes_only():
    assert policy.reduce_scatter_method(1 << 20, 4, nodes=2) == "2d"
    assert policy.reduce_scatter_method(1 << 20, 4) == policy.REDUCE_SCATTER_METHOD != "2d"
