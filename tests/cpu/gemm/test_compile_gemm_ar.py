"""GEMM+AllReduce compiles for sm_90, both methods: a pipelined wgmma/TMA loop, fp32 tiles stored
to the ranks with 16-byte vectors, one release per rank (the own rank included) each after a CTA
barrier, then acquire spins (one per rank up to two ranks for output_tiles; one in a loop for
more ranks and for split_k) with every partial-tile load depending on them, a sum in fp32 and one
rounding on the way out. Host-side rules of the context need no GPU."""

import re

import pytest

from triton_dist.kernels.gemm import dense as gemm_module
from triton_dist.kernels.gemm import gemm_ar as gemm_all_reduce
from triton_dist.kernels.gemm import policy as gemm_policy
from triton_dist.tools.compile_check import (compile_for_hopper, depends_on, ops_matching, results, spill_bytes,
                                             wgmma_serialized)

_SPIN = "ld.acquire.sys.global.u64"
_RELEASE = r"atom\.global\.sys\.release\.exch\.b64|atom\.release\.sys\.global\.exch"
_SMEM_LIMIT = 232448


def _compile(config, world, dtype="bf16", enter_call=False):
    c = gemm_module.config_params(config)
    meta = gemm_module.kernel_meta(config, False, epilogue="all_reduce", world=world, enter_call=enter_call)
    options = {"num_warps": meta.pop("num_warps"), "num_stages": meta.pop("num_stages")}
    signature = {"a_desc": f"tensordesc<{dtype}[{c['BM']}, {c['BK']}]>",
                 "b_desc": f"tensordesc<{dtype}[{c['BN']}, {c['BK']}]>", "c_desc": "*fp32", "M": "i32", "N": "i32",
                 "K": "i32", "signals": "*u64", "calls": "*i64", "rank": "i32", "m_per_rank": "i32",
                 "half_elems": "i32", "signal_region": "i32", "out": f"*{dtype}"}
    return compile_for_hopper(gemm_all_reduce.gemm_ar_kernel, signature, meta, **options)


@pytest.mark.parametrize("world", [1, 2, 4])  # 1: protocol_on_one_rank
@pytest.mark.parametrize("config", [gemm_all_reduce.CONFIG] + sorted(gemm_module.SKINNY_CONFIGS))
def test_pushes_signals_then_waits_and_sums(config, world):
    compiled = _compile(config, world)
    # The fp32 partial goes to world - 1 peers (its own stays in registers); beyond two ranks, one
    # wait and load in a loop over the ranks.
    _assert_pushes_then_waits(compiled, world, pushes=world - 1, waits=world if world <= 2 else 1)
    if world > 1:
        assert "nvshmemi_device_state_d" in compiled.asm["ptx"]  # peers' buffers through symm_at


