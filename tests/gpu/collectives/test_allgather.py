"""triton_dist.ops.all_gather (sm_push, ce_push, ll, ring, ce_pull, 2d, ll_2d, ce_chunked, ce_zero_copy,
sm_zero_copy, auto) against torch.distributed.all_gather_into_tensor: exact equality, back-to-back
calls, CUDA graph replay, symmetric outputs, bad inputs. Under TRITON_DIST_LOCAL_WORLD_SIZE
(scripts/gpu-test --local-world L) "2d", "ll_2d" and "auto" take the inter-node path."""

import gc
import random

import pytest
import torch
import torch.distributed as dist

import triton_dist as tdist
from conftest import all_ranks_agree, raises_everywhere
from triton_dist import host_collectives, ops
from triton_dist.kernels import AllGatherContext
from triton_dist.kernels.collectives.allgather import CE_MAX_CHUNKS, LL_MAX_BYTES
from triton_dist.kernels.collectives.policy import (ALL_GATHER_CE_CHUNKED, ALL_GATHER_SM_MAX_BYTES,
                                                    ALL_GATHER_ZERO_COPY)

_SIZES = [1, 7, 4099 * 3, 1000003]
_METHODS = ["sm_push", "ce_push", "ll", "ring", "ce_pull", "2d", "ll_2d", "auto"]  # *2d: across nodes
_DTYPES = [torch.float32, torch.bfloat16]


def _fresh(n, dtype, seed, rank=None):
    """Rank ``rank``'s (default: this rank's) input for ``seed``: any rank can rebuild any other's."""
    g = torch.Generator(device="cuda")
    g.manual_seed(seed * 7919 + (dist.get_rank() if rank is None else rank))
    return torch.randn(n, device="cuda", dtype=torch.float32, generator=g).to(dtype)


def _reference(x):
    return host_collectives.all_gather(x)


def _fits(method, n, dtype):
    return method not in ("ll", "ll_2d") or n * dtype.itemsize <= LL_MAX_BYTES


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


def test_nodes_are_the_runtimes_and_auto_crosses_them_with_2d():
    world, me, local = dist.get_world_size(), dist.get_rank(), tdist.local_world_size()
    topology = (tdist.num_nodes() * local == world and tdist.node() == me // local and
                tdist.local_rank() == me % local)
    picked = ops._cached_context("all_gather", torch.float32, 4096).method_for(4096)
    all_ranks_agree(topology and (picked == "ll_2d") == (tdist.num_nodes() > 1),
                    f"{tdist.num_nodes()} nodes of {local} ranks, node {tdist.node()}: auto picked {picked!r}")


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
    """1000 calls without synchronising, random sizes and methods (the same on every rank), every
    10th checked with a poisoned output."""
    ctx = AllGatherContext(4 << 20, dtype)
    rng = random.Random(4321)  # same sequence on every rank
    world = dist.get_world_size()
    ok, bad = True, []
    for i in range(1000):  # the issue asks for 1,000 back-to-back calls
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
    """One captured call, replayed 20 times with fresh input each time: each replay advances the
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
    raises_everywhere(lambda: ops.all_gather(x, out=torch.empty(world * 16 + 1, device="cuda")), ValueError, "out")
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


# ------------------------------------------------------------------------------------------------
# Methods added after the first GPU run: ce_chunked (any out), ce_zero_copy / sm_zero_copy
# (symmetric out), and every method with a symmetric out.

_ZERO_COPY = ["ce_zero_copy", "sm_zero_copy"]
_ALL_METHODS = _METHODS + ["ce_chunked"] + _ZERO_COPY


def _release():
    """Drop this test's contexts and symmetric tensors on every rank alike."""
    gc.collect()
    torch.cuda.synchronize()
    tdist.barrier()


