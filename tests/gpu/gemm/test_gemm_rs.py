"""triton_dist.ops.gemm_rs (GEMM+ReduceScatter), every method, against torch: the fp32 sum over
ranks of ``a @ b.T`` (the host all-reduce of each rank's fp32 product), this rank's rows. Back-to-
back calls with fresh inputs and a NaN-poisoned output (a tile reduced before a rank's partial
landed, or from the previous call's half, shows up as a large error or a NaN), M not a multiple of
the tile, CUDA graph replay, bad inputs. Runs at any world size, 1 included."""

import pytest
import torch
import torch.distributed as dist

import triton_dist as tdist
from conftest import all_ranks_agree, check_repeated_calls, raises_everywhere, rank_randn, tolerance_ratio
from triton_dist import host_collectives, ops
from triton_dist.kernels import GemmReduceScatterContext

_TOL = 1.0  # tolerance_ratio: every element within its own bound (conftest)
_METHODS = ["fused", "fused_tma", "fused_ce", "push", "pull", "2d", "push_2d"]  # *2d: across nodes


def _reference(a, b):
    """This rank's rows of the fp32 sum over ranks of a @ b.T."""
    return host_collectives.reduce_scatter(a.float() @ b.float().T)


@pytest.mark.parametrize("method", _METHODS)
@pytest.mark.parametrize("m,n,k", [(1000, 512, 768), (1024, 1024, 1024), (40, 264, 136)])
def test_gemm_rs_matches_torch(method, m, n, k):
    # m = 1000: not a multiple of the 128-row tile (each destination's last m-tile is masked);
    # m = 40 with N = 264: one partial m-tile per rank, N not a multiple of the 128-column tile.
    world, dtype = dist.get_world_size(), torch.bfloat16
    a, b = rank_randn((world * m, k), dtype, 1), rank_randn((n, k), dtype, 2)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
    got = ops.gemm_rs(a, b, out=out, method=method)
    torch.cuda.synchronize()
    err = tolerance_ratio(got, _reference(a, b))
    all_ranks_agree(got is out and err < _TOL, f"gemm_rs {method} M={world * m} N={n} K={k}: error/tolerance {err}")


@pytest.mark.parametrize("method", ["fused", "auto"])
def test_one_launch_calls_replay_their_launches(method, replays):
    """200 calls of one shape, fresh seeded inputs, a new out and a given poisoned out in turn: all
    but the first call of each form are replayed (triton_dist.eager_calls: the fused GEMM again,
    which advances the call counter itself), and every element is right. ``"auto"`` takes
    ``"fused"`` for such eager calls, whose GEMM is far too short to hide ``"fused_ce"``'s host
    time (kernels/gemm/policy.py), so they replay too. The reference is the host reduce-scatter, a
    collective: every rank checks every call, in the same order."""
    from triton_dist import eager_calls

    if method == "auto" and tdist.num_nodes() > 1:
        pytest.skip("across nodes auto takes '2d' (test_push_2d_sums_like_push_at_one_node_and_like_2d_across)")
    world, dtype = dist.get_world_size(), torch.bfloat16
    m, n, k = 40, 264, 136
    b = rank_randn((n, k), dtype, 81)

    def draw(i):
        a = rank_randn((world * m, k), dtype, 8000 + i)
        return (a, b), _reference(a, b)

    eager_calls.clear()
    check_repeated_calls(f"gemm_rs {method}", lambda a, b, out: ops.gemm_rs(a, b, out=out, method=method), draw,
                         (m, n), dtype, replays)
    # The same calls with a context of the caller's: replayed from plans kept on it, none cached.
    from triton_dist.kernels import GemmReduceScatterContext

    context = GemmReduceScatterContext(world * m, n, dtype)
    replays[0] = replays[1] = 0
    check_repeated_calls(f"gemm_rs {method} with context=",
                         lambda a, b, out: ops.gemm_rs(a, b, out=out, method=method, context=context), draw, (m, n),
                         dtype, replays, calls=40)
    all_ranks_agree(eager_calls.plans(context) == 2,
                    f"gemm_rs {method}: {eager_calls.plans(context)} plans on the context")


