"""GEMM+ReduceScatter kernels compile for sm_90: the producer (the persistent GEMM with
``SIGNAL_ROWS``) keeps wgmma and TMA loads, stores each C tile with 16-byte vectors (here or, for
the peer epilogue, through ``symm_at``) and releases its signal at system scope after a CTA
barrier that follows the tile's store, and never spins; the reduce kernel acquire-spins before
loading the partials (loads depend on the waits through the token) and sums them in fp32."""

import re

import pytest

from triton_dist.kernels.gemm import dense as gemm_module
from triton_dist.kernels.gemm import gemm_rs as grs
from triton_dist.kernels.gemm import policy as gemm_policy
from triton_dist.tools.compile_check import (compile_for_hopper, depends_on, ops_matching, results, spill_bytes,
                                             wgmma_serialized)

_SPIN = "ld.acquire.sys.global.u64"
_RELEASE = r"atom\.global\.sys\.release\.exch\.b64|atom\.release\.sys\.global\.exch"
_SMEM_LIMIT = 232448


def _producer(config, peer, dtype="bf16", world=2, reduce_own=False, peer_tma=False, peer_copy_engine=False,
              enter_call=False):
    c = gemm_module.CONFIGS[config]
    if reduce_own:
        epilogue = "reduce_own_ce" if peer_copy_engine else "reduce_own_tma" if peer_tma else "reduce_own"
    else:
        epilogue = "rows_to_peer" if peer else "rows_here"
    meta = gemm_module.kernel_meta(config, False, epilogue=epilogue, world=world, enter_call=enter_call)
    options = {"num_warps": meta.pop("num_warps"), "num_stages": meta.pop("num_stages")}
    signature = {"a_desc": f"tensordesc<{dtype}[{c['BM']}, {c['BK']}]>",
                 "b_desc": f"tensordesc<{dtype}[{c['BN']}, {c['BK']}]>", "c_desc": f"*{dtype}", "M": "i32",
                 "N": "i32", "K": "i32", "signals": "*u64", "calls": "*i64", "rank": "i32", "m_per_rank": "i32",
                 "half_elems": "i32", "signal_region": "i32", "out": f"*{dtype}"}
    if peer_copy_engine:
        signature.update(chunk_n="i32", chunk_flags="*i64", tickets="*i32")
    return compile_for_hopper(grs.gemm_rs_producer_kernel, signature, meta, **options)


def _peer_waits(world):
    """The own tile's waits (and partial loads) in the IR: one per peer, unrolled, up to two
    ranks; beyond, one in a loop over the peers (unrolled, it spilled)."""
    return world - 1 if world <= 2 else 1


def _reduce(config, peer, dtype="bf16", world=2):
    c = gemm_module.CONFIGS[config]
    meta = dict(WORLD=world, BM=c["BM"], BN=c["BN"], GROUP_M=c["GROUP_M"], ROWS=grs.REDUCE_TILE_ELEMS // c["BN"],
                PEER_EPILOGUE=peer)
    signature = {"partials": f"*{dtype}", "out": f"*{dtype}", "signals": "*u64", "calls": "*i64", "m": "i32",
                 "N": "i32", "half_elems": "i32", "signal_region": "i32"}
    return compile_for_hopper(grs.gemm_rs_reduce_kernel, signature, meta, num_warps=8)


def _releases_follow_barriers(ttir: str) -> None:
    """Two releases (a tile's signal is sent one tile late: in the loop, before the next tile's
    store, and once after the loop), each right after a CTA barrier with no other memory or
    synchronising op in between (the barrier makes every thread's stores precede the release),
    and a tile store in the loop."""
    lines = ttir.splitlines()
    releases = [i for i, line in enumerate(lines) if "tt.atomic_rmw" in line and "release" in line]
    assert len(releases) == 2, releases
    for i in releases:
        earlier = [line for line in lines[:i] if re.search(r"gpu\.barrier|tt\.store|tt\.atomic|inline_asm|"
                                                           r"tt\.descriptor_store", line)]
        assert earlier and "gpu.barrier" in earlier[-1], lines[max(0, i - 12):i + 1]
    assert any("tt.store" in line for line in lines[releases[0]:releases[1]])


