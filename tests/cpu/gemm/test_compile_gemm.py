"""The persistent GEMM, the split-K GEMM and the AllGather+GEMM kernels compile for sm_90: wgmma and
TMA in the plain GEMM and in the consumer, and in the consumer an acquire spin that every TMA load
of A depends on (through the descriptor's token), issued before the first load; the split-K GEMM
with B's rows on wgmma's M side, no spills, its partials read only after the ticket that collects
them; the producer's signal kernels release and acquire at system scope. Host-side rules (config
and slice choice) need no GPU."""

import inspect
import re

import pytest
import triton

from triton_dist.kernels.gemm import ag_gemm as allgather_gemm
from triton_dist.kernels.gemm import dense as gemm_module
from triton_dist.kernels.gemm import split_k as split_k_module
from triton_dist.tools.compile_check import (compile_for_hopper, depends_on, ops_matching, results, spill_bytes,
                                             ticket_order_problems, wgmma_serialized)

_SPIN = "ld.acquire.sys.global.u64"
_RELEASE = r"atom\.global\.sys\.release\.exch\.b64|atom\.release\.sys\.global\.exch"
_SMEM_LIMIT = 232448  # bytes of shared memory one program may use on sm_90


def _compile(config, dtype, wait_for_rows, node_ranks=0, push_world=0):
    c = gemm_module.config_params(config)
    meta = gemm_module.kernel_meta(config, wait_for_rows, node_ranks=node_ranks, world=max(push_world, 1),
                                   push_shard=push_world > 0)
    options = {"num_warps": meta.pop("num_warps"), "num_stages": meta.pop("num_stages")}
    signature = {"a_desc": f"tensordesc<{dtype}[{c['BM']}, {c['BK']}]>",
                 "b_desc": f"tensordesc<{dtype}[{c['BN']}, {c['BK']}]>",
                 "c_desc": f"tensordesc<{dtype}[{c['BM']}, {c['BN']}]>", "M": "i32", "N": "i32", "K": "i32",
                 "rank": "i32", "m_per_rank": "i32"}
    if wait_for_rows:
        kernel = allgather_gemm.ag_gemm_consumer_kernel
        signature.update(signals="*u64", calls="*i64")
        if push_world:
            signature.update(tickets="*i32", shard=f"*{dtype}", gathered=f"*{dtype}")
    else:
        kernel = gemm_module.gemm_kernel
        meta.update(signals=None, calls=None)
    return compile_for_hopper(kernel, signature, meta, **options)


@pytest.mark.parametrize("config,dtype", [(c, d) for c in sorted(gemm_module.CONFIGS) for d in ("bf16", "fp16")] +
                         [(c, "bf16") for c in sorted(gemm_module.SKINNY_CONFIGS)])
def test_plain_gemm_uses_wgmma_and_tma(config, dtype):
    compiled = _compile(config, dtype, False)
    ptx = compiled.asm["ptx"]
    assert "wgmma.mma_async" in ptx
    assert "cp.async.bulk.tensor" in ptx
    assert _SPIN not in ptx
    assert compiled.metadata.shared <= _SMEM_LIMIT
    # Pipelined: NUM_STAGES - 1 TMA loads of A (and of B) in flight before the loop.
    ttgir = compiled.asm["ttgir"]
    loads = ops_matching(ttgir, r"async_tma_copy_global_to_local")
    assert len(loads) >= 2 * gemm_module.config_params(config)["NUM_STAGES"]



@pytest.mark.parametrize("node_ranks", [0, 2])  # 2: the walk across nodes of two ranks ("sm_2d")
@pytest.mark.parametrize("config", sorted(gemm_module.CONFIGS))
def test_consumer_loads_of_a_depend_on_the_wait(config, node_ranks):
    compiled = _compile(config, "bf16", True, node_ranks)
    ptx = compiled.asm["ptx"]
    assert "wgmma.mma_async" in ptx and "cp.async.bulk.tensor" in ptx
    assert not wgmma_serialized(ptx)  # the wait's timeout path must not make a call
    assert compiled.metadata.shared <= _SMEM_LIMIT
    ttgir = compiled.asm["ttgir"]
    spins = results(ops_matching(ttgir, re.escape(_SPIN)))
    assert len(spins) == 1  # one wait per tile, outside the pipelined K loop
    loads = ops_matching(ttgir, r"async_tma_copy_global_to_local")
    a_loads = [op for op in loads if "%a_desc[" in op]
    b_loads = [op for op in loads if "%b_desc[" in op]
    assert len(a_loads) >= gemm_module.CONFIGS[config]["NUM_STAGES"] and len(a_loads) == len(b_loads)
    for load in a_loads:
        assert depends_on(ttgir, load, spins), f"a TMA load of A does not depend on the wait: {load}"
    lines = ptx.splitlines()
    first_spin = min(i for i, line in enumerate(lines) if _SPIN in line)
    first_load = min(i for i, line in enumerate(lines) if "cp.async.bulk.tensor.2d.shared::cluster.global" in line)
    assert first_spin < first_load
    # The acquired data reaches TMA's async proxy through a proxy fence after the spin.
    fence = min(i for i, line in enumerate(lines) if "fence.proxy.async.global" in line)
    assert first_spin < fence < first_load
    # The wait reports and traps on timeout like every dl.wait.
    assert "trap;" in ptx