@pytest.mark.parametrize("method", _METHODS + ["auto"])
def test_gemm_rs_back_to_back(method):
    world, dtype, calls = dist.get_world_size(), torch.bfloat16, 500
    m, n, k = 1000, 1024, 512
    b = rank_randn((n, k), dtype, 100)
    inputs = [rank_randn((world * m, k), dtype, 1000 + i) for i in range(calls)]
    checked = [i for i in range(calls) if i % 10 == 0 or i == calls - 1]
    outs = {i: torch.full((m, n), float("nan"), device="cuda", dtype=dtype) for i in checked}
    scratch = torch.empty((m, n), device="cuda", dtype=dtype)
    tdist.barrier()
    for i in range(calls):  # back to back: no synchronisation between calls
        got = ops.gemm_rs(inputs[i], b, out=outs.get(i, scratch), method=method)
        assert got is outs.get(i, scratch)
    torch.cuda.synchronize()
    errors = {i: tolerance_ratio(outs[i], _reference(inputs[i], b)) for i in checked}
    bad = {i: e for i, e in errors.items() if not e < _TOL}
    all_ranks_agree(not bad, f"gemm_rs {method} back to back: calls with wrong results (call: error/tolerance) {bad}")


def test_fused_ce_with_serialised_launches_queues_copies_first(monkeypatch):
    """Config.serialised_launches moves the copy stream's work before the GEMM launch (what
    CUDA_LAUNCH_BLOCKING needs); results must not change with the order."""
    import dataclasses

    from triton_dist import config

    monkeypatch.setattr(config, "_current", dataclasses.replace(config.get(), serialised_launches=True))
    world, dtype, calls = dist.get_world_size(), torch.bfloat16, 20
    m, n, k = 1000, 1024, 512
    b = rank_randn((n, k), dtype, 100)
    inputs = [rank_randn((world * m, k), dtype, 2000 + i) for i in range(calls)]
    outs = [torch.full((m, n), float("nan"), device="cuda", dtype=dtype) for _ in range(calls)]
    tdist.barrier()
    for i in range(calls):
        ops.gemm_rs(inputs[i], b, out=outs[i], method="fused_ce")
    torch.cuda.synchronize()
    bad = {i: e for i in range(calls) if not (e := tolerance_ratio(outs[i], _reference(inputs[i], b))) < _TOL}
    all_ranks_agree(not bad, f"gemm_rs fused_ce, copies queued first: wrong results (call: error/tolerance) {bad}")


@pytest.mark.parametrize("method", _METHODS)
def test_gemm_rs_back_to_back_with_changing_rows(method):
    """One context, M shrinking and growing between unsynchronised calls: a rank already on the
    next call must not set signals that this call's reduce is still waiting for (the signal region
    of each source rank is fixed by the context, not by the call's M)."""
    world, dtype, n, k = dist.get_world_size(), torch.bfloat16, 1024, 256
    context = GemmReduceScatterContext(world * 2048, n, dtype)
    b = rank_randn((n, k), dtype, 300)
    rows = [2048, 1024, 256, 2048, 40, 1000, 2048, 128] * 3
    inputs = [rank_randn((world * m, k), dtype, 3000 + i) for i, m in enumerate(rows)]
    outs = [torch.full((m, n), float("nan"), device="cuda", dtype=dtype) for m in rows]
    tdist.barrier()
    for x, out in zip(inputs, outs):
        ops.gemm_rs(x, b, out=out, method=method, context=context)
    torch.cuda.synchronize()
    bad = {i: e for i, (x, out) in enumerate(zip(inputs, outs))
           if not (e := tolerance_ratio(out, _reference(x, b))) < _TOL}
    all_ranks_agree(not bad, f"gemm_rs {method} with changing M: wrong calls (call: error/tolerance) {bad}")