@pytest.mark.parametrize("peer", [False, True], ids=["pull", "push"])
@pytest.mark.parametrize("config", sorted(gemm_module.CONFIGS))
def test_producer_stores_then_releases(config, peer):
    compiled = _producer(config, peer)
    ptx = compiled.asm["ptx"]
    assert "wgmma.mma_async" in ptx and "cp.async.bulk.tensor" in ptx  # the shared GEMM loop
    assert compiled.metadata.shared <= _SMEM_LIMIT
    assert _SPIN not in ptx  # the producer never waits (the no-deadlock argument)
    assert re.search(_RELEASE, ptx)
    # No TMA store (see the module notes): generic stores, 16-byte vectors.
    assert "cp.async.bulk.tensor.2d.global.shared" not in ptx
    stores = re.findall(r"st\.global[a-z0-9.]*", ptx)
    assert stores and all(".v4." in s for s in stores), stores
    assert "nvshmemi_device_state_d" in ptx  # the signal (and, for push, the tile) goes through symm_at
    _releases_follow_barriers(compiled.asm["ttir"])


@pytest.mark.parametrize("peer", [False, True], ids=["pull", "push"])
@pytest.mark.parametrize("config", sorted(gemm_module.CONFIGS))
def test_reduce_waits_then_sums_in_fp32(config, peer):
    compiled = _reduce(config, peer)
    ttgir = compiled.asm["ttgir"]
    spins = results(ops_matching(ttgir, re.escape(_SPIN)))
    assert len(spins) == 2  # one per rank (world 2), per tile
    loads = [op for op in ops_matching(ttgir, r"tt\.load ") if "tensor<" in op.split(":")[-1]]
    assert len(loads) == 2  # one partial tile per rank
    for load in loads:
        assert depends_on(ttgir, load, spins), f"a partial-tile load does not depend on the waits: {load}"
    assert "tensor<32x128xf32" in ttgir or "tensor<16x256xf32" in ttgir  # fp32 accumulator
    ptx = compiled.asm["ptx"]
    assert "cvt.f32.bf16" in ptx and re.search(r"add(\.rn)?\.f32", ptx)
    assert re.search(r"cvt\.rn\.bf16x2\.f32|cvt\.rn\.bf16\.f32", ptx)  # rounded once, on the way out
    lines = ptx.splitlines()
    first_spin = min(i for i, line in enumerate(lines) if _SPIN in line)
    first_load = min(i for i, line in enumerate(lines) if re.search(r"ld\.global(\.nc)?\.v4", line))
    assert first_spin < first_load
    assert all(".v4." in s for s in re.findall(r"st\.global[a-z0-9.]*", ptx))
    assert "trap;" in ptx  # the waits time out like every dl.wait


def test_fp16_and_world_4_compile():
    assert re.search(_RELEASE, _producer("small", True, "fp16", 4).asm["ptx"])
    ttgir = _reduce("small", False, "fp16", 4).asm["ttgir"]
    assert len(ops_matching(ttgir, re.escape(_SPIN))) == 4


def test_meta_and_blocks():
    meta = gemm_module.kernel_meta("large", False, epilogue="rows_to_peer", world=2)
    assert meta["EPILOGUE"] == "rows_to_peer" and meta["WORLD"] == 2 and not meta["WAIT_FOR_ROWS"]
    assert "EPILOGUE" not in gemm_module.kernel_meta("large", False)  # the plain GEMM's launch is unchanged
    bm, bn = grs._config_blocks()
    assert bm == 128 and bn == min(c["BN"] for c in gemm_module.CONFIGS.values())
    assert grs.METHODS == ("auto", "fused", "fused_tma", "fused_ce", "push", "pull", "2d", "push_2d")
    assert gemm_policy.GEMM_RS_METHOD in grs.METHODS[1:]
    assert gemm_policy.gemm_rs_method(64, nodes=2) == "2d" and gemm_policy.gemm_rs_method(64) != "2d"
    assert set(grs.PRODUCER_EPILOGUES) == set(grs.METHODS) - {"auto", "2d"}  # 2d: the plain GEMM
    assert set(grs.PRODUCER_EPILOGUES.values()) < set(gemm_module.EPILOGUES)
    with pytest.raises(ValueError, match="epilogue must be one of"):
        gemm_module.kernel_meta("large", False, epilogue="reduce_own_nvlink")


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("config", sorted(gemm_module.CONFIGS))
def test_fused_producer_sums_own_tiles_after_waiting(config, world):
    """The fused method: peers' tiles pushed and released as in push; its own tiles wait for every
    peer's signal (one acquire spin each) before loading that peer's partial, add in fp32, and the
    GEMM loop is the same wgmma/TMA loop."""
    compiled = _producer(config, True, world=world, reduce_own=True)
    ptx, ttgir = compiled.asm["ptx"], compiled.asm["ttgir"]
    assert "wgmma.mma_async" in ptx and "cp.async.bulk.tensor" in ptx
    assert not wgmma_serialized(ptx)
    assert compiled.metadata.shared <= _SMEM_LIMIT
    assert re.search(_RELEASE, ptx)
    spins = results(ops_matching(ttgir, re.escape(_SPIN)))
    assert len(spins) == _peer_waits(world)
    loads = [op for op in ops_matching(ttgir, r"tt\.load ") if "tensor<" in op.split(":")[-1]]
    assert len(loads) == _peer_waits(world)  # one partial tile per peer
    for load in loads:
        assert depends_on(ttgir, load, spins), f"a partial-tile load does not depend on the waits: {load}"
    stores = re.findall(r"st\.global[a-z0-9.]*", ptx)
    assert stores and all(".v4." in s for s in stores), stores
    assert "trap;" in ptx
    # Its launch plan (GemmReduceScatterContext.fused_plan, replayed by eager calls) installs no
    # global scratch: the kernel must ask for none.
    assert compiled.metadata.global_scratch_size == 0


