"""Tutorial 09: a mixture-of-experts layer with tensor parallelism (AllGather + grouped GEMMs).

    torchrun --nproc-per-node=2 tutorials/09_moe_tensor_parallel.py

Every rank holds a sequence shard of the tokens and a tensor-parallel shard of every expert (the
first weight split by output columns, the second by input columns), as in a Megatron-style MoE
layer. ``ops.ag_group_gemm`` gathers every rank's tokens while the grouped GEMM of the first
weights already runs on the rows that have arrived, and returns them expert-major;
``ops.group_gemm`` applies the second weights to the same rows; an ``index_add_`` weights each
(token, k) row by its router weight back into token order; ``ops.reduce_scatter`` sums the ranks'
partial outputs and hands each rank its own tokens back. No host synchronisation inside the layer.

The check: every rank recomputes its own tokens' outputs with the whole experts (rebuilt from
seeds), in fp32.
"""

import torch

import triton_dist as tdist
from triton_dist import ops
from triton_dist.kernels.moe import AllGatherGroupGemmContext

HIDDEN, FFN, EXPERTS, TOPK, TOKENS = 1024, 2048, 8, 2, 128


def _generator(seed: int) -> torch.Generator:
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    return g


def whole_experts():
    """Every expert's MLP, the same on every rank (seeded): ``w1 [E, FFN, HIDDEN]``, ``w2 [E, HIDDEN, FFN]``."""
    g = _generator(1000)
    w1 = torch.randn((EXPERTS, FFN, HIDDEN), generator=g, device="cuda") * HIDDEN ** -0.5
    w2 = torch.randn((EXPERTS, HIDDEN, FFN), generator=g, device="cuda") * FFN ** -0.5
    return w1.bfloat16(), w2.bfloat16()


def tokens_and_routing(rank: int, step: int):
    g = _generator(10 * step + rank)
    x = torch.randn((TOKENS, HIDDEN), generator=g, device="cuda").bfloat16()
    router = torch.randn((TOKENS, EXPERTS), generator=g, device="cuda")
    weights, idx = torch.softmax(router, -1).topk(TOPK, dim=-1)
    return x, idx.int(), weights


def moe_layer(x, idx, weights, w1_shard, w2_shard, ctx):
    """This rank's tokens through the layer; ``w*_shard``: this rank's slices of every expert."""
    world = tdist.world_size()
    h = ops.ag_group_gemm(x, idx, w1_shard, context=ctx)  # [world * TOKENS * TOPK, FFN / world], expert-major
    act = torch.nn.functional.silu(h.out)
    y = ops.group_gemm(act, w2_shard, offsets=h.offsets)  # partial sums over this rank's FFN slice
    every_weight = ops.all_gather(weights.contiguous()).view(world * TOKENS, TOPK)
    scale = every_weight[h.token_index.long(), h.topk_slot.long()][:, None]
    used = torch.arange(y.shape[0], device=y.device) < h.offsets[-1]  # pairs routed to no expert sort last
    combined = torch.zeros((world * TOKENS, HIDDEN), device=y.device, dtype=torch.float32)
    combined.index_add_(0, h.token_index.long(), torch.where(used[:, None], y.float() * scale, 0.0))
    return ops.reduce_scatter(combined)  # [TOKENS, HIDDEN]: the sum over ranks, this rank's tokens


def check(rounds: int = 3) -> bool:
    world, me = tdist.world_size(), tdist.rank()
    w1, w2 = whole_experts()
    cols = FFN // world
    w1_shard = w1[:, me * cols:(me + 1) * cols].contiguous()
    w2_shard = w2[:, :, me * cols:(me + 1) * cols].contiguous()
    ctx = AllGatherGroupGemmContext(TOKENS, HIDDEN, torch.bfloat16, EXPERTS, TOPK)
    ok = True
    for step in range(rounds):
        x, idx, weights = tokens_and_routing(me, step)
        out = moe_layer(x, idx, weights, w1_shard, w2_shard, ctx)
        torch.cuda.synchronize()
        want = torch.zeros((TOKENS, HIDDEN), device="cuda")
        for k in range(TOPK):
            for e in idx[:, k].unique().tolist():
                rows = idx[:, k] == e
                hidden = torch.nn.functional.silu(x[rows].float() @ w1[e].float().T)
                want[rows] += weights[rows, k, None] * (hidden @ w2[e].float().T)
        err = ((out - want).abs().max() / want.abs().max()).item()
        ok = ok and err < 3e-2
        if me == 0:
            print(f"step {step}: max relative error {err:.1e}", flush=True)
    tdist.barrier()
    return ok


def main():
    tdist.init()
    ok = check()
    print(f"rank {tdist.rank()}: the tensor-parallel MoE layer {'matches' if ok else 'DIFFERS FROM'} the reference")
    tdist.finalize()
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