def _assert_pushes_then_waits(compiled, world, *, pushes, waits, enters=False):
    """The protocol both methods share: a pipelined wgmma/TMA loop; ``pushes`` fp32 tile stores,
    then one release per rank, each right after a CTA barrier; ``waits`` acquire spins, after the
    releases (signalled before waiting: the no-deadlock argument), every partial-tile load
    depending on one; 16-byte stores; one rounding on the way out; waits that time out.
    ``enters``: the kernel also stores its epoch into the call counter (one 8-byte store)."""
    ptx, ttgir, ttir = compiled.asm["ptx"], compiled.asm["ttgir"], compiled.asm["ttir"]
    assert "wgmma.mma_async" in ptx and "cp.async.bulk.tensor" in ptx
    assert not wgmma_serialized(ptx)
    assert compiled.metadata.shared <= _SMEM_LIMIT
    lines = ttir.splitlines()
    releases = [i for i, line in enumerate(lines) if "tt.atomic_rmw" in line and "release" in line]
    assert len(releases) == world
    for i in releases:
        earlier = [line for line in lines[:i] if re.search(r"gpu\.barrier|tt\.store|tt\.atomic|inline_asm", line)]
        assert earlier and "gpu.barrier" in earlier[-1]
    stores_before = [line for line in lines[:releases[0]] if "tt.store" in line and
                     not (enters and "tt.store %calls," in line)]
    assert len(stores_before) == pushes and all("f32" in line for line in stores_before)
    spins = results(ops_matching(ttgir, re.escape(_SPIN)))
    assert len(spins) == waits
    loads = [op for op in ops_matching(ttgir, r"tt\.load ") if "tensor<" in op.split(":")[-1]]
    assert len(loads) == waits
    for load in loads:
        assert depends_on(ttgir, load, spins), f"a partial-tile load does not depend on the waits: {load}"
    first_spin = min(i for i, line in enumerate(lines) if "inline_asm" in line and "ld.acquire" in line)
    assert first_spin > releases[-1]
    stores = re.findall(r"st\.global[a-z0-9.]*", ptx)
    if enters:
        stores.remove("st.global.b64")  # the counter's epoch
    assert all(".v4." in s for s in stores)
    assert re.search(r"cvt\.rn\.bf16x2\.f32|cvt\.rn\.bf16\.f32", ptx)
    assert "trap;" in ptx


def test_meta():
    meta = gemm_module.kernel_meta("small", False, epilogue="all_reduce", world=4)
    assert meta["EPILOGUE"] == "all_reduce" and meta["WORLD"] == 4
    assert "EPILOGUE" not in gemm_module.kernel_meta("small", False)  # the plain GEMM's launch is unchanged


@pytest.mark.parametrize("world", [4, 8])
@pytest.mark.parametrize("config", [gemm_all_reduce.CONFIG] + sorted(gemm_module.SKINNY_CONFIGS))
def test_sum_does_not_spill_at_more_ranks(config, world):
    """Beyond two ranks the partials are summed in a loop: unrolled, ptxas spilled ~3 KB a thread
    at 8 ranks (small and skinny_n128 tiles)."""
    stores, loads = spill_bytes(_compile(config, world).asm["ptx"])
    assert stores <= 256 and loads <= 256, (config, world, stores, loads)


@pytest.mark.parametrize("world", [2, 4, 8])
@pytest.mark.parametrize("config", sorted(gemm_all_reduce.OUTPUT_TILES_ENTER_CONFIGS))
def test_output_tiles_entering_its_call_spills_no_more(config, world):
    """The output_tiles configs that enter their call (one launch): the entry's ticket before the
    first partial is stored, the spills of the bumped variant, the same protocol."""
    entering, plain = _compile(config, world, enter_call=True), _compile(config, world)
    ptx = entering.asm["ptx"]
    assert spill_bytes(ptx) == spill_bytes(plain.asm["ptx"]), config
    lines = ptx.splitlines()
    entry = [i for i, line in enumerate(lines) if re.search(r"atom\.global\.gpu\.acq_rel\.add\.u64", line)]
    stores = [i for i, line in enumerate(lines) if "st.global.v4" in line]
    assert len(entry) == 1 and stores and entry[0] < min(stores)
    _assert_pushes_then_waits(entering, world, pushes=world - 1, waits=world if world <= 2 else 1, enters=True)


def _compile_split_k(bm, world, dtype="bf16", enter=False):
    c = gemm_all_reduce.SPLIT_K_CONFIGS[bm]
    signature = {"a_desc": f"tensordesc<{dtype}[{bm}, {c['BK']}]>",
                 "b_desc": f"tensordesc<{dtype}[{gemm_all_reduce.SPLIT_K_BN}, {c['BK']}]>", "partials": "*fp32",
                 "out": f"*{dtype}", "signals": "*u64", "calls": "*i64", "M": "i32", "N": "i32", "K": "i32",
                 "rank": "i32", "half_elems": "i32", "signal_region": "i32", "split_k": "i32"}
    meta = dict(WORLD=world, BM=bm, BN=gemm_all_reduce.SPLIT_K_BN, BK=c["BK"], NUM_STAGES=c["NUM_STAGES"],
                ENTER=enter)
    return compile_for_hopper(gemm_all_reduce.gemm_ar_split_k_kernel, signature, meta, num_warps=c["num_warps"])


