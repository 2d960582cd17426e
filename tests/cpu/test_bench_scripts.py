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
