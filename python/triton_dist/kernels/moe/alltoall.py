"""Expert-parallel AllToAll: the kernels of dispatch (tokens to the ranks of their experts, laid
out expert-major there) and combine (the experts' outputs back, weighted and summed, in the
original token order), in two modes of one protocol. The context that owns their buffers is
:class:`~triton_dist.kernels.moe.EPContext`.

- *low-latency* (decode): two halves of every symmetric buffer, so a dispatch may be sent while
  the previous one waits for its receive; the output is ``[L, world * T, hidden]``, expert ``j``'s
  rows at the start of block ``j`` (no host synchronisation, CUDA-graph capturable).
- *high-throughput* (prefill, thousands of tokens): one half (``HALVES = 1``: each dispatch is
  received, and combined, before the next is sent), and a packed output ``[rows, hidden]`` with
  expert ``j``'s rows after those of experts ``< j`` (``PACKED``), sized by the received counts:
  the send half, :func:`ep_received_counts_kernel` and one host synchronisation, then the
  receive half; or, when the caller gives a maximum, no synchronisation and the rows past it
  dropped.

Experts are split evenly: rank ``d`` holds experts ``[d * L, (d + 1) * L)``. Every buffer below
has ``HALVES`` halves, picked by the epoch (the context's call counter, bumped per dispatch)
modulo ``HALVES``; "two calls ago" below reads "``HALVES`` calls ago".

Dispatch, on rank ``me`` (after :mod:`~triton_dist.kernels.moe.layout` computed ``slots``,
``positions`` and ``counts``):

1. *send*: for every token ``t`` and every rank ``d`` it goes to, the token's row once (however
   many of its experts ``d`` holds) into row ``slot = slots[t, d]`` of ``d``'s ``recv_x[me]``, with
   its ``K`` routing entries (local expert and position among ``me``'s assignments to that expert,
   or -1 for entries of other ranks) and weights. Program 0 also writes ``d``'s ``recv_counts[me]``:
   the tokens sent and the assignments per local expert. Then every program notifies ``d``'s
   ``dispatched[me, pid]`` with the epoch (release, system scope, after a CTA barrier).
   Before writing, the send waits until every destination has finished reading this half two
   calls ago (``freed``, below), so that a caller may split send and receive.
2. *receive*: wait for every rank's ``dispatched`` (acquire), then copy each received token into
   ``out_x[j, row]`` for each of its entries with local expert ``j``, where ``row`` = the
   assignments to ``j`` from lower ranks plus the entry's position: expert ``j``'s rows are packed
   at the start of its ``world * max_tokens`` rows, ordered by source rank, then by the source's
   token order. Each entry's row and weight are also kept for combine (``row_of``, ``weight_of``:
   local, so a later dispatch may reuse the receive buffers; the row as ``j * world * max_tokens +
row``, a row of ``out_x`` seen as ``[L * world * max_tokens, hidden]``, or -1), and ``recv_tokens[r]``. Then every
   program notifies each source's ``freed[me, pid]``.

Combine, on rank ``me`` with the experts' outputs ``y`` (``[L, world * max_tokens, hidden]``, rows
as dispatch laid them out): for every token received from rank ``r`` (slot ``s``), the weighted sum
of its entries' rows of ``y`` (fp32, rounded once to the dtype), into row ``s`` of ``r``'s
``comb_x[me]``; notify ``combined[me, pid]`` on every rank; wait for every rank's; then
``out[t] = sum over ranks d that t went to of comb_x[d, slots[t, d]]`` (fp32, ranks in order, so
every run gives the same bits). A token routed nowhere gets zeros. Combines must come in the order
of their dispatches (the context checks it): then a rank cannot start combine ``e + 2``, which
reuses half ``e % 2`` of its peers' ``comb_x``, before every peer has read it in combine ``e``.
With one half (high-throughput) the context also requires each dispatch to be combined before the
next dispatch, on the same stream (a CUDA graph must hold dispatch and combine together): a rank's
combine ``e + 1`` then follows its receive of ``e + 1``, which waited for every peer's send of
``e + 1``, which each peer issued after its own combine ``e`` (stream order), so no peer still
reads ``comb_x`` when it is written again.

Every program of a grid must be resident at once (programs wait for their peers' programs), so
grids are exactly ``MAX_PROGRAMS`` programs, the same on every rank.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ... import language as dl
from ...distributed_jit import jit


FP8_MAX = tl.constexpr(448.0)
"""The largest finite float8 e4m3 value: each block's scale maps its largest magnitude there."""