@pytest.mark.parametrize("world", [1, 2, 4])
@pytest.mark.parametrize("config", sorted(gemm_module.CONFIGS))
def test_one_launch_consumer_pushes_its_rows_before_its_tiles(config, world):
    """sm_push_inline's one launch: the epoch from enter_call (an acq_rel ticket at GPU scope on
    the counter's count), the push's shares claimed at run time (relaxed GPU-scope adds on one
    counter, before the loop and at its end, and the last claimant's reset of it), this rank's rows
    into its own slot (16-byte stores, before any wait), a GPU-scope ticket and release for the own
    slot's ready, then sm_push's per-peer protocol (an ack and a ready released at system scope per
    peer, a system-scope ticket per peer), and the tiles' TMA loads of A still behind a wait; no
    spills beyond the plain consumer's."""
    peers = world - 1
    compiled = _compile(config, "bf16", True, push_world=world)
    ptx = compiled.asm["ptx"]
    assert "wgmma.mma_async" in ptx and "cp.async.bulk.tensor" in ptx
    assert not wgmma_serialized(ptx)
    assert compiled.metadata.shared <= _SMEM_LIMIT
    plain = spill_bytes(_compile(config, "bf16", True).asm["ptx"])
    assert all(ours <= theirs for ours, theirs in zip(spill_bytes(ptx), plain)), (spill_bytes(ptx), plain)
    assert len(re.findall(_RELEASE, ptx)) == 2 * peers
    assert len(re.findall(r"atom\.global\.gpu\.release|atom\.release\.gpu\.global", ptx)) == 1
    gpu_tickets = re.findall(r"atom\.(?:global\.)?(?:gpu\.)?acq_rel\.(?:gpu\.)?(?:global\.)?add", ptx)
    assert len(gpu_tickets) == 2, gpu_tickets  # the call's entry and the own slot's copy
    sys_tickets = re.findall(r"atom\.(?:global\.)?sys\.acq_rel\.(?:global\.)?add|"
                             r"atom\.acq_rel\.sys\.(?:global\.)?add", ptx)
    assert len(sys_tickets) == peers, sys_tickets
    claims = re.findall(r"atom\.global\.gpu\.relaxed\.add\.u32 %r\d+, \[ (%rd\d+) \+ 0 \]", ptx)
    assert len(claims) == 2 and claims[0] == claims[1], claims
    assert re.search(rf"atom\.global\.gpu\.relaxed\.exch\.b32 %r\d+, \[ {claims[0]} \+ 0 \]", ptx)
    lines = ptx.splitlines()
    first_store = min(i for i, line in enumerate(lines) if "st.global.v4" in line)
    assert first_store < min(i for i, line in enumerate(lines) if _SPIN in line)
    ttgir = compiled.asm["ttgir"]
    spins = results(ops_matching(ttgir, re.escape(_SPIN)))
    a_loads = [op for op in ops_matching(ttgir, r"async_tma_copy_global_to_local") if "%a_desc[" in op]
    assert a_loads and all(depends_on(ttgir, load, spins) for load in a_loads)


@pytest.mark.parametrize("world", [1, 2, 4])  # 1: protocol_on_one_rank
def test_signal_kernels_release_and_acquire_at_the_right_scopes(world):
    # Push: 0 marks the own rows, acknowledges and waits, 1 signals a peer. Pull: 2 marks the own
    # rows and waits for the previous shard's copies, 3 publishes, 4 waits for a peer's shard, 5
    # marks the peer's rows and acknowledges. Each wait is a spin of two acquire loads.
    peers = world - 1
    waits = {0: peers, 1: 0, 2: peers, 3: 0, 4: 1, 5: 0}
    sys_releases = {0: peers, 1: 1, 2: 0, 3: peers, 4: 0, 5: 1}
    gpu_releases = {0: 1, 1: 0, 2: 1, 3: 0, 4: 0, 5: 1}
    for phase in range(6):
        ptx = compile_for_hopper(allgather_gemm.ag_gemm_signal_kernel, {"signals": "*u64", "calls": "*i64",
                                                                         "peer": "i32"},
                                 dict(PHASE=phase, WORLD=world), num_warps=1).asm["ptx"]
        assert len(re.findall(_RELEASE, ptx)) == sys_releases[phase], phase
        gpu = re.findall(r"atom\.global\.gpu\.release|atom\.release\.gpu\.global", ptx)
        assert len(gpu) == gpu_releases[phase], phase
        assert ptx.count(_SPIN) == 2 * waits[phase], phase
    assert allgather_gemm.METHODS == ("ce_push", "ce_pull", "sm_push", "sm_2d", "sm_push_inline")


