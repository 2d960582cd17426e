"""With check_collective_calls on (TRITON_DIST_CHECK_COLLECTIVE_CALLS=1), a rank that calls an op
with another shape or method than its peers gets a ValueError on every rank naming the ranks,
instead of a wait that times out; calls that agree run as before."""

import dataclasses

import pytest
import torch
import torch.distributed as dist

import triton_dist as tdist
from conftest import all_ranks_agree, raises_everywhere
from triton_dist import config, ops


@pytest.fixture
def checking():
    before = config.get()
    config._set(dataclasses.replace(before, check_collective_calls=True))
    yield
    config._set(before)


def test_calls_that_differ_are_refused_on_every_rank(checking):
    world, me = dist.get_world_size(), dist.get_rank()
    if world == 1:
        pytest.skip("one rank always agrees with itself")
    x = torch.ones((64 if me else 32, 128), device="cuda")
    raises_everywhere(lambda: ops.all_reduce(x), ValueError, "different arguments")
    method = "one_shot" if me == world - 1 else "two_shot"
    y = torch.ones((64, 128), device="cuda")
    raises_everywhere(lambda: ops.all_reduce(y, method=method), ValueError, f"rank {world - 1}")
    got = ops.all_reduce(y)  # agreeing calls still work
    torch.cuda.synchronize()
    all_ranks_agree(bool((got == world).all()), "all_reduce with the check on")
    tdist.barrier()
