"""triton_dist.ops.reduce_scatter (push, ring, ll and 2d) against torch.distributed.reduce_scatter_tensor.
Under TRITON_DIST_LOCAL_WORLD_SIZE (scripts/gpu-test --local-world L) "2d" and "auto" take the
inter-node path."""

import random

import pytest
import torch
import torch.distributed as dist

import triton_dist as tdist
from conftest import all_ranks_agree, raises_everywhere
from triton_dist import host_collectives, ops
from triton_dist.kernels import ReduceScatterContext
from triton_dist.kernels.collectives.policy import REDUCE_SCATTER_METHOD

_SHARDS = [1, 7, 4099 * 3, 1_000_003]  # elements per shard
_METHODS = ["push", "ring", "ll", "2d"]  # 2d: across nodes (push's reduction at one node)


def _in_rank_order(method):
    """Whether ``method`` sums in fp32 in rank order, rounding once: push, ll, and 2d at one node
    (across nodes 2d sums each node's partial first; "auto" is 2d there)."""
    across = tdist.num_nodes() > 1
    if method == "auto":
        method = "2d" if across else REDUCE_SCATTER_METHOD
    return method in ("push", "ll") or (method == "2d" and not across)


def _fresh(n, dtype, seed):
    g = torch.Generator(device="cuda")
    g.manual_seed(seed * 7919 + dist.get_rank())
    return torch.randn(n, device="cuda", dtype=torch.float32, generator=g).to(dtype)


def _reference(x):
    """This rank's shard of the fp32 sum over ranks of ``x``."""
    return host_collectives.reduce_scatter(x.float().view(-1))


def _matches(x, got, ulps=1):
    """fp32: 1e-5 relative; bf16/fp16: within ``ulps`` ulp of the fp32 sum, rounded."""
    ref = _reference(x)
    got = got.reshape(-1)
    if x.dtype == torch.float32:
        return torch.allclose(got, ref, rtol=1e-5, atol=1e-6 * dist.get_world_size())
    rounded = ref.to(x.dtype).float()
    ulp = torch.finfo(x.dtype).eps * rounded.abs().clamp_min(torch.finfo(x.dtype).tiny)
    return bool(((got.float() - rounded).abs() <= ulps * ulp + 1e-30).all())


