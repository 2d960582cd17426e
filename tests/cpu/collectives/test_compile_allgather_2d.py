"""AllGather across nodes, then within (method "2d", kernels/collectives/allgather_2d.py) compiles
for sm_90 at every declared topology the GPU tests run, and only NVSHMEM's put-with-signal
crosses nodes: NVSHMEM inlines its NVLink path and calls its transfer path (a proxy, InfiniBand)
once per other node, never at one node; the release notifies of NVLink stores go only to the
ranks of the node.
"""

import re

import pytest

from triton_dist.kernels.collectives import allgather_2d, policy
from triton_dist.kernels.common import chunks
from triton_dist.tools.compile_check import compile_for_hopper, ptx_calls, put_signal_paths

_SPIN = "ld.acquire.sys.global.u64"
_RELEASE = r"atom\.global\.sys\.release\.exch\.b64|atom\.release\.sys\.global\.exch"


def _ptx(world, local, dt="bf16", aligned=True):
    return compile_for_hopper(allgather_2d.all_gather_2d_kernel,
                              {"x": f"*{dt}", "out": f"*{dt}", "gathered": f"*{dt}", "signals": "*u64", "n": "i32",
                               "chunk": "i32", "calls": "*i64", "slot_tiles": "i32", "max_programs": "i32",
                               "ready": "i32"},
                              dict(WORLD=world, LOCAL=local,
                                   ELEMENT_BYTES={"bf16": 2, "fp32": 4}[dt], BLOCK=2048, ALIGNED=aligned),
                              num_warps=8).asm["ptx"]


@pytest.mark.parametrize("world,local", [(2, 2), (4, 2), (4, 1), (8, 4), (8, 2), (2, 1)])
def test_only_puts_cross_nodes(world, local):
    ptx = _ptx(world, local)
    nodes = world // local
    assert put_signal_paths(ptx) == nodes - 1, ptx_calls(ptx)
    # Step 1 notifies the node's other ranks of this rank's chunk, step 3 of each other node's.
    assert len(re.findall(_RELEASE, ptx)) == (local - 1) * nodes
    # A wait (two acquire spins: the first try, the timed loop) per other rank: the counterparts
    # on the other nodes in step 3, every rank of another local index in step 4.
    assert ptx.count(_SPIN) == 2 * (world - 1), ptx.count(_SPIN)


def test_fp32_and_unaligned_compile():
    assert ".target sm_90" in _ptx(4, 2, "fp32", aligned=False)


@pytest.mark.parametrize("n,max_programs", [(1, 128), (2048, 128), (2049, 128), (10 ** 6, 128), (10 ** 6, 7),
                                            (5 * 2048, 3)])
def test_chunks_cover_every_element_once(n, max_programs):
    chunk, programs = chunks.chunk_and_grid(n, max_programs, 2048)
    assert chunk % 2048 == 0 and 1 <= programs <= max_programs
    assert (programs - 1) * chunk < n <= programs * chunk


def test_auto_takes_2d_across_nodes_only():
    assert policy.all_gather_method(1 << 10, 1 << 16, nodes=2) == "ll_2d"
    assert policy.all_gather_method(1 << 30, 1 << 16, True, nodes=4) == "2d"
    assert policy.all_gather_method(1 << 10, 1 << 16, nodes=1) == "ll"


def _ll_ptx(world, local, dt="bf16"):
    return compile_for_hopper(allgather_2d.all_gather_ll_2d_kernel,
                              {"x": f"*{dt}", "out": f"*{dt}", "ll": "*i64", "n": "i32", "words": "i32",
                               "calls": "*i64", "ll_slot": "i32"},
                              dict(WORLD=world, LOCAL=local, BLOCK_W=512,
                                   ELEMS={"bf16": 2, "fp32": 1}[dt]), num_warps=8).asm["ptx"]


@pytest.mark.parametrize("world,local", [(2, 2), (4, 2), (4, 1), (8, 4), (8, 2)])
@pytest.mark.parametrize("dt", ["bf16", "fp32"])
def test_ll_2d_crosses_nodes_only_by_puts_and_has_no_signals(world, local, dt):
    """LL across nodes: NVSHMEM's transfer path once per other node (the put loop), no signal
    atomic of ours, no acquire spin (the flags are in the words: relaxed system-scope loads)."""
    ptx = _ll_ptx(world, local, dt)
    nodes = world // local
    transfers = [c for c in ptx_calls(ptx) if "nvshmemi_transfer" in c]
    assert len(transfers) == nodes - 1, ptx_calls(ptx)
    assert not re.findall(_RELEASE, ptx)
    assert _SPIN not in ptx
    assert "ld.relaxed.sys.global" in ptx
