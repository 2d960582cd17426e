"""bench/gemm.py's rows (issue 22's table) without a GPU: deduplicated, TMA-aligned, the quick set
inside the full one, the filters, the configs swept, the table."""

import importlib.util
import pathlib
import subprocess
import sys

import pytest

_SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "bench" / "gemm.py"


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("bench_gemm_rows", _SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_rows_are_deduplicated_and_tma_aligned(script):
    full = script.rows()
    shapes = [r[:3] for r in full]
    assert len(shapes) == len(set(shapes))
    assert len(full) == len(script.M_VALUES) * len(script.shape_pairs())
    for m, n, k, labels in full:
        assert m >= 1 and n >= 8 and k >= 8 and n % 8 == 0 and k % 8 == 0, (m, n, k)
        assert labels and all(label.rsplit(".", 1)[0] in script.MODELS for label in labels)


def test_every_projection_every_split_both_ways(script):
    pairs = script.shape_pairs()
    labels = {label for names in pairs.values() for label in names}
    for model in script.MODELS:
        for proj in ("qkv", "o", "gate_up", "down"):
            assert f"{model}.{proj}" in labels
            for world in (2, 4, 8):
                assert {f"{model}.{proj}/col{world}", f"{model}.{proj}/row{world}"} <= labels
    assert pairs[(4096, 7168)] == ["llama3.1-8b.down/row2"]
    assert pairs[(10240, 8192)] == ["llama3.1-70b.qkv", "qwen2-72b.qkv"]  # one pair, both labels


def test_issue_22_rows_are_in_the_full_run(script):
    shapes = {r[:3] for r in script.rows()}
    for row in [(8192, 14336, 8192), (8192, 8192, 14336), (2048, 8192, 8192), (1024, 14336, 8192),
                (128, 14336, 8192), (16, 8192, 14336), (1, 8192, 14336), (1, 4096, 7168), (64, 8192, 14336)]:
        assert row in shapes, row


def test_quick_is_a_subset(script):
    full = {r[:3]: r[3] for r in script.rows()}
    quick = script.rows(quick=True)
    assert len(quick) == len(script.QUICK_M) * len(script.QUICK_PAIRS) < len(full) / 20
    for m, n, k, labels in quick:
        assert full[(m, n, k)] == labels


def test_filters(script):
    assert {r[0] for r in script.rows(ms=(1, 4096))} == {1, 4096}
    assert {r[0] for r in script.rows(quick=True, ms=(8,))} == {8}
    only = script.rows(shapes=("4096x7168", ))
    assert [r[:3] for r in only] == [(m, 4096, 7168) for m in script.M_VALUES]
    big = script.rows(shapes=("405B", ))
    assert big and all(any("405b" in label for label in r[3]) for r in big)
    row8 = script.rows(shapes=("row8", "70b.qkv"))
    assert all(any("/row8" in label or "70b.qkv" in label for label in r[3]) for r in row8)
    assert script.rows(shapes=("no-such-model", )) == []
    assert script.rows(quick=True, shapes=("405b", )) == []  # label pieces filter the quick pairs
    assert script.rows(ms=(1, ), shapes=("1024x2048", )) == [(1, 1024, 2048, ("custom", ))]
    with pytest.raises(SystemExit):
        script.rows(shapes=("1000x2050", ))
    assert script.parse_ms("1, 16") == (1, 16) and script.parse_ms(None) is None
    for bad in ("0", "a,b"):
        with pytest.raises(SystemExit):
            script.parse_ms(bad)
    assert script.parse_shapes(" 70b , qkv,") == ("70b", "qkv") and script.parse_shapes("") is None


def test_sweep_covers_the_pick(script):
    from triton_dist.kernels.gemm.dense import pick_gemm_config

    for m, n, k, _ in script.rows():
        for sms in (78, 132):
            assert pick_gemm_config(m, n, k, sms) in script.sweep_configs(m)


def test_sweep_includes_the_split_k_configs_that_hold_m(script):
    from triton_dist.kernels.gemm.split_k import CONFIG_NAMES

    assert [c for c in script.sweep_configs(1) if c.startswith("split_k")] == list(CONFIG_NAMES)
    assert [c for c in script.sweep_configs(17) if c.startswith("split_k")] == ["split_k_m32", "split_k_m64",
                                                                               "split_k_m128", "split_k_m128_n64"]
    assert [c for c in script.sweep_configs(128) if c.startswith("split_k")] == ["split_k_m128", "split_k_m128_n64"]
    assert not [c for c in script.sweep_configs(129) if c.startswith("split_k")]


def test_trial_split_k_is_swept_and_checked(script, monkeypatch):
    monkeypatch.setattr(script, "NARROW_CONFIGS", dict(script.NARROW_CONFIGS))
    monkeypatch.setattr(script, "SPLIT_K_CONFIGS", dict(script.SPLIT_K_CONFIGS))
    assert script.add_trial_split_k("split_k_m128_n256=128,256,64,4,8") == "split_k_m128_n256"
    assert script.sweep_configs(128)[-1] == "split_k_m128_n256"
    assert script.NARROW_CONFIGS["split_k_m128_n256"] == dict(BM=128, BN=256, BK=64, NUM_STAGES=4, num_warps=8)
    for bad in ("split_k_m128_n256=128,256,64,4,8", "split_k_x=128,128,64,4", "other=128,128,64,4,8",
                "split_k_m256=256,128,64,4,8", "split_k_m128_big=128,256,128,4,8", "large=128,128,64,4,8"):
        with pytest.raises(SystemExit, match="--trial-split-k"):
            script.add_trial_split_k(bad)


def test_trial_config_is_swept_and_checked(script, monkeypatch):
    monkeypatch.setattr(script, "CONFIGS", dict(script.CONFIGS))
    assert script.add_trial_config("small_s5=128,128,64,8,5,8") == "small_s5"
    assert "small_s5" in script.sweep_configs(1024) and "small_s5" in script.sweep_configs(1)
    assert script.CONFIGS["small_s5"] == dict(BM=128, BN=128, BK=64, GROUP_M=8, NUM_STAGES=5, num_warps=8)
    assert script.add_trial_config("large_flat=128,256,64,8,3,8,1") == "large_flat"
    assert script.CONFIGS["large_flat"]["FLATTEN"] is True and "FLATTEN" not in script.CONFIGS["small_s5"]
    for bad in ("small_s5=128,128,64,8,5,8", "x=128,128,64,8,5", "big=128,256,64,8,4,8", "zero=128,128,64,0,4,8"):
        with pytest.raises(SystemExit, match="--trial-config"):
            script.add_trial_config(bad)


def test_sweep_includes_the_wave_tail_configs_above_split_k(script):
    from triton_dist.kernels.gemm.wave_tail import CONFIG_NAMES

    assert not set(CONFIG_NAMES) & set(script.sweep_configs(128))
    for m in (129, 1024, 8192):
        assert [c for c in script.sweep_configs(m) if c in CONFIG_NAMES] == list(CONFIG_NAMES)


def test_sampling_and_estimate(script):
    for call_us in (1.0, 5.0, 100.0, 2000.0, 40_000.0):
        group, iters = script.sampling(call_us)
        assert 1 <= group <= script.GROUP and script.MIN_ITERS <= iters <= script.ITERS
    assert script.sampling(5.0)[0] == script.GROUP and script.sampling(40_000.0)[0] == 1
    assert script.estimate_row_s(8192, 106496, 16384) > script.estimate_row_s(1, 768, 4096) > 0
    assert script.estimate_row_s(1, 768, 4096, sweep=False, do_bench=False) < script.estimate_row_s(1, 768, 4096)


def test_table(script):
    from triton_dist.bench import record

    versions = {"torch": "2.11.0", "triton": "3.6.0"}
    recs = [record("gemm", shape=[m, 4096, 7168], dtype="bfloat16", world_size=1, gpu="h200", ours_us=ours,
                   baselines={"torch_cublas_us": 10.0}, bound_us=10.0, commit="abc1234", versions=versions,
                   verified=True, config="skinny_n32", config_us={"skinny_n32": ours, "small": 9.0},
                   best_config="small", do_bench={"ours_us": 20.0, "cublas_us": 18.0})
            for m, ours in ((1, 12.5), (16, 9.5))]
    table = script.format_rows(recs)
    assert "0.800" in table and "1.053" in table and "1.111" in table and "0.900" in table
    assert "2 rows: 1 below 0.95 of cuBLAS" in table and "worst 0.800 at 1x4096x7168" in table


def test_list_runs_without_a_gpu():
    done = subprocess.run([sys.executable, str(_SCRIPT), "--list", "--quick"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert "[gemm] 20 rows (4 (N, K) pairs)" in done.stdout and "llama3.1-8b.down/row2" in done.stdout
