"""kernels/common/reach on the GPU: with some ranks declared unmapped (as ranks on other hosts
are; faked here, since every rank of this host is mapped), contexts are still created, every
single-host method raises on every rank before launching anything, the methods that cross hosts
still run (and give exact results, the memory being mapped after all), and the ops keep working
after the refusals."""

import pytest
import torch
import torch.distributed as dist

from conftest import all_ranks_agree, raises_everywhere, rank_randn, tolerance_ratio
from triton_dist import host_collectives, ops
from triton_dist.kernels import (AllGatherContext, AllGatherGemmContext, AllReduceContext, GemmAllReduceContext,
                                 GemmReduceScatterContext, ReduceScatterContext)
from triton_dist.kernels.common import reach


@pytest.fixture
def other_half_unmapped(monkeypatch):
    """Ranks of the other half of the world count as unmapped for contexts made in the test."""
    world, me = dist.get_world_size(), dist.get_rank()
    if world == 1:
        pytest.skip("needs two ranks or more")
    half = world // 2
    unmapped = tuple(r for r in range(world) if (r < half) != (me < half))
    monkeypatch.setattr(reach, "unmapped_ranks", lambda: unmapped)
    return unmapped


def test_collectives_refuse_single_host_methods_and_run_2d(other_half_unmapped):
    world = dist.get_world_size()
    x = rank_randn((4096, ), torch.float32, 71)
    gather, scatter, reduce = (AllGatherContext(1 << 16, torch.float32), ReduceScatterContext(1 << 16, torch.float32),
                               AllReduceContext(1 << 16, torch.float32))
    for method in ("sm_push", "ce_push", "ll", "ring"):
        raises_everywhere(lambda: ops.all_gather(x, method=method, context=gather), ValueError, "other hosts")
    for method in ("push", "ring", "ll"):
        raises_everywhere(lambda: ops.reduce_scatter(x, method=method, context=scatter), ValueError, "other hosts")
    for method in ("one_shot", "two_shot", "ll", "ce_two_shot"):
        raises_everywhere(lambda: ops.all_reduce(x, method=method, context=reduce), ValueError, "other hosts")
    got_gather = ops.all_gather(x, method="2d", context=gather)
    got_scatter = ops.reduce_scatter(x, method="2d", context=scatter)
    got_reduce = ops.all_reduce(x, method="2d", context=reduce)
    torch.cuda.synchronize()
    ok = (torch.equal(got_gather, host_collectives.all_gather(x)) and
          torch.allclose(got_scatter, host_collectives.reduce_scatter(x.double()).float(), rtol=1e-5, atol=1e-5) and
          torch.allclose(got_reduce, host_collectives.all_reduce(x.double()).float(), rtol=1e-5, atol=1e-5))
    all_ranks_agree(ok, f"2d collectives with ranks {other_half_unmapped} unmapped (world {world})")


def test_overlapped_gemms_refuse_single_host_methods(other_half_unmapped):
    world, dtype, m, n, k = dist.get_world_size(), torch.bfloat16, 256, 512, 256
    raises_everywhere(lambda: AllGatherGemmContext(m, k, dtype, method="ce_push"), ValueError, "other hosts")
    a_shard, b = rank_randn((m, k), dtype, 72), rank_randn((n, k), dtype, 73)
    ctx = AllGatherGemmContext(m, k, dtype, method="sm_2d")
    got = ops.ag_gemm(a_shard, b, context=ctx)
    a = rank_randn((world * m, k), dtype, 74)
    rs = GemmReduceScatterContext(world * m, n, dtype)
    for method in ("fused", "fused_ce", "push", "pull"):
        raises_everywhere(lambda: ops.gemm_rs(a, b, method=method, context=rs), ValueError, "other hosts")
    got_rs = ops.gemm_rs(a, b, method="push_2d", context=rs)
    ar = GemmAllReduceContext(m, n, dtype)
    raises_everywhere(lambda: ops.gemm_ar(a[:m], b, context=ar), ValueError, "no method of this op crosses hosts")
    torch.cuda.synchronize()
    ref = host_collectives.all_gather(a_shard).float() @ b.float().T
    ref_rs = host_collectives.reduce_scatter(a.float() @ b.float().T)
    errors = tolerance_ratio(got, ref), tolerance_ratio(got_rs, ref_rs)
    all_ranks_agree(max(errors) < 1, f"sm_2d and push_2d with ranks {other_half_unmapped} unmapped: error/tolerance "
                                     f"{errors}")
