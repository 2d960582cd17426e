"""The LL (low-latency) protocol's device side, shared by the LL AllGather
(:func:`~triton_dist.kernels.collectives.allgather_kernels.all_gather_ll_kernel`) and the LL AllReduce and
ReduceScatter (:func:`~triton_dist.kernels.collectives.allreduce_kernels.ll_reduce_kernel`): every 8-byte word sent to
a peer carries 4 bytes of payload (low half) and a 4-byte flag derived from the call's epoch (high
half), written with one 64-bit store, which is single-copy atomic, so a receiver that sees the flag
sees the payload: no signal and no fence. Receivers spin with ``ld.relaxed.sys`` on every word of a
tile until every flag is this call's. Buffers start zeroed and flags are never 0, so a stale word
never matches; a buffer alternates halves by epoch parity, and the flags of epochs ``e`` and
``e - 2`` differ. A word carries one 4-byte element or two 2-byte ones (``ELEMS``: 1 or 2)."""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language import core

from ... import language as dl
from ...language.signals import _timed_out
from .call_counter import enter_call


@core.builtin
def globaltimer(_semantic=None):
    """The GPU's nanosecond clock (``%globaltimer``), for the receive's timeout."""
    return core.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.uint64, is_pure=False,
                                       pack=1, _semantic=_semantic)



LL_BLOCK = 512
"""8-byte LL words per tile (one program handles a tile at a time), in every LL kernel."""

@triton.jit
def ll_words(x, w, n, ELEMS: tl.constexpr):
    """The 32-bit payloads of LL words ``w`` (zero-extended to int64; 0 past the data)."""
    if ELEMS == 1:
        v = tl.load(x.to(tl.pointer_type(tl.int32)) + w, mask=w < n, other=0)
        return v.to(tl.uint32, bitcast=True).to(tl.int64)
    else:
        e = w[:, None] * 2 + tl.arange(0, 2)[None, :]
        v = tl.load(x.to(tl.pointer_type(tl.int16)) + e, mask=e < n, other=0)
        lo, hi = tl.split(v)
        return lo.to(tl.uint16, bitcast=True).to(tl.int64) | (hi.to(tl.uint16, bitcast=True).to(tl.int64) << 16)


@triton.jit
def ll_store(out, w, n, payload, ELEMS: tl.constexpr):
    """Store the payloads (int64, low 32 bits used) of words ``w`` as elements of ``out``."""
    if ELEMS == 1:
        tl.store(out.to(tl.pointer_type(tl.int32)) + w, payload.to(tl.int32), mask=w < n)
    else:
        e = w[:, None] * 2 + tl.arange(0, 2)[None, :]
        lo = payload.to(tl.int16)
        hi = (payload >> 16).to(tl.int16)
        tl.store(out.to(tl.pointer_type(tl.int16)) + e, tl.join(lo, hi), mask=e < n)


@triton.jit
def ll_own_copy(x, out, w, n, ELEMS: tl.constexpr):
    """This rank's own words ``w`` of ``x`` straight into ``out`` (no flag: nothing travels)."""
    if ELEMS == 1:
        tl.store(out.to(tl.pointer_type(tl.int32)) + w,
                 tl.load(x.to(tl.pointer_type(tl.int32)) + w, mask=w < n), mask=w < n)
    else:
        e = w[:, None] * 2 + tl.arange(0, 2)[None, :]
        tl.store(out.to(tl.pointer_type(tl.int16)) + e, tl.load(x.to(tl.pointer_type(tl.int16)) + e, mask=e < n),
                 mask=e < n)


@triton.jit
def ll_flag(epoch):
    """This call's LL flag: never 0 (LL buffers start zeroed), and different for epochs ``e`` and
    ``e - 2`` (the previous user of the half). Returns ``(flag, flag << 32)``."""
    flag = (epoch % 0xFFFFFFFF) + 1
    return flag, flag << 32


