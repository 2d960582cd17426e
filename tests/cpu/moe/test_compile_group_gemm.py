"""The MoE grouped GEMM compiles for sm_90 with the dense GEMM's pipelined TMA + wgmma K loop, in
both row layouts and both dtypes, within the shared memory of one program, without spills, and
stores only through masked stores (no TMA store, whose box could cross into another expert's
rows); so do the swapped decode configs (the weights' rows on wgmma's M side, the split-K GEMM's
table), routed by name to their own kernel. Host-side rules (config choice, row checks, argument
errors) need no GPU."""

import re

import pytest

from triton_dist import ops
from triton_dist.kernels.gemm import dense as gemm_module
from triton_dist.kernels.gemm import split_k as split_k_module
from triton_dist.kernels.moe import group_gemm as gg
from triton_dist.kernels.moe import group_gemm_swapped as swapped
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


def _compile_swapped(config, dtype, padded, **extra):
    c = swapped.config_params(config)
    signature = {"a_desc": f"tensordesc<{dtype}[{c['BM']}, {c['BK']}]>",
                 "w_desc": f"tensordesc<{dtype}[{c['BN']}, {c['BK']}]>", "c": f"*{dtype}", "ends": "*i32",
                 "num_experts": "i32", "total_rows": "i32", "capacity": "i32", "N": "i32", "K": "i32"}
    if extra:
        signature["timeline"] = "*i64"
    meta = swapped.kernel_meta(config, padded) | extra
    options = {"num_warps": meta.pop("num_warps"), "num_stages": meta.pop("num_stages")}
    return compile_for_hopper(swapped.group_gemm_swapped_kernel, signature, meta, **options)


@pytest.mark.parametrize("padded", [False, True], ids=["packed", "padded"])
@pytest.mark.parametrize("config,dtype", [(c, "bf16") for c in swapped.CONFIG_NAMES] + [("swapped_m16", "fp16")])
def test_swapped_configs_put_the_weights_on_wgmmas_m_side(config, dtype, padded):
    """``m64n<BM>``: the weights' rows are wgmma's M, the expert's rows its N; the split-K GEMM's
    pipeline (NUM_STAGES - 1 loads of each operand ahead of the loop) not serialised by ptxas, no
    spills, no TMA store, 16-byte masked stores."""
    c = swapped.config_params(config)
    compiled = _compile_swapped(config, dtype, padded)
    ptx = compiled.asm["ptx"]
    assert re.search(rf"wgmma\.mma_async\.sync\.aligned\.m64n{c['BM']}k16", ptx)
    assert not wgmma_serialized(ptx)
    assert spill_bytes(ptx) == (0, 0), config
    assert compiled.metadata.shared <= _SMEM_LIMIT
    assert "cp.async.bulk.tensor" in ptx and "cp.async.bulk.tensor.2d.global.shared" not in ptx
    loads = ops_matching(compiled.asm["ttgir"], r"async_tma_copy_global_to_local")
    assert len(loads) >= 2 * c["NUM_STAGES"]
    stores = re.findall(r"st\.global[a-z0-9.]*", ptx)
    assert stores and all(".v4." in op for op in stores) and "@%p" in ptx


def test_swapped_kernel_stamps_only_while_recording():
    plain = _compile_swapped("swapped_m16", "bf16", False).asm["ptx"]
    stamped = _compile_swapped("swapped_m16", "bf16", False, TIMELINE=True).asm["ptx"]
    assert "%globaltimer" not in plain and stamped.count("%globaltimer") == 3


def test_swapped_config_names_come_from_the_split_k_table():
    assert list(swapped.CONFIG_NAMES) == ["swapped_m16", "swapped_m32", "swapped_m64", "swapped_m128"]
    for name, bm in swapped.CONFIG_NAMES.items():
        params = swapped.config_params(name)
        assert params == dict(BM=bm, BN=split_k_module.SPLIT_K_BN, **split_k_module.SPLIT_K_CONFIGS[bm])
    assert gg.config_names() == list(gg.CONFIGS) + list(swapped.CONFIG_NAMES)
    with pytest.raises(ValueError, match="not a swapped config.*swapped_m16"):
        swapped.config_params("small")
    # Every row block of every expert has a program when the SMs allow: at most cdiv(rows, BM)
    # + experts row blocks per n-tile.
    assert swapped.grid_for(128, 8, 14336, "swapped_m16", 132) == (132, )
    assert swapped.grid_for(1, 8, 256, "swapped_m16", 132) == (18, )


def test_swapped_configs_are_opt_in_and_for_the_plain_op_only():
    # The default rules never pick them (until a GPU measurement), and the overlapped grouped
    # GEMMs keep their own configs.
    from triton_dist.kernels.moe import group_gemm_rs

    for rows, experts, n in ((1, 8, 14336), (128, 8, 14336), (1024, 128, 1536), (32768, 128, 1536)):
        assert gg.pick_group_gemm_config(rows, experts, n, 132) in gg.CONFIGS
        assert gg.pick_config(rows, experts, n, 132) in gg.CONFIGS
    assert not set(swapped.CONFIG_NAMES) & (set(gg.CONFIGS) | set(group_gemm_rs.CONFIGS))


@pytest.mark.parametrize("config", ["swapped_m32", "small"])
def test_launch_routes_swapped_names_to_their_kernel(monkeypatch, config):
    """``launch`` hands a swapped config to the swapped kernel's launcher with the rows as ``[E *
    capacity, K]`` (padded) and the SM count; any other config goes to the persistent kernel."""
    calls = []
    monkeypatch.setattr(gg._gemm, "num_sms", lambda device: 132)
    monkeypatch.setattr(swapped, "launch", lambda *args, **kwargs: calls.append(("swapped", args, kwargs)))
    monkeypatch.setattr(gg._gemm, "operand_descriptors", lambda *args: calls.append(("persistent", args)) or (1, 2))

    class Kernel:  # kernel[grid](...)
        def __getitem__(self, grid):
            return lambda *args, **kwargs: None

    monkeypatch.setattr(gg, "group_gemm_kernel", Kernel())

    class Rows:  # just the shape and reshape that launch reads
        def __init__(self, *shape):
            self.shape, self.device = shape, "cuda:0"

        def reshape(self, *shape):
            total = 1
            for d in self.shape:
                total *= d
            return Rows(total // shape[1], shape[1])

    gg.launch(Rows(4, 20, 64), Rows(4, 128, 64), "out", "ends", padded=True, config=config)
    assert calls[0][0] == ("swapped" if config.startswith("swapped") else "persistent")
    if calls[0][0] == "swapped":
        _, (a2, w, c, ends), kwargs = calls[0]
        assert a2.shape == (80, 64) and w.shape == (4, 128, 64) and (c, ends) == ("out", "ends")
        assert kwargs["padded"] and kwargs["capacity"] == 20 and kwargs["config"] == config
        assert kwargs["num_sms"] == 132