@pytest.mark.parametrize("world", [2, 8])
@pytest.mark.parametrize("config", sorted(gemm_module.CONFIGS))
def test_fused_producer_entering_its_call_spills_no_more(config, world):
    """``"fused"``'s plan (GemmReduceScatterContext.fused_plan): the GEMM takes its epoch from
    enter_call, one acq_rel add at GPU scope on the counter's count before any partial tile is
    stored, and spills no more than the bumped variant (ptxas, sm_90a: the same bytes at 2-8 ranks
    when written)."""
    entering = _producer(config, True, world=world, reduce_own=True, enter_call=True)
    plain = _producer(config, True, world=world, reduce_own=True)
    ptx = entering.asm["ptx"]
    assert spill_bytes(ptx) == spill_bytes(plain.asm["ptx"])
    assert not wgmma_serialized(ptx) and entering.metadata.global_scratch_size == 0
    lines = ptx.splitlines()
    entry = [i for i, line in enumerate(lines) if re.search(r"atom\.global\.gpu\.acq_rel\.add\.u64", line)]
    stores = [i for i, line in enumerate(lines) if "st.global.v4" in line]
    assert len(entry) == 1 and stores and entry[0] < min(stores)
    assert entering.asm["ttir"].count("tt.load %calls") == 1  # enter_call's, the only read of the counter


@pytest.mark.parametrize("config", sorted(gemm_module.CONFIGS))
def test_fused_tma_producer_waits_for_its_tma_stores_before_each_release(config):
    """fused_tma: the peers' tiles leave by TMA store through a descriptor built on the device
    (global scratch), and before each release (one tile late, and after the loop) every thread
    waits for its bulk stores to complete and fences the async proxy, then a CTA barrier."""
    compiled = _producer(config, True, reduce_own=True, peer_tma=True)
    ptx, ttir = compiled.asm["ptx"], compiled.asm["ttir"]
    assert compiled.metadata.global_scratch_size > 0  # the device-built descriptor
    assert compiled.metadata.shared <= _SMEM_LIMIT
    assert "cp.async.bulk.tensor.2d.global.shared" in ptx and "tensormap.replace" in ptx
    lines = ttir.splitlines()
    releases = [i for i, line in enumerate(lines) if "tt.atomic_rmw" in line and "release" in line]
    assert len(releases) == 2
    for i in releases:
        earlier = [line for line in lines[:i] if re.search(r"gpu\.barrier|tt\.store|tt\.atomic|inline_asm|"
                                                           r"tt\.descriptor_store", line)]
        assert "gpu.barrier" in earlier[-1], earlier[-3:]
        waited = max(j for j, line in enumerate(earlier) if "cp.async.bulk.wait_group 0" in line)
        assert not any("descriptor_store" in line for line in earlier[waited:]), earlier[waited:]
    spins = results(ops_matching(compiled.asm["ttgir"], re.escape(_SPIN)))
    assert len(spins) == 1  # the own tiles' wait for the one peer


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("config", sorted(gemm_module.CONFIGS))
def test_fused_ce_producer_stages_locally_and_counts_chunks(config, world):
    """fused_ce: the same wgmma/TMA loop (not serialised); no per-tile signal is released to a peer
    (the one system-scope release is the chunk flag for the copy stream); each peer tile's
    chunk count is an acq_rel atomic right after a CTA barrier that follows the tile's store, and
    the chunk's flag a system-scope release; own tiles wait (one acquire spin per peer) before
    loading that peer's partial."""
    compiled = _producer(config, False, world=world, reduce_own=True, peer_copy_engine=True)
    ptx, ttir, ttgir = compiled.asm["ptx"], compiled.asm["ttir"], compiled.asm["ttgir"]
    assert "wgmma.mma_async" in ptx and "cp.async.bulk.tensor" in ptx
    assert not wgmma_serialized(ptx)
    assert compiled.metadata.shared <= _SMEM_LIMIT
    lines = ttir.splitlines()
    # Counted one tile late: in the loop (before the next tile's store) and once after it.
    tickets = [i for i, line in enumerate(lines) if "tt.atomic_rmw" in line and "add" in line and "acq_rel" in line]
    assert len(tickets) == 2, [line for line in lines if "atomic_rmw" in line]
    for i in tickets:
        earlier = [line for line in lines[:i] if re.search(r"gpu\.barrier|tt\.store|tt\.atomic|inline_asm", line)]
        assert "gpu.barrier" in earlier[-1], earlier[-3:]
    assert any("tt.store" in line for line in lines[tickets[0]:tickets[1]])
    flags = [line for line in lines if "tt.atomic_rmw" in line and "exch" in line and "release" in line]
    assert len(flags) == 2 and all("sys" in line for line in flags), flags
    spins = results(ops_matching(ttgir, re.escape(_SPIN)))
    assert len(spins) == _peer_waits(world)
    loads = [op for op in ops_matching(ttgir, r"tt\.load ") if "tensor<" in op.split(":")[-1]]
    assert len(loads) == _peer_waits(world)
    for load in loads:
        assert depends_on(ttgir, load, spins), f"a partial-tile load does not depend on the waits: {load}"
    stores = re.findall(r"st\.global[a-z0-9.]*", ptx)
    assert stores and all(".v4." in s for s in stores), stores


