"""GEMM+ReduceScatter across nodes, overlapped ("push_2d", kernels/gemm/gemm_rs_2d.py), compiles for
sm_90 at every declared topology the GPU tests run: the producer is push's GEMM (stores and
releases, never a wait) with its destinations made node-aware; the reduce kernel's only traffic
between nodes is NVSHMEM's put-with-signal (its transfer path once per other node), it waits once
per node rank for each other node's tiles and for its own, and once per other node's inbox; it
sums in fp32. At one node the producer's code is push's."""

import re

import pytest

from triton_dist.kernels.gemm import dense as gemm_module
from triton_dist.kernels.gemm import gemm_rs as grs
from triton_dist.kernels.gemm import gemm_rs_2d
from triton_dist.tools.compile_check import compile_for_hopper, ptx_calls, put_signal_paths

_SPIN = "ld.acquire.sys.global.u64"
_RELEASE = r"atom\.global\.sys\.release\.exch\.b64|atom\.release\.sys\.global\.exch"
_TOPOLOGIES = [(2, 2), (2, 1), (4, 2), (4, 1), (8, 4), (8, 2)]


def _producer_ptx(config, world, node_ranks):
    c = gemm_module.CONFIGS[config]
    meta = gemm_module.kernel_meta(config, False, epilogue="rows_to_peer", world=world, node_ranks=node_ranks)
    options = {"num_warps": meta.pop("num_warps"), "num_stages": meta.pop("num_stages")}
    signature = {"a_desc": f"tensordesc<bf16[{c['BM']}, {c['BK']}]>",
                 "b_desc": f"tensordesc<bf16[{c['BN']}, {c['BK']}]>", "c_desc": "*bf16", "M": "i32",
                 "N": "i32", "K": "i32", "signals": "*u64", "calls": "*i64", "rank": "i32", "m_per_rank": "i32",
                 "half_elems": "i32", "signal_region": "i32", "out": "*bf16"}
    return compile_for_hopper(grs.gemm_rs_producer_kernel, signature, meta, **options).asm["ptx"]


