"""ops.group_gemm_rs (grouped GEMM + ReduceScatter, MoE tensor parallelism) against torch: every rank
rebuilds every rank's routed rows, weight shards and router weights from seeds and checks its own
tokens' outputs, the router-weighted sum over their experts and over the ranks' shards, element by
element; NaN-poisoned outputs, dropped pairs (-1), back-to-back calls with changing routing (the
halves of the exchange buffer), CUDA graph replay, bad inputs. Also the whole layer: ag_group_gemm
into group_gemm_rs."""

import pytest
import torch
import torch.distributed as dist

from conftest import all_ranks_agree, raises_everywhere, rank_randn
from triton_dist import ops
from triton_dist.kernels.moe import AGGroupGemmOutput, AllGatherGroupGemmContext, GroupGemmReduceScatterContext

_TOL = 2e-2  # relative to the largest output: bf16 inputs, fp32 sums in any order, one rounding


def _routing(m, experts, topk, seed, rank):
    gen = torch.Generator().manual_seed(seed * 1009 + rank)
    idx = torch.stack([torch.randperm(experts, generator=gen)[:topk] for _ in range(m)]) if m else \
        torch.zeros((0, topk), dtype=torch.int64)
    idx[torch.rand(idx.shape, generator=gen) < 0.125] = -1
    weights = torch.rand(idx.shape, generator=gen)
    return idx.to(torch.int32), weights


class _Case:
    """Every rank's routing, router weights, routed rows and weight shards, rebuilt from seeds."""

    def __init__(self, m, k, n, experts, topk, seed, layout_ctx):
        world = dist.get_world_size()
        self.m, self.n, self.experts, self.topk = m, n, experts, topk
        routes = [_routing(m, experts, topk, seed, r) for r in range(world)]
        self.idx_all = torch.cat([i for i, _ in routes]).cuda()
        self.weights = [w.cuda() for _, w in routes]
        offsets, token_index, topk_slot = layout_ctx.layout(self.idx_all)
        self.layout = AGGroupGemmOutput(None, offsets, token_index, topk_slot)
        rows = world * m * topk
        self.acts = [rank_randn((rows, k), torch.bfloat16, seed + 1, rank=r) * k ** -0.25 for r in range(world)]
        self.ws = [rank_randn((experts, n, k), torch.bfloat16, seed + 2, rank=r) * k ** -0.25 for r in range(world)]

    def expected(self, rank):
        """Rank ``rank``'s tokens: sum over ranks and routed pairs of weight * act row @ w[e].T."""
        m = self.m
        want = torch.zeros((m, self.n), device="cuda")
        valid = int(self.layout.offsets[-1])
        tokens = self.layout.token_index[:valid].long()
        slots = self.layout.topk_slot[:valid].long()
        experts = self.idx_all.long()[tokens, slots]
        weights_all = torch.cat(self.weights)
        mine = (tokens // m) == rank
        for act, w in zip(self.acts, self.ws):
            for e in range(self.experts):
                rows = mine & (experts == e)
                if rows.any():
                    part = act[:valid][rows].float() @ w[e].float().T
                    scale = weights_all[tokens[rows], slots[rows]][:, None]
                    want.index_add_(0, tokens[rows] - rank * m, part * scale)
        return want


def _close(got, want):
    scale = float(want.abs().max()) or 1.0
    return bool(torch.isfinite(got).all()) and bool(((got.float() - want).abs() <= _TOL * scale).all())


# (128, 256, 1024) and (128, 256, 512): sums of 64 Ki elements and more, where the finish kernel
# once zeroed some before reading them (tutorial 09's shapes at worlds 2 and 8).
@pytest.mark.parametrize("m,k,n,experts,topk", [(64, 256, 128, 8, 2), (7, 128, 64, 4, 1), (1, 64, 256, 16, 4),
                                               (128, 256, 1024, 8, 2), (128, 256, 512, 8, 2)])
def test_matches_torch(m, k, n, experts, topk):
    me = dist.get_rank()
    layout_ctx = AllGatherGroupGemmContext(max(m, 64), 64, torch.bfloat16, experts, topk)
    ctx = GroupGemmReduceScatterContext(max(m, 64), n, torch.bfloat16, experts, topk)
    case = _Case(m, k, n, experts, topk, seed=m + n, layout_ctx=layout_ctx)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    got = ops.group_gemm_rs(case.acts[me], case.ws[me], case.layout, case.weights[me], context=ctx, out=out)
    torch.cuda.synchronize()
    all_ranks_agree(got is out and _close(got, case.expected(me)), f"group_gemm_rs m={m} k={k} n={n} E={experts}")


def test_back_to_back_with_changing_routing():
    calls, m, k, n, experts, topk = 100, 128, 128, 512, 8, 2  # m * n = 64 Ki: see test_matches_torch
    me = dist.get_rank()
    layout_ctx = AllGatherGroupGemmContext(m, 64, torch.bfloat16, experts, topk)
    ctx = GroupGemmReduceScatterContext(m, n, torch.bfloat16, experts, topk)
    cases = [_Case(m, k, n, experts, topk, seed=500 + i, layout_ctx=layout_ctx) for i in range(calls)]
    outs = [torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16) for _ in range(calls)]
    for case, out in zip(cases, outs):  # no synchronisation between calls
        ops.group_gemm_rs(case.acts[me], case.ws[me], case.layout, case.weights[me], context=ctx, out=out)
    torch.cuda.synchronize()
    bad = [i for i in range(0, calls, 7) if not _close(outs[i], cases[i].expected(me))]
    all_ranks_agree(not bad, f"group_gemm_rs back to back: wrong calls {bad}")