def _rank_order_sum(x):
    """This rank's shard of the sum over ranks, summed in fp32 in rank order 0..W-1 and rounded
    once: what push must produce bit for bit."""
    world, me = dist.get_world_size(), dist.get_rank()
    every = host_collectives.all_gather_list(x)
    m = x.numel() // world
    acc = torch.zeros(m, device=x.device, dtype=torch.float32)
    for r in range(world):
        acc += every[r].view(-1)[me * m:(me + 1) * m].float()
    return acc.to(x.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("method", ["auto"] + _METHODS)
@pytest.mark.parametrize("m", _SHARDS)
def test_matches_torch(m, method, dtype):
    world = dist.get_world_size()
    if method == "ll" and world * m * dtype.itemsize > ReduceScatterContext.LL_MAX_BYTES:
        pytest.skip("ll takes at most ReduceScatterContext.LL_MAX_BYTES of input")
    x = _fresh(world * m, dtype, seed=m)
    out = torch.full((m, ), float("nan"), device="cuda", dtype=dtype)
    got = ops.reduce_scatter(x, out=out, method=method)
    torch.cuda.synchronize()
    what = f"reduce_scatter {method} m={m} {dtype}"
    all_ranks_agree(got is out and _matches(x, got, ulps=1 if _in_rank_order(method) else 2), what)
    if _in_rank_order(method):
        all_ranks_agree(torch.equal(got, _rank_order_sum(x)), f"{what}: not the rank-order sum bit for bit")


@pytest.mark.parametrize("method", ["auto"] + _METHODS)
def test_rows_new_tensor_and_in_place(method):
    world, me = dist.get_world_size(), dist.get_rank()
    x = _fresh(world * 3 * 4096, torch.bfloat16, seed=5).view(world * 3, 4096)
    y = ops.reduce_scatter(x, method=method)
    ok = tuple(y.shape) == (3, 4096) and _matches(x, y, ulps=2)
    # In place: out is this rank's rows of x.
    x2 = x.clone()
    mine = x2[me * 3:(me + 1) * 3]
    ops.reduce_scatter(x2, out=mine, method=method)
    torch.cuda.synchronize()
    all_ranks_agree(ok and torch.equal(mine, y), f"reduce_scatter {method}: rows / in place")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_back_to_back_random_sizes(dtype):
    """1000 calls without synchronising, random sizes and methods (the same on every rank), every
    10th checked with a poisoned output."""
    world = dist.get_world_size()
    ctx = ReduceScatterContext(8 << 20, dtype)
    max_shard = ctx.max_numel // world
    rng = random.Random(4321)  # same sequence on every rank
    ok, bad = True, []
    for i in range(1000):  # the issue asks for 1,000 back-to-back calls
        m = rng.choice([1, 7, 100, 2048, 2049, 4099 * 3, rng.randint(1, max_shard)])
        method = rng.choice(["auto"] + _METHODS)
        if method == "ll" and world * m * dtype.itemsize > ctx.ll_max_bytes:
            method = "push"
        x = _fresh(world * m, dtype, seed=20000 + i)
        out = torch.full((m, ), float("nan"), device="cuda", dtype=dtype)
        ops.reduce_scatter(x, out=out, method=method, context=ctx)
        if i % 10 == 9:
            torch.cuda.synchronize()
            if not _matches(x, out, ulps=2):
                ok = False
                bad.append((i, m, method))
    torch.cuda.synchronize()
    all_ranks_agree(ok, f"back-to-back reduce_scatter {dtype}: wrong at {bad}")


@pytest.mark.parametrize("method", _METHODS)
def test_cuda_graph_replays(method):
    """A captured call replays with a fresh epoch each time: 20 replays, fresh input each."""
    world = dist.get_world_size()
    m = 4099 * 5
    dtype = torch.bfloat16
    ctx = ReduceScatterContext(world * m * 2, dtype)
    x = _fresh(world * m, dtype, seed=77)
    out = torch.empty(m, device="cuda", dtype=dtype)
    ops.reduce_scatter(x, out=out, method=method, context=ctx)  # uncaptured first call
    torch.cuda.synchronize()
    tdist.barrier()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ops.reduce_scatter(x, out=out, method=method, context=ctx)
    torch.cuda.synchronize()
    tdist.barrier()
    ok, bad = True, []
    for i in range(20):
        fresh = _fresh(world * m, dtype, seed=500 + i)
        x.copy_(fresh)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        if not _matches(fresh, out, ulps=2):
            ok = False
            bad.append(i)
    torch.cuda.synchronize()
    del graph
    all_ranks_agree(ok, f"reduce_scatter {method} CUDA graph: wrong at replays {bad}")


def test_bad_inputs():
    world = dist.get_world_size()
    x = torch.ones(4 * world, device="cuda")
    raises_everywhere(lambda: ops.reduce_scatter(x.to(torch.int32)), TypeError, "dtype")
    raises_everywhere(lambda: ops.reduce_scatter(torch.ones(4 * world)), ValueError, "CUDA|cuda")
    raises_everywhere(lambda: ops.reduce_scatter(torch.ones(4 * world, 4 * world, device="cuda").t()), ValueError,
                      "contiguous")
    if world > 1:  # every length divides among one rank
        raises_everywhere(lambda: ops.reduce_scatter(torch.ones(4 * world + 1, device="cuda")), ValueError,
                          "divisible")
    raises_everywhere(lambda: ops.reduce_scatter(x, out=torch.empty(5, device="cuda")), ValueError, "out")
    raises_everywhere(lambda: ops.reduce_scatter(x, method="tree"), ValueError, "method")
    small = ReduceScatterContext(1024, torch.float32)
    raises_everywhere(lambda: ops.reduce_scatter(torch.ones(1000 * world, device="cuda"), context=small), ValueError,
                      "more than the context")
    raises_everywhere(lambda: ops.reduce_scatter(x.bfloat16(), context=small), TypeError, "context")
    big = torch.ones(ReduceScatterContext.LL_MAX_BYTES // 4 + 4 * world, device="cuda")
    raises_everywhere(lambda: ops.reduce_scatter(big, method="ll"), ValueError, "method 'll' takes")
    # The op still works after the errors.
    y = ops.reduce_scatter(x, context=small)
    torch.cuda.synchronize()
    all_ranks_agree(tuple(y.shape) == (4, ) and bool((y == world).all()), "reduce_scatter after bad inputs")
    tdist.barrier()
