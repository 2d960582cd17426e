"""The collectives' one-kernel methods: the kernel is the whole call. Each program takes its
epoch from ``enter_call`` (one past the context's call counter) and the last to enter advances the
counter (:mod:`triton_dist.kernels.common.call_counter`), so the context launches no bump before
it: one launch per call instead of two."""

import inspect
import re

import pytest

from triton_dist.kernels.collectives import allgather_2d, allgather_kernels, allreduce_kernels, reduce_scatter
from triton_dist.kernels.collectives import reduce_scatter_2d
from triton_dist.kernels.common import ring

ONE_KERNEL_CALLS = [
    allreduce_kernels.all_reduce_one_shot_kernel, allreduce_kernels.all_reduce_two_shot_kernel,
    allreduce_kernels.all_reduce_ring_kernel, allreduce_kernels.ll_reduce_kernel,
    allgather_kernels.all_gather_push_kernel, allgather_kernels.all_gather_ll_kernel, ring.all_gather_ring_kernel,
    allgather_2d.all_gather_2d_kernel, allgather_2d.all_gather_ll_2d_kernel,
    reduce_scatter.reduce_scatter_push_kernel, reduce_scatter.reduce_scatter_ring_kernel,
    reduce_scatter_2d.reduce_scatter_2d_kernel,
]


def _body(kernel) -> list[str]:
    """The kernel's statements after its docstring, blank lines and comments left out."""
    source = inspect.getsource(kernel.fn.fn)
    body = source.split('"""')[-1] if '"""' in source else source.split(":", 1)[1]
    return [line.strip() for line in body.splitlines() if line.strip() and not line.strip().startswith("#")]


@pytest.mark.parametrize("kernel", ONE_KERNEL_CALLS, ids=lambda k: k.fn.fn.__name__)
def test_enters_its_call_once_and_reads_the_counter_nowhere_else(kernel):
    text = "\n".join(_body(kernel))
    assert len(re.findall(r"\benter_call\(calls\)|\bll_call\(calls,", text)) == 1, text
    assert "tl.load(calls" not in text  # a read past enter_call could see the next call's epoch


def test_the_contexts_launch_no_bump_before_them():
    """run() of each collective context passes ``self.calls`` to these kernels without
    ``next_call()`` (a bump first would advance the counter twice per call)."""
    from triton_dist.kernels.collectives import allgather, allreduce
    from triton_dist.kernels.collectives import reduce_scatter as rs

    for context in (allreduce.AllReduceContext, allgather.AllGatherContext, rs.ReduceScatterContext):
        run = inspect.getsource(context.run)
        assert "next_call()" not in run and "bump(" not in run, context.__name__
