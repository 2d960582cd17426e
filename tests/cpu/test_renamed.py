"""The keywords renamed to method= (variant=, producer=) still work, say so, and refuse to
disagree with method=."""

import pytest

from triton_dist.renamed import method_or_old_name


def test_the_old_name_alone_is_taken_with_a_warning():
    with pytest.warns(DeprecationWarning, match="variant= is now called method="):
        assert method_or_old_name("gemm_rs", "auto", "auto", "variant", "fused") == "fused"


def test_without_the_old_name_method_stands_and_nothing_is_said(recwarn):
    assert method_or_old_name("ag_gemm", "sm_push", "ce_push", "producer", None) == "sm_push"
    assert not recwarn.list


@pytest.mark.parametrize("method,ok", [("ce_pull", True), ("sm_push", False)])
def test_both_names_must_agree(method, ok):
    with pytest.warns(DeprecationWarning):
        if ok:
            assert method_or_old_name("ag_gemm", method, "ce_push", "producer", "ce_pull") == "ce_pull"
        else:
            with pytest.raises(ValueError, match="method='sm_push' and producer='ce_pull' disagree"):
                method_or_old_name("ag_gemm", method, "ce_push", "producer", "ce_pull")
