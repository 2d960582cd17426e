"""The routing layout of an expert-parallel dispatch, computed on the GPU from ``topk_idx``:
where every token goes and where each of its expert assignments lands.

One program per expert and one per rank, each scanning the ``[tokens, topk]`` routing in order
(token-major, then ``k``) with a running count, so the layout is the same on every run (no
atomics): a dispatch moves the same bytes to the same places each time.

- Program ``e < E`` (expert ``e``): ``positions[t, k]`` = how many earlier assignments (in that
  order) went to ``e``, for every ``(t, k)`` routed to ``e``; ``counts[e]`` = all of them.
- Program ``E + d`` (rank ``d``): ``slots[t, d]`` = how many earlier tokens go to rank ``d`` (a
  token with several experts on ``d`` counts once: it travels once per rank), or -1 if ``t`` sends
  nothing there; ``counts[E + d]`` = the tokens that go to ``d``.

Entries that name no expert (``-1``, as in DeepEP) or one out of ``[0, E)`` count nowhere.
"""

import triton
import triton.language as tl


@triton.jit(do_not_specialize=["tokens"])
def ep_layout_kernel(topk_idx, slots, positions, counts, tokens, K: tl.constexpr, KP: tl.constexpr,
                     E: tl.constexpr, L: tl.constexpr, WORLD: tl.constexpr, BT: tl.constexpr):
    """The layout (module notes): ``E + WORLD`` programs. ``topk_idx``: int32 ``[tokens, K]``;
    ``slots``: int32 ``[tokens, WORLD]``; ``positions``: int32 ``[tokens, K]``; ``counts``: int32
    ``[E + WORLD]``. ``L`` experts per rank, ``KP`` = ``K`` rounded up to a power of two, ``BT`` tokens
    per step."""
    pid = tl.program_id(0)
    t_off = tl.arange(0, BT)
    k_off = tl.arange(0, KP)
    running = tl.sum(tl.zeros([BT], dtype=tl.int32), axis=0)
    for t0 in range(0, tokens, BT):
        t = t0 + t_off
        in_range = (t[:, None] < tokens) & (k_off[None, :] < K)
        entry = t[:, None] * K + k_off[None, :]
        idx = tl.load(topk_idx + entry, mask=in_range, other=-1)
        valid = (idx >= 0) & (idx < E)
        if pid < E:
            hit = (valid & (idx == pid)).to(tl.int32)
            flat = tl.reshape(hit, [BT * KP])
            earlier = tl.reshape(tl.cumsum(flat, axis=0) - flat, [BT, KP])
            tl.store(positions + entry, running + earlier, mask=hit != 0)
            running += tl.sum(flat, axis=0)
        else:
            d = pid - E
            goes = tl.max((valid & (idx // L == d)).to(tl.int32), axis=1)
            earlier_tokens = tl.cumsum(goes, axis=0) - goes
            tl.store(slots + t * WORLD + d, tl.where(goes != 0, running + earlier_tokens, -1), mask=t < tokens)
            running += tl.sum(goes, axis=0)
    tl.store(counts + pid, running)
