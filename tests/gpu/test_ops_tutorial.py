"""Tutorial 05 (the ops in a tensor-parallel MLP: ag_gemm + gemm_rs for prefill, gemm_ar for
decode, in a CUDA graph too, and the collectives) passes its own checks against torch."""

import importlib.util
import os

import pytest

from conftest import all_ranks_agree

_ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


# Every op's context compiles and loads all its kernels on first use: on a cold Triton cache this
# one test compiled for longer than the suite's 200 s per-test limit (a pytest-timeout at 200 s,
# inside the allgather context's preload, at d9d294d).
@pytest.mark.timeout(600)
def test_ops_tutorial():
    spec = importlib.util.spec_from_file_location("tutorial_05", os.path.join(_ROOT, "tutorials", "05_ops.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    all_ranks_agree(module.run_all(), "tutorial 05 (ops) failed its checks; see the printed errors")
