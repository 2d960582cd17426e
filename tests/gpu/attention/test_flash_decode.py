"""Paged decode attention and distributed flash decoding against an fp32 torch reference on the
gathered KV: random lengths (1 to 128K), page sizes 1, 16 and 64, GQA ratios 1 to 16, 1 to 8 query
tokens, soft-cap, fp16; NaN-poisoned outputs and unused cache slots (a read past a sequence shows
up); a rank holding no token of a sequence; 500 back-to-back calls; CUDA-graph replay; bad inputs.
Every rank computes the whole reference from seeds. Any world size."""

import pytest
import torch

import triton_dist as tdist
from conftest import all_ranks_agree, raises_everywhere
from triton_dist import ops
from triton_dist.kernels.attention import paged_decode
from triton_dist.kernels.attention.flash_decode import FlashDecodeContext


def _gen(seed):
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    return g


def _reference(q, ks, vs, scale, soft_cap, causal=True):
    """fp32 attention of ``q [B, T, Hq, D]`` over ``ks[b]``/``vs[b]`` ``[L_b, Hkv, D]``: ``(out, lse)``.
    One KV head at a time, never a KV tensor repeated over its query heads: at 128K tokens that
    copy was 2 GiB, and eight ranks on one GPU ran out of memory making it (2026-12-07)."""
    batch, tokens, q_heads, dim = q.shape
    outs, lses = [], []
    for b in range(batch):
        length, kv_heads = ks[b].shape[0], ks[b].shape[1]
        group = q_heads // kv_heads
        if length == 0:
            outs.append(torch.zeros(q[b].shape, device=q.device))
            lses.append(torch.full(q[b].shape[:2], float("-inf"), device=q.device))
            continue
        if causal:
            pos = torch.arange(length, device=q.device)
            last = length - tokens + torch.arange(tokens, device=q.device)
            future = pos[None, None, :] > last[:, None, None]  # [T, 1, L]
        out = torch.empty(tokens, q_heads, dim, device=q.device)
        lse = torch.empty(tokens, q_heads, device=q.device)
        for h in range(kv_heads):
            heads = slice(h * group, (h + 1) * group)
            k, v = ks[b][:, h].float(), vs[b][:, h].float()  # [L, D]
            s = torch.einsum("tgd,ld->tgl", q[b, :, heads].float(), k) * scale
            if soft_cap is not None:
                s = soft_cap * torch.tanh(s / soft_cap)
            if causal:
                s = s.masked_fill(future, float("-inf"))
            lse[:, heads] = torch.logsumexp(s, dim=-1)
            out[:, heads] = torch.einsum("tgl,ld->tgd", torch.softmax(s, dim=-1), v)
        outs.append(out)
        lses.append(lse)
    return torch.stack(outs), torch.stack(lses)


