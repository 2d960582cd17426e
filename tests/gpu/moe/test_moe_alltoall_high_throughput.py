"""High-throughput expert-parallel dispatch and combine (``EPContext(mode="high_throughput")``):
the packed output (expert ``j``'s rows ``[offsets[j - 1], offsets[j])``) against the same torch
reference as the low-latency tests (every rank redraws every rank's seeded routing), exactly for
what dispatch moves and within bf16 rounding for combine; uniform, skewed, one-rank and ``-1``
routing; the output sized by the counts (one host synchronisation) or by ``max_recv_rows`` (none,
rows past it dropped); back-to-back calls with changing routing; CUDA-graph replay with
``max_recv_rows``; bad input. Any world size."""

import pytest
import torch

import triton_dist as tdist
from conftest import all_ranks_agree, raises_everywhere
from test_moe_alltoall import (DTYPE, combine_errors, expected_combine, expected_dispatch, expert_scale, routing,
                               skip_impossible_routing, tokens_of)
from triton_dist import ops
from triton_dist.kernels import EPContext


def local_scales(ctx):
    """``expert_scale`` of this rank's experts, on the GPU."""
    me, local = tdist.rank(), ctx.local_experts
    return torch.tensor([expert_scale(me * local + j, ctx.num_experts) for j in range(local)], device="cuda")


def packed_experts_forward(d, ctx, scales=None):
    """The stand-in expert GEMMs of the low-latency tests on the packed rows: expert ``e`` scales
    its rows by ``expert_scale(e)``; with ``scales`` (:func:`local_scales`) GPU work only, so a
    CUDA graph can capture it."""
    local = ctx.local_experts
    scales = local_scales(ctx) if scales is None else scales
    rows = torch.arange(d.x.shape[0], device="cuda", dtype=torch.int32)
    expert = torch.searchsorted(d.offsets, rows, right=True).clamp(max=local - 1)
    return (d.x.float() * scales[expert][:, None]).to(DTYPE)


def check_packed(ctx, d, seed, kind, rows=None):
    """What failed in dispatch ``d`` of ``seed``'s routing (``rows``: the output's capacity, when
    the caller gave one)."""
    want_x, want_w = expected_dispatch(seed, ctx, kind)
    bad = []
    counts = d.counts.tolist()
    want_counts = [w.shape[0] for w in want_x]
    if counts != want_counts:
        return [f"counts {counts}, expected {want_counts}"]
    ends = torch.cumsum(torch.tensor(want_counts), 0).tolist()
    capacity = ends[-1] if rows is None else rows
    ends = [min(e, capacity) for e in ends]  # offsets stay within the output's rows
    if d.offsets.tolist() != ends:
        bad.append(f"offsets {d.offsets.tolist()}, expected {ends}")
    if d.x.shape[0] != capacity or d.weights.shape[0] != capacity:
        bad.append(f"{d.x.shape[0]} rows, expected {capacity}")
    start = 0
    for j, (x, w) in enumerate(zip(want_x, want_w)):
        keep = max(0, min(x.shape[0], capacity - start))  # rows past the capacity are dropped
        got_x, got_w = d.x[start:start + keep], d.weights[start:start + keep]
        if not (torch.equal(got_x, x[:keep]) and torch.equal(got_w, w[:keep])):
            bad.append(f"expert {j}: rows or weights differ")
        start += x.shape[0]
    return bad


def check_call(ctx, seed, kind, max_recv_rows=None):
    me = tdist.rank()
    x, idx, w = routing(seed, me, tokens_of(me, ctx.max_tokens), ctx.hidden, ctx.num_experts, ctx.topk, kind)
    d = ops.ep_dispatch(x, idx, w, context=ctx, max_recv_rows=max_recv_rows)
    bad = check_packed(ctx, d, seed, kind, max_recv_rows)
    return bad + combine_errors(ops.ep_combine(packed_experts_forward(d, ctx), d.handle), seed, ctx, kind)


SHAPES = [  # (max_tokens, hidden, experts per rank, topk)
    (512, 7168, 8, 8),
    (300, 1001, 3, 2),
    (64, 256, 2, 1),
]


def poisoned(ctx):
    """``ctx`` with every packed output NaN before the receive writes it: a row the receive
    misses cannot pass for one that an earlier call left there."""
    allocate = ctx._packed_outputs

    def poisoned_outputs(rows):
        outputs = allocate(rows)
        for t in outputs.values():
            if t is not None:
                t.fill_(float("nan"))
        return outputs

    ctx._packed_outputs = poisoned_outputs
    return ctx


def high_throughput_context(max_tokens, hidden, experts, topk):
    return poisoned(EPContext(max_tokens, hidden, experts, topk, DTYPE, mode="high_throughput"))


@pytest.fixture(scope="module", params=SHAPES, ids=lambda s: f"T{s[0]}-H{s[1]}-L{s[2]}-k{s[3]}")
def ctx(request):
    max_tokens, hidden, local, topk = request.param
    return high_throughput_context(max_tokens, hidden, local * tdist.world_size(), topk)


@pytest.mark.parametrize("kind", ["uniform", "skewed", "one_rank", "with_none"])
def test_packed_dispatch_and_combine_match_torch(ctx, kind):
    skip_impossible_routing(ctx, kind)
    bad = check_call(ctx, seed=21, kind=kind)
    all_ranks_agree(not bad, f"rank {tdist.rank()}: {bad[:4]}")


