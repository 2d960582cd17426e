"""Tutorial 09: a mixture-of-experts layer with tensor parallelism (AllGather + grouped GEMMs).

    torchrun --nproc-per-node=2 tutorials/09_moe_tensor_parallel.py

Every rank holds a sequence shard of the tokens and a tensor-parallel shard of every expert (the
first weight split by output columns, the second by input columns), as in a Megatron-style MoE
layer. ``ops.ag_group_gemm`` gathers every rank's tokens while the grouped GEMM of the first
weights already runs on the rows that have arrived, and returns them expert-major;
``ops.group_gemm_rs`` applies the second weights to the same rows and, in its epilogue, weights
each (token, k) row by its router weight and adds it into the token's row on the rank that owns
the token, so that each rank ends with its own tokens summed over experts and over the ranks'
shards. ``moe_layer_unfused`` spells the second half out with plain ops (grouped GEMM, a weighted
``index_add_``, ``ops.reduce_scatter``) to show what the fused op replaces. No host
synchronisation inside the layer.

The check: every rank recomputes its own tokens' outputs with the whole experts (rebuilt from
seeds), in fp32.
"""

import torch

import triton_dist as tdist
from triton_dist import ops
from triton_dist.kernels.moe import AllGatherGroupGemmContext, GroupGemmReduceScatterContext

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


def moe_layer(x, idx, weights, w1_shard, w2_shard, agg, grs):
    """This rank's tokens through the layer; ``w*_shard``: this rank's slices of every expert."""
    h = ops.ag_group_gemm(x, idx, w1_shard, context=agg)  # [world * TOKENS * TOPK, FFN / world], expert-major
    act = torch.nn.functional.silu(h.out)
    return ops.group_gemm_rs(act, w2_shard, h, weights, context=grs)  # [TOKENS, HIDDEN], this rank's tokens


def moe_layer_unfused(x, idx, weights, w1_shard, w2_shard, agg):
    """The same layer with the second GEMM, the top-k combine and the reduction as separate ops."""
    world = tdist.world_size()
    h = ops.ag_group_gemm(x, idx, w1_shard, context=agg)
    act = torch.nn.functional.silu(h.out)
    y = ops.group_gemm(act, w2_shard, offsets=h.offsets, check_rows=False)  # partial sums over this rank's slice
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
    agg = AllGatherGroupGemmContext(TOKENS, HIDDEN, torch.bfloat16, EXPERTS, TOPK)
    grs = GroupGemmReduceScatterContext(TOKENS, HIDDEN, torch.bfloat16, EXPERTS, TOPK)
    ok = True
    for step in range(rounds):
        x, idx, weights = tokens_and_routing(me, step)
        out = moe_layer(x, idx, weights, w1_shard, w2_shard, agg, grs)
        unfused = moe_layer_unfused(x, idx, weights, w1_shard, w2_shard, agg)
        torch.cuda.synchronize()
        want = torch.zeros((TOKENS, HIDDEN), device="cuda")
        for k in range(TOPK):
            for e in idx[:, k].unique().tolist():
                rows = idx[:, k] == e
                hidden = torch.nn.functional.silu(x[rows].float() @ w1[e].float().T)
                want[rows] += weights[rows, k, None] * (hidden @ w2[e].float().T)
        err = ((out.float() - want).abs().max() / want.abs().max()).item()
        err_unfused = ((unfused - want).abs().max() / want.abs().max()).item()
        ok = ok and err < 3e-2 and err_unfused < 3e-2
        if me == 0:
            print(f"step {step}: max relative error {err:.1e} (fused), {err_unfused:.1e} (unfused)", flush=True)
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
