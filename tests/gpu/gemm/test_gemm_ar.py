"""triton_dist.ops.gemm_ar (GEMM+AllReduce) against torch: the fp32 sum over ranks of ``a @ b.T``
(the host all-reduce of each rank's fp32 product), and bit-identical results on every rank. Back-to-
back calls with fresh inputs and NaN-poisoned outputs (a tile summed before a peer's partial
landed, or from the previous call's half, shows up as a large error or a NaN), M and N not
multiples of the tile, changing M on one context, CUDA graph replay, the protocol on one rank,
bad inputs. Runs at any world size, 1 included."""

import pytest
import torch

import triton_dist as tdist
from conftest import (all_ranks_agree, check_repeated_calls, graph_replay_errors, raises_everywhere, rank_randn,
                      tolerance_ratio)
from triton_dist import host_collectives, ops
from triton_dist.kernels import GemmAllReduceContext

_TOL = 1.0  # tolerance_ratio: every element within its own bound (conftest)


def _reference(a, b):
    return host_collectives.all_reduce(a.float() @ b.float().T)


def _identical_everywhere(t) -> bool:
    """Whether every rank holds the same bits in ``t``."""
    return host_collectives.same_on_every_rank(t)


_METHODS = ["split_k", "output_tiles"]


@pytest.mark.parametrize("method", _METHODS)
@pytest.mark.parametrize("m,n,k", [(1, 4096, 1024), (16, 1024, 2048), (100, 264, 136), (128, 8192, 512),
                                   (1000, 512, 768), (8, 8192, 256), (16, 16384, 512), (3, 4096, 7168),
                                   (33, 520, 4104), (128, 1024, 2048), (4, 20480, 256)])
def test_gemm_ar_matches_torch_and_agrees_across_ranks(m, n, k, method):
    if method == "split_k" and m > 128:
        pytest.skip("split_k takes M <= 128")
    dtype = torch.bfloat16
    a, b = rank_randn((m, k), dtype, 1), rank_randn((n, k), dtype, 2)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
    got = ops.gemm_ar(a, b, out=out, method=method)
    torch.cuda.synchronize()
    err = tolerance_ratio(got, _reference(a, b))
    same = _identical_everywhere(got)
    all_ranks_agree(got is out and err < _TOL and same,
                    f"gemm_ar {method} M={m} N={n} K={k}: error/tolerance {err}, identical on every rank {same}")


@pytest.mark.parametrize("method", _METHODS)
def test_gemm_ar_back_to_back(method):
    """500 unsynchronised calls with fresh inputs on one context; every tenth result checked."""
    dtype, calls = torch.bfloat16, 500
    m, n, k = 64, 2048, 2048
    b = rank_randn((n, k), dtype, 100)
    inputs = [rank_randn((m, k), dtype, 1000 + i) for i in range(calls)]
    checked = [i for i in range(calls) if i % 10 == 0 or i == calls - 1]
    outs = {i: torch.full((m, n), float("nan"), device="cuda", dtype=dtype) for i in checked}
    scratch = torch.empty((m, n), device="cuda", dtype=dtype)
    tdist.barrier()
    for i in range(calls):
        assert ops.gemm_ar(inputs[i], b, out=outs.get(i, scratch), method=method) is outs.get(i, scratch)
    torch.cuda.synchronize()
    errors = {i: tolerance_ratio(outs[i], _reference(inputs[i], b)) for i in checked}
    bad = {i: e for i, e in errors.items() if not e < _TOL}
    same = all(_identical_everywhere(outs[i]) for i in checked)
    all_ranks_agree(not bad and same, f"gemm_ar {method} back to back: wrong calls (call: error/tolerance) {bad}, identical {same}")


@pytest.mark.parametrize("method", ["auto", "split_k"])
def test_repeated_calls_replay_the_split_k_launches(method, replays):
    """200 calls of one shape, fresh seeded inputs (every rank redraws every rank's to know the
    sum), a new out and a given poisoned out in turn: all but the first call of each form are
    replayed (triton_dist.eager_calls: the split-K kernel again, which at 16 rows advances the
    call counter itself), and every element is right."""
    from triton_dist import eager_calls

    world, me = tdist.world_size(), tdist.rank()
    m, n, k = 16, 1024, 512

    def draw(i):
        a_all = [rank_randn((m, k), torch.bfloat16, 3000 + i, r) for r in range(world)]
        b_all = [rank_randn((n, k), torch.bfloat16, 5000 + i, r) for r in range(world)]
        return (a_all[me], b_all[me]), sum(a.float() @ b.float().T for a, b in zip(a_all, b_all))

    eager_calls.clear()
    check_repeated_calls(f"gemm_ar {method}", lambda a, b, out: ops.gemm_ar(a, b, out=out, method=method), draw,
                         (m, n), torch.bfloat16, replays)