@pytest.mark.parametrize("world", [1, 2, 4])
def test_push_kernel_releases_each_peers_rows_after_storing_them(world):
    """sm_push: program 0's local ready (GPU scope) and one ack per peer (system scope); per peer
    an acquire wait for its ack before the stores (16-byte vectors, through the wait's token),
    then a system-scope acq_rel ticket and, in the last program, the peer's ready (system-scope
    release)."""
    peers = world - 1
    compiled = compile_for_hopper(allgather_gemm.ag_gemm_push_kernel,
                                  {"gathered": "*bf16", "signals": "*u64", "calls": "*i64", "tickets": "*i32",
                                   "n": "i32"}, dict(WORLD=world, BLOCK=allgather_gemm.PUSH_BLOCK), num_warps=8)
    ptx = compiled.asm["ptx"]
    assert len(re.findall(_RELEASE, ptx)) == 2 * peers
    assert len(re.findall(r"atom\.global\.gpu\.release|atom\.release\.gpu\.global", ptx)) == 1
    assert ptx.count(_SPIN) == 2 * peers
    tickets = re.findall(r"atom\.(?:global\.)?(?:sys\.)?acq_rel\.(?:sys\.)?(?:global\.)?add", ptx)
    assert len(tickets) == peers, tickets
    if peers:
        lines = ptx.splitlines()
        stores = [i for i, line in enumerate(lines) if "st.global" in line]
        assert any("st.global.v4" in lines[i] for i in stores)  # 16-byte stores on the unmasked path
        assert min(i for i, line in enumerate(lines) if _SPIN in line) < min(stores)


@pytest.mark.parametrize("world", [1, 2, 4])
def test_inline_push_kernel_enters_its_call_and_copies_its_own_rows_first(world):
    """sm_push_inline: the call's epoch from enter_call (one acq_rel ticket on the counter's
    count, at GPU scope) instead of a bump; this rank's rows into its own slot (16-byte loads and
    stores, no wait before them); then sm_push's protocol: the same releases, waits and
    per-peer tickets as :func:`ag_gemm_push_kernel`."""
    peers = world - 1
    compiled = compile_for_hopper(allgather_gemm.ag_gemm_push_inline_kernel,
                                  {"shard": "*bf16", "gathered": "*bf16", "signals": "*u64", "calls": "*i64",
                                   "tickets": "*i32", "n": "i32"}, dict(WORLD=world, BLOCK=allgather_gemm.PUSH_BLOCK),
                                  num_warps=8)
    ptx = compiled.asm["ptx"]
    assert len(re.findall(_RELEASE, ptx)) == 2 * peers
    assert len(re.findall(r"atom\.global\.gpu\.release|atom\.release\.gpu\.global", ptx)) == 1
    assert ptx.count(_SPIN) == 2 * peers
    sys_tickets = re.findall(r"atom\.(?:global\.)?(?:sys\.)?acq_rel\.sys\.(?:global\.)?add|"
                             r"atom\.(?:global\.)?sys\.acq_rel\.(?:global\.)?add|"
                             r"atom\.acq_rel\.sys\.(?:global\.)?add", ptx)
    assert len(sys_tickets) == peers, sys_tickets
    lines = ptx.splitlines()
    stores = [i for i, line in enumerate(lines) if "st.global.v4" in line]
    assert stores  # the own slot's copy, 16-byte vectors
    if peers:
        assert min(stores) < min(i for i, line in enumerate(lines) if _SPIN in line)  # own rows before any wait
    body = inspect.getsource(allgather_gemm.ag_gemm_push_inline_kernel.fn.fn).split('"""')[-1]
    assert body.count("enter_call(calls)") == 1 and "tl.load(calls" not in body