@triton.jit
def _quantize_row(dst, dst_scale, src, H: tl.constexpr, QB: tl.constexpr, QG: tl.constexpr):
    """``src[:H]`` as float8 e4m3 into ``dst`` with one fp32 scale per ``QB`` values into
    ``dst_scale`` (``value = dst * scale``; ``scale = max |block| / FP8_MAX``, 1 for a block of
    zeros), ``QG`` blocks at a time (so that each thread stores several bytes at once). ``H`` a
    multiple of ``QB * QG``."""
    for g in tl.static_range(0, H // (QB * QG)):
        blocks = g * QG + tl.arange(0, QG)
        h = blocks[:, None] * QB + tl.arange(0, QB)[None, :]
        v = tl.load(src + h).to(tl.float32)
        amax = tl.max(tl.abs(v), 1)
        scale = tl.where(amax > 0, amax / FP8_MAX, 1.0)
        tl.store(dst + h, (v / scale[:, None]).to(dst.dtype.element_ty))
        tl.store(dst_scale + blocks, scale)


@triton.jit
def _copy_row(dst, src, H: tl.constexpr, BH: tl.constexpr):
    """``dst[:H] = src[:H]``, ``BH`` elements at a time."""
    for h0 in tl.static_range(0, H, BH):
        h = h0 + tl.arange(0, BH)
        tl.store(dst + h, tl.load(src + h, mask=h < H), mask=h < H)


@triton.jit
def _entries_per_expert(counts, L: tl.constexpr, LP: tl.constexpr, WORLD: tl.constexpr):
    """``[LP]``: the entries every source sent to each local expert (``recv_counts``' per-expert
    part, summed over the sources; 0 past ``L``)."""
    l_off = tl.arange(0, LP)
    total = tl.zeros([LP], dtype=tl.int32)
    for src in tl.static_range(WORLD):
        total += tl.load(counts + src * (1 + LP) + 1 + l_off, mask=l_off < L, other=0)
    return total


@jit(do_not_specialize=["tokens", "capacity"])
def ep_dispatch_kernel(x, topk_idx, topk_weights, slots, positions, layout_counts, recv_x, recv_route, recv_weight,
                       recv_counts, signals, out_x, out_weight, out_counts, row_of, weight_of, recv_tokens,
                       epoch_ptr, handle_epoch, tokens, recv_scale, out_scale, capacity, H: tl.constexpr,
                       T: tl.constexpr, K: tl.constexpr, KP: tl.constexpr, E: tl.constexpr, L: tl.constexpr,
                       LP: tl.constexpr, WORLD: tl.constexpr, MAX_PROGRAMS: tl.constexpr, BH: tl.constexpr,
                       SEND: tl.constexpr, RECV: tl.constexpr, FP8: tl.constexpr = False, QB: tl.constexpr = 128,
                       QG: tl.constexpr = 1, PACKED: tl.constexpr = False, HALVES: tl.constexpr = 2):
    """Dispatch's send and/or receive half (module notes), ``MAX_PROGRAMS`` programs.

    ``HALVES``: 2 (low-latency: a dispatch may be sent while the previous one is not yet received)
    or 1 (high-throughput: each dispatch is received before the next is sent, and the symmetric
    buffers hold one call). ``PACKED`` (high-throughput): ``out_x`` is ``[capacity, H]``, expert
    ``j``'s rows packed after those of experts ``< j`` (counted over every source), ``out_weight``
    ``[capacity]``; an entry whose row would be ``>= capacity`` is dropped (``row_of`` -1).
    Otherwise ``capacity`` is unused and ``out_x`` is ``[L, WORLD * T, H]``.

    ``FP8``: each row travels as float8 e4m3 with one fp32 scale per ``QB`` values (quantised by
    the sender, :func:`_quantize_row`, ``QG`` blocks at a time): ``recv_x`` and ``out_x`` are
    float8, ``recv_scale`` (symmetric, ``HALVES`` halves of ``[WORLD, T, H / QB]``) and ``out_scale``
    (``[L, WORLD * T, H / QB]``) fp32; otherwise both are None.

    Local inputs: ``x`` ``[tokens, H]``; ``topk_idx`` int32 and ``topk_weights`` fp32 ``[tokens, K]``;
    the layout's ``slots`` ``[tokens, WORLD]``, ``positions`` ``[tokens, K]``, ``layout_counts``
    ``[E + WORLD]``. Symmetric, ``HALVES`` halves each: ``recv_x`` ``[WORLD, T, H]``, ``recv_route`` int32
    ``[WORLD, T, KP, 2]`` (local expert, position), ``recv_weight`` fp32 ``[WORLD, T, KP]``,
    ``recv_counts`` int32 ``[WORLD, 1 + LP]``; ``signals``: the pad, regions ``dispatched`` then
    ``freed`` (``WORLD * MAX_PROGRAMS`` each). Local outputs: ``out_x`` ``[L, WORLD * T, H]``,
    ``out_weight`` fp32 ``[L, WORLD * T]``, ``out_counts`` int32 ``[L]``, ``row_of`` int32 (rows of
    ``out_x`` flattened to ``[L * WORLD * T, H]``, -1 for none) and ``weight_of`` fp32 ``[WORLD, T,
    KP]``, ``recv_tokens`` int32 ``[WORLD]``; ``handle_epoch``
    (int64, one element) receives this call's epoch for combine."""
    epoch = tl.load(epoch_ptr)
    me = dl.rank()
    pid = tl.program_id(0)
    half = (epoch % HALVES).to(tl.int64)
    k_off = tl.arange(0, KP)
    k_ok = k_off < K
    l_off = tl.arange(0, LP)
    dispatched = signals
    freed = signals + WORLD * MAX_PROGRAMS
    x_half = half * WORLD * T * H
    scale_half = half * WORLD * T * (H // QB)
    route_half = half * WORLD * T * KP
    counts_half = half * WORLD * (1 + LP)
    if SEND:
        if pid == 0:
            tl.store(handle_epoch, epoch)
        if epoch > HALVES:  # every destination has read this half HALVES calls ago
            dl.wait(freed, WORLD * MAX_PROGRAMS, "sys", "acquire", epoch - HALVES)
        for t in range(pid, tokens, MAX_PROGRAMS):
            t64 = t.to(tl.int64)
            idx = tl.load(topk_idx + t64 * K + k_off, mask=k_ok, other=-1)
            valid = (idx >= 0) & (idx < E)
            weight = tl.load(topk_weights + t64 * K + k_off, mask=k_ok, other=0.0)
            pos = tl.load(positions + t64 * K + k_off, mask=k_ok & valid, other=0)
            for d in tl.static_range(WORLD):
                slot = tl.load(slots + t64 * WORLD + d)
                if slot >= 0:
                    row = me.to(tl.int64) * T + slot
                    peer_x = dl.symm_at(recv_x, d) + x_half
                    if FP8:
                        peer_scale = dl.symm_at(recv_scale, d) + scale_half
                        # 16-byte aligned: a symmetric base and rows of H bytes, H a multiple of QB
                        # (symm_at loses the fact, and the stores would go a byte at a time).
                        dst = tl.multiple_of(peer_x + row * H, 16)
                        _quantize_row(dst, peer_scale + row * (H // QB), x + t64 * H, H, QB, QG)
                    else:
                        _copy_row(peer_x + row * H, x + t64 * H, H, BH)
                    here = valid & (idx // L == d)
                    entry = route_half + row * KP + k_off
                    peer_route = dl.symm_at(recv_route, d)
                    tl.store(peer_route + 2 * entry, tl.where(here, idx - d * L, -1))
                    tl.store(peer_route + 2 * entry + 1, tl.where(here, pos, 0))
                    tl.store(dl.symm_at(recv_weight, d) + entry, weight)
        if pid == 0:
            for d in tl.static_range(WORLD):
                peer_counts = dl.symm_at(recv_counts, d) + counts_half + me * (1 + LP)
                tl.store(peer_counts, tl.load(layout_counts + E + d))
                tl.store(peer_counts + 1 + l_off, tl.load(layout_counts + d * L + l_off, mask=l_off < L),
                         mask=l_off < L)
        for d in tl.static_range(WORLD):
            dl.notify(dispatched + me * MAX_PROGRAMS + pid, d, epoch, "set", "intra_node")
    if RECV:
        token = dl.wait(dispatched, WORLD * MAX_PROGRAMS, "sys", "acquire", epoch)
        counts = dl.consume_token(recv_counts + counts_half, token)
        route = dl.consume_token(recv_route + 2 * route_half, token)
        arrived_x = dl.consume_token(recv_x + x_half, token)
        arrived_weight = dl.consume_token(recv_weight + route_half, token)
        if FP8:
            arrived_scale = dl.consume_token(recv_scale + scale_half, token)
        if PACKED:  # expert j's first row: the entries of experts < j from every source
            total = _entries_per_expert(counts, L, LP, WORLD)
            expert_base = tl.cumsum(total, axis=0) - total
        if pid == 0:
            for src in tl.static_range(WORLD):
                tl.store(recv_tokens + src, tl.load(counts + src * (1 + LP)))
            tl.store(out_counts + l_off, _entries_per_expert(counts, L, LP, WORLD), mask=l_off < L)
        for i in range(pid, WORLD * T, MAX_PROGRAMS):
            r = i // T
            s = i % T
            row_in = i.to(tl.int64)
            if s < tl.load(counts + r * (1 + LP)):
                for k in tl.static_range(K):
                    j = tl.load(route + 2 * (row_in * KP + k))
                    w = tl.load(arrived_weight + row_in * KP + k)
                    out_row = tl.load(route + 2 * (row_in * KP + k) + 1)
                    for lower in range(r):  # assignments to j from lower ranks come first
                        out_row += tl.load(counts + lower * (1 + LP) + 1 + j, mask=j >= 0, other=0)
                    if PACKED:
                        packed = tl.sum(tl.where(l_off == j, expert_base, 0), axis=0).to(tl.int64) + out_row
                        flat = tl.where((j >= 0) & (packed < capacity), packed, -1)
                    else:
                        flat = tl.where(j >= 0, j.to(tl.int64) * WORLD * T + out_row, -1)
                    if flat >= 0:
                        _copy_row(out_x + flat * H, arrived_x + row_in * H, H, BH)
                        if FP8:
                            _copy_row(out_scale + flat * (H // QB), arrived_scale + row_in * (H // QB), H // QB,
                                      64)
                        tl.store(out_weight + flat, w)
                    tl.store(row_of + row_in * KP + k, flat.to(tl.int32))
                    tl.store(weight_of + row_in * KP + k, w)
        for r in tl.static_range(WORLD):
            dl.notify(freed + me * MAX_PROGRAMS + pid, r, epoch, "set", "intra_node")


@jit(do_not_specialize=["tokens"])
def ep_combine_kernel(y, row_of, weight_of, recv_tokens, slots, comb_x, signals, out, handle_epoch, tokens,
                      H: tl.constexpr, T: tl.constexpr, K: tl.constexpr, KP: tl.constexpr, WORLD: tl.constexpr,
                      MAX_PROGRAMS: tl.constexpr, BH: tl.constexpr, HALVES: tl.constexpr = 2):
    """Combine (module notes), ``MAX_PROGRAMS`` programs. ``y``: the dispatch's ``out_x`` layout
    (``[L, WORLD * T, H]``, or packed ``[rows, H]``: ``row_of`` holds rows of ``y`` seen as ``[-1,
    H]`` either way); ``row_of``, ``weight_of``, ``recv_tokens``, ``slots``, ``handle_epoch``: the
    dispatch's handle; ``comb_x``: symmetric, ``HALVES`` halves of ``[WORLD, T, H]``; ``signals``:
    the pad's ``combined`` region (``WORLD * MAX_PROGRAMS``); ``out``: ``[tokens, H]``."""
    epoch = tl.load(handle_epoch)
    me = dl.rank()
    pid = tl.program_id(0)
    half = (epoch % HALVES).to(tl.int64)
    comb_half = half * WORLD * T * H
    for i in range(pid, WORLD * T, MAX_PROGRAMS):
        r = i // T
        s = i % T
        row_in = i.to(tl.int64)
        if s < tl.load(recv_tokens + r):
            dst = dl.symm_at(comb_x, r) + comb_half + (me.to(tl.int64) * T + s) * H
            for h0 in tl.static_range(0, H, BH):
                h = h0 + tl.arange(0, BH)
                acc = tl.zeros([BH], dtype=tl.float32)
                for k in tl.static_range(K):
                    y_row = tl.load(row_of + row_in * KP + k).to(tl.int64)
                    if y_row >= 0:
                        w = tl.load(weight_of + row_in * KP + k)
                        acc += w * tl.load(y + y_row * H + h, mask=h < H, other=0.0).to(tl.float32)
                tl.store(dst + h, acc.to(dst.dtype.element_ty), mask=h < H)
    for r in tl.static_range(WORLD):
        dl.notify(signals + me * MAX_PROGRAMS + pid, r, epoch, "set", "intra_node")
    token = dl.wait(signals, WORLD * MAX_PROGRAMS, "sys", "acquire", epoch)
    arrived = dl.consume_token(comb_x + comb_half, token)
    for t in range(pid, tokens, MAX_PROGRAMS):
        t64 = t.to(tl.int64)
        for h0 in tl.static_range(0, H, BH):
            h = h0 + tl.arange(0, BH)
            acc = tl.zeros([BH], dtype=tl.float32)
            for d in tl.static_range(WORLD):
                slot = tl.load(slots + t64 * WORLD + d)
                if slot >= 0:
                    acc += tl.load(arrived + (d * T + slot.to(tl.int64)) * H + h, mask=h < H, other=0.0).to(tl.float32)
            tl.store(out + t64 * H + h, acc.to(out.dtype.element_ty), mask=h < H)


@jit
def ep_received_counts_kernel(recv_counts, signals, handle_epoch, out_counts, L: tl.constexpr, LP: tl.constexpr,
                              WORLD: tl.constexpr, MAX_PROGRAMS: tl.constexpr, HALVES: tl.constexpr):
    """High-throughput dispatch, between its send and its receive (one program): wait for every
    rank's ``dispatched`` of this call, then ``out_counts[j]`` = the entries of local expert ``j``
    from every source, so that the host can size the packed output."""
    epoch = tl.load(handle_epoch)
    l_off = tl.arange(0, LP)
    token = dl.wait(signals, WORLD * MAX_PROGRAMS, "sys", "acquire", epoch)
    counts = dl.consume_token(recv_counts + (epoch % HALVES).to(tl.int64) * WORLD * (1 + LP), token)
    tl.store(out_counts + l_off, _entries_per_expert(counts, L, LP, WORLD), mask=l_off < L)
