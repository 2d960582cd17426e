"""Expert-parallel dispatch and combine (triton_dist.kernels.moe) against a torch reference that every
rank computes from every rank's seeded inputs: uniform and skewed routing, every token's experts on
one rank, ``-1`` entries and tokens routed nowhere, topk 1, 2 and 8, hidden 7168 and odd sizes. What
dispatch moves is compared exactly (routing is not arithmetic), combine within bf16 rounding. Also
1,000 back-to-back calls with changing routing, the send/receive split with two micro-batches in
flight, CUDA-graph capture and replay, bad input, and FP8 dispatch against torch's quantisation.
Any world size."""

import pytest
import torch

import triton_dist as tdist
from conftest import all_ranks_agree, rank_generator, raises_everywhere
from triton_dist import ops
from triton_dist.kernels import EPContext

DTYPE = torch.bfloat16


def routing(seed: int, rank: int, tokens: int, hidden: int, experts: int, topk: int, kind: str):
    """Rank ``rank``'s ``(x, topk_idx, topk_weights)`` for ``seed``; any rank can redraw any rank's."""
    world = tdist.world_size()
    g = rank_generator(seed, rank)
    x = torch.randn((tokens, hidden), device="cuda", generator=g).to(DTYPE)
    scores = torch.rand((tokens, experts), device="cuda", generator=g)
    local = experts // world
    if kind == "skewed":  # one hot expert in every token, the upper half of the experts idle
        scores[:, 1] += 10
        scores[:, experts // 2:] -= 10
    elif kind == "one_rank":  # every token's experts on rank (rank + 1) % world
        d = (rank + 1) % world
        scores[:, d * local:(d + 1) * local] += 10
    idx = scores.topk(topk, dim=1).indices.to(torch.int32)
    if kind == "with_none":
        idx[::3, -1] = -1
        idx[::7] = -1  # routed nowhere: combine gives zeros
    weights = torch.rand((tokens, topk), device="cuda", generator=g)
    return x, idx.contiguous(), weights


def tokens_of(rank: int, max_tokens: int) -> int:
    return max_tokens - 3 * (rank % 3)  # ranks send different counts


def expected_dispatch(seed, ctx, kind):
    """What this rank's experts receive: per local expert, rows ordered by source rank, then by
    the source's (token, k) order."""
    me, world, local = tdist.rank(), tdist.world_size(), ctx.local_experts
    xs, ws = [[] for _ in range(local)], [[] for _ in range(local)]
    for r in range(world):
        x, idx, w = routing(seed, r, tokens_of(r, ctx.max_tokens), ctx.hidden, ctx.num_experts, ctx.topk, kind)
        for j in range(local):
            t, k = (idx == me * local + j).nonzero(as_tuple=True)
            xs[j].append(x[t])
            ws[j].append(w[t, k])
    return [torch.cat(v) for v in xs], [torch.cat(v) for v in ws]


def expert_scale(e: int, experts: int) -> float:
    return 0.5 + e / experts


def experts_forward(d, ctx):
    """A stand-in for the expert GEMMs: expert ``e`` scales its rows by ``expert_scale(e)``."""
    me, local = tdist.rank(), ctx.local_experts
    y = torch.full_like(d.x, float("nan"))  # rows past the counts must never be read
    counts = d.counts.tolist()
    for j in range(local):
        y[j, :counts[j]] = (d.x[j, :counts[j]].float() * expert_scale(me * local + j, ctx.num_experts)).to(DTYPE)
    return y


def expected_combine(seed, ctx, kind):
    me, world, local = tdist.rank(), tdist.world_size(), ctx.local_experts
    x, idx, w = routing(seed, me, tokens_of(me, ctx.max_tokens), ctx.hidden, ctx.num_experts, ctx.topk, kind)
    total = torch.zeros(x.shape, device="cuda", dtype=torch.float32)
    for d in range(world):  # each rank's partial rounded to the dtype, then summed in rank order
        partial = torch.zeros_like(total)
        for k in range(ctx.topk):
            e = idx[:, k]
            here = (e >= d * local) & (e < (d + 1) * local)
            scale = torch.tensor([expert_scale(int(v), ctx.num_experts) for v in e.clamp(min=0).tolist()],
                                 device="cuda")
            y = (x.float() * scale[:, None]).to(DTYPE).float()
            partial += torch.where(here[:, None], w[:, k, None] * y, 0.0)
        total += partial.to(DTYPE).float()
    return total.to(DTYPE)


def check_call(ctx, seed, kind, send_only=False):
    """One dispatch and combine of ``seed``'s routing, checked; returns what failed."""
    me = tdist.rank()
    x, idx, w = routing(seed, me, tokens_of(me, ctx.max_tokens), ctx.hidden, ctx.num_experts, ctx.topk, kind)
    out_x = torch.full((ctx.local_experts, ctx.world * ctx.max_tokens, ctx.hidden), float("nan"), device="cuda",
                       dtype=DTYPE)
    out_w = torch.full(out_x.shape[:2], float("nan"), device="cuda")
    d = ops.ep_dispatch(x, idx, w, context=ctx, send_only=send_only, out_x=out_x, out_weight=out_w)
    if send_only:
        ctx.receive(d.handle)
    want_x, want_w = expected_dispatch(seed, ctx, kind)
    bad = []
    counts = d.counts.tolist()
    for j in range(ctx.local_experts):
        n = want_x[j].shape[0]
        if counts[j] != n:
            bad.append(f"expert {j}: {counts[j]} rows, expected {n}")
        elif not (torch.equal(d.x[j, :n], want_x[j]) and torch.equal(d.weights[j, :n], want_w[j])):
            bad.append(f"expert {j}: rows or weights differ")
    return bad + combine_errors(ops.ep_combine(experts_forward(d, ctx), d.handle), seed, ctx, kind)


def combine_errors(out, seed, ctx, kind):
    """What is wrong with combine's ``out`` for ``seed``'s routing (bf16 rounding allowed)."""
    want = expected_combine(seed, ctx, kind)
    if torch.allclose(out.float(), want.float(), rtol=2e-2, atol=2e-2):
        return []
    return [f"combine: max error {(out.float() - want.float()).abs().max().item():.3g}"]


SHAPES = [  # (max_tokens, hidden, experts per rank, topk)
    (128, 7168, 8, 8),
    (61, 1001, 3, 2),
    (32, 256, 2, 1),
]


@pytest.fixture(scope="module", params=SHAPES, ids=lambda s: f"T{s[0]}-H{s[1]}-L{s[2]}-k{s[3]}")
def ctx(request):
    max_tokens, hidden, local, topk = request.param
    return EPContext(max_tokens, hidden, local * tdist.world_size(), topk, DTYPE)


def skip_impossible_routing(ctx, kind):
    """Skip routings ``ctx``'s shape cannot have."""
    if kind == "one_rank" and ctx.topk > ctx.local_experts:
        pytest.skip("every token's experts on one rank needs topk <= experts per rank")
    if kind == "skewed" and ctx.topk > ctx.num_experts // 2:
        pytest.skip("skewed routing keeps half the experts idle")


@pytest.mark.parametrize("kind", ["uniform", "skewed", "one_rank", "with_none"])
def test_dispatch_and_combine_match_torch(ctx, kind):
    skip_impossible_routing(ctx, kind)
    bad = check_call(ctx, seed=11, kind=kind)
    all_ranks_agree(not bad, f"rank {tdist.rank()}: {bad[:4]}")


def test_send_receive_split_with_two_batches_in_flight(ctx):
    me = tdist.rank()
    inputs = [routing(20 + i, me, tokens_of(me, ctx.max_tokens), ctx.hidden, ctx.num_experts, ctx.topk, "uniform")
              for i in range(2)]
    a = ops.ep_dispatch(*inputs[0], context=ctx, send_only=True)
    b = ops.ep_dispatch(*inputs[1], context=ctx, send_only=True)
    raises_everywhere(lambda: ops.ep_dispatch(*inputs[0], context=ctx, send_only=True), ValueError,
                      "two dispatches are already waiting")
    raises_everywhere(lambda: ctx.receive(b.handle), ValueError, "in their order")
    placeholder = torch.zeros((ctx.local_experts, ctx.world * ctx.max_tokens, ctx.hidden), device="cuda", dtype=DTYPE)
    raises_everywhere(lambda: ops.ep_combine(placeholder, a.handle), ValueError, r"call receive\(handle\) first")
    ctx.receive(a.handle)
    raises_everywhere(lambda: ctx.receive(a.handle), ValueError, "already received")
    ctx.receive(b.handle)
    outs = [ops.ep_combine(experts_forward(d, ctx), d.handle) for d in (a, b)]
    bad = [i for i, out in enumerate(outs)
           if not torch.allclose(out.float(), expected_combine(20 + i, ctx, "uniform").float(), rtol=2e-2, atol=2e-2)]
    all_ranks_agree(not bad, f"rank {me}: micro-batches {bad} combined wrong")


def test_bad_input_is_refused(ctx):
    me = tdist.rank()
    tokens = tokens_of(me, ctx.max_tokens)
    x, idx, w = routing(5, me, tokens, ctx.hidden, ctx.num_experts, ctx.topk, "uniform")
    too_big = idx.clone()
    too_big[0, 0] = ctx.num_experts
    raises_everywhere(lambda: ops.ep_dispatch(x, too_big, w, context=ctx), ValueError, "expert ids must be in")
    raises_everywhere(lambda: ops.ep_dispatch(x, idx - 2, w, context=ctx), ValueError, "expert ids must be in")
    raises_everywhere(lambda: ops.ep_dispatch(x, idx.float(), w, context=ctx), ValueError, "int32 or int64")
    raises_everywhere(lambda: ops.ep_dispatch(x.float(), idx, w, context=ctx), ValueError, "x must be")
    raises_everywhere(lambda: ops.ep_dispatch(x[:, :-1], idx, w, context=ctx), ValueError, "x must be")
    big = torch.zeros((ctx.max_tokens + 1, ctx.hidden), device="cuda", dtype=DTYPE)
    big_idx = torch.zeros((ctx.max_tokens + 1, ctx.topk), device="cuda", dtype=torch.int32)
    big_w = torch.zeros((ctx.max_tokens + 1, ctx.topk), device="cuda")
    raises_everywhere(lambda: ops.ep_dispatch(big, big_idx, big_w, context=ctx), ValueError, "at most")
    raises_everywhere(lambda: ops.ep_dispatch(x, idx, w.half(), context=ctx), ValueError, "float32")
    if ctx.topk > 1:
        raises_everywhere(lambda: ops.ep_dispatch(x, idx.t().contiguous().t(), w, context=ctx), ValueError,
                          "contiguous")
    raises_everywhere(lambda: ops.ep_dispatch(x, idx, w, context=None), TypeError, "EPContext")
    d = ops.ep_dispatch(x, idx, w, context=ctx)
    y = experts_forward(d, ctx)
    raises_everywhere(lambda: ops.ep_combine(y[:, :-1], d.handle), ValueError, "y must be")
    raises_everywhere(lambda: ops.ep_combine(y, "handle"), TypeError, "EPHandle")
    ops.ep_combine(y, d.handle)
    raises_everywhere(lambda: ops.ep_combine(y, d.handle), ValueError, "already combined")
    # Nothing above left the context broken.
    bad = check_call(ctx, seed=6, kind="uniform")
    all_ranks_agree(not bad, f"rank {me}: after the refusals: {bad[:3]}")


def test_a_handle_of_another_context_is_refused():
    me = tdist.rank()
    one = EPContext(16, 256, 2 * tdist.world_size(), 1, DTYPE)
    two = EPContext(16, 256, 2 * tdist.world_size(), 1, DTYPE)
    x, idx, w = routing(9, me, 16, 256, one.num_experts, 1, "uniform")
    d = one.dispatch(x, idx, w)
    raises_everywhere(lambda: two.combine(experts_forward(d, one), d.handle), ValueError, "another EPContext")
    one.combine(experts_forward(d, one), d.handle)


def test_back_to_back_calls_with_changing_routing():
    """1,000 calls, each checked: the epochs, halves and freed signals of the protocol."""
    ctx = EPContext(24, 128, 4 * tdist.world_size(), 2, DTYPE)
    kinds = ["uniform", "skewed", "with_none", "one_rank"]
    failed = []
    for i in range(1000):
        bad = check_call(ctx, seed=1000 + i, kind=kinds[i % 4], send_only=i % 5 == 0)
        if bad:
            failed.append((i, bad[:2]))
    all_ranks_agree(not failed, f"rank {tdist.rank()}: {len(failed)} of 1000 calls wrong, first {failed[:2]}")


def test_cuda_graph_capture_and_replay():
    me = tdist.rank()
    ctx = EPContext(32, 512, 2 * tdist.world_size(), 2, DTYPE)
    tokens = tokens_of(me, ctx.max_tokens)
    x, idx, w = (t.clone() for t in routing(40, me, tokens, ctx.hidden, ctx.num_experts, ctx.topk, "uniform"))
    scale = torch.tensor([expert_scale(me * ctx.local_experts + j, ctx.num_experts) for j in range(ctx.local_experts)],
                         device="cuda")

    def layer():
        d = ctx.dispatch(x, idx, w, check_routing=False)
        y = (d.x.float() * scale[:, None, None]).to(DTYPE)
        return ctx.combine(y, d.handle)

    layer()  # outside capture: every kernel loaded
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph, stream=stream):
            out = layer()
    torch.cuda.synchronize()
    bad = []
    for seed in range(41, 46):
        nx, nidx, nw = routing(seed, me, tokens, ctx.hidden, ctx.num_experts, ctx.topk, "uniform")
        x.copy_(nx), idx.copy_(nidx), w.copy_(nw)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        if not torch.allclose(out.float(), expected_combine(seed, ctx, "uniform").float(), rtol=2e-2, atol=2e-2):
            bad.append(seed)
    all_ranks_agree(not bad, f"rank {me}: replays of seeds {bad} combined wrong")