@pytest.mark.parametrize("m", [1, 100, 512, 4096, 8192])
def test_fused_ce_chunks_cover_every_tile_once(m):
    """The host's chunks (count and copy regions) and the kernel's chunk numbering
    (:func:`triton_dist.kernels.gemm.epilogues.copy_chunk`, mirrored here) agree: every tile of a destination falls in exactly one
    chunk, whose copy region holds exactly that chunk's tiles; the regions tile ``[0, m) x [0, n)``;
    each chunk holds the tile count the kernel expects; there are at least ``CE_MIN_CHUNKS`` of
    them where there are that many tiles, and never more than the signal region has room for."""
    for config, n in (("large", 28672), ("small", 4096), ("large", 2056)):
        c = gemm_module.CONFIGS[config]
        chunk_n, chunks = grs.copy_engine_chunking(m, n, 2, config)
        local_m, num_n = -(-m // c["BM"]), -(-n // c["BN"])
        per_group = -(-num_n // chunk_n)
        tiles_of = {}
        for pid_m in range(local_m):
            for pid_n in range(num_n):
                chunk = (pid_m // c["GROUP_M"]) * per_group + pid_n // chunk_n
                tiles_of.setdefault(chunk, set()).add((pid_m, pid_n))
        assert sorted(tiles_of) == list(range(chunks)), (config, n, chunk_n)
        area = 0
        for chunk, tiles in tiles_of.items():
            group, j = divmod(chunk, per_group)
            group_m = min(local_m - group * c["GROUP_M"], c["GROUP_M"])
            assert len(tiles) == group_m * (min(num_n, (j + 1) * chunk_n) - j * chunk_n)
            r0, r1, c0, c1 = grs.copy_engine_chunk_region(chunk, m, n, chunk_n, config)
            assert 0 <= r0 < r1 <= m and 0 <= c0 < c1 <= n
            in_region = {(pm, pn) for pm in range(local_m) for pn in range(num_n)
                         if r0 <= pm * c["BM"] < r1 and c0 <= pn * c["BN"] < c1}
            assert in_region == tiles, (config, n, chunk)
            area += (r1 - r0) * (c1 - c0)
        assert area == m * n  # disjoint regions (each holds only its own tiles) covering every element
        groups = -(-local_m // c["GROUP_M"])
        assert min(grs.CE_MIN_CHUNKS, groups * num_n) <= chunks <= local_m * num_n


@pytest.mark.parametrize("world", [4, 8])
@pytest.mark.parametrize("config", sorted(gemm_module.CONFIGS))
def test_own_tile_sum_does_not_spill_at_more_ranks(config, world):
    """fused and fused_ce sum the peers' partials in a loop beyond two ranks: unrolled, ptxas
    spilled 0.8 KB a thread at 4 ranks and 3.3 KB at 8 (128x256 tiles)."""
    for copy_engine in (False, True):
        ptx = _producer(config, not copy_engine, world=world, reduce_own=True, peer_copy_engine=copy_engine).asm["ptx"]
        stores, loads = spill_bytes(ptx)
        assert stores <= 256 and loads <= 256, (config, world, copy_engine, stores, loads)
