"""ops.ag_group_gemm (AllGather + grouped GEMM, MoE tensor parallelism) against torch on every rank:
each rank rebuilds every rank's tokens and routing from seeds, and checks every output row against
the fp32 product of its gathered token and its expert's weight shard (per-element tolerance), the
layout (offsets, every routed pair exactly once, expert-major), NaN-poisoned outputs, back-to-back
calls with changing routing, every producer, CUDA graph replay, bad inputs."""

import pytest
import torch
import torch.distributed as dist

from conftest import all_ranks_agree, raises_everywhere, rank_randn
from triton_dist import ops
from triton_dist.kernels.moe import AllGatherGroupGemmContext

_ATOL, _RTOL = 2e-2, 2e-2


def _routing(m, experts, topk, seed, rank, drop=True):
    """Rank ``rank``'s routing: distinct random experts per token, about one pair in eight ``-1``."""
    gen = torch.Generator().manual_seed(seed * 1009 + rank)
    idx = torch.stack([torch.randperm(experts, generator=gen)[:topk] for _ in range(m)]) if m else \
        torch.zeros((0, topk), dtype=torch.int64)
    if drop:
        idx[torch.rand(idx.shape, generator=gen) < 0.125] = -1
    return idx.to(torch.int32)


def _inputs(m, k, experts, topk, seed):
    world = dist.get_world_size()
    scale = k ** -0.25
    xs = [rank_randn((m, k), torch.bfloat16, seed, rank=r) * scale for r in range(world)]
    idx = [_routing(m, experts, topk, seed, r) for r in range(world)]
    return xs, idx


def _check(result, xs, idx, w, experts):
    """Every row of ``result`` against its token and expert; the layout against the routing."""
    x_all, idx_all = torch.cat(xs), torch.cat(idx).long()
    topk = idx_all.shape[1]
    valid = (idx_all >= 0).sum().item()
    offsets = result.offsets.cpu().long()
    counts = torch.bincount(idx_all[idx_all >= 0], minlength=experts)
    ok = torch.equal(offsets, torch.cumsum(counts, 0))
    tokens, slots = result.token_index[:valid].long(), result.topk_slot[:valid].long()
    ids = idx_all.cuda()[tokens, slots]
    ok &= bool((ids >= 0).all()) and bool((ids[1:] >= ids[:-1]).all())  # expert-major
    pairs = tokens * topk + slots
    ok &= pairs.unique().numel() == valid  # each routed pair once
    got = result.out[:valid].float()
    ok &= bool(torch.isfinite(got).all())
    for e in range(experts):  # expert by expert: a [rows, N, K] gather of the weights would not fit
        rows = ids == e
        want = x_all[tokens[rows]].float() @ w[e].float().T
        ok &= bool(torch.isclose(got[rows], want, atol=_ATOL, rtol=_RTOL).all())
    return ok


