"""Every benchmark script imports without a GPU or torch (torch is imported inside ``main``) and
has a ``main``; the overlapped-GEMM benchmarks' shapes split evenly across 2, 4 and 8 ranks and
keep TMA's 16-byte rows."""

import importlib.util
import pathlib

import pytest

_BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench"


def _load(path):
    spec = importlib.util.spec_from_file_location(f"bench_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("path", sorted(_BENCH.glob("*.py")), ids=lambda p: p.stem)
def test_bench_script_imports(path):
    assert callable(_load(path).main)


@pytest.mark.parametrize("world", [2, 4, 8])
def test_overlap_shapes_split_evenly(world):
    from triton_dist.bench.script import overlap_shapes

    for quick in (False, True):
        for _, m, n, k in overlap_shapes(quick):
            assert m % world == 0 and (n // world) % 8 == 0 and (k // world) % 8 == 0 and n % 8 == 0 and k % 8 == 0
    gemm_ar = _load(_BENCH / "gemm_ar.py")
    for quick in (False, True):
        for _, m, n, k in gemm_ar._shapes(quick):
            assert (k // world) % 8 == 0 and n % 8 == 0 and 1 <= m <= max(gemm_ar.ROWS)


@pytest.mark.parametrize("world", [2, 4, 8])
def test_collective_sweep_fits_the_contexts(world):
    """Every swept size is a whole number of elements of each dtype, splits into ``world`` equal
    shards (reduce-scatter) and stays under the contexts' element limit."""
    from triton_dist.bench.script import COLLECTIVE_SWEEP_BYTES
    from triton_dist.kernels.common.context import MAX_NUMEL

    assert min(COLLECTIVE_SWEEP_BYTES) == 8 << 10 and max(COLLECTIVE_SWEEP_BYTES) == 10**9
    for nbytes in COLLECTIVE_SWEEP_BYTES:
        for itemsize in (2, 4):
            assert nbytes % (itemsize * world) == 0 and nbytes // itemsize < MAX_NUMEL


def test_dtypes_option():
    import argparse

    pytest.importorskip("torch")
    import torch

    from triton_dist.bench import script

    parser = argparse.ArgumentParser()
    script.add_dtypes_option(parser)
    assert script.parse_dtypes(parser.parse_args([])) == [torch.bfloat16, torch.float32]
    assert script.parse_dtypes(parser.parse_args(["--dtypes", "float32"])) == [torch.float32]
    with pytest.raises(SystemExit, match="int8"):
        script.parse_dtypes(parser.parse_args(["--dtypes", "bfloat16,int8"]))


def test_group_gemm_sweeps_the_swapped_configs_at_decode_only():
    """bench/group_gemm.py times every persistent config, and the swapped ones where an expert
    averages at most 128 rows: the decode layers, not the prefill ones."""
    script = _load(_BENCH / "group_gemm.py")
    from triton_dist.kernels.moe.group_gemm import CONFIGS
    from triton_dist.kernels.moe.group_gemm_swapped import CONFIG_NAMES

    swept = {name: script.sweep_configs(rows, experts) for name, experts, rows, _, _ in script.SHAPES}
    for name, configs in swept.items():
        assert configs[:len(CONFIGS)] == list(CONFIGS)
        assert configs[len(CONFIGS):] == (list(CONFIG_NAMES) if "decode" in name else []), name
