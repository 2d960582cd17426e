"""Benchmark records (docs/design.md §7): their format, the JSON files, the table; no torch, no GPU."""

import json
import subprocess
import sys

import pytest

from triton_dist.bench import results
from triton_dist.bench.results import FIELDS, format_table, gpu_slug, record, validate_record, write_results

VERSIONS = {"torch": "2.11.0", "triton": "3.6.0", "nvshmem": "3.4.5", "triton_dist": "0.1.0", "cuda": "13.0"}


def _rec(op="all_gather", **kw):
    args = dict(shape=[8192, 4096], dtype="bfloat16", world_size=2, gpu="h200", ours_us=10.0,
                baselines={"torch_nccl_us": 35.0, "torch_symm_mem_us": None}, bound_us=8.0, commit="abc1234",
                versions=VERSIONS)
    args.update(kw)
    return record(op, **args)


def test_record_has_the_design_fields_in_order_then_extras():
    rec = _rec(bytes=1 << 20, gbps=380.5)
    assert tuple(rec)[:len(FIELDS)] == FIELDS == ("op", "shape", "dtype", "world_size", "gpu", "ours_us", "baselines",
                                                  "bound_us", "commit", "versions")
    assert rec["baselines"] == {"torch_nccl_us": 35.0}  # a missing baseline is omitted
    assert rec["bytes"] == 1 << 20 and rec["gbps"] == 380.5
    assert rec["shape"] == [8192, 4096] and isinstance(rec["ours_us"], float)
    assert json.loads(json.dumps(rec)) == rec


def test_bound_may_be_null_and_commit_versions_default():
    rec = record("signal_round_trip", shape=[1], dtype="uint64", world_size=2, gpu="h200", ours_us=2.5)
    assert rec["bound_us"] is None and rec["baselines"] == {}
    assert isinstance(rec["commit"], str) and rec["commit"]
    assert {"torch", "triton", "nvshmem", "triton_dist", "cuda"} <= set(rec["versions"])
    assert rec["versions"]["triton_dist"]


@pytest.mark.parametrize("bad, match", [
    (dict(ours_us=float("nan")), "ours_us"),
    (dict(ours_us=-1.0), "ours_us"),
    (dict(baselines={"torch_nccl_us": "fast"}), "baseline"),
    (dict(baselines={"torch_nccl": 3.0}), "end in '_us'"),
    (dict(gpu="NVIDIA H200"), "slug"),
    (dict(world_size=0), "world_size"),
    (dict(shape=[-1]), "shape"),
    (dict(commit=""), "commit"),
    (dict(dtype=""), "dtype"),
])
def test_bad_records_are_refused(bad, match):
    with pytest.raises(ValueError, match=match):
        _rec(**bad)


def test_validate_wants_every_field_in_order():
    rec = _rec()
    validate_record(rec)
    del rec["versions"]
    with pytest.raises(ValueError, match="missing"):
        validate_record(rec)
    rec = _rec()
    shuffled = {"shape": rec.pop("shape"), **rec}
    with pytest.raises(ValueError, match="must start with"):
        validate_record(shuffled)


@pytest.mark.parametrize("name, slug", [("NVIDIA H200", "h200"), ("NVIDIA H100 80GB HBM3", "h100"),
                                        ("NVIDIA A100-SXM4-80GB", "a100"), ("NVIDIA B200", "b200"),
                                        ("NVIDIA GeForce RTX 4090", "rtx4090"), ("NVIDIA L40S", "l40s")])
def test_gpu_slug(name, slug):
    assert gpu_slug(name) == slug


def test_write_results_on_rank_0_into_gpu_world_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(results, "RESULTS_ROOT", tmp_path)
    recs = [_rec(), _rec("reduce_scatter", bound_us=None)]
    path = write_results(recs, "collectives", rank=0)
    assert path == tmp_path / "h200-x2" / "collectives.json"
    assert json.loads(path.read_text()) == recs
    # Written again: replaced, not appended; no temporary files left behind.
    write_results(recs[:1], "collectives", rank=0)
    assert json.loads(path.read_text()) == recs[:1]
    assert [p.name for p in path.parent.iterdir()] == ["collectives.json"]


def test_other_ranks_write_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(results, "RESULTS_ROOT", tmp_path)
    assert write_results([_rec()], "x", rank=1) is None
    assert not any(tmp_path.iterdir())


def test_rank_from_environment_and_explicit_root(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    assert write_results([_rec()], "x", root=tmp_path) is None
    monkeypatch.setenv("RANK", "0")
    assert write_results([_rec()], "x", root=tmp_path) == tmp_path / "h200-x2" / "x.json"


def test_write_refuses_mixed_machines_bad_names_and_nothing(tmp_path):
    with pytest.raises(ValueError, match="several"):
        write_results([_rec(), _rec(world_size=4)], "x", root=tmp_path, rank=0)
    with pytest.raises(ValueError, match="file name"):
        write_results([_rec()], "../x", root=tmp_path, rank=0)
    with pytest.raises(ValueError, match="no records"):
        write_results([], "x", root=tmp_path, rank=0)
    assert not any(tmp_path.iterdir())


def test_table_shows_ours_baselines_bound_and_ratios():
    text = format_table([_rec(gbps=12.5), _rec("put_sm_store", baselines={}, bound_us=None)])
    lines = text.splitlines()
    for column in ("op", "shape", "ours_us", "torch_nccl_us", "bound_us", "torch_nccl/ours", "bound/ours", "gbps"):
        assert column in lines[0]
    assert "8192x4096" in lines[2] and "3.50" in lines[2] and "0.80" in lines[2] and "12.50" in lines[2]
    assert lines[3].startswith("put_sm_store")


def test_commit_falls_back_to_the_environment(monkeypatch, tmp_path):
    monkeypatch.setattr(results, "_SOURCE_TREE", tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TRITON_DIST_COMMIT", "deadbee")
    results.commit.cache_clear()
    try:
        assert results.commit() == "deadbee"
        monkeypatch.delenv("TRITON_DIST_COMMIT")
        results.commit.cache_clear()
        assert results.commit() == "unknown"
    finally:
        results.commit.cache_clear()


def test_bench_imports_without_torch():
    code = "import sys, triton_dist.bench; assert 'torch' not in sys.modules, 'torch imported'; print('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**__import__("os").environ, "PYTHONPATH": __import__("os").pathsep.join(sys.path)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
