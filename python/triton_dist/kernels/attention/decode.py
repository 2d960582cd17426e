"""Paged GQA decode attention: split-KV over programs, then a log-sum-exp combine of the splits.

Queries are ``[batch, q_tokens, q_heads, head_dim]`` (one new token, or up to 8 for speculative
decoding); the KV cache is paged, ``[blocks, block_size, kv_heads, head_dim]`` for K and for V,
with ``block_table [batch, max_blocks]`` (int32 page numbers) and ``seq_lens [batch]`` (int32,
tokens in the cache, the new ones included). Query token ``t`` of ``T`` sees cache positions
``< seq_len - T + 1 + t`` (causal among the new tokens); with ``causal=False`` (a cache part that
precedes the new tokens, in distributed decoding) it sees every position.

Stage 1 (:func:`decode_split_kernel`), grid ``(batch, kv_heads, splits)``: a program takes one
KV head, all ``group = q_heads / kv_heads`` query heads that share it and all ``T`` tokens (the
``group * T`` rows are the M side of ``tl.dot``, padded to 16), and one contiguous split of the
sequence; it walks the split in tiles of ``BLOCK_N`` positions, gathers each position's page from
the block table, and keeps the online softmax in base 2 (``exp2``, the scale folded with
``log2(e)``). It writes its normalised partial output and its LSE (natural log; ``-inf`` for an
empty split). Splits cut every sequence so that ``batch * kv_heads * splits`` programs fill the
SMs even at batch 1: bytes of KV are what the kernel moves, so the whole GPU must stream them.

Stage 2 (:func:`combine_splits_kernel`): per ``(batch, token, head)`` row, ``lse = logsumexp_s
lse_s`` and ``out = sum_s exp(lse_s - lse) * out_s``; an all-empty row (no visible position)
gives zeros and ``lse = -inf``. The same combine, across ranks instead of splits, is what
distributed flash decoding does (:mod:`~triton_dist.kernels.attention.flash_decode`).
"""

from __future__ import annotations

import math

import triton
import triton.language as tl

DTYPES = ("bfloat16", "float16")
HEAD_DIMS = (64, 128)
MAX_Q_TOKENS = 8
MAX_GROUP = 16
BLOCK_N = 64
"""Cache positions per tile of stage 1."""

_LOG2E = 1.4426950408889634
_LN2 = 0.6931471805599453


