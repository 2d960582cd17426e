"""triton_dist.ops.all_reduce (one-shot, two-shot, ll, ce_two_shot, ring, 2d) against torch.distributed.all_reduce.
Under TRITON_DIST_LOCAL_WORLD_SIZE (scripts/gpu-test --local-world L) "2d" and "auto" take the
inter-node path."""

import random

import pytest
import torch
import torch.distributed as dist

import triton_dist as tdist
from conftest import all_ranks_agree, raises_everywhere
from triton_dist import host_collectives, ops
from triton_dist.kernels import AllReduceContext

# 4099 * 1031 elements: several ce_two_shot chunks per shard (CE_MIN_CHUNK_BYTES), a short last one.
_SIZES = [1, 7, 4099 * 3, 1000003, 4099 * 1031]
_METHODS = ["one_shot", "two_shot", "ll", "ce_two_shot", "ring", "2d"]  # 2d: RS + AG across nodes
_LL_MAX = AllReduceContext.LL_MAX_BYTES


def _fits(method, n, dtype):
    return method != "ll" or n * dtype.itemsize <= _LL_MAX


def _skip_unless_fits(method, n, dtype):
    if not _fits(method, n, dtype):
        pytest.skip(f"ll takes at most AllReduceContext.LL_MAX_BYTES = {_LL_MAX} bytes per rank; "
                    f"{n} x {dtype} is {n * dtype.itemsize}")


def _fresh(n, dtype, seed):
    g = torch.Generator(device="cuda")
    g.manual_seed(seed * 7919 + dist.get_rank())
    return torch.randn(n, device="cuda", dtype=torch.float32, generator=g).to(dtype)


def _matches(x, got):
    """True when ``got`` is the sum over ranks of ``x`` (fp32: 1e-5 relative; bf16/fp16: within
    one ulp of the fp32 sum of the same inputs, rounded)."""
    ref = host_collectives.all_reduce(x.float())
    if x.dtype == torch.float32:
        return torch.allclose(got, ref, rtol=1e-5, atol=1e-6 * dist.get_world_size())
    rounded = ref.to(x.dtype).float()
    ulp = torch.finfo(x.dtype).eps * rounded.abs().clamp_min(torch.finfo(x.dtype).tiny)
    return bool(((got.float() - rounded).abs() <= ulp + 1e-30).all())


def _same_everywhere(t):
    """Every rank holds the same bits."""
    return host_collectives.same_on_every_rank(t)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("method", _METHODS)