def quantized_reference(x):
    """torch's float8 e4m3 of ``x`` (``[rows, hidden]``) with one scale per 128 values, as FP8
    dispatch promises: ``(values [rows, hidden / 128, 128] in fp32, scales [rows, hidden / 128])``."""
    v = x.float().view(x.shape[0], -1, 128)
    amax = v.abs().amax(-1)
    scale = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax))
    return (v / scale[..., None]).to(torch.float8_e4m3fn).float(), scale


@pytest.mark.parametrize("max_tokens,hidden,local,topk", [(128, 7168, 8, 8), (32, 256, 2, 2)])
def test_fp8_dispatch_matches_torch_quantisation(max_tokens, hidden, local, topk):
    """Rows arrive as float8 with per-128 scales equal to torch's quantisation of the same rows (the
    GPU's division is within 2 ulp of torch's, so an fp8 value may round one step apart), the
    weights and counts exactly; combine (bf16) still brings every token back."""
    me = tdist.rank()
    ctx = EPContext(max_tokens, hidden, local * tdist.world_size(), topk, DTYPE, fp8_dispatch=True)
    bad = []
    for seed, kind in ((31, "uniform"), (32, "with_none")):
        x, idx, w = routing(seed, me, tokens_of(me, max_tokens), hidden, ctx.num_experts, topk, kind)
        d = ops.ep_dispatch(x, idx, w, context=ctx)
        scales_shape = (*d.x.shape[:2], hidden // 128)
        if d.x.dtype != torch.float8_e4m3fn or d.scales is None or tuple(d.scales.shape) != scales_shape:
            bad.append(f"x {d.x.dtype}, scales {None if d.scales is None else tuple(d.scales.shape)}")
            break
        want_x, want_w = expected_dispatch(seed, ctx, kind)
        counts = d.counts.tolist()
        for j in range(ctx.local_experts):
            n = want_x[j].shape[0]
            if counts[j] != n or not torch.equal(d.weights[j, :n], want_w[j]):
                bad.append(f"expert {j}: {counts[j]} rows (expected {n}) or weights differ")
                continue
            values, scales = quantized_reference(want_x[j])
            got_scales = d.scales[j, :n]
            got = d.x[j, :n].float().view(n, -1, 128)
            if not torch.allclose(got_scales, scales, rtol=1e-6, atol=0):
                bad.append(f"expert {j}: scales differ by {(got_scales - scales).abs().max().item():.3g}")
            # One fp8 step apart at most: e4m3 has 3 mantissa bits (relative step 2**-3), and
            # subnormals a step of 2**-9.
            if not bool(((got - values).abs() <= values.abs() * 2**-3 + 2**-9).all()):
                bad.append(f"expert {j}: values more than one fp8 step from torch's")
        dequantized = d.x.float().view(*d.x.shape[:2], -1, 128) * d.scales[..., None]
        y = torch.zeros((*d.x.shape[:2], hidden), device="cuda", dtype=DTYPE)
        for j, n in enumerate(counts):
            scale = expert_scale(me * ctx.local_experts + j, ctx.num_experts)
            y[j, :n] = (dequantized[j, :n].reshape(n, hidden) * scale).to(DTYPE)
        out = ops.ep_combine(y, d.handle)
        want = expected_combine(seed, ctx, kind).float()
        if not torch.allclose(out.float(), want, rtol=0.15, atol=0.15 * float(want.abs().max())):
            bad.append(f"combine after fp8: max error {(out.float() - want).abs().max().item():.3g}")
    all_ranks_agree(not bad, f"rank {me}: {bad[:4]}")


def test_fp8_dispatch_needs_whole_blocks():
    with pytest.raises(ValueError, match="multiple of 128"):
        EPContext(16, 1000, 2 * tdist.world_size(), 1, DTYPE, fp8_dispatch=True)
