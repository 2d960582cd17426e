"""The MoE grouped GEMM compiles for sm_90 with the dense GEMM's pipelined TMA + wgmma K loop, in
both row layouts and both dtypes, within the shared memory of one program, without spills, and
stores only through masked stores (no TMA store, whose box could cross into another expert's
rows). Host-side rules (config choice, row checks, argument errors) need no GPU."""

import pytest

from triton_dist import ops
from triton_dist.kernels.gemm import dense as gemm_module
from triton_dist.kernels.moe import group_gemm as gg
from triton_dist.tools.compile_check import compile_for_hopper, ops_matching, spill_bytes, wgmma_serialized

_SMEM_LIMIT = 232448  # bytes of shared memory one program may use on sm_90


def _compile(config, dtype, padded):
    c = gemm_module.config_params(config)
    signature = {"a_desc": f"tensordesc<{dtype}[{c['BM']}, {c['BK']}]>",
                 "w_desc": f"tensordesc<{dtype}[{c['BN']}, {c['BK']}]>", "c": f"*{dtype}", "ends": "*i32",
                 "num_experts": "i32", "total_rows": "i32", "capacity": "i32", "N": "i32", "K": "i32"}
    meta = dict(BM=c["BM"], BN=c["BN"], BK=c["BK"], GROUP_M=c["GROUP_M"], NUM_STAGES=c["NUM_STAGES"], PADDED=padded)
    return compile_for_hopper(gg.group_gemm_kernel, signature, meta, num_warps=c["num_warps"],
                              num_stages=c["NUM_STAGES"])


@pytest.mark.parametrize("padded", [False, True], ids=["packed", "padded"])
@pytest.mark.parametrize("config,dtype", [(c, "bf16") for c in gg.CONFIGS] + [("small", "fp16")])
def test_pipelined_wgmma_and_masked_stores(config, dtype, padded):
    compiled = _compile(config, dtype, padded)
    ptx = compiled.asm["ptx"]
    assert "wgmma.mma_async" in ptx and not wgmma_serialized(ptx)
    assert "cp.async.bulk.tensor" in ptx
    assert "cp.async.bulk.tensor.2d.global.shared" not in ptx  # no TMA store
    assert compiled.metadata.shared <= _SMEM_LIMIT
    assert spill_bytes(ptx) == (0, 0)
    # The dense GEMM's pipeline: NUM_STAGES - 1 loads of A and of W ahead of the loop, one each inside.
    loads = ops_matching(compiled.asm["ttgir"], r"async_tma_copy_global_to_local")
    assert len(loads) >= 2 * gemm_module.config_params(config)["NUM_STAGES"]
    assert "@%p" in ptx and "st.global" in ptx  # predicated (masked) stores


def test_plain_grouped_gemm_rule_follows_the_measured_configs():
    # bench/results/h100-x1/group_gemm.json (132 SMs): 128x256 tiles on every prefill row, N = 1536
    # included; decode keeps the 64-row tiles.
    rule = gg.pick_group_gemm_config
    assert rule(rows=32768, experts=128, n=1536, num_sms=132) == "large"  # Qwen3 up, pick_config: "small"
    assert gg.pick_config(rows=32768, experts=128, n=1536, num_sms=132) == "small"
    for rows, experts, n in ((8192, 8, 14336), (8192, 8, 4096), (32768, 128, 2048), (8192, 32, 4096)):
        assert rule(rows=rows, experts=experts, n=n, num_sms=132) == "large"
    for rows, experts, n in ((128, 8, 14336), (1024, 128, 1536), (256, 32, 7168)):
        assert rule(rows=rows, experts=experts, n=n, num_sms=132) == "skinny_n128"
    assert rule(rows=1024, experts=8, n=512, num_sms=132) == "small"  # 24 128x256 tiles: one thin wave


def test_config_rule():
    # Decode: a few rows per expert take the 64-row tiles.
    assert gg.pick_config(rows=8 * 64, experts=8, n=4096, num_sms=132) == "skinny_n128"
    assert gg.pick_config(rows=37, experts=16, n=256, num_sms=132) == "skinny_n128"
    # Prefill: wide N with enough 128x256 tiles, else 128x128.
    assert gg.pick_config(rows=16384, experts=8, n=4096, num_sms=132) == "large"
    assert gg.pick_config(rows=16384, experts=8, n=1024, num_sms=132) == "small"
    assert gg.pick_config(rows=1024, experts=8, n=2048, num_sms=132) == "small"  # 128-row tiles, too few wide ones
    assert set(gg.CONFIGS) <= set(gemm_module.CONFIGS) | set(gemm_module.SKINNY_CONFIGS)


def test_row_checks():
    gg._check_rows([0, 3, 3, 10], False, 10, 0)  # an empty expert is fine
    with pytest.raises(ValueError, match=r"non-decreasing.*offsets\[2\] = 2 is below 5"):
        gg._check_rows([1, 5, 2, 10], False, 10, 0)
    gg._check_rows([1, 5, 9], False, 10, 0)  # the last row unused (a dropped pair sorted last)
    with pytest.raises(ValueError, match="at most at x's 10 rows, got offsets\\[-1\\] = 11"):
        gg._check_rows([1, 5, 11], False, 10, 0)
    with pytest.raises(ValueError, match=r"offsets\[0\] = -1 is below 0"):
        gg._check_rows([-1, 5, 10], False, 10, 0)
    gg._check_rows([], False, 3, 0)  # no experts: nothing to compute
    gg._check_rows([0, 16, 7], True, 48, 16)
    gg._check_rows([], True, 0, 16)
    with pytest.raises(ValueError, match=r"in \[0, 16\]"):
        gg._check_rows([0, 17, 7], True, 48, 16)


def test_offsets_or_counts_without_a_gpu():
    for kwargs in ({}, {"offsets": object(), "counts": object()}):
        with pytest.raises(ValueError, match="exactly one of offsets"):
            ops.group_gemm(object(), object(), **kwargs)