@pytest.mark.parametrize("producer", ["ce_push", "sm_push", "ce_pull", "sm_2d", "sm_push_inline"])
@pytest.mark.parametrize("m,k,n,experts,topk", [(256, 512, 384, 8, 2), (7, 256, 128, 16, 4), (1, 128, 64, 4, 1)])
def test_matches_torch(m, k, n, experts, topk, producer):
    ctx = AllGatherGroupGemmContext(max(m, 64), k, torch.bfloat16, experts, topk, method=producer)
    xs, idx = _inputs(m, k, experts, topk, seed=m + k)
    me = dist.get_rank()
    w = rank_randn((experts, n, k), torch.bfloat16, 77) * k ** -0.25  # this rank's shard of every expert
    out = torch.full((dist.get_world_size() * m * topk, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    result = ops.ag_group_gemm(xs[me], idx[me].cuda(), w, context=ctx, out=out)
    torch.cuda.synchronize()
    ok = result.out is out and _check(result, xs, idx, w, experts)
    all_ranks_agree(ok, f"ag_group_gemm {producer} m={m} k={k} n={n} experts={experts} topk={topk}")


def test_one_rank_runs_the_protocol():
    if dist.get_world_size() != 1:
        pytest.skip("the one-rank protocol check")
    m, k, n, experts, topk = 100, 256, 128, 8, 2
    ctx = AllGatherGroupGemmContext(m, k, torch.bfloat16, experts, topk, protocol_on_one_rank=True)
    xs, idx = _inputs(m, k, experts, topk, seed=5)
    w = rank_randn((experts, n, k), torch.bfloat16, 6) * k ** -0.25
    result = ops.ag_group_gemm(xs[0], idx[0].cuda(), w, context=ctx)
    torch.cuda.synchronize()
    all_ranks_agree(_check(result, xs, idx, w, experts), "ag_group_gemm with the protocol on one rank")


def test_back_to_back_with_changing_routing():
    calls, m, k, n, experts, topk = 200, 64, 256, 128, 8, 2
    ctx = AllGatherGroupGemmContext(m, k, torch.bfloat16, experts, topk)
    me = dist.get_rank()
    w = rank_randn((experts, n, k), torch.bfloat16, 9) * k ** -0.25
    inputs = [_inputs(m, k, experts, topk, seed=1000 + i) for i in range(calls)]
    mine = [(xs[me], idx[me].cuda()) for xs, idx in inputs]
    checked = [i for i in range(calls) if i % 10 == 0 or i == calls - 1]
    results = {}
    for i in range(calls):  # no synchronisation between calls
        r = ops.ag_group_gemm(*mine[i][:2], w, context=ctx, check_routing=False)
        if i in checked:
            results[i] = r
    torch.cuda.synchronize()
    bad = [i for i in checked if not _check(results[i], *inputs[i], w, experts)]
    all_ranks_agree(not bad, f"ag_group_gemm back to back: wrong calls {bad}")


def test_cuda_graph_replay():
    m, k, n, experts, topk = 128, 256, 128, 8, 2
    ctx = AllGatherGroupGemmContext(m, k, torch.bfloat16, experts, topk)
    me = dist.get_rank()
    w = rank_randn((experts, n, k), torch.bfloat16, 12) * k ** -0.25
    x = torch.empty((m, k), device="cuda", dtype=torch.bfloat16)
    idx = torch.empty((m, topk), device="cuda", dtype=torch.int32)
    xs, routes = _inputs(m, k, experts, topk, seed=13)
    x.copy_(xs[me])
    idx.copy_(routes[me])
    ops.ag_group_gemm(x, idx, w, context=ctx)  # contexts (this one, the routing's all_gather) outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        result = ops.ag_group_gemm(x, idx, w, context=ctx)
    ok = True
    for step in range(3):
        xs, routes = _inputs(m, k, experts, topk, seed=20 + step)
        x.copy_(xs[me])
        idx.copy_(routes[me])
        result.out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ok &= _check(result, xs, routes, w, experts)
    all_ranks_agree(ok, "ag_group_gemm replayed in a CUDA graph with new tokens and routing")


def test_bad_inputs():
    m, k, n, experts, topk = 32, 128, 64, 4, 2
    ctx = AllGatherGroupGemmContext(m, k, torch.bfloat16, experts, topk)
    x = rank_randn((m, k), torch.bfloat16, 30)
    idx = _routing(m, experts, topk, 31, dist.get_rank()).cuda()
    w = rank_randn((experts, n, k), torch.bfloat16, 32)
    raises_everywhere(lambda: ops.ag_group_gemm(x, idx, w, context=object()), TypeError, "AllGatherGroupGemmContext")
    raises_everywhere(lambda: ops.ag_group_gemm(x.half(), idx, w, context=ctx), ValueError, "x must be")
    raises_everywhere(lambda: ops.ag_group_gemm(torch.cat([x, x]), torch.cat([idx, idx]), w, context=ctx), ValueError,
                      r"m <= 32")
    raises_everywhere(lambda: ops.ag_group_gemm(x, idx[:, :1].contiguous(), w, context=ctx), ValueError,
                      "topk_idx must be")
    raises_everywhere(lambda: ops.ag_group_gemm(x, idx.float(), w, context=ctx), ValueError, "int32 or int64")
    raises_everywhere(lambda: ops.ag_group_gemm(x, idx, w[:3].contiguous(), context=ctx), ValueError, r"\[4, N, 128\]")
    raises_everywhere(lambda: ops.ag_group_gemm(x, idx, w[:, :60].contiguous(), context=ctx), ValueError,
                      "multiple of 8")
    raises_everywhere(lambda: ops.ag_group_gemm(x, torch.full_like(idx, experts), w, context=ctx), ValueError,
                      r"in \[-1, 4\)")
    raises_everywhere(lambda: ops.ag_group_gemm(x, idx, w, context=ctx, out=torch.empty(3, n, device="cuda",
                                                                                      dtype=torch.bfloat16)),
                      ValueError, "out must be")
    with pytest.raises(ValueError, match="topk"):
        AllGatherGroupGemmContext(m, k, torch.bfloat16, 2, 3)
    # Still works after the errors.
    result = ops.ag_group_gemm(x, idx, w, context=ctx)
    torch.cuda.synchronize()
    world = dist.get_world_size()
    xs = [rank_randn((m, k), torch.bfloat16, 30, rank=r) for r in range(world)]
    routes = [_routing(m, experts, topk, 31, r) for r in range(world)]
    all_ranks_agree(_check(result, xs, routes, w, experts), "ag_group_gemm after bad inputs")
