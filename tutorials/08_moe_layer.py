"""Tutorial 08: a mixture-of-experts layer with expert parallelism (dispatch, expert GEMMs, combine).

    torchrun --nproc-per-node=2 tutorials/08_moe_layer.py

Each rank holds ``experts / world`` experts (a two-layer MLP each) and a batch of tokens; a router
picks every token's top-2 experts. ``ops.ep_dispatch`` sends each token once to every rank that holds
one of its experts and lays the tokens out expert-major there (``d.x[j, :d.counts[j]]`` are expert
``j``'s), the experts' two GEMMs run as ``ops.group_gemm`` over those rows (one kernel for all
local experts, reading ``d.counts`` on the GPU), and ``ops.ep_combine`` brings the outputs back to
the tokens' ranks, weighted by the router and summed, in the original order. No host
synchronisation inside the layer: the layer could be captured in a CUDA graph.

The layer runs twice: as a decode step (64 tokens per rank, the low-latency mode above) and as a
prefill step (1024 tokens per rank, ``EPContext(mode="high_throughput")``): there the tokens
arrive packed, ``d.x [rows, hidden]`` with expert ``j``'s rows ``[d.offsets[j - 1],
d.offsets[j])``, sized by the rows received (one host synchronisation; ``max_recv_rows`` avoids
it), and the grouped GEMMs take ``offsets`` instead of ``counts``.

The check: every rank recomputes the whole layer for its own tokens with every expert's weights
(rebuilt from seeds), in fp32.
"""

import torch

import triton_dist as tdist
from triton_dist import ops
from triton_dist.kernels import EPContext

HIDDEN, FFN, EXPERTS_PER_RANK, TOPK = 1024, 2048, 4, 2
TOKENS = {"low_latency": 64, "high_throughput": 1024}


def _generator(seed: int) -> torch.Generator:
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    return g


def expert_weights(e: int):
    """Expert ``e``'s MLP, the same on every rank (seeded)."""
    g = _generator(1000 + e)
    w1 = torch.randn((FFN, HIDDEN), generator=g, device="cuda") * HIDDEN ** -0.5
    w2 = torch.randn((HIDDEN, FFN), generator=g, device="cuda") * FFN ** -0.5
    return w1.bfloat16(), w2.bfloat16()


def mlp(x, w1, w2):
    return (torch.nn.functional.silu(x @ w1.T) @ w2.T).to(x.dtype)


def check(mode: str, rounds: int = 3) -> bool:
    world, me = tdist.world_size(), tdist.rank()
    experts = EXPERTS_PER_RANK * world
    tokens = TOKENS[mode]
    ctx = EPContext(tokens, HIDDEN, experts, TOPK, torch.bfloat16, mode=mode)
    mine = [expert_weights(me * EXPERTS_PER_RANK + j) for j in range(EXPERTS_PER_RANK)]
    w1 = torch.stack([w for w, _ in mine])  # [local experts, FFN, HIDDEN]: group_gemm's [experts, N, K]
    w2 = torch.stack([w for _, w in mine])  # [local experts, HIDDEN, FFN]
    ok = True
    for step in range(rounds):
        g = _generator(10 * step + me)
        x = torch.randn((tokens, HIDDEN), generator=g, device="cuda").bfloat16()
        router = torch.randn((tokens, experts), generator=g, device="cuda")
        weights, idx = torch.softmax(router, -1).topk(TOPK, dim=-1)
        d = ops.ep_dispatch(x, idx.int(), weights, context=ctx)
        # The rows per expert come from the dispatch, valid by construction: no host check (a
        # synchronisation). Low-latency rows are [experts, capacity] with counts; high-throughput
        # rows are packed with offsets.
        layout = dict(offsets=d.offsets) if mode == "high_throughput" else dict(counts=d.counts)
        h = torch.nn.functional.silu(ops.group_gemm(d.x, w1, check_rows=False, **layout))
        y = ops.group_gemm(h, w2, check_rows=False, **layout)  # rows past a count: never read
        out = ops.ep_combine(y, d.handle)
        torch.cuda.synchronize()
        want = torch.zeros((tokens, HIDDEN), device="cuda")
        for k in range(TOPK):
            for e in idx[:, k].unique().tolist():
                rows = idx[:, k] == e
                want[rows] += weights[rows, k, None] * mlp(x[rows], *expert_weights(e)).float()
        err = ((out.float() - want).abs().max() / want.abs().max()).item()
        ok = ok and err < 3e-2
        if me == 0:
            print(f"{mode} step {step}: tokens per local expert {d.counts.tolist()}, max relative error {err:.1e}",
                  flush=True)
    tdist.barrier()
    return ok


def main():
    tdist.init()
    ok = check("low_latency") & check("high_throughput")
    print(f"rank {tdist.rank()}: the expert-parallel MoE layer {'matches' if ok else 'DIFFERS FROM'} the reference")
    tdist.finalize()
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
