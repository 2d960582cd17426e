"""triton_dist.ops.all_gather (sm_push, ce_push, ll, auto) against
torch.distributed.all_gather_into_tensor: exact equality, back-to-back calls, CUDA graph replay,
bad inputs."""

import random

import pytest
import torch
import torch.distributed as dist

import triton_dist as tdist
from conftest import all_ranks_agree, raises_everywhere
from triton_dist import ops
from triton_dist.kernels import AllGatherContext
from triton_dist.kernels.allgather import LL_MAX_BYTES

_SIZES = [1, 7, 4099 * 3, 1000003]
_METHODS = ["sm_push", "ce_push", "ll", "auto"]
_DTYPES = [torch.float32, torch.bfloat16]


def _fresh(n, dtype, seed):
    g = torch.Generator(device="cuda")
    g.manual_seed(seed * 7919 + dist.get_rank())
    return torch.randn(n, device="cuda", dtype=torch.float32, generator=g).to(dtype)


def _reference(x):
    ref = torch.empty((dist.get_world_size() * x.shape[0], *x.shape[1:]), dtype=x.dtype, device=x.device)
    dist.all_gather_into_tensor(ref, x)
    return ref


def _fits(method, n, dtype):
    return method != "ll" or n * dtype.itemsize <= LL_MAX_BYTES


@pytest.mark.parametrize("dtype", _DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("method", _METHODS)
@pytest.mark.parametrize("n", _SIZES)
def test_matches_torch(n, method, dtype):
    if not _fits(method, n, dtype):
        pytest.skip("ll takes at most LL_MAX_BYTES per rank")
    x = _fresh(n, dtype, seed=n)
    out = torch.full((dist.get_world_size() * n, ), float("nan"), device="cuda", dtype=dtype)
    got = ops.all_gather(x, out=out, method=method)
    torch.cuda.synchronize()
    ref = _reference(x)
    all_ranks_agree(got is out and torch.equal(got, ref), f"all_gather {method} n={n} {dtype}")


@pytest.mark.parametrize("method", _METHODS)
def test_two_dimensional_and_new_tensor(method):
    x = _fresh(3 * 5, torch.bfloat16, seed=5).view(3, 5)
    y = ops.all_gather(x, method=method)
    torch.cuda.synchronize()
    all_ranks_agree(tuple(y.shape) == (3 * dist.get_world_size(), 5) and torch.equal(y, _reference(x)),
                    f"all_gather {method} 2-D")


def test_ll_rejects_large_inputs():
    ctx = AllGatherContext(1 << 20, torch.float32)
    x = torch.ones(LL_MAX_BYTES // 4 + 1, device="cuda")
    raises_everywhere(lambda: ops.all_gather(x, method="ll", context=ctx), ValueError, "ll")
    tdist.barrier()


@pytest.mark.parametrize("dtype", _DTYPES, ids=["fp32", "bf16"])
def test_back_to_back_random_sizes(dtype):
    """300 calls without synchronising, random sizes and methods (the same on every rank), every
    10th checked with a poisoned output."""
    ctx = AllGatherContext(4 << 20, dtype)
    rng = random.Random(4321)  # same sequence on every rank
    world = dist.get_world_size()
    ok, bad = True, []
    for i in range(300):
        n = rng.choice([1, 7, 100, 2048, 2049, 4099 * 3, rng.randint(1, 20000), rng.randint(1, ctx.max_numel)])
        method = rng.choice(_METHODS)
        if not _fits(method, n, dtype):
            method = "sm_push"
        x = _fresh(n, dtype, seed=20000 + i)
        out = torch.full((world * n, ), float("nan"), device="cuda", dtype=dtype)
        ops.all_gather(x, out=out, method=method, context=ctx)
        if i % 10 == 9:
            torch.cuda.synchronize()
            if not torch.equal(out, _reference(x)):
                ok = False
                bad.append((i, n, method))
    torch.cuda.synchronize()
    all_ranks_agree(ok, f"back-to-back all_gather {dtype}: wrong at {bad}")


@pytest.mark.parametrize("method", _METHODS)
def test_cuda_graph_replay(method):
    """One captured call, replayed 20 times with fresh input each time: each replay bumps the
    device call counter, so signals and buffer halves stay correct."""
    dtype, n = torch.bfloat16, 4099 * 3
    world = dist.get_world_size()
    ctx = AllGatherContext(1 << 20, dtype)
    x = _fresh(n, dtype, seed=1)
    out = torch.empty(world * n, device="cuda", dtype=dtype)
    ops.all_gather(x, out=out, method=method, context=ctx)  # warm call, outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    captured, why = True, ""
    try:
        # thread_local: a CUDA call from another thread (NCCL's watchdog) must not invalidate it.
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            ops.all_gather(x, out=out, method=method, context=ctx)
    except Exception as e:  # noqa: BLE001 - reported through all_ranks_agree, never one rank alone
        captured, why = False, f"{type(e).__name__}: {e}"
    torch.cuda.synchronize()
    all_ranks_agree(captured, f"all_gather {method}: capture failed ({why})")
    tdist.barrier()
    ok, bad = True, []
    for i in range(20):
        x.copy_(_fresh(n, dtype, seed=500 + i))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        if not torch.equal(out, _reference(x)):
            ok, bad = False, bad + [i]
    all_ranks_agree(ok, f"all_gather {method}: graph replays {bad} wrong")
    # An eager call after the replays still agrees with the device counter.
    y = ops.all_gather(x, method=method, context=ctx)
    torch.cuda.synchronize()
    all_ranks_agree(torch.equal(y, _reference(x)), f"all_gather {method}: eager call after replays")
    del graph
    tdist.barrier()


def test_bad_inputs():
    world = dist.get_world_size()
    x = torch.ones(16, device="cuda")
    raises_everywhere(lambda: ops.all_gather(x.to(torch.int32)), TypeError, "dtype")
    raises_everywhere(lambda: ops.all_gather(torch.ones(16)), ValueError, "CUDA|cuda")
    raises_everywhere(lambda: ops.all_gather(torch.ones(4, 4, device="cuda").t()), ValueError, "contiguous")
    raises_everywhere(lambda: ops.all_gather(x, method="ring9"), ValueError, "method")
    raises_everywhere(lambda: ops.all_gather(x, out=torch.empty(16, device="cuda")), ValueError, "out")
    raises_everywhere(lambda: ops.all_gather(x, out=torch.empty(world * 16, device="cuda", dtype=torch.bfloat16)),
                      ValueError, "out")
    small = AllGatherContext(1024, torch.float32)
    raises_everywhere(lambda: ops.all_gather(torch.ones(1000, device="cuda"), context=small), ValueError,
                      "more than the context")
    raises_everywhere(lambda: ops.all_gather(x.bfloat16(), context=small), TypeError, "context")
    raises_everywhere(lambda: ops.all_gather([1.0]), TypeError, "torch.Tensor")
    # The op still works after the errors.
    y = ops.all_gather(x * (dist.get_rank() + 1), context=small)
    torch.cuda.synchronize()
    expect = torch.arange(1, world + 1, device="cuda", dtype=torch.float32).repeat_interleave(16)
    all_ranks_agree(torch.equal(y, expect), "all_gather after bad inputs")
    tdist.barrier()
