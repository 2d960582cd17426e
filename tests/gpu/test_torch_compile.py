"""The dense ops under torch.compile (triton_dist.torch_library): torch.ops.triton_dist.* pass
torch's custom-op checks (schema, fake tensors), and a tensor-parallel MLP written with ops.* and
compiled with fullgraph=True gives the eager result (to bf16 rounding); each collective and gemm_ar
compiled alone give exactly the eager bits; out= inside a compiled function is refused, and so is an
op call traced at another world size."""

import pytest
import torch
import torch.distributed as dist

import triton_dist as tdist
from conftest import all_ranks_agree, rank_randn
from triton_dist import ops


def _tp_mlp(x_shard, w1_shard, w2_shard):
    """Sequence-parallel input, column- then row-parallel weights: AllGather+GEMM, then
    GEMM+ReduceScatter back to this rank's rows."""
    h = torch.nn.functional.silu(ops.ag_gemm(x_shard, w1_shard).float()).to(x_shard.dtype)
    return ops.gemm_rs(h, w2_shard)


def test_a_tensor_parallel_mlp_compiles_with_fullgraph():
    world = dist.get_world_size()
    m, hidden, ffn = 128, 512, 1024 * world
    x = rank_randn((m, hidden), torch.bfloat16, 1) * hidden ** -0.25
    w1 = rank_randn((ffn // world, hidden), torch.bfloat16, 2) * hidden ** -0.25
    w2 = rank_randn((hidden, ffn // world), torch.bfloat16, 3) * ffn ** -0.25
    eager = _tp_mlp(x, w1, w2)
    compiled = torch.compile(_tp_mlp, fullgraph=True)
    got = compiled(x, w1, w2)
    torch.cuda.synchronize()
    # The compiled SiLU is Inductor's, which may round unlike torch's: bf16 tolerance, not bits.
    close = got.shape == eager.shape and bool(torch.isfinite(got).all()) and \
        bool(((got.float() - eager.float()).abs() <= 2e-2 * eager.float().abs().max()).all())
    all_ranks_agree(close, "compiled TP MLP differs from eager")


@pytest.mark.parametrize("op", ["all_reduce", "all_gather", "reduce_scatter"])
def test_each_collective_compiles(op):
    world = dist.get_world_size()
    x = rank_randn((4 * world, 256), torch.float32, 4)
    fn = getattr(ops, op)
    eager = fn(x)
    got = torch.compile(lambda t: fn(t) * 2, fullgraph=True)(x)
    torch.cuda.synchronize()
    all_ranks_agree(torch.equal(got, eager * 2), f"compiled {op} differs from eager")


def test_gemm_ar_compiles():
    a = rank_randn((16, 256), torch.bfloat16, 5) * 256 ** -0.25
    b = rank_randn((512, 256), torch.bfloat16, 6) * 256 ** -0.25
    eager = ops.gemm_ar(a, b)
    got = torch.compile(lambda p, q: ops.gemm_ar(p, q), fullgraph=True)(a, b)
    torch.cuda.synchronize()
    all_ranks_agree(torch.equal(got, eager), "compiled gemm_ar differs from eager")


def test_custom_ops_pass_torchs_checks():
    world = dist.get_world_size()
    x = rank_randn((2 * world, 64), torch.float32, 7)
    a = rank_randn((128, 256), torch.bfloat16, 8)
    b = rank_randn((256, 256), torch.bfloat16, 9)
    lib = torch.ops.triton_dist
    cases = [(lib.all_reduce, (x, "auto", world)), (lib.all_gather, (x, "auto", world)),
             (lib.reduce_scatter, (x, "auto", world)), (lib.ag_gemm, (a, b, "auto", world)),
             (lib.gemm_rs, (a, b, "auto", world)), (lib.gemm_ar, (a[:16].contiguous(), b, "auto", world))]
    failed = []
    for op, args in cases:  # the same order on every rank: each check runs the collective
        try:
            torch.library.opcheck(op, args, test_utils=("test_schema", "test_faketensor"))
        except Exception as e:  # noqa: BLE001 - reported through all_ranks_agree
            failed.append(f"{op}: {str(e).splitlines()[0]}")
    all_ranks_agree(not failed, f"torch.library.opcheck: {failed}")


def test_out_and_context_are_refused_inside_compile():
    x = rank_randn((8, 16), torch.float32, 10)
    out = torch.empty_like(x)

    def with_out(t):
        return ops.all_reduce(t, out=out)

    try:
        torch.compile(with_out, fullgraph=True)(x)
        refused = False
    except Exception as e:  # noqa: BLE001 - dynamo wraps the ValueError
        refused = "cannot be given inside torch.compile" in str(e)
    torch.cuda.synchronize()
    tdist.barrier()
    all_ranks_agree(refused, "ops.all_reduce(out=...) inside torch.compile was not refused")


def test_a_graph_traced_at_another_world_size_is_refused():
    """The world size is a literal of each op's call (torch_library's notes: Inductor's graph cache
    would otherwise hand a graph traced at one world size to a run at another); the op refuses a
    call whose world is not the runtime's, on every rank, before any collective starts."""
    world = dist.get_world_size()
    x = rank_randn((4 * world, 32), torch.float32, 11)
    try:
        torch.ops.triton_dist.all_gather(x, "auto", world + 1)
        refused = False
    except Exception as e:  # noqa: BLE001 - torch.library may wrap the ValueError
        refused = f"traced at world size {world + 1}" in str(e)
    torch.cuda.synchronize()
    tdist.barrier()
    all_ranks_agree(refused, "torch.ops.triton_dist.all_gather with another world size was not refused")