def test_gemm_ar_changing_rows_and_fp16():
    """One context, M shrinking and growing between unsynchronised calls (the slots move with M,
    the signals do not; "auto" alternates between the methods, which share the buffer and the
    signals; K deep enough for four split_k slices), in fp16, the same bits on every rank."""
    dtype, n, k = torch.float16, 1024, 2048
    context = GemmAllReduceContext(256, n, dtype)
    b = rank_randn((n, k), dtype, 300)
    rows = [256, 1, 128, 17, 256, 64, 200, 8] * 4
    inputs = [rank_randn((m, k), dtype, 3000 + i) for i, m in enumerate(rows)]
    outs = [torch.full((m, n), float("nan"), device="cuda", dtype=dtype) for m in rows]
    tdist.barrier()
    for x, out in zip(inputs, outs):
        ops.gemm_ar(x, b, out=out, context=context)
    torch.cuda.synchronize()
    bad = {i: e for i, (x, out) in enumerate(zip(inputs, outs))
           if not (e := tolerance_ratio(out, _reference(x, b))) < _TOL}
    same = all(_identical_everywhere(out) for out in outs)
    all_ranks_agree(not bad and same, f"gemm_ar with changing M: wrong calls (call: error/tolerance) {bad}, identical {same}")


@pytest.mark.parametrize("method", _METHODS)
def test_gemm_ar_cuda_graph_replay(method):
    dtype, m, n, k = torch.bfloat16, 32, 4096, 1024
    ctx = GemmAllReduceContext(m, n, dtype)
    a = rank_randn((m, k), dtype, 12)
    b = rank_randn((n, k), dtype, 11)
    out = torch.empty((m, n), device="cuda", dtype=dtype)
    ops.gemm_ar(a, b, out=out, method=method, context=ctx)  # one call outside the capture
    torch.cuda.synchronize()
    tdist.barrier()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        for _ in range(3):  # an odd count: replays alternate halves
            ops.gemm_ar(a, b, out=out, method=method, context=ctx)
    torch.cuda.synchronize()
    tdist.barrier()
    errors = graph_replay_errors(graph, a, out, lambda a: _reference(a, b), replays=6, seed=20)
    all_ranks_agree(all(e < _TOL for e in errors), f"gemm_ar {method} graph replays: error/tolerance {errors}")


@pytest.mark.parametrize("method", _METHODS)
def test_gemm_ar_protocol_on_one_rank(method):
    """The signalling kernel at any world size, one rank included (where gemm_ar is otherwise the
    plain GEMM)."""
    dtype, n, k = torch.bfloat16, 512, 2048  # split_k: four slices
    context = GemmAllReduceContext(128, n, dtype, protocol_on_one_rank=True)
    b = rank_randn((n, k), dtype, 500)
    bad = []
    for i in range(20):
        a = rank_randn((100, k), dtype, 5000 + i)
        out = torch.full((100, n), float("nan"), device="cuda", dtype=dtype)
        ops.gemm_ar(a, b, out=out, method=method, context=context)
        torch.cuda.synchronize()
        if not (err := tolerance_ratio(out, _reference(a, b))) < _TOL:
            bad.append((i, err))
    all_ranks_agree(not bad, f"gemm_ar {method} with the protocol forced on: wrong calls (call, error/tolerance) {bad}")


def test_gemm_ar_bad_inputs():
    a = rank_randn((64, 128), torch.bfloat16, 9)
    b = rank_randn((64, 128), torch.bfloat16, 10)
    raises_everywhere(lambda: ops.gemm_ar(a.float(), b.float()), TypeError, "bfloat16")
    raises_everywhere(lambda: ops.gemm_ar(a, b.half()), TypeError, "b is torch.float16")
    raises_everywhere(lambda: ops.gemm_ar(a, b[:, :64].contiguous()), ValueError, "K differs")
    raises_everywhere(lambda: ops.gemm_ar(a, b[:60]), ValueError, "multiple of 8")
    raises_everywhere(lambda: ops.gemm_ar(a[:, :120], b[:, :120]), ValueError, "contiguous")
    raises_everywhere(lambda: ops.gemm_ar(a.cpu(), b), ValueError, "cuda|CUDA")
    misaligned = torch.empty(a.numel() + 8, device="cuda", dtype=a.dtype)[1:a.numel() + 1].view(a.shape)
    raises_everywhere(lambda: ops.gemm_ar(misaligned, b), ValueError, "16-byte")
    raises_everywhere(lambda: ops.gemm_ar(a, b, out=torch.empty((65, 64), device="cuda", dtype=a.dtype)),
                      ValueError, "out")
    small = GemmAllReduceContext(32, 64, torch.bfloat16)
    raises_everywhere(lambda: ops.gemm_ar(a, b, context=small), ValueError, "max_m>=64")
    raises_everywhere(lambda: ops.gemm_ar(a, b, context=object()), TypeError, "GemmAllReduceContext")
    raises_everywhere(lambda: ops.gemm_ar(a, b, method="fused"), ValueError, "method must be one of")
    tall = rank_randn((200, 128), torch.bfloat16, 8)
    raises_everywhere(lambda: ops.gemm_ar(tall, b, method="split_k"), ValueError, "M <= 128")
    got = ops.gemm_ar(a[:32], b, context=small)  # still works after the errors
    torch.cuda.synchronize()
    err = tolerance_ratio(got, _reference(a[:32], b))
    all_ranks_agree(tuple(got.shape) == (32, 64) and err < _TOL, f"gemm_ar after errors: {err}")