@triton.jit(do_not_specialize=["num_splits", "max_blocks", "num_blocks", "scale", "soft_cap", "causal"])
def decode_split_kernel(q, k_cache, v_cache, block_table, seq_lens, part_out, part_lse, num_splits, max_blocks,
                        num_blocks, scale, soft_cap, causal, Q_HEADS: tl.constexpr, KV_HEADS: tl.constexpr,
                        T: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr, M_PAD: tl.constexpr,
                        BLOCK_N: tl.constexpr, SOFT_CAP: tl.constexpr):
    """Stage 1 (module notes). ``q``: ``[B, T, Q_HEADS, D]`` contiguous; ``k_cache``/``v_cache``:
    ``[num_blocks, PAGE, KV_HEADS, D]`` contiguous; ``part_out``: fp32 ``[B, num_splits, T,
    Q_HEADS, D]``; ``part_lse``: fp32 ``[B, num_splits, T, Q_HEADS]``."""
    b = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.program_id(2)
    GROUP: tl.constexpr = Q_HEADS // KV_HEADS
    seq_len = tl.load(seq_lens + b)
    chunk = tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
    start = s * chunk
    end = tl.minimum(start + chunk, seq_len)

    rows = tl.arange(0, M_PAD)
    t = rows // GROUP
    head = h * GROUP + rows % GROUP
    row_ok = rows < GROUP * T
    d = tl.arange(0, D)
    q_rows = (b * T + t).to(tl.int64) * (Q_HEADS * D) + head * D
    q_tile = tl.load(q + q_rows[:, None] + d[None, :], mask=row_ok[:, None], other=0.0)
    # The last position query token t may see (``causal`` 0: the whole part).
    last_visible = seq_len - 1 - (T - 1 - t) * causal

    qk_scale = scale * 1.4426950408889634  # log2(e): the softmax runs in base 2
    m_i = tl.full([M_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([M_PAD], tl.float32)
    acc = tl.zeros([M_PAD, D], tl.float32)
    lanes = tl.arange(0, BLOCK_N)
    for n0 in range(start, end, BLOCK_N):
        pos = n0 + lanes
        in_range = (pos < end) & (pos // PAGE < max_blocks)
        page = tl.load(block_table + b.to(tl.int64) * max_blocks + pos // PAGE, mask=in_range, other=0)
        # A bad page number reads page 0 or the last page, never past the cache (the host checks the
        # table where it can; this keeps a wrong entry from reading foreign memory).
        page = tl.minimum(tl.maximum(page, 0), num_blocks - 1)
        kv_rows = ((page.to(tl.int64) * PAGE + pos % PAGE) * KV_HEADS + h) * D
        k = tl.load(k_cache + kv_rows[:, None] + d[None, :], mask=in_range[:, None], other=0.0)
        v = tl.load(v_cache + kv_rows[:, None] + d[None, :], mask=in_range[:, None], other=0.0)
        scores = tl.dot(q_tile, tl.trans(k))
        if SOFT_CAP:
            scores = soft_cap * _tanh(scores * scale / soft_cap) * 1.4426950408889634
        else:
            scores = scores * qk_scale
        visible = in_range[None, :] & (pos[None, :] <= last_visible[:, None]) & row_ok[:, None]
        scores = tl.where(visible, scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing visible yet
        p = tl.exp2(scores - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new

    empty = l_i == 0.0
    out = acc / tl.where(empty, 1.0, l_i)[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.log2(tl.where(empty, 1.0, l_i))) * 0.6931471805599453)
    part_rows = ((b * num_splits + s) * T + t).to(tl.int64) * Q_HEADS + head
    tl.store(part_out + part_rows[:, None] * D + d[None, :], out, mask=row_ok[:, None])
    tl.store(part_lse + part_rows, lse, mask=row_ok)


@triton.jit
def _tanh(x):
    e = tl.exp(-2.0 * tl.abs(x))
    y = (1.0 - e) / (1.0 + e)
    return tl.where(x < 0, -y, y)


@triton.jit
def combine_rows(parts, lses, out, out_lse, row, num_parts, part_stride, lse_stride, D: tl.constexpr,
                 PARTS: tl.constexpr):
    """``out[row] = sum_p exp(lse_p - lse) * parts[p][row]`` and ``out_lse[row] = lse = logsumexp_p
    lse_p`` over ``num_parts`` (<= ``PARTS``) partial results at ``parts + p * part_stride`` (rows
    of ``D`` fp32) and ``lses + p * lse_stride``; zeros and ``-inf`` when every part is empty.
    Shared by the split combine and the cross-rank one."""
    p = tl.arange(0, PARTS)
    have = p < num_parts
    lse_p = tl.load(lses + p.to(tl.int64) * lse_stride + row, mask=have, other=float("-inf"))
    top = tl.max(lse_p, 0)
    top_safe = tl.where(top == float("-inf"), 0.0, top)
    w = tl.exp(lse_p - top_safe)  # 0 for empty parts
    total = tl.sum(w, 0)
    d = tl.arange(0, D)
    vals = tl.load(parts + (p.to(tl.int64) * part_stride + row * D)[:, None] + d[None, :], mask=have[:, None],
                   other=0.0)
    acc = tl.sum(vals * w[:, None], 0) / tl.where(total == 0.0, 1.0, total)
    tl.store(out + row * D + d, acc.to(out.dtype.element_ty))
    tl.store(out_lse + row, tl.where(total == 0.0, float("-inf"), top_safe + tl.log(tl.where(total == 0.0, 1.0,
                                                                                             total))))


@triton.jit(do_not_specialize=["num_splits"])
def combine_splits_kernel(part_out, part_lse, out, lse, num_splits, ROWS_PER_BATCH: tl.constexpr,
                          D: tl.constexpr, SPLITS: tl.constexpr):
    """Stage 2 (module notes), grid ``(batch, T * Q_HEADS)``: ``out`` ``[B, T, Q_HEADS, D]`` in the
    output dtype, ``lse`` fp32 ``[B, T, Q_HEADS]``."""
    b = tl.program_id(0).to(tl.int64)
    r = tl.program_id(1).to(tl.int64)
    base = b * num_splits * ROWS_PER_BATCH
    combine_rows(part_out + base * D, part_lse + base, out + b * ROWS_PER_BATCH * D, lse + b * ROWS_PER_BATCH, r,
                 num_splits, ROWS_PER_BATCH * D, ROWS_PER_BATCH, D, SPLITS)


def row_pad(group: int, q_tokens: int) -> int:
    """Rows of stage 1's dot: ``group * q_tokens`` padded to a power of two, at least 16 (tl.dot)."""
    return max(16, triton.next_power_of_2(group * q_tokens))


def split_warps(m_pad: int, head_dim: int) -> int:
    """Warps of stage 1: 8 once the fp32 accumulator (``m_pad x head_dim``) passes 8 K elements, so
    that it stays in registers (4 warps spilled 296 B a thread at 128 x 128, sm_90 compile)."""
    return 4 if m_pad * head_dim <= 8192 else 8


def pick_splits(batch: int, kv_heads: int, max_seq_len: int, num_sms: int) -> int:
    """Splits per sequence so that ``batch * kv_heads * splits`` programs are about four waves of the
    SMs (loads in flight on every SM), no split shorter than two tiles; a fixed rule, the same on
    every rank for the same shapes."""
    programs = max(1, batch * kv_heads)
    want = max(1, (4 * num_sms) // programs)
    longest = max(1, math.ceil(max_seq_len / (2 * BLOCK_N)))
    return max(1, min(want, longest, 256))


def check_inputs(op: str, q, k_cache, v_cache, block_table, seq_lens, *, check_table: bool, min_len: int) -> None:
    """Raise a clear error for inputs the kernels cannot take (module notes for the layouts).
    ``check_table``: also check every page a sequence uses and every length, ``min_len`` up to the
    table's capacity (one host synchronisation; off under CUDA-graph capture)."""
    import torch

    def fail(what):
        raise ValueError(f"triton_dist {op}: {what}")

    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("block_table", block_table),
                    ("seq_lens", seq_lens)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"triton_dist {op}: {name} must be a torch.Tensor, got {type(t).__name__}")
        if not t.is_cuda or t.device != q.device:
            fail(f"{name} is on {t.device}; every input must be on the CUDA device of q ({q.device})")
        if not t.is_contiguous():
            fail(f"{name} must be contiguous")
    if str(q.dtype).replace("torch.", "") not in DTYPES or k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        raise TypeError(f"triton_dist {op}: q, k_cache and v_cache must all be bfloat16 or all float16, got "
                        f"{q.dtype}, {k_cache.dtype}, {v_cache.dtype}")
    if block_table.dtype != torch.int32 or seq_lens.dtype != torch.int32:
        raise TypeError(f"triton_dist {op}: block_table and seq_lens must be int32, got {block_table.dtype} and "
                        f"{seq_lens.dtype}")
    if q.dim() != 4:
        fail(f"q must be [batch, q_tokens, q_heads, head_dim], got {list(q.shape)}")
    batch, tokens, q_heads, head_dim = q.shape
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        fail(f"k_cache and v_cache must both be [blocks, block_size, kv_heads, head_dim], got {list(k_cache.shape)} "
             f"and {list(v_cache.shape)}")
    _, page, kv_heads, cache_dim = k_cache.shape
    if head_dim not in HEAD_DIMS or cache_dim != head_dim:
        fail(f"head_dim must be one of {HEAD_DIMS} in q and the cache, got {head_dim} and {cache_dim}")
    if not 1 <= tokens <= MAX_Q_TOKENS:
        fail(f"q_tokens must be 1..{MAX_Q_TOKENS}, got {tokens}")
    if q_heads % kv_heads or not 1 <= q_heads // kv_heads <= MAX_GROUP:
        fail(f"q_heads ({q_heads}) must be a multiple of kv_heads ({kv_heads}), at most {MAX_GROUP} times it")
    if k_cache.shape[0] == 0:
        fail("k_cache has no blocks; a rank that holds no token of any sequence passes a one-block cache "
             "with seq_lens 0")
    if page & (page - 1):
        fail(f"block_size must be a power of two, got {page}")
    if block_table.dim() != 2 or block_table.shape[0] != batch or seq_lens.shape != (batch, ):
        fail(f"block_table must be [batch={batch}, max_blocks] and seq_lens [batch], got "
             f"{list(block_table.shape)} and {list(seq_lens.shape)}")
    if check_table and batch:
        capacity = block_table.shape[1] * page
        used = torch.arange(block_table.shape[1], device=q.device)[None, :] < ((seq_lens + page - 1) // page)[:, None]
        bad_page = ((block_table < 0) | (block_table >= k_cache.shape[0])) & used
        bad_len = (seq_lens < min_len) | (seq_lens > capacity)
        if bool(bad_page.any() | bad_len.any()):  # one synchronisation for both
            if bool(bad_len.any()):
                fail(f"every seq_len must be in [{min_len}, {capacity}] (max_blocks * block_size), got "
                     f"{seq_lens.tolist()}")
            b, j = (int(i) for i in bad_page.nonzero()[0])
            fail(f"block_table[{b}, {j}] = {int(block_table[b, j])} is not a page of the cache "
                 f"(0..{k_cache.shape[0] - 1})")


def paged_decode(q, k_cache, v_cache, block_table, seq_lens, *, scale: float | None = None,
                 soft_cap: float | None = None, num_splits: int | None = None, out=None, lse=None,
                 check_table: bool | None = None, causal: bool = True, _out_dtype=None):
    """Decode attention over a paged KV cache (module notes); returns ``(out, lse)``: ``out`` like
    ``q`` (``[batch, q_tokens, q_heads, head_dim]``), ``lse`` fp32 ``[batch, q_tokens, q_heads]`` (natural
    log of the softmax denominator, ``-inf`` where nothing is visible).

    ``scale``: the softmax scale (default ``head_dim ** -0.5``); ``soft_cap``: scores become
    ``soft_cap * tanh(score / soft_cap)`` (None: off); ``num_splits``: splits per sequence (default:
    :func:`pick_splits` for the SMs of this process); ``check_table``: check the table and lengths
    on the host (default: unless a CUDA graph is being captured); ``causal``: the cache ends with
    the ``q_tokens`` new tokens, each seeing only those before it (False: every query sees every
    position, for a part of a sequence that precedes the new tokens)."""
    import torch

    from ... import residency

    op = "paged_decode"
    if check_table is None:
        check_table = not torch.cuda.is_current_stream_capturing()
    check_inputs(op, q, k_cache, v_cache, block_table, seq_lens, check_table=check_table,
                 min_len=q.shape[1] if causal and q.dim() == 4 else 0)
    batch, tokens, q_heads, head_dim = q.shape
    kv_heads, page = k_cache.shape[2], k_cache.shape[1]
    if soft_cap is not None and not soft_cap > 0:
        raise ValueError(f"triton_dist {op}: soft_cap must be positive (or None), got {soft_cap!r}")
    scale = head_dim ** -0.5 if scale is None else float(scale)
    if num_splits is None:
        num_splits = pick_splits(batch, kv_heads, block_table.shape[1] * page, residency.sm_count(q.device))
    if isinstance(num_splits, bool) or not isinstance(num_splits, int) or not 1 <= num_splits <= 256:
        raise ValueError(f"triton_dist {op}: num_splits must be an int in 1..256, got {num_splits!r}")
    out_dtype = _out_dtype or q.dtype
    if out is None:
        out = torch.empty(q.shape, device=q.device, dtype=out_dtype)
    if lse is None:
        lse = torch.empty(q.shape[:3], device=q.device, dtype=torch.float32)
    if out.shape != q.shape or out.dtype != out_dtype or not out.is_contiguous():
        raise ValueError(f"triton_dist {op}: out must be a contiguous {list(q.shape)} {out_dtype} tensor")
    if lse.shape != q.shape[:3] or lse.dtype != torch.float32 or not lse.is_contiguous():
        raise ValueError(f"triton_dist {op}: lse must be a contiguous {list(q.shape[:3])} float32 tensor")
    if batch == 0:
        return out, lse
    part_out = torch.empty((batch, num_splits, tokens, q_heads, head_dim), device=q.device, dtype=torch.float32)
    part_lse = torch.empty((batch, num_splits, tokens, q_heads), device=q.device, dtype=torch.float32)
    group = q_heads // kv_heads
    decode_split_kernel[(batch, kv_heads, num_splits)](
        q, k_cache, v_cache, block_table, seq_lens, part_out, part_lse, num_splits, block_table.shape[1],
        k_cache.shape[0], scale, float(soft_cap or 1.0), int(bool(causal)), Q_HEADS=q_heads, KV_HEADS=kv_heads,
        T=tokens, D=head_dim, PAGE=page, M_PAD=row_pad(group, tokens), BLOCK_N=BLOCK_N, SOFT_CAP=soft_cap is not None,
        num_warps=split_warps(row_pad(group, tokens), head_dim), num_stages=2)
    combine_splits_kernel[(batch, tokens * q_heads)](part_out, part_lse, out, lse, num_splits,
                                                     ROWS_PER_BATCH=tokens * q_heads, D=head_dim,
                                                     SPLITS=triton.next_power_of_2(num_splits), num_warps=4)
    return out, lse
