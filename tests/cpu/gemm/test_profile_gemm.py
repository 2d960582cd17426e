"""The GEMM profiling entry point's argument handling (it needs a GPU to run)."""

import pytest

from triton_dist.tools.profile_gemm import parse_shape


def test_shape_is_m_n_k():
    assert parse_shape("128x4096x7168") == (128, 4096, 7168)
    assert parse_shape("1X8X16") == (1, 8, 16)


@pytest.mark.parametrize("text", ["128x4096", "0x8x8", "ax8x8", "128x-1x8", ""])
def test_bad_shape_names_the_form(text):
    with pytest.raises(ValueError, match="MxNxK"):
        parse_shape(text)
