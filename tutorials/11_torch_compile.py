"""Tutorial 11: the ops under torch.compile. A tensor-parallel MLP written with ``ops.*`` compiles
with ``fullgraph=True``: the dense ops are torch.library custom ops (``torch.ops.triton_dist.*``,
registered by ``init()``), which Dynamo puts in the graph instead of tracing into them, and
Inductor fuses the elementwise work around them.

    torchrun --nproc-per-node=2 tutorials/11_torch_compile.py

The layer: sequence-parallel activations ``x [tokens / world, hidden]``; the first weight split
by output columns (AllGather + GEMM gathers the tokens while the GEMM runs), the second by input
columns (GEMM + ReduceScatter sums the ranks' partials back onto each rank's tokens). The check:
the compiled layer against the same layer run eagerly, and against torch on the whole weights
(rebuilt from seeds on every rank), in fp32.
"""

import torch

import triton_dist as tdist
from triton_dist import ops

TOKENS_PER_RANK, HIDDEN, FFN = 256, 1024, 4096


def mlp(x_shard, w1_shard, w2_shard):
    h = torch.nn.functional.gelu(ops.ag_gemm(x_shard, w1_shard).float()).to(x_shard.dtype)
    return ops.gemm_rs(h, w2_shard)


def main():
    tdist.init()
    world, me = tdist.world_size(), tdist.rank()
    g = torch.Generator(device="cuda").manual_seed(0)  # the same whole weights on every rank
    w1 = (torch.randn((FFN, HIDDEN), generator=g, device="cuda") * HIDDEN ** -0.5).bfloat16()
    w2 = (torch.randn((HIDDEN, FFN), generator=g, device="cuda") * FFN ** -0.5).bfloat16()
    cols = FFN // world
    w1_shard, w2_shard = w1[me * cols:(me + 1) * cols].contiguous(), w2[:, me * cols:(me + 1) * cols].contiguous()
    xs = [torch.randn((TOKENS_PER_RANK, HIDDEN), generator=torch.Generator(device="cuda").manual_seed(10 + r),
                      device="cuda").bfloat16() for r in range(world)]
    compiled = torch.compile(mlp, fullgraph=True)
    eager_out, compiled_out = mlp(xs[me], w1_shard, w2_shard), compiled(xs[me], w1_shard, w2_shard)
    torch.cuda.synchronize()
    whole = torch.cat(xs).float()
    mine = slice(me * TOKENS_PER_RANK, (me + 1) * TOKENS_PER_RANK)
    want = (torch.nn.functional.gelu(whole @ w1.float().T) @ w2.float().T)[mine]
    scale = want.abs().max().item()
    err_eager = (eager_out.float() - want).abs().max().item() / scale
    err_compiled = (compiled_out.float() - want).abs().max().item() / scale
    ok = err_eager < 3e-2 and err_compiled < 3e-2
    # Collective: capturing the graph runs the layer once more on every rank.
    ours = sorted(set(_graph_ops(mlp, xs[me], w1_shard, w2_shard)))
    ok = ok and ours == ["ag_gemm", "gemm_rs"]
    if me == 0:
        print(f"max relative error against torch: eager {err_eager:.1e}, compiled {err_compiled:.1e}", flush=True)
        print(f"triton_dist ops in the captured graph: {ours}", flush=True)
    tdist.barrier()
    print(f"rank {me}: the compiled tensor-parallel MLP {'matches' if ok else 'DIFFERS FROM'} the reference", flush=True)
    tdist.finalize()
    if not ok:
        raise SystemExit(1)


def _graph_ops(fn, *args):
    """The names of the ``torch.ops.triton_dist`` calls in the FX graph Dynamo captures of ``fn``.
    Dynamo records the op as the user called it: the packet (``torch.ops.triton_dist.ag_gemm``,
    printed ``triton_dist.ag_gemm``) or an overload (``triton_dist.ag_gemm.default``)."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    torch.compile(fn, fullgraph=True, backend=backend)(*args)
    calls = [str(n.target) for gm in graphs for n in gm.graph.nodes if n.op == "call_function"]
    if tdist.rank() == 0:
        print(f"calls in the captured graph: {calls}", flush=True)
    return [name.split(".")[1] for name in calls if name.startswith("triton_dist.")]


if __name__ == "__main__":
    main()