def _reduce_ptx(config, world, local):
    c = gemm_module.CONFIGS[config]
    meta = dict(WORLD=world, LOCAL=local, BM=c["BM"], BN=c["BN"], GROUP_M=c["GROUP_M"],
                ROWS=max(1, grs.REDUCE_TILE_ELEMS // c["BN"]))
    signature = {"partials": "*bf16", "inbox": "*fp32", "staging": "*fp32", "out": "*bf16", "signals": "*u64",
                 "calls": "*i64", "m": "i32", "N": "i32", "half_elems": "i32", "signal_region": "i32",
                 "inbox_slot": "i32"}
    return compile_for_hopper(gemm_rs_2d.gemm_rs_reduce_2d_kernel, signature, meta, num_warps=8).asm["ptx"]


@pytest.mark.parametrize("world,local", [(4, 2), (8, 4)])
def test_producer_is_push_made_node_aware(world, local):
    ptx = _producer_ptx("small", world, local)
    push = _producer_ptx("small", world, 0)
    assert "wgmma.mma_async" in ptx and _SPIN not in ptx  # the producer never waits
    assert len(re.findall(_RELEASE, ptx)) == len(re.findall(_RELEASE, push)) > 0
    stores = re.findall(r"st\.global[a-z0-9.]*", ptx)
    assert stores and all(".v4." in s for s in stores), stores


def test_node_ranks_only_where_it_means_something():
    with pytest.raises(ValueError, match="node_ranks"):
        gemm_module.kernel_meta("small", False, epilogue="reduce_own", world=4, node_ranks=2)
    assert "NODE_RANKS" not in gemm_module.kernel_meta("small", False, epilogue="rows_to_peer", world=4)


@pytest.mark.parametrize("world,local", _TOPOLOGIES)
def test_reduce_puts_across_and_waits_per_node_rank(world, local):
    ptx = _reduce_ptx("small", world, local)
    nodes = world // local
    assert put_signal_paths(ptx) == nodes - 1, ptx_calls(ptx)
    assert not re.findall(_RELEASE, ptx)  # no NVLink notify: the GEMM's stores carry the node's traffic
    # Per other node a wait per node rank; for the own rows a wait per node rank and per inbox slot.
    # Each wait is two acquire spins.
    assert ptx.count(_SPIN) == 2 * ((nodes - 1) * local + local + (nodes - 1)), ptx.count(_SPIN)
    assert re.search(r"add(\.rn)?\.f32", ptx)  # the sum is taken in fp32


def test_large_config_compiles_across_nodes():
    assert ".target sm_90" in _reduce_ptx("large", 8, 2)


def test_push_2d_is_a_method_but_not_auto():
    from triton_dist.kernels.gemm import policy

    assert "push_2d" in grs.METHODS and grs.PRODUCER_EPILOGUES["push_2d"] == "rows_to_peer"
    assert policy.gemm_rs_method(1024, 2) == "2d"


def _cdiv(a, b):
    return -(-a // b)


@pytest.mark.parametrize("world,local", _TOPOLOGIES + [(16, 4)])
def test_every_signal_has_one_writer_and_every_read_fits(world, local):
    """A model of "push_2d"'s indices (epilogues.partial_destination and the reduce kernel, mirrored;
    the sizes as PushAcrossNodes computes them): per call every signal of the method's pad has one
    writer, each wait names the writer of the data it reads, and no slot runs past its buffer."""
    nodes, bm = world // local, 128
    bn_max = max(c["BN"] for c in gemm_module.CONFIGS.values())
    for max_m, n in ((world * 100, 136), (world * 1027, 1000), (world * 4096, 256)):
        region = _cdiv(_cdiv(max_m, world), bm) * _cdiv(n, 128)  # the context's tiles_per_rank
        inbox_slot = _cdiv(_cdiv(max_m, world), bm) * bm * _cdiv(n, bn_max) * bn_max
        for m in sorted({1, min(129, max_m // world), max_m // world}):
            for bn in sorted({c["BN"] for c in gemm_module.CONFIGS.values()}):
                tiles = _cdiv(m, bm) * _cdiv(n, bn)
                assert tiles <= region and tiles * bm * bn <= inbox_slot
                writers = {}
                for me in range(world):  # the producer GEMMs: destinations interleaved, as in dense.py
                    for tile in range(world * tiles):
                        dest, t = (me + 1 + tile % world) % world, tile // world
                        target = (me // local) * local + dest % local
                        slot = (me % local) * nodes + dest // local
                        assert target // local == me // local and (slot + 1) * m * n <= max_m * n
                        assert (target, slot * region + t) not in writers
                        writers[(target, slot * region + t)] = ("gemm", me, dest, t)
                for me in range(world):  # the reduce kernels' puts (step 2)
                    node, lr = divmod(me, local)
                    for j in range(1, nodes):
                        d, theirs = (node + j) % nodes, nodes - 1 - j
                        for t in range(tiles):
                            for l in range(local):
                                assert writers[(me, (l * nodes + d) * region + t)] == ("gemm", node * local + l,
                                                                                      d * local + lr, t)
                            key = (d * local + lr, world * region + theirs * region + t)
                            assert key not in writers
                            writers[key] = ("put", me, t)
                for me in range(world):  # step 3: my own rows
                    node, lr = divmod(me, local)
                    for t in range(tiles):
                        for l in range(local):
                            assert writers[(me, (l * nodes + node) * region + t)] == ("gemm", node * local + l, me, t)
                        for q in range(nodes - 1):
                            sender = ((node + q + 1) % nodes) * local + lr
                            assert writers[(me, world * region + q * region + t)] == ("put", sender, t)
                assert all(index < (world + nodes - 1) * region for _, index in writers)