def test_push_2d_sums_like_push_at_one_node_and_like_2d_across():
    """At one node "push_2d" is push's reduction (the same order, the same bits); across nodes it
    sums each node first, in fp32, then the nodes in order, as "2d" does: within rounding of push."""
    world, dtype, m, n, k = dist.get_world_size(), torch.bfloat16, 1000, 1024, 512
    a, b = rank_randn((world * m, k), dtype, 61), rank_randn((n, k), dtype, 62)
    push = ops.gemm_rs(a, b, method="push")
    push_2d = ops.gemm_rs(a, b, method="push_2d")
    torch.cuda.synchronize()
    if tdist.num_nodes() == 1:
        all_ranks_agree(torch.equal(push, push_2d), "gemm_rs push_2d at one node: bits differ from push")
    else:
        err = tolerance_ratio(push_2d, _reference(a, b))
        all_ranks_agree(err < _TOL, f"gemm_rs push_2d across {tdist.num_nodes()} nodes: error/tolerance {err}")


def test_gemm_rs_alternating_variants_and_fp16():
    world, dtype = dist.get_world_size(), torch.float16
    m, n, k = 256, 512, 256
    b = rank_randn((n, k), dtype, 5)
    inputs = [rank_randn((world * m, k), dtype, 50 + i) for i in range(8)]
    outs = [torch.full((m, n), float("nan"), device="cuda", dtype=dtype) for _ in inputs]
    for i, x in enumerate(inputs):
        ops.gemm_rs(x, b, out=outs[i], method=_METHODS[i % len(_METHODS)])
    torch.cuda.synchronize()
    errors = [tolerance_ratio(o, _reference(x, b)) for o, x in zip(outs, inputs)]
    all_ranks_agree(all(e < _TOL for e in errors), f"gemm_rs alternating methods fp16: error/tolerance {errors}")


def test_gemm_rs_new_tensor():
    world = dist.get_world_size()
    a, b = rank_randn((world * 64, 128), torch.bfloat16, 7), rank_randn((256, 128), torch.bfloat16, 8)
    got = ops.gemm_rs(a, b)
    torch.cuda.synchronize()
    ok = tuple(got.shape) == (64, 256) and got.dtype == torch.bfloat16
    err = tolerance_ratio(got, _reference(a, b))
    all_ranks_agree(ok and err < _TOL, f"gemm_rs new tensor: shape {tuple(got.shape)}, error/tolerance {err}")


def test_gemm_rs_bad_inputs():
    world = dist.get_world_size()
    a = rank_randn((world * 64, 128), torch.bfloat16, 9)
    b = rank_randn((64, 128), torch.bfloat16, 10)
    raises_everywhere(lambda: ops.gemm_rs(a.float(), b.float()), TypeError, "bfloat16")
    raises_everywhere(lambda: ops.gemm_rs(a, b.half()), TypeError, "b is torch.float16")
    raises_everywhere(lambda: ops.gemm_rs(a, b[:, :64].contiguous()), ValueError, "K differs")
    raises_everywhere(lambda: ops.gemm_rs(a, b[:60]), ValueError, "multiple of 8")
    raises_everywhere(lambda: ops.gemm_rs(a[:, :120], b[:, :120]), ValueError, "contiguous")
    raises_everywhere(lambda: ops.gemm_rs(a.cpu(), b), ValueError, "cuda|CUDA")
    raises_everywhere(lambda: ops.gemm_rs(a.view(-1), b), ValueError, "2-D")
    raises_everywhere(lambda: ops.gemm_rs(a, b, method="sideways"), ValueError, "method must be one of")
    raises_everywhere(lambda: ops.gemm_rs(a, b, method="push", variant="pull"), ValueError, "disagree")
    misaligned = torch.empty(a.numel() + 8, device="cuda", dtype=a.dtype)[1:a.numel() + 1].view(a.shape)
    raises_everywhere(lambda: ops.gemm_rs(misaligned, b), ValueError, "16-byte")
    if world > 1:
        raises_everywhere(lambda: ops.gemm_rs(a[:world * 64 - 1], b), ValueError, "divisible by the world size")
    wrong = torch.empty((65, 64), device="cuda", dtype=torch.bfloat16)
    raises_everywhere(lambda: ops.gemm_rs(a, b, out=wrong), ValueError, "out")
    small = GemmReduceScatterContext(world * 32, 64, torch.bfloat16)
    raises_everywhere(lambda: ops.gemm_rs(a, b, context=small), ValueError, f"max_m>={world * 64}")
    raises_everywhere(lambda: ops.gemm_rs(a, b, context=object()), TypeError, "GemmReduceScatterContext")
    other_n = GemmReduceScatterContext(world * 64, 128, torch.bfloat16)
    raises_everywhere(lambda: ops.gemm_rs(a, b, context=other_n), ValueError, "N=128")
    # The op still works after the errors.
    got = ops.gemm_rs(a[:world * 32], b, context=small)
    torch.cuda.synchronize()
    err = tolerance_ratio(got, _reference(a[:world * 32], b))
    all_ranks_agree(tuple(got.shape) == (32, 64) and err < _TOL, f"gemm_rs after errors: {err}")
    # variant=, the name method= had before, still works and says so.
    with pytest.warns(DeprecationWarning, match="method="):
        old = ops.gemm_rs(a[:world * 32], b, variant="fused", context=small)
    torch.cuda.synchronize()
    err = tolerance_ratio(old, _reference(a[:world * 32], b))
    all_ranks_agree(err < _TOL, f"gemm_rs(variant='fused'): error/tolerance {err}")