def test_cuda_graph_replay():
    m, k, n, experts, topk = 32, 128, 128, 8, 2
    me = dist.get_rank()
    layout_ctx = AllGatherGroupGemmContext(m, 64, torch.bfloat16, experts, topk)
    ctx = GroupGemmReduceScatterContext(m, n, torch.bfloat16, experts, topk)
    case = _Case(m, k, n, experts, topk, seed=41, layout_ctx=layout_ctx)
    act, w, weights = case.acts[me].clone(), case.ws[me], case.weights[me].clone()
    layout = AGGroupGemmOutput(None, *(t.clone() for t in (case.layout.offsets, case.layout.token_index,
                                                           case.layout.topk_slot)))
    ops.group_gemm_rs(act, w, layout, weights, context=ctx)  # the weights' all_gather context, outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = ops.group_gemm_rs(act, w, layout, weights, context=ctx)
    captured_weights = case.ws  # every rank's graph keeps its weights of this first case
    ok = True
    for step in range(4):  # an even and an odd number of replays: both halves
        case = _Case(m, k, n, experts, topk, seed=60 + step, layout_ctx=layout_ctx)
        case.ws = captured_weights
        act.copy_(case.acts[me])
        weights.copy_(case.weights[me])
        for mine, theirs in zip((layout.offsets, layout.token_index, layout.topk_slot),
                                (case.layout.offsets, case.layout.token_index, case.layout.topk_slot)):
            mine.copy_(theirs)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ok &= _close(out, case.expected(me))
    all_ranks_agree(ok, "group_gemm_rs replayed in a CUDA graph with new rows and routing")


def test_the_whole_layer():
    """ag_group_gemm into group_gemm_rs, no activation: every rank's output is its tokens through
    the experts, with both weights split over the ranks (the first by N, the second by K)."""
    m, hidden, ffn, experts, topk = 48, 256, 512, 8, 2
    world, me = dist.get_world_size(), dist.get_rank()
    shard = ffn // world
    agg = AllGatherGroupGemmContext(m, hidden, torch.bfloat16, experts, topk)
    grs = GroupGemmReduceScatterContext(m, hidden, torch.bfloat16, experts, topk)
    w1 = rank_randn((experts, ffn, hidden), torch.bfloat16, 70, rank=0) * hidden ** -0.25
    w2 = rank_randn((experts, hidden, ffn), torch.bfloat16, 71, rank=0) * ffn ** -0.25
    x = rank_randn((m, hidden), torch.bfloat16, 72) * hidden ** -0.25
    idx, weights = _routing(m, experts, topk, 73, me)
    h = ops.ag_group_gemm(x, idx.cuda(), w1[:, me * shard:(me + 1) * shard].contiguous(), context=agg)
    y = ops.group_gemm_rs(h.out, w2[:, :, me * shard:(me + 1) * shard].contiguous(), h, weights.cuda(), context=grs)
    torch.cuda.synchronize()
    want = torch.zeros((m, hidden), device="cuda")
    for t in range(m):
        for s in range(topk):
            e = int(idx[t, s])
            if e >= 0:
                want[t] += float(weights[t, s]) * ((x[t].float() @ w1[e].float().T) @ w2[e].float().T)
    all_ranks_agree(_close(y, want), "ag_group_gemm -> group_gemm_rs: the layer")


def test_bad_inputs():
    m, k, n, experts, topk = 16, 64, 64, 4, 2
    me = dist.get_rank()
    layout_ctx = AllGatherGroupGemmContext(m, 64, torch.bfloat16, experts, topk)
    ctx = GroupGemmReduceScatterContext(m, n, torch.bfloat16, experts, topk)
    case = _Case(m, k, n, experts, topk, seed=80, layout_ctx=layout_ctx)
    act, w, weights, layout = case.acts[me], case.ws[me], case.weights[me], case.layout
    raises_everywhere(lambda: ops.group_gemm_rs(act, w, layout, weights, context=object()), TypeError,
                      "GroupGemmReduceScatterContext")
    raises_everywhere(lambda: ops.group_gemm_rs(act, w, (1, 2, 3), weights, context=ctx), TypeError, "AGGroupGemmOutput")
    raises_everywhere(lambda: ops.group_gemm_rs(act, w, layout, weights.double(), context=ctx), ValueError,
                      "topk_weights must be")
    raises_everywhere(lambda: ops.group_gemm_rs(act[1:], w, layout, weights, context=ctx), ValueError, "act must be")
    raises_everywhere(lambda: ops.group_gemm_rs(act, w[:, :32].contiguous(), layout, weights, context=ctx), ValueError,
                      "w must be")
    bad_layout = AGGroupGemmOutput(None, layout.offsets.long(), layout.token_index, layout.topk_slot)
    raises_everywhere(lambda: ops.group_gemm_rs(act, w, bad_layout, weights, context=ctx), ValueError, "offsets")
    raises_everywhere(lambda: ops.group_gemm_rs(act, w, layout, weights, context=ctx, out=torch.empty(3, device="cuda")),
                      ValueError, "out must be")
    got = ops.group_gemm_rs(act, w, layout, weights, context=ctx)  # still works
    torch.cuda.synchronize()
    all_ranks_agree(_close(got, case.expected(me)), "group_gemm_rs after bad inputs")