@pytest.mark.parametrize("n", _SIZES)
def test_matches_torch(n, method, dtype):
    _skip_unless_fits(method, n, dtype)
    x = _fresh(n, dtype, seed=n)
    out = torch.full_like(x, float("nan"))
    got = ops.all_reduce(x, out=out, method=method)
    torch.cuda.synchronize()
    all_ranks_agree(got is out and _matches(x, got), f"all_reduce {method} n={n} {dtype}")
    all_ranks_agree(_same_everywhere(got), f"all_reduce {method} n={n} {dtype}: ranks differ")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_ce_two_shot_many_chunks_at_any_world_size(dtype):
    """Several copy-engine chunks per shard whatever the world size (4099 * 1031 elements give
    several only on two ranks): a context whose chunks may be as small as 64 KiB, fresh data, a
    poisoned output, every element checked, 20 calls back to back."""
    ctx = AllReduceContext(8 << 20, dtype)
    ctx.CE_MIN_CHUNK_BYTES = 64 << 10  # the same on every rank: ce_chunking reads it per call
    n = ctx.max_numel - 12345
    shard_tiles = -(-n // (dist.get_world_size() * ctx.BLOCK))
    assert ctx.ce_chunking(shard_tiles)[1] > 1
    ok, bad = True, []
    outs = []
    for i in range(20):
        x = _fresh(n, dtype, seed=700 + i)
        out = torch.full_like(x, float("nan"))
        ops.all_reduce(x, out=out, method="ce_two_shot", context=ctx)
        outs.append((x, out))
    torch.cuda.synchronize()
    for i, (x, out) in enumerate(outs):
        if not _matches(x, out):
            ok = False
            bad.append(i)
    all_ranks_agree(ok, f"ce_two_shot with many chunks, {dtype}: wrong at calls {bad}")


@pytest.fixture(scope="module")
def bits_contexts():
    """dtype -> AllReduceContext, created on first use (every rank runs the same parametrisations
    in the same order) and dropped at the end of the module."""
    contexts = {}
    yield contexts
    contexts.clear()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("n", [1, 2, 3, 1023, 1024, 1025, 4099 * 3, 16384, 32768])
def test_ll_same_bits_as_one_shot(n, dtype, bits_contexts):
    """ll adds the same values in the same order as one_shot: the same bits (odd sizes, tails of
    the last word and of the last tile included)."""
    _skip_unless_fits("ll", n, dtype)
    ctx = bits_contexts.get(dtype)
    if ctx is None:
        ctx = bits_contexts[dtype] = AllReduceContext(1 << 20, dtype)
    x = _fresh(n, dtype, seed=77 + n)
    one = ops.all_reduce(x, method="one_shot", context=ctx)
    ll = torch.full_like(x, float("nan"))
    ops.all_reduce(x, out=ll, method="ll", context=ctx)
    torch.cuda.synchronize()
    all_ranks_agree(torch.equal(one, ll), f"all_reduce ll n={n} {dtype}: bits differ from one_shot")


def test_ll_max_size_and_too_large():
    """Exactly LL_MAX_BYTES works (with the same bits as auto at one node, where auto sums in the
    same order; across nodes auto is "2d", which sums each node first); one element more is refused."""
    ctx = AllReduceContext(1 << 20, torch.float32)
    x = _fresh(_LL_MAX // 4, torch.float32, seed=9)
    y = ops.all_reduce(x, method="ll", context=ctx)
    z = ops.all_reduce(x, method="auto", context=ctx)
    torch.cuda.synchronize()
    same_order = tdist.num_nodes() == 1
    all_ranks_agree(_matches(x, y) and _matches(x, z) and (torch.equal(y, z) or not same_order),
                    "all_reduce ll at LL_MAX_BYTES")
    big = torch.ones(_LL_MAX // 4 + 1, device="cuda")
    raises_everywhere(lambda: ops.all_reduce(big, method="ll", context=ctx), ValueError, "ll")
    y = ops.all_reduce(big, context=ctx)  # auto: one_shot at one node, 2d across nodes
    torch.cuda.synchronize()
    all_ranks_agree(bool((y == dist.get_world_size()).all()), "all_reduce auto just above the ll limit")
    tdist.barrier()


def test_ll_words_are_named_for_the_timeout_report():
    """A timed-out LL wait reports the address of a word of ``ctx.ll``: the report names the
    half, the sending rank and the word (triton_dist.kernels.common.ll_buffer)."""
    from triton_dist import _C

    ctx = AllReduceContext(1 << 20, torch.float32)
    world, slot = dist.get_world_size(), ctx.ll_slot
    sender = world - 1
    word = ctx.ll.data_ptr() + 8 * ((world + sender) * slot + 5)  # half 1, from the last rank, word 5
    name = _C.signal_name(word)
    all_ranks_agree(name.endswith(f"of AllReduceContext LL's buffer: half1.from_rank{sender}[5]"),
                    f"LL word named {name!r}")


@pytest.mark.parametrize("method", ["auto"] + _METHODS)
def test_in_place_and_new_tensor(method):
    x = _fresh(5000, torch.bfloat16, seed=3)
    y = ops.all_reduce(x, method=method)
    ok = y is not x and _matches(x, y)
    ops.all_reduce(x, out=x, method=method)
    torch.cuda.synchronize()
    all_ranks_agree(ok and torch.equal(x, y), f"all_reduce {method} in place")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_back_to_back_random_sizes(dtype):
    """1000 calls without synchronising, random sizes and methods (the same on every rank), every
    10th checked with a poisoned output."""
    ctx = AllReduceContext(4 << 20, dtype)
    rng = random.Random(1234)  # same sequence on every rank
    ok, bad = True, []
    advanced = 0  # calls that take an epoch of ctx's counter ("2d" runs on contexts of its own)
    for i in range(1000):  # the issue asks for 1,000 back-to-back calls
        n = rng.choice([1, 7, 100, 2048, 2049, 4099 * 3, rng.randint(1, ctx.max_numel)])
        method = rng.choice(_METHODS)
        if not _fits(method, n, dtype):
            method = rng.choice(["one_shot", "two_shot"])
        advanced += method != "2d" and dist.get_world_size() > 1
        x = _fresh(n, dtype, seed=10000 + i)
        out = torch.full_like(x, float("nan"))
        ops.all_reduce(x, out=out, method=method, context=ctx)
        if i % 10 == 9:
            torch.cuda.synchronize()
            if not _matches(x, out):
                ok = False
                bad.append((i, n, method))
    torch.cuda.synchronize()
    all_ranks_agree(ok, f"back-to-back all_reduce {dtype}: wrong at {bad}")
    # One epoch per call whichever the method (the one-kernel ones enter it in their kernel, the
    # others bump first), and no program count left behind.
    counter = ctx.calls.tolist()
    all_ranks_agree(counter == [advanced, 0], f"all_reduce call counter {counter}, expected [{advanced}, 0]")


def test_bad_inputs():
    x = torch.ones(16, device="cuda")
    raises_everywhere(lambda: ops.all_reduce(x.to(torch.int32)), TypeError, "dtype")
    raises_everywhere(lambda: ops.all_reduce(torch.ones(16)), ValueError, "CUDA|cuda")
    raises_everywhere(lambda: ops.all_reduce(torch.ones(4, 4, device="cuda").t()), ValueError, "contiguous")
    raises_everywhere(lambda: ops.all_reduce(x, method="three_shot"), ValueError, "method")
    raises_everywhere(lambda: ops.all_reduce(x, out=torch.empty(8, device="cuda")), ValueError, "out")
    small = AllReduceContext(1024, torch.float32)
    raises_everywhere(lambda: ops.all_reduce(torch.ones(1000, device="cuda"), context=small), ValueError,
                      "more than the context")
    raises_everywhere(lambda: ops.all_reduce(x.bfloat16(), context=small), TypeError, "context")
    raises_everywhere(lambda: ops.all_reduce([1.0]), TypeError, "torch.Tensor")
    # The op still works after the errors.
    y = ops.all_reduce(x, context=small)
    torch.cuda.synchronize()
    all_ranks_agree(bool((y == dist.get_world_size()).all()), "all_reduce after bad inputs")
    tdist.barrier()


@pytest.mark.parametrize("method", _METHODS)
def test_cuda_graph_capture_and_replay(method):
    """One captured call replayed 20 times on fresh inputs: every replay takes a new epoch from the
    context's device counter, so none reads the previous replay's data."""
    ctx = AllReduceContext(1 << 20, torch.bfloat16)
    n = 100_003 if method != "ll" else 30_011  # ll: at most LL_MAX_BYTES
    x = _fresh(n, torch.bfloat16, seed=1)
    out = torch.empty_like(x)
    ops.all_reduce(x, out=out, method=method, context=ctx)  # uncaptured first call
    torch.cuda.synchronize()
    tdist.barrier()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ops.all_reduce(x, out=out, method=method, context=ctx)
    torch.cuda.synchronize()
    tdist.barrier()
    ok, bad = True, []
    for i in range(20):
        x.copy_(_fresh(n, torch.bfloat16, seed=500 + i))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        if not _matches(x, out):
            ok = False
            bad.append(i)
    all_ranks_agree(ok, f"all_reduce {method} in a CUDA graph: wrong at replays {bad}")
    # Every replay advanced the counter by one: the uncaptured call, then 20 replays.
    if method != "2d" and dist.get_world_size() > 1:
        counter = ctx.calls.tolist()
        all_ranks_agree(counter == [21, 0], f"all_reduce {method} replays: call counter {counter}, expected [21, 0]")
    tdist.barrier()