def test_plain_gemm_rule_follows_the_measured_configs():
    # gemm()'s default (bench/results/h200-x1/gemm.json, 132 SMs): split-K with the smallest block
    # holding the rows up to 128 rows (the 64-wide tiles while they fit in one wave), then the
    # config with the least work in its waves of tiles.
    rule = gemm_module.pick_gemm_config
    assert [rule(m, 4096, 7168, 132) for m in (1, 16, 17, 32, 33, 64, 65, 128)] == \
        ["split_k_m16"] * 2 + ["split_k_m32"] * 2 + ["split_k_m64"] * 2 + ["split_k_m128_n64"] * 2
    assert rule(128, 8192, 8192, 132) == "split_k_m128_n64"  # 128 narrow tiles: one wave
    assert rule(128, 14336, 8192, 132) == "split_k_m128"  # 224 narrow tiles would take two
    assert rule(1024, 4096, 7168, 132) == "large"  # 128 tiles, one wave (small: two)
    assert rule(1024, 14336, 8192, 132) == "small"  # large: 3.4 waves run as 4; small: 6.8 as 7
    assert rule(1024, 8192, 14336, 132) == "large"
    for n in (4096, 8192):
        assert rule(8192, n, 8192, 132) == "large"
    assert rule(8192, 14336, 8192, 132) == "large_tail_split"  # its last wave of 20 tiles cut in 4
    for m in (1, 100, 129, 5000):
        assert rule(m, 4096, 4096, 78) in gemm_module.config_names()


def test_config_rule():
    assert gemm_module.pick_config(8192, 14336, 8192, 131) == "large"
    assert gemm_module.pick_config(1000, 512, 768, 132) == "small"
    assert gemm_module.pick_config(2048, 1024, 1024, 131) == "small"
    assert gemm_module.grid_for(1000, 512, "small", 131) == (32, )
    assert gemm_module.grid_for(8192, 14336, "large", 131) == (131, )
    # Decode-sized M: the narrowest 64-row tiles whose count fits the SMs, one read of B per SM.
    assert gemm_module.pick_skinny_config(1, 4096, 132) == "skinny_n32"
    assert gemm_module.pick_skinny_config(64, 8192, 132) == "skinny_n64"
    assert gemm_module.pick_skinny_config(16, 16384, 132) == "skinny_n128"
    assert gemm_module.pick_skinny_config(1, 65536, 132) == "skinny_n128"
    assert gemm_module.pick_skinny_config(65, 4096, 132) is None
    assert gemm_module.grid_for(1, 4096, "skinny_n32", 132) == (128, )
    with pytest.raises(ValueError, match="unknown config"):
        gemm_module.config_params("huge")
    for name in gemm_module.CONFIGS:
        meta = gemm_module.kernel_meta(name, True)
        assert meta["WAIT_FOR_ROWS"] and meta["num_stages"] == meta["NUM_STAGES"]


def _compile_split_k(config, dtype="bf16"):
    c = gemm_module.config_params(config)
    signature = {"a_desc": f"tensordesc<{dtype}[{c['BM']}, {c['BK']}]>",
                 "b_desc": f"tensordesc<{dtype}[{c['BN']}, {c['BK']}]>", "out": f"*{dtype}", "partials": "*fp32",
                 "tickets": "*i32", "M": "i32", "N": "i32", "K": "i32", "split_k": "i32"}
    meta = dict(BM=c["BM"], BN=c["BN"], BK=c["BK"], NUM_STAGES=c["NUM_STAGES"])
    return compile_for_hopper(split_k_module.gemm_split_k_kernel, signature, meta, num_warps=c["num_warps"])


@pytest.mark.parametrize("config,dtype", [(c, "bf16") for c in split_k_module.CONFIG_NAMES] + [("split_k_m16", "fp16")])
def test_split_k_gemm_uses_wgmma_without_spills(config, dtype):
    """B's rows on wgmma's M side (``m64n<BM>``), a pipelined TMA loop that ptxas does not
    serialise, no spills, 16-byte stores."""
    c = gemm_module.config_params(config)
    compiled = _compile_split_k(config, dtype)
    ptx = compiled.asm["ptx"]
    assert re.search(rf"wgmma\.mma_async\.sync\.aligned\.m64n{c['BM']}k16", ptx)
    assert "cp.async.bulk.tensor" in ptx
    assert not wgmma_serialized(ptx)
    assert spill_bytes(ptx) == (0, 0), config
    assert compiled.metadata.shared <= _SMEM_LIMIT
    loads = ops_matching(compiled.asm["ttgir"], r"async_tma_copy_global_to_local")
    assert len(loads) >= 2 * c["NUM_STAGES"]
    assert all(".v4." in op for op in re.findall(r"st\.global[a-z0-9.]*", ptx))


