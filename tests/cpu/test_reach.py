"""kernels/common/reach: a method that loads and stores in other ranks' memory is refused, with a
message naming the op, the rank, the unreachable ranks and the fix, once ranks are on other hosts;
within a host (nothing unmapped) every method passes."""

import pytest

from triton_dist.kernels.common.reach import check_reach


def test_within_a_host_every_method_passes():
    for method in ("ll", "sm_push", "ce_push", "2d"):
        check_reach("all_gather", method, ("2d", "ll_2d"), (), 0)


def test_across_hosts_only_the_methods_that_cross_them_pass():
    check_reach("gemm_rs", "push_2d", ("2d", "push_2d"), (2, 3), 1)
    with pytest.raises(ValueError, match=r"\[rank 1\] gemm_rs: method 'fused_ce' .* ranks \[2, 3\] are on other "
                                         r"hosts; across hosts use '2d', 'push_2d' \(or 'auto'\)"):
        check_reach("gemm_rs", "fused_ce", ("2d", "push_2d"), (2, 3), 1)


def test_an_op_with_no_method_across_hosts_says_so():
    with pytest.raises(ValueError, match="no method of this op crosses hosts yet"):
        check_reach("gemm_ar", "output_tiles", (), (1, ), 0)