@triton.jit
def ll_call(calls, words, WORLD: tl.constexpr, ll_slot, BLOCK_W: tl.constexpr):
    """What every LL kernel derives first from its call: ``(flag, flag << 32)`` of this epoch
    (:func:`ll_flag`; ``calls``: the context's two-element call counter, which the kernel advances
    through :func:`~triton_dist.kernels.common.call_counter.enter_call`: a kernel that uses this
    must be its call's only one, launched with no bump before it), the offset of this call's half of a
    ``2 * WORLD * ll_slot``-word buffer, the tiles of ``BLOCK_W`` words that ``words`` take, and the
    lanes of one tile."""
    epoch = enter_call(calls)
    flag, high = ll_flag(epoch)
    half = (epoch % 2).to(tl.int64) * (WORLD * ll_slot)
    return flag, high, half, tl.cdiv(words, BLOCK_W), tl.arange(0, BLOCK_W)


@triton.jit
def ll_receive(ptrs, valid, flag, lanes, TIMEOUT_NS: tl.constexpr):
    """Spin on the LL words at ``ptrs`` until every valid one carries ``flag`` in its high half;
    returns the words. On timeout, reports (word index in the tile, its address, expected flag,
    observed flag) like a timed-out ``dl.wait`` and traps."""
    vals = dl.ld(ptrs, "sys", "relaxed")
    ok = (((vals >> 32) & 0xFFFFFFFF) == flag) | (valid == 0)
    pending = tl.sum((ok == 0).to(tl.int32), 0)
    if TIMEOUT_NS == 0:
        while pending > 0:
            vals = dl.ld(ptrs, "sys", "relaxed")
            ok = (((vals >> 32) & 0xFFFFFFFF) == flag) | (valid == 0)
            pending = tl.sum((ok == 0).to(tl.int32), 0)
    else:
        start = globaltimer()
        waited = start - start
        while (pending > 0) & (waited < TIMEOUT_NS):
            vals = dl.ld(ptrs, "sys", "relaxed")
            ok = (((vals >> 32) & 0xFFFFFFFF) == flag) | (valid == 0)
            pending = tl.sum((ok == 0).to(tl.int32), 0)
            waited = globaltimer() - start
        if pending > 0:
            first = tl.min(tl.where(ok, lanes.shape[0], lanes), 0)
            observed = tl.sum(tl.where(lanes == first, (vals >> 32) & 0xFFFFFFFF, 0), 0)
            bad = tl.sum(tl.where(lanes == first, ptrs.to(tl.int64), 0), 0)
            _timed_out(first, bad.to(tl.pointer_type(tl.int64)), flag, observed, waited)
    return vals


@triton.jit
def ll_values(vals, out, ELEMS: tl.constexpr):
    """The elements carried by LL words ``vals`` (int64, payload in the low 32 bits), as fp32:
    shape ``[BLOCK_W]`` for 4-byte elements (``ELEMS == 1``), ``[BLOCK_W, 2]`` for 2-byte ones
    (element ``2w`` in column 0, ``2w + 1`` in column 1, as :func:`ll_words` packs them)."""
    if ELEMS == 1:
        return vals.to(tl.int32).to(tl.float32, bitcast=True)  # truncation drops the flag
    else:
        lo = vals.to(tl.int16).to(out.dtype.element_ty, bitcast=True).to(tl.float32)
        hi = (vals >> 16).to(tl.int16).to(out.dtype.element_ty, bitcast=True).to(tl.float32)
        return tl.join(lo, hi)


@triton.jit
def ll_store_values(out, w, n, acc, ELEMS: tl.constexpr):
    """Round ``acc`` (the fp32 sums of words ``w``, shaped as :func:`ll_values` returns) once to
    the output dtype and store the elements below ``n``."""
    if ELEMS == 1:
        tl.store(out + w, acc.to(out.dtype.element_ty), mask=w < n)
    else:
        e = w[:, None] * 2 + tl.arange(0, 2)[None, :]
        tl.store(out + e, acc.to(out.dtype.element_ty), mask=e < n)