def test_max_recv_rows_sizes_the_output_without_a_synchronisation(ctx):
    received = sum(x.shape[0] for x in expected_dispatch(31, ctx, "uniform")[0])
    # Room to spare, but none at world 1, where every rank receives the most it can.
    bad = check_call(ctx, seed=31, kind="uniform", max_recv_rows=min(received + 17, ctx.max_recv_rows))
    me = tdist.rank()
    x, idx, w = routing(32, me, tokens_of(me, ctx.max_tokens), ctx.hidden, ctx.num_experts, ctx.topk, "uniform")
    short = max(0, sum(v.shape[0] for v in expected_dispatch(32, ctx, "uniform")[0]) - 5)
    d = ops.ep_dispatch(x, idx, w, context=ctx, max_recv_rows=short)  # the last 5 rows do not fit
    bad += check_packed(ctx, d, 32, "uniform", short)
    ops.ep_combine(packed_experts_forward(d, ctx), d.handle)
    torch.cuda.synchronize()
    all_ranks_agree(not bad, f"rank {tdist.rank()}: {bad[:4]}")


def test_back_to_back_calls_with_changing_routing():
    """300 calls, each checked: one half of every buffer, reused call after call."""
    ctx = high_throughput_context(96, 128, 4 * tdist.world_size(), 2)
    kinds = ["uniform", "skewed", "with_none", "one_rank"]
    failed = []
    for i in range(300):
        bad = check_call(ctx, seed=3000 + i, kind=kinds[i % 4], max_recv_rows=None if i % 3 else ctx.max_recv_rows)
        if bad:
            failed.append((i, bad[:2]))
    all_ranks_agree(not failed, f"rank {tdist.rank()}: {len(failed)} of 300 calls wrong, first {failed[:2]}")


def test_cuda_graph_replay_with_max_recv_rows():
    me = tdist.rank()
    ctx = high_throughput_context(64, 512, 2 * tdist.world_size(), 2)
    tokens = tokens_of(me, ctx.max_tokens)
    rows = tdist.world_size() * ctx.max_tokens * ctx.topk  # every entry fits
    x, idx, w = (t.clone() for t in routing(50, me, tokens, ctx.hidden, ctx.num_experts, ctx.topk, "uniform"))
    d = ops.ep_dispatch(x, idx, w, context=ctx, max_recv_rows=rows)  # warm, outside the capture
    ops.ep_combine(packed_experts_forward(d, ctx), d.handle)
    torch.cuda.synchronize()
    tdist.barrier()
    scales = local_scales(ctx)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        d = ops.ep_dispatch(x, idx, w, context=ctx, max_recv_rows=rows)
        out = ops.ep_combine(packed_experts_forward(d, ctx, scales), d.handle)
    ok = True
    for step in range(4):
        seed = 60 + step
        for mine, theirs in zip((x, idx, w), routing(seed, me, tokens, ctx.hidden, ctx.num_experts, ctx.topk,
                                                     "uniform")):
            mine.copy_(theirs)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ok &= not check_packed(ctx, d, seed, "uniform", rows)
        ok &= torch.allclose(out.float(), expected_combine(seed, ctx, "uniform").float(), rtol=2e-2, atol=2e-2)
    all_ranks_agree(ok, "high-throughput dispatch and combine replayed in a CUDA graph")


def test_bad_input_is_refused():
    world, me = tdist.world_size(), tdist.rank()
    raises_everywhere(lambda: EPContext(16, 128, 2 * world, 2, DTYPE, mode="fast"), ValueError, "mode must be")
    raises_everywhere(lambda: EPContext(2048, 128, 2 * world, 2, DTYPE), ValueError, "high_throughput")
    ctx = high_throughput_context(16, 128, 2 * world, 2)
    x, idx, w = routing(70, me, tokens_of(me, 16), 128, ctx.num_experts, 2, "uniform")
    raises_everywhere(lambda: ops.ep_dispatch(x, idx, w, context=ctx, send_only=True), ValueError, "low_latency")
    raises_everywhere(lambda: ops.ep_dispatch(x, idx, w, context=ctx, max_recv_rows=-1), ValueError, "max_recv_rows")
    raises_everywhere(lambda: ops.ep_dispatch(x, idx, w, context=ctx, max_recv_rows=ctx.max_recv_rows + 1), ValueError,
                      "the most entries")
    d = ops.ep_dispatch(x, idx, w, context=ctx)
    raises_everywhere(lambda: ops.ep_dispatch(x, idx, w, context=ctx), ValueError, "combine dispatch")
    raises_everywhere(lambda: ops.ep_combine(d.x[:, :64].contiguous(), d.handle), ValueError, "y must be")
    ops.ep_combine(packed_experts_forward(d, ctx), d.handle)
    low_latency = EPContext(16, 128, 2 * world, 2, DTYPE)
    raises_everywhere(lambda: ops.ep_dispatch(x, idx, w, context=low_latency, max_recv_rows=8), ValueError,
                      "high_throughput")
    all_ranks_agree(not check_call(ctx, seed=71, kind="uniform"), "high-throughput dispatch after bad input")