@pytest.mark.parametrize("method", _METHODS)
def test_gemm_rs_cuda_graph_replay(method):
    world, dtype = dist.get_world_size(), torch.bfloat16
    m, n, k = 512, 1024, 1024
    ctx = GemmReduceScatterContext(world * m, n, dtype)
    a = torch.empty((world * m, k), device="cuda", dtype=dtype)
    b = rank_randn((n, k), dtype, 11)
    out = torch.empty((m, n), device="cuda", dtype=dtype)
    a.copy_(rank_randn((world * m, k), dtype, 12))
    ops.gemm_rs(a, b, out=out, method=method, context=ctx)  # one call outside the capture
    torch.cuda.synchronize()
    tdist.barrier()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        ops.gemm_rs(a, b, out=out, method=method, context=ctx)
        ops.gemm_rs(a, b, out=out, method=method, context=ctx)
        ops.gemm_rs(a, b, out=out, method=method, context=ctx)  # an odd count: replays alternate halves
    torch.cuda.synchronize()
    tdist.barrier()
    errors = []
    for replay in range(4):
        a.copy_(rank_randn((world * m, k), dtype, 20 + replay))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        errors.append(tolerance_ratio(out, _reference(a, b)))
    all_ranks_agree(all(e < _TOL for e in errors), f"gemm_rs {method} graph replays: error/tolerance {errors}")


@pytest.mark.parametrize("method", _METHODS)
def test_gemm_rs_protocol_on_one_rank(method):
    """The signalling GEMM and the reduce kernel at any world size, including one rank (where
    gemm_rs is otherwise the plain GEMM)."""
    world, dtype, n, k = dist.get_world_size(), torch.bfloat16, 512, 256
    context = GemmReduceScatterContext(world * 1024, n, dtype, protocol_on_one_rank=True)
    b = rank_randn((n, k), dtype, 500)
    bad = []
    for i in range(20):
        a = rank_randn((world * 1000, k), dtype, 5000 + i)
        out = torch.full((1000, n), float("nan"), device="cuda", dtype=dtype)
        ops.gemm_rs(a, b, out=out, method=method, context=context)
        torch.cuda.synchronize()
        err = tolerance_ratio(out, _reference(a, b))
        if not err < _TOL:
            bad.append((i, err))
    all_ranks_agree(not bad, f"gemm_rs {method} with the protocol forced on: wrong calls (call, error/tolerance) {bad}")
