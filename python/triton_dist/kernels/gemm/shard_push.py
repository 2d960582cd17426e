"""AllGather+GEMM's push of this rank's shard into slot ``me`` of every rank's ``gathered``, each
peer's slot after that peer's ack: the body of the ``"sm_push"`` kernels
(:mod:`~triton_dist.kernels.gemm.ag_gemm`) and the prologue of ``"sm_push_inline"``'s one
launch, where the GEMM's running programs push every share before their tiles
(:func:`~triton_dist.kernels.gemm.dense.gemm_kernel`'s ``PUSH_SHARD``).
"""

import triton
import triton.language as tl

from ... import language as dl
from ..common.claims import claim, end_claims
from ..common.tickets import last_to_finish
from ..common.tiles import copy_share_tiles

PUSH_BLOCK = 4096
"""Elements per tile of a push (8 KiB of bf16: 16 bytes a thread, twice, at 8 warps)."""

_BLOCK = tl.constexpr(PUSH_BLOCK)


@triton.jit
def push_rows(src, gathered, signals, tickets, k, n, share, WORLD: tl.constexpr, BLOCK: tl.constexpr,
              OWN_READY: tl.constexpr = True):
    """Share ``share`` of the push for call ``k`` (of the grid's ``num_programs`` shares): share 0
    sets ``ack[me] = k - 1`` on every peer (and, with ``OWN_READY``, ``ready[me] = k`` here: the
    push kernels, whose GEMM is a later kernel on the stream, so every program's own-slot copy has
    ended when it reads them); then for each peer ``r`` it waits for ``ack[r] >= k - 1`` and stores
    its share of the ``n`` elements at ``src`` into slot ``me`` of ``r``'s ``gathered``, and the
    last share to finish sets ``ready[me] = k`` on ``r``."""
    me = dl.rank()
    grid = tl.num_programs(0)
    if share == 0:
        if OWN_READY:
            dl.notify(signals + me, me, k, "set", "gpu")
        for i in tl.static_range(1, WORLD):
            dl.notify(signals + WORLD + me, (me + i) % WORLD, k - 1, "set", "intra_node")
    slot = me.to(tl.int64) * ((n // 8) * 8)
    tiles = tl.cdiv(n, BLOCK)
    for i in tl.static_range(1, WORLD):
        # Rank r's GEMM needs my rows (me - r) % world blocks in: ranks me - 1, me - 2, ... first.
        r = (me - i + WORLD) % WORLD
        token = dl.wait(signals + WORLD + r, 1, "sys", "acquire", k - 1)  # r no longer reads slot me
        dst = dl.consume_token(tl.multiple_of(dl.symm_at(gathered, r), 16), token) + slot  # symm_at loses alignment
        copy_share_tiles(dst, src, n, tiles, share, BLOCK)
        if last_to_finish(tickets, r, grid, "sys"):
            dl.notify(signals + me, r, k, "set", "intra_node")


@triton.jit
def push_shard_first(shard, gathered, signals, tickets, k, n, WORLD: tl.constexpr):
    """The one-launch ``"sm_push_inline"`` GEMM's prologue, before any program's first tile: the
    running programs claim the grid's shares (:mod:`~triton_dist.kernels.common.claims`, counter
    ``tickets[WORLD * WORLD]``) until none is left; a share is its part of this rank's ``n``
    elements at ``shard`` copied into slot ``me`` of the local ``gathered`` (the last share to
    finish sets ``ready[me] = k`` here: ticket ``me``, which the peers' pushes leave unused), then
    :func:`push_rows` without its early ``ready[me]``. No wait of a running program needs a program
    that has not started: the GEMM's own programs read slot ``me`` once ``ready[me]`` is set, and
    the running ones did every share; the acks, which the peers' pushes wait for, are sent with
    share 0, which the first program to run claims."""
    me = dl.rank()
    grid = tl.num_programs(0)
    counter = tickets + WORLD * WORLD
    share = claim(counter)
    while share < grid:
        copy_share_tiles(gathered + me.to(tl.int64) * ((n // 8) * 8), shard, n, tl.cdiv(n, _BLOCK), share, _BLOCK)
        if last_to_finish(tickets, me, grid):
            dl.notify(signals + me, me, k, "set", "gpu")
        push_rows(shard, gathered, signals, tickets, k, n, share, WORLD, _BLOCK, False)
        share = claim(counter)
    end_claims(counter, share, grid)