def _paged(ks, vs, page, seed, dtype):
    """A paged cache holding ``ks[b]``/``vs[b]``: pages in a random order, every slot past a
    sequence NaN, unused table entries invalid (-7): ``(k_cache, v_cache, block_table, seq_lens)``."""
    kv_heads, dim = ks[0].shape[1], ks[0].shape[2]
    counts = [-(-k.shape[0] // page) for k in ks]
    total = sum(counts) + 3
    order = torch.randperm(total, generator=_gen(seed), device="cuda")
    k_cache = torch.full((total, page, kv_heads, dim), float("nan"), device="cuda", dtype=dtype)
    v_cache = torch.full_like(k_cache, float("nan"))
    width = max(max(counts), 1)
    table = torch.full((len(ks), width), -7, device="cuda", dtype=torch.int32)
    used = 0
    for b, (k, v) in enumerate(zip(ks, vs)):
        for j in range(counts[b]):
            blk = int(order[used])
            used += 1
            table[b, j] = blk
            lo, hi = j * page, min((j + 1) * page, k.shape[0])
            k_cache[blk, :hi - lo] = k[lo:hi]
            v_cache[blk, :hi - lo] = v[lo:hi]
    lens = torch.tensor([k.shape[0] for k in ks], device="cuda", dtype=torch.int32)
    return k_cache, v_cache, table, lens


def _inputs(batch, tokens, q_heads, kv_heads, dim, lengths, dtype, seed):
    q = torch.randn((batch, tokens, q_heads, dim), generator=_gen(seed), device="cuda").to(dtype)
    ks = [torch.randn((n, kv_heads, dim), generator=_gen(seed + 1 + b), device="cuda").to(dtype)
          for b, n in enumerate(lengths)]
    vs = [torch.randn((n, kv_heads, dim), generator=_gen(seed + 1001 + b), device="cuda").to(dtype)
          for b, n in enumerate(lengths)]
    return q, ks, vs


def _close(out, lse, ref_out, ref_lse):
    finite = torch.isfinite(ref_lse)
    err = (out.float() - ref_out).abs().max().item() / max(ref_out.abs().max().item(), 1e-6)
    lse_ok = torch.equal(torch.isfinite(lse), finite) and bool(
        ((lse - ref_lse).abs()[finite] <= 2e-3 * ref_lse.abs()[finite].clamp_min(1)).all())
    return bool(torch.isfinite(out).all()) and err < 1e-2 and lse_ok, err


_CASES = [  # batch, tokens, q_heads, kv_heads, dim, page, lengths, soft_cap, dtype
    (1, 1, 32, 8, 128, 16, [128 * 1024], None, torch.bfloat16),
    (3, 1, 32, 8, 128, 64, [1, 777, 4096], None, torch.bfloat16),
    (2, 4, 16, 1, 128, 16, [4, 20000], 30.0, torch.bfloat16),
    (4, 8, 8, 8, 64, 1, [8, 9, 100, 513], None, torch.float16),
    (2, 2, 64, 4, 64, 64, [3000, 65], 50.0, torch.float16),
    (8, 1, 32, 8, 128, 16, [1, 2, 3, 31, 32, 33, 1000, 5000], None, torch.bfloat16),
]


@pytest.mark.parametrize("batch,tokens,q_heads,kv_heads,dim,page,lengths,soft_cap,dtype", _CASES)
def test_paged_decode_matches_torch(batch, tokens, q_heads, kv_heads, dim, page, lengths, soft_cap, dtype):
    q, ks, vs = _inputs(batch, tokens, q_heads, kv_heads, dim, lengths, dtype, seed=batch * 100 + page)
    k_cache, v_cache, table, lens = _paged(ks, vs, page, 7, dtype)
    out = torch.full_like(q, float("nan"))
    lse = torch.full(q.shape[:3], float("nan"), device="cuda")
    got, got_lse = paged_decode(q, k_cache, v_cache, table, lens, soft_cap=soft_cap, out=out, lse=lse)
    ref_out, ref_lse = _reference(q, ks, vs, dim ** -0.5, soft_cap)
    ok, err = _close(got, got_lse, ref_out, ref_lse)
    all_ranks_agree(got is out and ok, f"paged_decode {lengths} page {page} GQA {q_heads}/{kv_heads}: rel err {err}")


def _split_parts(lengths, world, seed):
    """Cut every sequence into ``world`` contiguous parts (some empty): ``parts[r][b] = (lo, hi)``."""
    g = torch.Generator()
    g.manual_seed(seed)
    parts = [[None] * len(lengths) for _ in range(world)]
    for b, n in enumerate(lengths):
        cuts = sorted(torch.randint(0, n + 1, (world - 1, ), generator=g).tolist())
        if b == 0 and world > 1:
            cuts[0] = 0  # rank 0 holds nothing of sequence 0
        edges = [0] + cuts + [n]
        for r in range(world):
            parts[r][b] = (edges[r], edges[r + 1])
    return parts


def _distributed_inputs(lengths, tokens, q_heads, kv_heads, dim, page, dtype, seed):
    """Every rank draws the whole problem from seeds and keeps its part in a paged cache; the new
    tokens are at the end of the last rank's part."""
    world, me = tdist.world_size(), tdist.rank()
    q, ks, vs = _inputs(len(lengths), tokens, q_heads, kv_heads, dim, lengths, dtype, seed)
    parts = _split_parts(lengths, world, seed)
    for b, n in enumerate(lengths):  # the last rank holds every sequence's newest q_tokens
        cut = n - tokens
        for r in range(world - 1):
            lo, hi = parts[r][b]
            parts[r][b] = (min(lo, cut), min(hi, cut))
        parts[world - 1][b] = (min(parts[world - 1][b][0], cut), n)
    mine = [(ks[b][lo:hi], vs[b][lo:hi]) for b, (lo, hi) in enumerate(parts[me])]
    cache = _paged([k for k, _ in mine], [v for _, v in mine], page, seed + me, dtype)
    return q, ks, vs, cache


@pytest.mark.parametrize("lengths,tokens,page", [([4096], 1, 16), ([1, 100, 70000], 1, 64), ([9, 3000], 4, 16)])
def test_flash_decode_matches_torch_over_every_ranks_part(lengths, tokens, page):
    dtype, q_heads, kv_heads, dim = torch.bfloat16, 32, 8, 128
    q, ks, vs, (k_cache, v_cache, table, lens) = _distributed_inputs(lengths, tokens, q_heads, kv_heads, dim, page,
                                                                     dtype, seed=11 + len(lengths))
    out = torch.full_like(q, float("nan"))
    got, got_lse = ops.flash_decode(q, k_cache, v_cache, table, lens, out=out)
    torch.cuda.synchronize()
    ref_out, ref_lse = _reference(q, ks, vs, dim ** -0.5, None)
    ok, err = _close(got, got_lse, ref_out, ref_lse)
    all_ranks_agree(got is out and ok, f"flash_decode {lengths}: rel err {err}")
    from triton_dist import host_collectives

    all_ranks_agree(host_collectives.same_on_every_rank(got), "flash_decode: ranks disagree")


def test_flash_decode_back_to_back_and_in_a_graph():
    dtype, q_heads, kv_heads, dim, page, lengths = torch.bfloat16, 16, 4, 128, 16, [513, 2000]
    q, ks, vs, (k_cache, v_cache, table, lens) = _distributed_inputs(lengths, 1, q_heads, kv_heads, dim, page,
                                                                     dtype, seed=5)
    ctx = FlashDecodeContext(4, 1, q_heads, dim)
    queries = [torch.randn(q.shape, generator=_gen(900 + i), device="cuda").to(dtype) for i in range(500)]
    outs = {i: torch.full_like(q, float("nan")) for i in range(0, 500, 25)}
    scratch = torch.empty_like(q)
    tdist.barrier()
    for i, x in enumerate(queries):  # back to back: no synchronisation between calls
        ctx(x, k_cache, v_cache, table, lens, out=outs.get(i, scratch), check_table=False)
    torch.cuda.synchronize()
    bad = []
    for i, o in outs.items():
        ref_out, _ = _reference(queries[i], ks, vs, dim ** -0.5, None)
        err = (o.float() - ref_out).abs().max().item() / ref_out.abs().max().item()
        if not (torch.isfinite(o).all() and err < 1e-2):
            bad.append((i, err))
    all_ranks_agree(not bad, f"flash_decode back to back: wrong calls {bad}")

    static_q, out = queries[0].clone(), torch.empty_like(q)
    lse = torch.empty(q.shape[:3], device="cuda")
    ctx(static_q, k_cache, v_cache, table, lens, out=out, lse=lse, check_table=False)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        ctx(static_q, k_cache, v_cache, table, lens, out=out, lse=lse, check_table=False)
    wrong = []
    for step in range(5):
        static_q.copy_(queries[100 + step])
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        if not _close(out, lse, *_reference(static_q, ks, vs, dim ** -0.5, None))[0]:
            wrong.append(step)
    all_ranks_agree(not wrong, f"flash_decode graph replays wrong: {wrong}")
    tdist.barrier()


def test_bad_inputs_are_refused():
    q = torch.randn((1, 1, 8, 128), device="cuda").bfloat16()
    k = torch.randn((4, 16, 2, 128), device="cuda").bfloat16()
    table = torch.tensor([[0, 1]], device="cuda", dtype=torch.int32)
    lens = torch.tensor([20], device="cuda", dtype=torch.int32)
    raises_everywhere(lambda: paged_decode(q, k, k, table.long(), lens), TypeError, "int32")
    raises_everywhere(lambda: paged_decode(q.float(), k, k, table, lens), TypeError, "bfloat16 or all float16")
    q96, k96 = q[..., :96].contiguous(), k[..., :96].contiguous()
    raises_everywhere(lambda: paged_decode(q96, k96, k96, table, lens), ValueError, "head_dim")
    k4 = torch.randn((4, 16, 4, 128), device="cuda").bfloat16()
    raises_everywhere(lambda: paged_decode(q[:, :, :6].contiguous(), k4, k4, table, lens), ValueError, "multiple of")
    raises_everywhere(lambda: paged_decode(q, k, k, torch.tensor([[0, 9]], device="cuda", dtype=torch.int32), lens),
                      ValueError, r"block_table\[0, 1\] = 9")
    raises_everywhere(lambda: paged_decode(q, k, k, table, torch.tensor([33], device="cuda", dtype=torch.int32)),
                      ValueError, "seq_len must be in")
    raises_everywhere(lambda: paged_decode(q.cpu(), k, k, table, lens), ValueError, "CUDA")


def test_flash_decode_tutorial():
    import importlib.util
    import os

    path = os.path.join(os.path.dirname(__file__), "..", "..", "..", "tutorials", "07_flash_decode.py")
    spec = importlib.util.spec_from_file_location("tutorial_07", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    all_ranks_agree(module.check(length=64 * 1024, rounds=2), "tutorial 07 (flash decoding) failed its checks")
