"""The MoE grouped GEMM (ops.group_gemm) against a per-expert fp32 torch reference, on every rank
(a local op: each rank routes its own random tokens): packed rows with offsets and padded rows
with counts, uniform and skewed routing, empty experts, one token, no tokens, every config (the
swapped decode configs too, with experts of more rows than their ``BM``), 500 back-to-back calls
with changing routing, CUDA graph replay with new routing, bad inputs. Outputs
are NaN-poisoned first; every element is compared with a per-element tolerance, and rows a call
must not write (past a padded expert's count) must still hold their poison."""

import pytest
import torch

from conftest import all_ranks_agree, raises_everywhere, rank_randn
from triton_dist import ops
from triton_dist.kernels.moe import group_gemm as group_gemm_module
from triton_dist.kernels.moe import group_gemm_swapped as swapped_module

_ATOL, _RTOL = 2e-2, 2e-2  # bf16 output rounding (2**-8) of sums of K products of O(1) values, scaled by 1/sqrt(K)


def _routing(tokens: int, experts: int, skew: str, seed: int) -> torch.Tensor:
    """Rows per expert (int64, CPU) for ``tokens`` rows: ``uniform`` random, ``skewed`` (half the
    experts empty, one taking most), ``one`` (every row to one expert)."""
    gen = torch.Generator().manual_seed(seed * 1009 + torch.distributed.get_rank())  # on the CPU, as the counts
    if skew == "one":
        counts = torch.zeros(experts, dtype=torch.int64)
        counts[int(torch.randint(experts, (1, ), generator=gen))] = tokens
        return counts
    weights = torch.rand(experts, generator=gen)
    if skew == "skewed":
        weights[torch.randperm(experts, generator=gen)[:experts // 2]] = 0
        weights[int(torch.argmax(weights))] += 4 * float(weights.sum()) + 1
    picks = torch.multinomial(weights, tokens, replacement=True, generator=gen) if tokens else torch.zeros(0).long()
    return torch.bincount(picks, minlength=experts)


def _reference(x, w, counts):
    """Per expert, its packed rows of x @ w[e].T in fp32."""
    out, start = [], 0
    for e, c in enumerate(counts.tolist()):
        out.append(x[start:start + c].float() @ w[e].float().T)
        start += c
    return torch.cat(out) if out else x.new_zeros((0, w.shape[1]), dtype=torch.float32)


def _scaled(shape, dtype, seed, scale):
    return rank_randn(shape, dtype, seed) * scale


def _close(got, want):
    return bool(torch.isfinite(got).all()) and bool(torch.isclose(got.float(), want, atol=_ATOL, rtol=_RTOL).all())


def _check_packed(tokens, experts, n, k, skew, dtype=torch.bfloat16, config=None, seed=0):
    x = _scaled((tokens, k), dtype, seed, k ** -0.25)
    w = _scaled((experts, n, k), dtype, seed + 1, k ** -0.25)
    counts = _routing(tokens, experts, skew, seed + 2)
    offsets = torch.cumsum(counts, 0).to(torch.int32).cuda()
    out = torch.full((tokens, n), float("nan"), device="cuda", dtype=dtype)
    got = ops.group_gemm(x, w, offsets=offsets, out=out, config=config)
    torch.cuda.synchronize()
    ok = got is out and _close(got, _reference(x, w, counts))
    all_ranks_agree(ok, f"group_gemm packed {tokens}x{n}x{k}, {experts} experts, {skew}, {dtype}, config {config}: "
                    f"counts {counts.tolist()[:16]}")


@pytest.mark.parametrize("tokens,experts,n,k,skew", [
    (4096, 8, 2048, 1024, "uniform"),     # Mixtral-like prefill, top-2 of 8
    (2048, 64, 512, 1024, "skewed"),      # fine-grained experts, half of them empty
    (37, 16, 256, 512, "uniform"),        # decode-sized: a few rows per expert
    (1, 8, 128, 256, "uniform"),          # one token
    (999, 5, 136, 264, "one"),            # odd sizes, every row to one expert, N and K off the tiles
    (0, 4, 128, 128, "uniform"),          # no tokens
])
def test_packed_matches_torch(tokens, experts, n, k, skew):
    _check_packed(tokens, experts, n, k, skew)


@pytest.mark.parametrize("config", group_gemm_module.CONFIGS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_every_config_and_dtype(config, dtype):
    _check_packed(700, 12, 384, 512, "skewed", dtype=dtype, config=config, seed=7)


@pytest.mark.parametrize("config", [None, *swapped_module.CONFIG_NAMES])
def test_padded_rows_like_ep_dispatch(config):
    experts, capacity, n, k, dtype = 6, 300, 256, 512, torch.bfloat16
    x = _scaled((experts, capacity, k), dtype, 20, k ** -0.25)
    w = _scaled((experts, n, k), dtype, 21, k ** -0.25)
    counts = torch.tensor([0, 1, 300, 77, 128, 255], dtype=torch.int32)
    out = torch.full((experts, capacity, n), float("nan"), device="cuda", dtype=dtype)
    ops.group_gemm(x, w, counts=counts.cuda(), out=out, config=config)
    torch.cuda.synchronize()
    ok = True
    for e, c in enumerate(counts.tolist()):
        ok &= _close(out[e, :c], x[e, :c].float() @ w[e].float().T)
        ok &= bool(torch.isnan(out[e, c:]).all())  # rows past the count are not written
    all_ranks_agree(ok, f"group_gemm padded, config {config}: counts {counts.tolist()}")


@pytest.mark.parametrize("config", list(swapped_module.CONFIG_NAMES))
@pytest.mark.parametrize("tokens,experts,n,k,skew", [
    (128, 8, 1024, 512, "uniform"),    # Mixtral-like decode: about 16 rows an expert
    (256, 32, 384, 512, "skewed"),     # half the experts empty, one with most rows (more than BM)
    (1, 8, 128, 256, "uniform"),       # one token
    (300, 4, 136, 264, "one"),         # every row to one expert (300 > BM), N and K off the tiles
])
def test_swapped_configs_match_torch(config, tokens, experts, n, k, skew):
    _check_packed(tokens, experts, n, k, skew, config=config, seed=11)


@pytest.mark.parametrize("config", ["swapped_m16", "swapped_m64"])
def test_swapped_configs_fp16_and_unrouted_rows(config):
    """fp16, and rows past ``offsets[-1]`` (dropped pairs sorted last) keep their poison."""
    tokens, routed, experts, n, k, dtype = 200, 190, 16, 256, 384, torch.float16
    x = _scaled((tokens, k), dtype, 70, k ** -0.25)
    w = _scaled((experts, n, k), dtype, 71, k ** -0.25)
    counts = _routing(routed, experts, "skewed", 72)
    offsets = torch.cumsum(counts, 0).to(torch.int32).cuda()
    out = torch.full((tokens, n), float("nan"), device="cuda", dtype=dtype)
    ops.group_gemm(x, w, offsets=offsets, out=out, config=config)
    torch.cuda.synchronize()
    ok = _close(out[:routed], _reference(x[:routed], w, counts)) and bool(torch.isnan(out[routed:]).all())
    all_ranks_agree(ok, f"group_gemm {config} fp16: counts {counts.tolist()}")


def test_back_to_back_with_changing_routing():
    calls, tokens, experts, n, k, dtype = 500, 256, 8, 256, 256, torch.bfloat16
    x = [_scaled((tokens, k), dtype, 100 + i, k ** -0.25) for i in range(8)]
    w = _scaled((experts, n, k), dtype, 99, k ** -0.25)
    routing = [_routing(tokens, experts, ("uniform", "skewed", "one")[i % 3], 200 + i) for i in range(calls)]
    offsets = [torch.cumsum(c, 0).to(torch.int32).cuda() for c in routing]
    outs = [torch.full((tokens, n), float("nan"), device="cuda", dtype=dtype) for _ in range(calls)]
    for i in range(calls):  # no synchronisation between calls
        ops.group_gemm(x[i % 8], w, offsets=offsets[i], out=outs[i], check_rows=False)
    torch.cuda.synchronize()
    bad = [i for i in range(calls) if not _close(outs[i], _reference(x[i % 8], w, routing[i]))]
    all_ranks_agree(not bad, f"group_gemm back to back: wrong calls {bad[:10]}")


@pytest.mark.parametrize("config", [None, "swapped_m32"])
def test_cuda_graph_replays_new_routing(config):
    tokens, experts, n, k, dtype = 512, 8, 256, 256, torch.bfloat16
    x = _scaled((tokens, k), dtype, 30, k ** -0.25)
    w = _scaled((experts, n, k), dtype, 31, k ** -0.25)
    offsets = torch.cumsum(_routing(tokens, experts, "uniform", 32), 0).to(torch.int32).cuda()
    out = torch.empty((tokens, n), device="cuda", dtype=dtype)
    ops.group_gemm(x, w, offsets=offsets, out=out, config=config)  # compiled and loaded outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ops.group_gemm(x, w, offsets=offsets, out=out, config=config)
    ok = True
    for i, skew in enumerate(("skewed", "one", "uniform")):
        counts = _routing(tokens, experts, skew, 40 + i)
        offsets.copy_(torch.cumsum(counts, 0).to(torch.int32))
        x.copy_(_scaled((tokens, k), dtype, 50 + i, k ** -0.25))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ok &= _close(out, _reference(x, w, counts))
    all_ranks_agree(ok, f"group_gemm (config {config}) in a CUDA graph, replayed with new routing")


def test_bad_inputs():
    bf = torch.bfloat16
    x = rank_randn((64, 128), bf, 60)
    w = rank_randn((4, 64, 128), bf, 61)
    offsets = torch.tensor([16, 32, 48, 64], dtype=torch.int32, device="cuda")
    raises_everywhere(lambda: ops.group_gemm(x, w), ValueError, "exactly one of offsets")
    raises_everywhere(lambda: ops.group_gemm(x, w, offsets=offsets, counts=offsets), ValueError, "exactly one")
    raises_everywhere(lambda: ops.group_gemm(x.half(), w, offsets=offsets), TypeError, "float16")
    raises_everywhere(lambda: ops.group_gemm(x, w.float(), offsets=offsets), ValueError, "bfloat16 or float16")
    raises_everywhere(lambda: ops.group_gemm(x[:, :64], w, offsets=offsets), ValueError, "contiguous")
    raises_everywhere(lambda: ops.group_gemm(x[:, :100].contiguous(), w[:, :, :100].contiguous(), offsets=offsets),
                      ValueError, "multiples of 8")
    raises_everywhere(lambda: ops.group_gemm(x, w[:, :, :64].contiguous(), offsets=offsets), ValueError, "K = 128")
    raises_everywhere(lambda: ops.group_gemm(x, w, offsets=offsets.long()), ValueError, "int32")
    raises_everywhere(lambda: ops.group_gemm(x, w, offsets=offsets[:3]), ValueError, r"int32 \[4\]")
    raises_everywhere(lambda: ops.group_gemm(x.cpu(), w, offsets=offsets), ValueError, "cuda")
    raises_everywhere(lambda: ops.group_gemm(x, w, offsets=torch.tensor([16, 8, 48, 64], dtype=torch.int32,
                                                                         device="cuda")), ValueError, "non-decreasing")
    raises_everywhere(lambda: ops.group_gemm(x, w, offsets=offsets + 1), ValueError, "at most at x's 64 rows")
    raises_everywhere(lambda: ops.group_gemm(x.view(4, 16, 128), w, counts=offsets), ValueError, r"in \[0, 16\]")
    raises_everywhere(lambda: ops.group_gemm(x.view(2, 32, 128), w, counts=offsets), ValueError, "4 experts")
    raises_everywhere(lambda: ops.group_gemm(x, w, offsets=offsets, out=torch.empty(64, 32, device="cuda",
                                                                                     dtype=bf)), ValueError, "out")
    raises_everywhere(lambda: ops.group_gemm(x, w, offsets=offsets, config="huge"), ValueError, "swapped_m16")
    # Unchecked bad offsets are clamped on the GPU: nothing is written outside out.
    guard = torch.full((3 * 64, 64), float("nan"), device="cuda", dtype=bf)
    out = guard[64:128]
    ops.group_gemm(x, w, offsets=torch.tensor([40, 8, 500, -3], dtype=torch.int32, device="cuda"), out=out,
                   check_rows=False)
    torch.cuda.synchronize()
    intact = bool(torch.isnan(guard[:64]).all()) and bool(torch.isnan(guard[128:]).all())
    all_ranks_agree(intact, "group_gemm with unchecked bad offsets wrote outside out")