@pytest.mark.parametrize("world", [1, 2, 8])
@pytest.mark.parametrize("bm", sorted(gemm_all_reduce.SPLIT_K_CONFIGS))
def test_split_k_pushes_signals_then_waits_and_sums(bm, world):
    """split_k: B's rows are the MMA's M side (``acc [128, BM]``: wgmma's N is ``BM``); the fp32
    partial goes to every rank, its own included; the waits and loads sit in one loop over (rank,
    slice); no spills to speak of (96 bytes at 128 rows and 8 ranks)."""
    compiled = _compile_split_k(bm, world)
    assert re.search(rf"wgmma\.mma_async\.sync\.aligned\.m64n{bm}k16", compiled.asm["ptx"])
    stores, loads = spill_bytes(compiled.asm["ptx"])
    assert stores <= 128 and loads <= 128, (bm, world, stores, loads)
    _assert_pushes_then_waits(compiled, world, pushes=world, waits=1)


@pytest.mark.parametrize("world", [1, 2, 8])
@pytest.mark.parametrize("bm", [bm for bm in sorted(gemm_all_reduce.SPLIT_K_CONFIGS)
                                if bm <= gemm_all_reduce.SPLIT_K_ENTER_MAX_BM])
def test_split_k_entering_its_call_spills_nothing_and_keeps_the_protocol(bm, world):
    """The ENTER variant (one launch a call): the entry's ticket (one acq_rel add at GPU scope on
    the counter's count) before the first partial is stored, no spills, the same pushes and waits."""
    compiled = _compile_split_k(bm, world, enter=True)
    ptx = compiled.asm["ptx"]
    assert re.search(rf"wgmma\.mma_async\.sync\.aligned\.m64n{bm}k16", ptx)
    assert spill_bytes(ptx) == (0, 0), bm
    lines = ptx.splitlines()
    entry = [i for i, line in enumerate(lines) if re.search(r"atom\.global\.gpu\.acq_rel\.add\.u64", line)]
    stores = [i for i, line in enumerate(lines) if "st.global.v4" in line]  # the fp32 partials
    assert len(entry) == 1 and stores and entry[0] < min(stores)
    _assert_pushes_then_waits(compiled, world, pushes=world, waits=1, enters=True)


def test_split_k_rules():
    """The host's choices need no GPU: the smallest block holding M, slices that fill the SMs
    without exceeding SPLIT_K_MAX or leaving a slice under four K steps, and auto's measured rule
    (output_tiles at 33-64 rows and past 128)."""
    ctx = gemm_all_reduce.GemmAllReduceContext.__new__(gemm_all_reduce.GemmAllReduceContext)
    assert [ctx.split_k_block(m) for m in (1, 16, 17, 32, 33, 64, 65, 128)] == [16, 16, 32, 32, 64, 64, 128, 128]
    ctx.num_sms = 132
    for n, k, want in ((4096, 7168, 4), (8192, 14336, 2), (16384, 26624, 1), (4096, 1024, 2), (4096, 256, 1),
                       (65536, 8192, 1)):
        ctx.n = n
        assert ctx.split_k(k) == want, (n, k)
    assert gemm_all_reduce.SPLIT_K_MAX_M == max(gemm_all_reduce.SPLIT_K_CONFIGS)
    rule = {m: gemm_policy.gemm_ar_method(m, gemm_all_reduce.SPLIT_K_MAX_M) for m in (1, 16, 32, 33, 64, 65, 128, 129, 4096)}
    assert rule == {1: "split_k", 16: "split_k", 32: "split_k", 33: "output_tiles", 64: "output_tiles",
                    65: "split_k", 128: "split_k", 129: "output_tiles", 4096: "output_tiles"}