def test_split_k_gemm_reads_partials_after_the_ticket():
    """Each program stores its fp32 partial, then a CTA barrier and one acq_rel add at GPU scope
    (the ticket); Triton hands its result to every thread through shared memory behind a barrier;
    only then, in the last program, the relaxed reset and the partials' loads, summed in fp32 and
    rounded once into ``out``."""
    compiled = _compile_split_k("split_k_m16")
    assert ticket_order_problems(compiled) == []
    ttir = compiled.asm["ttir"].splitlines()
    stores = [line for line in ttir if "tt.store" in line]
    assert len([line for line in stores if "bf16>>" in line]) == 2  # one slice: straight out; several: the sum


def test_split_k_configs():
    names = split_k_module.CONFIG_NAMES
    assert list(names) == ["split_k_m16", "split_k_m32", "split_k_m64", "split_k_m128", "split_k_m128_n64"]
    for name, bm in names.items():
        c = gemm_module.config_params(name)
        bn = 64 if name in split_k_module.NARROW_CONFIGS else split_k_module.SPLIT_K_BN
        assert c["BM"] == bm and c["BN"] == bn and name in gemm_module.config_names()
        with pytest.raises(ValueError, match="split-K kernel"):
            gemm_module.kernel_meta(name, False)
        with pytest.raises(ValueError, match="split-K kernel"):
            gemm_module.grid_for(1, 4096, name, 132)
    # GEMM+AllReduce's split_k runs the same table.
    from triton_dist.kernels.gemm import gemm_ar

    assert gemm_ar.SPLIT_K_CONFIGS is split_k_module.SPLIT_K_CONFIGS and gemm_ar.SPLIT_K_BN == 128
    assert [split_k_module.block_for(m) for m in (1, 16, 17, 64, 65, 128)] == [16, 16, 32, 64, 128, 128]
    with pytest.raises(ValueError, match="at most 128"):
        split_k_module.block_for(129)


def test_split_k_slice_rule():
    """Issue 22's decode rows as measured on one H100 (bench/results/h100-x1/gemm.json,
    ``slices_us``): a few rows cut K only until about half the SMs stream B (64 programs), 128-row
    tiles until the SMs are full, and never into a second wave that costs more than it saves."""
    pick = split_k_module.pick_split_k
    assert pick(1, 4096, 7168, 132, "split_k_m32") == 2  # 32 n-tiles x 2 (measured best of 1-8)
    assert pick(16, 8192, 14336, 132, "split_k_m32") == 1  # 64 n-tiles (1 ran 3 % faster than 2)
    assert pick(16, 8192, 8192, 132, "split_k_m32") == 1
    assert pick(1, 14336, 8192, 132, "split_k_m32") == 1
    assert pick(128, 4096, 7168, 132, "split_k_m128_n64") == 2  # 64 n-tiles x 2 fill the SMs
    for n, k in ((8192, 14336), (8192, 8192), (14336, 8192)):
        assert pick(128, n, k, 132, "split_k_m128_n64") == 1
    assert pick(1, 65536, 8192, 132) == 1  # 512 n-tiles: the SMs are full without slices
    assert pick(1, 4096, 256, 132) == 1  # 2 K steps: too short to cut
    for config, bm in split_k_module.CONFIG_NAMES.items():
        c = gemm_module.config_params(config)
        for m in {1, 7, 16, 32, 64, 128} & set(range(1, bm + 1)):
            for n in (512, 1024, 4096, 8192, 14336, 28672, 106496):
                for k in (128, 512, 1024, 4096, 8192, 14336, 53248):
                    for sms in (78, 132):
                        steps, tiles = triton.cdiv(k, c["BK"]), triton.cdiv(n, c["BN"])
                        s = pick(m, n, k, sms, config)
                        assert 1 <= s <= split_k_module.MAX_SLICES
                        assert s == 1 or steps // s >= split_k_module.MIN_SLICE_STEPS, (m, n, k, s)
                        if steps < 2 * split_k_module.MIN_SLICE_STEPS:
                            assert s == 1
                        # Slices give B streams to idle SMs: at a long K, n-tiles short of the
                        # streaming share get slices up to at least most of it.
                        share = split_k_module.STREAMING_SHARE[bm] * sms
                        if steps >= 64 and tiles * split_k_module.MAX_SLICES >= share:
                            assert tiles * s >= 0.6 * share or tiles >= share, (config, m, n, k, sms, s)
    with pytest.raises(ValueError, match="unknown config"):
        pick(1, 4096, 4096, 132, "skinny_n32")

