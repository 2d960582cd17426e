"""AllGather+GEMM's producer across nodes ("sm_2d", kernels/gemm/ag_gemm_2d.py) compiles for sm_90
at the declared topologies the GPU tests run, with the protocol's shape: one NVSHMEM put-with-signal
per other node (its transfer path called once each), NVLink releases only to the node's ranks (the
acks, and each forwarded or own block of rows' ready), a ticket per (rows, node peer), and one wait
per ack or landed block."""

import re

import pytest

from triton_dist.kernels.gemm import ag_gemm, ag_gemm_2d, policy
from triton_dist.tools.compile_check import compile_for_hopper, ptx_calls, put_signal_paths

_SPIN = "ld.acquire.sys.global.u64"
_RELEASE = r"atom\.global\.sys\.release\.exch\.b64|atom\.release\.sys\.global\.exch"
_TICKET = r"atom\.(?:global\.)?(?:sys\.)?acq_rel\.(?:sys\.)?(?:global\.)?add"


@pytest.mark.parametrize("world,local", [(2, 2), (2, 1), (4, 2), (4, 1), (8, 4), (8, 2)])
def test_producer_protocol_per_topology(world, local):
    ptx = compile_for_hopper(ag_gemm_2d.ag_gemm_push_2d_kernel,
                             {"gathered": "*bf16", "signals": "*u64", "calls": "*i64", "tickets": "*i32", "n": "i32"},
                             dict(WORLD=world, LOCAL=local, ELEMENT_BYTES=2, BLOCK=ag_gemm.PUSH_BLOCK),
                             num_warps=8).asm["ptx"]
    nodes = world // local
    assert put_signal_paths(ptx) == nodes - 1, ptx_calls(ptx)
    # Acks to the node's other ranks, then a ready per block of rows (own + one per other node) and peer.
    assert len(re.findall(_RELEASE, ptx)) == (local - 1) * (1 + nodes)
    assert len(re.findall(_TICKET, ptx)) == (local - 1) * nodes
    # Waits: an ack per other node (the put), per node peer (own rows), and per other node one
    # landed block plus an ack per node peer (forwarding); each is two acquire spins.
    assert ptx.count(_SPIN) == 2 * ((nodes - 1) + (local - 1) + (nodes - 1) * local)


def test_auto_producer_across_nodes():
    assert policy.ag_gemm_method(1) == "ce_push"
    assert policy.ag_gemm_method(2) == "sm_2d"


def _own_node_first(pid_m, num_m, rank, m, bm, local):
    """kernels/gemm/tile.py's own_node_first, mirrored (Triton's integer ops on non-negative ints)."""
    node_rows = local * m
    own_start = -(-(rank // local) * node_rows // bm)
    p = (pid_m + own_start) % num_m
    node = p * bm // node_rows
    start = -(-node * node_rows // bm)
    end = min(-(-(node + 1) * node_rows // bm), num_m)
    first = (node * local + rank % local) * m // bm
    return start + (p - start + max(first - start, 0)) % (end - start)


@pytest.mark.parametrize("world,local", [(2, 2), (2, 1), (4, 2), (4, 1), (8, 4), (8, 2), (16, 4)])
def test_consumer_walks_own_node_first(world, local):
    """The consumer's m-tile order across nodes: every m-tile once; this node's tiles (a tile is
    the node's of its first row) first, then the other nodes in order from the next; within a
    node, from the tile of the rank at this rank's local index; at one node the plain rotation."""
    for bm in (64, 128):
        for m in (1, 7, 64, 100, 128, 129, 256, 1000, 4096):
            num_m = -(-world * m // bm)
            for rank in range(world):
                order = [_own_node_first(i, num_m, rank, m, bm, local) for i in range(num_m)]
                assert sorted(order) == list(range(num_m)), (world, local, m, bm, rank)
                if local == world:
                    assert order == [(i + rank * m // bm) % num_m for i in range(num_m)]
                nodes = [(t * bm // (local * m) - rank // local) % (world // local) for t in order]
                assert nodes == sorted(nodes), (world, local, m, bm, rank, order)
                for d in sorted(set(nodes)):
                    tiles = [t for t, n in zip(order, nodes) if n == d]
                    source = ((rank // local + d) % (world // local)) * local + rank % local
                    if m % bm == 0:  # tiles align with ranks' rows: the walk starts at that rank's first tile
                        assert tiles[0] == source * m // bm, (world, local, m, bm, rank, d, tiles)
