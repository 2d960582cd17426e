"""The persistent GEMM and the AllGather+GEMM kernels compile for sm_90: wgmma and TMA in the plain
GEMM and in the consumer, and in the consumer an acquire spin that every TMA load of A depends on
(through the descriptor's token), issued before the first load; the producer's signal kernels
release and acquire at system scope. Host-side rules (config choice) need no GPU."""

import re

import pytest

from triton_dist.kernels.gemm import ag_gemm as allgather_gemm
from triton_dist.kernels.gemm import dense as gemm_module
from triton_dist.tools.compile_check import compile_for_hopper, depends_on, ops_matching, results, wgmma_serialized

_SPIN = "ld.acquire.sys.global.u64"
_RELEASE = r"atom\.global\.sys\.release\.exch\.b64|atom\.release\.sys\.global\.exch"
_SMEM_LIMIT = 232448  # bytes of shared memory one program may use on sm_90


def _compile(config, dtype, wait_for_rows, node_ranks=0):
    c = gemm_module.config_params(config)
    meta = gemm_module.kernel_meta(config, wait_for_rows, node_ranks=node_ranks)
    options = {"num_warps": meta.pop("num_warps"), "num_stages": meta.pop("num_stages")}
    signature = {"a_desc": f"tensordesc<{dtype}[{c['BM']}, {c['BK']}]>",
                 "b_desc": f"tensordesc<{dtype}[{c['BN']}, {c['BK']}]>",
                 "c_desc": f"tensordesc<{dtype}[{c['BM']}, {c['BN']}]>", "M": "i32", "N": "i32", "K": "i32",
                 "rank": "i32", "m_per_rank": "i32"}
    if wait_for_rows:
        kernel = allgather_gemm.ag_gemm_consumer_kernel
        signature.update(signals="*u64", calls="*i64")
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
    assert allgather_gemm.METHODS == ("ce_push", "ce_pull", "sm_push", "sm_2d")


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
