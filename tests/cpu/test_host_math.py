"""kernels.common.host_math.cdiv: triton.cdiv's results for the host's integers, without its
ConstexprFunction call (the eager paths make several a call)."""

import triton

from triton_dist.kernels.common.host_math import cdiv


def test_cdiv_is_tritons_for_every_small_pair():
    for a in range(0, 300):
        for b in range(1, 40):
            assert cdiv(a, b) == triton.cdiv(a, b), (a, b)


def test_cdiv_takes_large_counts_exactly():
    for a, b in ((2**31 - 1, 2048), (2**40 + 1, 128), (10**12, 7)):
        assert cdiv(a, b) == triton.cdiv(a, b) == (a + b - 1) // b
