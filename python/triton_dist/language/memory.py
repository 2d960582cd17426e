"""Memory-model primitives for Triton kernels: loads, stores and fences with an explicit scope and
semantic, and thread identity. Stock Triton exposes neither acquire loads nor release stores on
arbitrary pointers, so these are inline PTX.

Scopes: ``"cta"``, ``"gpu"``, ``"sys"`` (``sys`` is what peers across NVLink observe).
Every primitive here runs in every thread of the program; stores and fences are harmless
when repeated, so no thread election is needed.
"""

from __future__ import annotations

import triton.language as tl
from triton.language import core

SCOPES = ("cta", "gpu", "sys")
_LOAD_SEMANTICS = ("relaxed", "acquire", "volatile")
_STORE_SEMANTICS = ("relaxed", "release", "volatile")
_CONSTRAINT = {32: "r", 64: "l"}


def _choice(name: str, value, allowed) -> str:
    value = core._unwrap_if_constexpr(value)
    if value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
    return value


def address(ptr, _semantic):
    """A pointer (or tensor of pointers) as int64, for inline PTX."""
    ptr = _semantic.to_tensor(ptr)
    if not ptr.dtype.is_ptr():
        raise TypeError(f"expected a pointer, got {ptr.dtype}")
    return _semantic.cast(ptr, tl.int64)


def _element_bits(ptr) -> int:
    elem = ptr.dtype.element_ty
    bits = elem.primitive_bitwidth
    if bits not in _CONSTRAINT:
        raise TypeError(f"only 32- and 64-bit elements are supported, got {elem}")
    return bits


def _qualifier(semantic: str, scope: str) -> str:
    return "volatile" if semantic == "volatile" else f"{semantic}.{scope}"


@core.builtin
def ld(ptr, scope="gpu", semantic="acquire", _semantic=None):
    """Load ``*ptr`` with ``ld.<semantic>.<scope>``; semantic is relaxed, acquire or volatile."""
    scope, semantic = _choice("scope", scope, SCOPES), _choice("semantic", semantic, _LOAD_SEMANTICS)
    ptr = _semantic.to_tensor(ptr)
    bits = _element_bits(ptr)
    c = _CONSTRAINT[bits]
    return core.inline_asm_elementwise(f"ld.{_qualifier(semantic, scope)}.global.b{bits} $0, [$1];", f"={c},l",
                                       [address(ptr, _semantic)], dtype=ptr.dtype.element_ty, is_pure=False, pack=1,
                                       _semantic=_semantic)


@core.builtin
def st(ptr, value, scope="gpu", semantic="release", _semantic=None):
    """Store ``value`` to ``*ptr`` with ``st.<semantic>.<scope>``; returns a dummy int32.

    A release store orders only the calling thread's earlier writes: put ``tl.debug_barrier()``
    before it when other threads of the program wrote the data it publishes.
    """
    scope, semantic = _choice("scope", scope, SCOPES), _choice("semantic", semantic, _STORE_SEMANTICS)
    ptr = _semantic.to_tensor(ptr)
    bits = _element_bits(ptr)
    value = _semantic.cast(_semantic.to_tensor(value), ptr.dtype.element_ty)
    return core.inline_asm_elementwise(
        f"st.{_qualifier(semantic, scope)}.global.b{bits} [$1], $2; mov.u32 $0, 0;", f"=r,l,{_CONSTRAINT[bits]}",
        [address(ptr, _semantic), value], dtype=tl.int32, is_pure=False, pack=1, _semantic=_semantic)


@core.builtin
def fence(scope="gpu", _semantic=None):
    """``fence.acq_rel.<scope>``: orders this thread's memory accesses before and after it."""
    scope = _choice("scope", scope, SCOPES)
    return core.inline_asm_elementwise(f"fence.acq_rel.{scope}; mov.u32 $0, 0;", "=r", [], dtype=tl.int32,
                                       is_pure=False, pack=1, _semantic=_semantic)


@core.builtin
def wait_tma_stores(_semantic=None):
    """Wait until this thread's TMA (bulk asynchronous) stores have completed, then order them
    before its later generic-proxy accesses (``cp.async.bulk.wait_group 0`` and
    ``fence.proxy.async.global``). Triton issues a descriptor's ``store`` from one thread and waits
    only until the shared-memory source has been read; run this in every thread (threads with no
    store pending return at once) before a CTA barrier and a release, e.g. :func:`notify`, to
    publish the stored data to another GPU."""
    return core.inline_asm_elementwise("cp.async.bulk.wait_group 0; fence.proxy.async.global; mov.u32 $0, 0;", "=r",
                                       [], dtype=tl.int32, is_pure=False, pack=1, _semantic=_semantic)


@core.builtin
def tid(axis=0, _semantic=None):
    """This thread's index in the program (CTA) along ``axis`` (0, 1 or 2)."""
    axis = "xyz"[_choice("axis", axis, (0, 1, 2))]
    return core.inline_asm_elementwise(f"mov.u32 $0, %tid.{axis};", "=r", [], dtype=tl.int32, is_pure=True, pack=1,
                                       _semantic=_semantic)


@core.builtin
def laneid(_semantic=None):
    """This thread's lane in its warp (0..31)."""
    return core.inline_asm_elementwise("mov.u32 $0, %laneid;", "=r", [], dtype=tl.int32, is_pure=True, pack=1,
                                       _semantic=_semantic)


_ATOMIC_SEMANTICS = ("relaxed", "acquire", "release", "acq_rel")


def _atomic(name: str, triton_op):

    def call(ptr, *operands, scope="gpu", semantic="acq_rel", mask=None, _semantic=None):
        scope = _choice("scope", scope, SCOPES)
        semantic = _choice("semantic", semantic, _ATOMIC_SEMANTICS)
        return triton_op(ptr, *operands, mask=mask, sem=semantic, scope=scope, _semantic=_semantic) if mask is not None \
            else triton_op(ptr, *operands, sem=semantic, scope=scope, _semantic=_semantic)

    call.__name__ = call.__qualname__ = name
    call.__doc__ = (f"``tl.{triton_op.__name__}`` with the scope and semantic named like the rest of this module: "
                    "scope cta, gpu or sys; semantic relaxed, acquire, release or acq_rel. On a scalar pointer one "
                    "thread performs it; put :func:`barrier` before a release that publishes other threads' "
                    "stores.")
    return core.builtin(call)


atomic_add = _atomic("atomic_add", core.atomic_add)
atomic_xchg = _atomic("atomic_xchg", core.atomic_xchg)


@core.builtin
def atomic_cas(ptr, compare, value, scope="gpu", semantic="acq_rel", _semantic=None):
    """``tl.atomic_cas`` with an explicit scope (cta, gpu, sys) and semantic (relaxed, acquire,
    release, acq_rel); returns the old value. On a scalar pointer one thread performs it."""
    scope = _choice("scope", scope, SCOPES)
    semantic = _choice("semantic", semantic, _ATOMIC_SEMANTICS)
    ptr = _semantic.to_tensor(ptr)
    element = ptr.dtype.element_ty
    compare, value = (_semantic.cast(_semantic.to_tensor(v), element) for v in (compare, value))
    return core.atomic_cas(ptr, compare, value, sem=semantic, scope=scope, _semantic=_semantic)


@core.builtin
def barrier(_semantic=None):
    """CTA barrier (``bar.sync 0``): every thread of the program arrives before any goes on."""
    return core.debug_barrier(_semantic=_semantic)