@pytest.mark.parametrize("dtype", _DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("method", _ALL_METHODS)
@pytest.mark.parametrize("n", _SIZES)
def test_symmetric_out_matches_torch(n, method, dtype):
    if not _fits(method, n, dtype):
        pytest.skip("ll takes at most LL_MAX_BYTES per rank")
    x = _fresh(n, dtype, seed=n + 3)
    out = tdist.symm_empty((dist.get_world_size() * n, ), dtype)
    out.fill_(float("nan"))
    got = ops.all_gather(x, out=out, method=method)
    torch.cuda.synchronize()
    all_ranks_agree(got is out and torch.equal(got, _reference(x)), f"all_gather {method} symmetric out n={n} {dtype}")
    del out, got
    _release()


@pytest.mark.parametrize("method", ["ce_chunked"] + _ZERO_COPY)
def test_new_methods_2d_symmetric_view(method):
    """A 2-D symmetric out, passed as a view at a nonzero offset of a bigger allocation (the same
    offset on every rank)."""
    world = dist.get_world_size()
    x = _fresh(3 * 40, torch.bfloat16, seed=6).view(3, 40)
    big = tdist.symm_empty((world * 3 * 40 + 64, ), torch.bfloat16)
    out = big[64:].view(world * 3, 40)
    out.fill_(float("nan"))
    ops.all_gather(x, out=out, method=method)
    torch.cuda.synchronize()
    all_ranks_agree(torch.equal(out, _reference(x)), f"all_gather {method} 2-D symmetric view")
    del big, out
    _release()


def test_zero_copy_needs_symmetric_out():
    x = torch.ones(16, device="cuda")
    plain = torch.empty(dist.get_world_size() * 16, device="cuda")
    for method in _ZERO_COPY:
        raises_everywhere(lambda m=method: ops.all_gather(x, out=plain, method=m), ValueError, "symmetric")
    tdist.barrier()


@pytest.mark.parametrize("dtype", _DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("n", [1, 7, 2048, 16384 * 3 + 1, 16384 * 5, 1000003, 3 * 1000003])
def test_ce_chunked_many_chunks(n, dtype):
    """Small chunks (64 KiB), so that small inputs span several chunks: odd counts (a partial
    last tile and chunk), exactly whole chunks, the chunk cap (CE_MAX_CHUNKS)."""
    ctx = AllGatherContext(16 << 20, dtype, ce_chunk_bytes=64 << 10)
    chunks = -(-n // ctx.chunk_numel(n))
    assert 1 <= chunks <= CE_MAX_CHUNKS
    x = _fresh(n, dtype, seed=n + 11)
    out = torch.full((dist.get_world_size() * n, ), float("nan"), device="cuda", dtype=dtype)
    for _ in range(3):  # repeated: the acks and chunk signals of the previous call must not confuse it
        out.fill_(float("nan"))
        ops.all_gather(x, out=out, method="ce_chunked", context=ctx)
    torch.cuda.synchronize()
    all_ranks_agree(torch.equal(out, _reference(x)), f"ce_chunked n={n} ({chunks} chunks) {dtype}")
    del ctx
    _release()


def test_ce_chunked_default_chunks_large():
    """The default chunk size at 40 MB + 1 element per rank (4 chunks of ~10 MB), and auto above
    ALL_GATHER_SM_MAX_BYTES with plain and symmetric outputs."""
    dtype = torch.float32
    n = 10_000_001
    world = dist.get_world_size()
    assert n * 4 > ALL_GATHER_SM_MAX_BYTES
    ctx = AllGatherContext(n * 4, dtype)
    if tdist.num_nodes() > 1:  # across nodes auto takes the inter-node path at every size
        assert ctx.method_for(n * 4) == ctx.method_for(n * 4, True) == "2d"
    else:
        assert ctx.method_for(n * 4) == ("ce_chunked" if ALL_GATHER_CE_CHUNKED else "ce_push")
        assert ctx.method_for(n * 4, True) == ("ce_zero_copy" if ALL_GATHER_ZERO_COPY else ctx.method_for(n * 4))
    x = _fresh(n, dtype, seed=77)
    ref = _reference(x)
    plain = torch.full((world * n, ), float("nan"), device="cuda", dtype=dtype)
    symm = tdist.symm_empty((world * n, ), dtype)
    ok = []
    for method, out in (("ce_chunked", plain), ("ce_push", plain), ("auto", plain), ("ce_zero_copy", symm),
                        ("sm_zero_copy", symm), ("auto", symm), ("ce_chunked", symm)):
        out.fill_(float("nan"))
        ops.all_gather(x, out=out, method=method, context=ctx)
        torch.cuda.synchronize()
        ok.append((method, torch.equal(out, ref)))
    all_ranks_agree(all(good for _, good in ok), f"large all_gather: {ok}")
    del ctx, symm, plain
    _release()


@pytest.mark.parametrize("dtype", _DTYPES, ids=["fp32", "bf16"])
def test_back_to_back_symmetric_out(dtype):
    """1000 calls without synchronising into ONE symmetric out (views of its start), random sizes
    and methods (zero-copy ones included), the same on every rank. After each call, on the
    stream: a checksum of the result (must be this call's), then the output is poisoned with NaN
    (the user writing the tensor it owns between calls). A peer writing this rank's out for call
    i + 1 before this rank's call i + 1 started would corrupt the checksum of call i or be
    erased by the poison, failing call i + 1."""
    ctx = AllGatherContext(4 << 20, dtype, ce_chunk_bytes=256 << 10)
    world = dist.get_world_size()
    out_all = tdist.symm_empty((world * ctx.max_numel, ), dtype)
    rng = random.Random(8765)  # same sequence on every rank
    plan, sums = [], []
    for i in range(1000):
        n = rng.choice([1, 7, 100, 2048, 2049, 4099 * 3, rng.randint(1, 20000), rng.randint(1, ctx.max_numel)])
        method = rng.choice(_ALL_METHODS + _ZERO_COPY)  # zero-copy twice as likely
        if not _fits(method, n, dtype):
            method = "sm_zero_copy"
        x = _fresh(n, dtype, seed=40000 + i)
        out = out_all[:world * n]
        ops.all_gather(x, out=out, method=method, context=ctx)
        sums.append(out.double().sum())
        out.fill_(float("nan"))
        plan.append((n, method))
    torch.cuda.synchronize()
    bad = []
    for i, (n, method) in enumerate(plan):
        expect = torch.cat([_fresh(n, dtype, seed=40000 + i, rank=r) for r in range(world)]).double().sum()
        if not torch.equal(sums[i], expect):
            bad.append((i, n, method))
    all_ranks_agree(not bad, f"back-to-back all_gather into a symmetric out {dtype}: wrong at {bad[:10]}")
    del ctx, out_all, out
    _release()


@pytest.mark.parametrize("method", _ALL_METHODS)
def test_cuda_graph_replay_symmetric_out(method):
    """Captured into a symmetric out, replayed 20 times with fresh input; between replays the
    output is poisoned (on the stream, no synchronisation between replay and check)."""
    dtype, n = torch.bfloat16, 4099 * 3 + 5
    world = dist.get_world_size()
    ctx = AllGatherContext(1 << 20, dtype, ce_chunk_bytes=8 << 10)  # ce_chunked: several chunks
    x = _fresh(n, dtype, seed=2)
    out = tdist.symm_empty((world * n, ), dtype)
    ops.all_gather(x, out=out, method=method, context=ctx)  # warm call, outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    captured, why = True, ""
    try:
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            ops.all_gather(x, out=out, method=method, context=ctx)
    except Exception as e:  # noqa: BLE001 - reported through all_ranks_agree, never one rank alone
        captured, why = False, f"{type(e).__name__}: {e}"
    torch.cuda.synchronize()
    all_ranks_agree(captured, f"all_gather {method} symmetric out: capture failed ({why})")
    tdist.barrier()
    snaps = []
    for i in range(20):
        x.copy_(_fresh(n, dtype, seed=700 + i))
        graph.replay()
        snaps.append(out.clone())
        out.fill_(float("nan"))
    torch.cuda.synchronize()
    bad = [i for i in range(20)
           if not torch.equal(snaps[i], torch.cat([_fresh(n, dtype, seed=700 + i, rank=r) for r in range(world)]))]
    all_ranks_agree(not bad, f"all_gather {method} symmetric out: graph replays {bad} wrong")
    # Eager calls after the replays still agree with the device counters.
    for m in (method, "ce_zero_copy", "ce_chunked"):
        ops.all_gather(x, out=out, method=m, context=ctx)
        torch.cuda.synchronize()
        all_ranks_agree(torch.equal(out, _reference(x)), f"all_gather {m} after {method} replays")
    del graph, ctx, out
    _release()
