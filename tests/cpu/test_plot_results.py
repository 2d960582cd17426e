"""The benchmark plots: every known JSON in a results directory becomes a non-empty PNG, including
sweeps where a method ran only at some sizes and overlap records without the symm_mem baseline."""

import json

import pytest

from triton_dist.tools import plot_results

pytest.importorskip("matplotlib")


def _collective(bytes_, ours, nccl, extra, dtype="bfloat16"):
    return {"op": "all_reduce", "shape": [bytes_ // 2], "dtype": dtype, "world_size": 2, "gpu": "h200",
            "ours_us": ours, "baselines": {"torch_nccl_us": nccl}, "bound_us": 3.0, "commit": "abc", "bytes": bytes_,
            **extra}


def test_every_known_benchmark_is_plotted(tmp_path):
    sweep = [_collective(8192, 8.0, 10.0, {"ll_us": 8.0, "one_shot_us": 9.0}),
             _collective(1 << 20, 20.0, 40.0, {"ll_us": None, "one_shot_us": 20.0, "two_shot_us": 25.0}),
             _collective(8192, 9.0, 11.0, {"one_shot_us": 9.0}, dtype="float32"),
             _collective(1 << 20, 30.0, 45.0, {"one_shot_us": 30.0}, dtype="float32")]
    (tmp_path / "allreduce.json").write_text(json.dumps(sweep))
    overlap = [{"op": "gemm_rs", "shape": [8192, 8192, 4096], "model": "m", "dtype": "bfloat16", "world_size": 2,
                "gpu": "h200", "ours_us": 100.0, "baselines": {"torch_nccl_us": 120.0, "torch_symm_mem_us": None},
                "bound_us": 90.0, "commit": "abc"}]
    (tmp_path / "gemm_rs.json").write_text(json.dumps(overlap))
    (tmp_path / "language_floors.json").write_text(json.dumps([{"op": "ping"}]))  # not a plotted benchmark
    written = plot_results.plot_dir(tmp_path, tmp_path / "plots")
    assert sorted(p.name for p in written) == ["allreduce.png", "gemm_rs.png"]
    for path in written:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


def test_series_collects_methods_measured_at_some_sizes_only():
    records = [_collective(8192, 8.0, 10.0, {"one_shot_us": 9.0}),
               _collective(1 << 20, 20.0, 40.0, {"one_shot_us": 20.0, "zero_copy_us": 5.0, "sm_zero_copy_us": 5.0})]
    series = plot_results._series(records)
    assert series["one_shot"] == [9.0, 20.0]
    assert series["sm_zero_copy"] == [None, 5.0]
    assert series["torch_nccl"] == [10.0, 40.0]
    assert series["bound"] == [3.0, 3.0]
    assert "zero_copy" not in series and "ours" not in series
