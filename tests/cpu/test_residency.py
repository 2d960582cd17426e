"""The co-residency rule (triton_dist.residency): grids that wait are sized from the SMs the
process may use, read in one place, never from a constant."""

import pathlib
import re

import pytest

from triton_dist import residency

_PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "python" / "triton_dist"


@pytest.mark.parametrize("warps,regs,shared,expected", [
    (8, 128, 0, 2),          # 256 threads x 128 registers: 32 K of 64 K registers
    (4, 168, 180 * 1024, 1),  # a persistent GEMM program: its shared memory takes most of the SM
    (8, 32, 0, 8),           # threads bound: 2048 / 256
    (1, 16, 0, 32),          # the 32-blocks-per-SM limit
    (4, 255, 0, 2),          # 255 registers round up to 256 per thread: 32 K per program
    (8, 64, 240 * 1024, 0),  # more shared memory than an SM has: does not fit at all
])
def test_programs_per_sm(warps, regs, shared, expected):
    assert residency.programs_per_sm(warps, regs, shared) == expected


def test_only_residency_reads_the_sm_count():
    """One place reads multiProcessorCount, so an MPS share lowers every grid alike."""
    readers = [str(p.relative_to(_PACKAGE)) for p in _PACKAGE.rglob("*.py")
               if "multi_processor_count" in p.read_text() and p.name != "residency.py"]
    assert not readers, f"read the SM count through triton_dist.residency, not directly: {readers}"


def test_contexts_size_their_grids_from_residency():
    """Every context that launches waiting grids takes its program limit from the SMs this process
    may use (kernels/common/context.py for the collectives, kernels/gemm/context.py for the GEMM contexts)."""
    kernels = _PACKAGE / "kernels"
    assert "_residency.max_waiting_programs(" in (kernels / "common" / "context.py").read_text()
    assert "_residency.sm_count(" in (kernels / "gemm" / "dense.py").read_text()
    # The smallest any rank sees: the GEMM config, and the tile -> signal layout with it, must agree.
    gemm_context = (kernels / "gemm" / "context.py").read_text()
    assert re.search(r"self\.num_sms, = smallest_on_any_rank\(_gemm\.num_sms\(", gemm_context)
    for name in ("ag_gemm.py", "gemm_rs.py", "gemm_ar.py"):
        assert "(OverlappedGemmContext):" in (kernels / "gemm" / name).read_text(), name


def test_no_reserved_sms_leave_nothing(monkeypatch):
    monkeypatch.setattr(residency, "sm_count", lambda device=None: 16)
    assert residency.max_waiting_programs(reserved=8) == 8
    with pytest.raises(RuntimeError, match="leave none of the 16 this process may use"):
        residency.max_waiting_programs(reserved=16, what="gemm_rs")
