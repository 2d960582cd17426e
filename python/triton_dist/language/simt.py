"""Per-thread operations (``dl.simt``): every thread of the program runs its own, with its own operands.

Triton treats a scalar as one value for the whole program: a scalar ``tl.atomic_*`` or
``dl.atomic_*`` runs in one thread and its result is broadcast. Some protocols need each thread to
act on its own: a barrier among ranks in which thread ``i`` signals rank ``i`` and waits for rank
``i``'s signal, or flags that each lane of a warp owns. These functions are inline PTX executed by
every thread, so their operands may differ per thread (build them from :func:`dl.tid`, or pass
the results of other ``simt`` calls), and each takes a predicate ``pred`` (per thread as well)
instead of an ``if``, whose condition Triton would take as uniform.

The rule of this region: values that differ per thread (``dl.tid``, what these functions return)
go only into ``simt`` functions, ``dl.ld``/``dl.st``, ``dl.symm_at`` and arithmetic; never into
``tl.load``/``tl.store`` of scalars, Triton's atomics, or control flow. ``dl.barrier()`` closes the
region when other threads must see what each did.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language import core

from . import signals as _signals
from .memory import SCOPES, _choice, _element_bits, address, tid

_CONSTRAINT = {32: "r", 64: "l"}
_ATOMIC_SEMANTICS = ("relaxed", "acquire", "release", "acq_rel")


def _pred(pred, _semantic):
    return _semantic.cast(_semantic.to_tensor(pred), tl.int32)


def _asm(body: str, constraints: str, args, dtype, _semantic):
    return core.inline_asm_elementwise("{ .reg .pred %p; setp.ne.s32 %p, $1, 0; " + body + " }", constraints, args,
                                       dtype=dtype, is_pure=False, pack=1, _semantic=_semantic)


@core.builtin
def ld(ptr, scope="gpu", semantic="acquire", pred=1, _semantic=None):
    """This thread's ``ld.<semantic>.<scope>`` of ``*ptr`` where ``pred`` holds (0 elsewhere)."""
    scope = _choice("scope", scope, SCOPES)
    semantic = _choice("semantic", semantic, ("relaxed", "acquire", "volatile"))
    ptr = _semantic.to_tensor(ptr)
    bits = _element_bits(ptr)
    qualifier = "volatile" if semantic == "volatile" else f"{semantic}.{scope}"
    return _asm(f"mov.b{bits} $0, 0; @%p ld.{qualifier}.global.b{bits} $0, [$2];", f"={_CONSTRAINT[bits]},r,l",
                [_pred(pred, _semantic), address(ptr, _semantic)], ptr.dtype.element_ty, _semantic)


@core.builtin
def st(ptr, value, scope="gpu", semantic="release", pred=1, _semantic=None):
    """This thread's ``st.<semantic>.<scope>`` of ``value`` to ``*ptr`` where ``pred`` holds. A release
    orders only this thread's earlier writes (``dl.barrier()`` first to cover the program's)."""
    scope = _choice("scope", scope, SCOPES)
    semantic = _choice("semantic", semantic, ("relaxed", "release", "volatile"))
    ptr = _semantic.to_tensor(ptr)
    bits = _element_bits(ptr)
    value = _semantic.cast(_semantic.to_tensor(value), ptr.dtype.element_ty)
    qualifier = "volatile" if semantic == "volatile" else f"{semantic}.{scope}"
    return _asm(f"mov.u32 $0, 0; @%p st.{qualifier}.global.b{bits} [$2], $3;", f"=r,r,l,{_CONSTRAINT[bits]}",
                [_pred(pred, _semantic), address(ptr, _semantic), value], tl.int32, _semantic)


def _integer_pointer(op: str, ptr, _semantic):
    ptr = _semantic.to_tensor(ptr)
    element = ptr.dtype.element_ty if ptr.dtype.is_ptr() else ptr.dtype
    if not element.is_int():
        raise TypeError(f"dl.simt.{op}: takes pointers to 32- or 64-bit integers (the PTX atomics used are "
                        f"integer ones), got a pointer to {element}")
    return ptr


def _atomic(op: str, doc: str):

    def call(ptr, value, scope="gpu", semantic="acq_rel", pred=1, _semantic=None):
        scope = _choice("scope", scope, SCOPES)
        semantic = _choice("semantic", semantic, _ATOMIC_SEMANTICS)
        ptr = _integer_pointer(f"atomic_{op}", ptr, _semantic)
        bits = _element_bits(ptr)
        kind = f"u{bits}" if op == "add" else f"b{bits}"
        value = _semantic.cast(_semantic.to_tensor(value), ptr.dtype.element_ty)
        c = _CONSTRAINT[bits]
        return _asm(f"mov.b{bits} $0, 0; @%p atom.{semantic}.{scope}.global.{op}.{kind} $0, [$2], $3;",
                    f"={c},r,l,{c}", [_pred(pred, _semantic), address(ptr, _semantic), value], ptr.dtype.element_ty,
                    _semantic)

    call.__name__ = call.__qualname__ = f"atomic_{op}"
    call.__doc__ = f"This thread's ``atom.<semantic>.<scope>.{op}`` on ``*ptr`` where ``pred`` holds: {doc}"
    return core.builtin(call)


atomic_add = _atomic("add", "returns the old value (0 where ``pred`` is false).")
atomic_xchg = _atomic("exch", "stores ``value``, returns the old value (0 where ``pred`` is false).")


@core.builtin
def atomic_cas(ptr, compare, value, scope="gpu", semantic="acq_rel", pred=1, _semantic=None):
    """This thread's compare-and-swap on ``*ptr`` where ``pred`` holds; returns the old value."""
    scope = _choice("scope", scope, SCOPES)
    semantic = _choice("semantic", semantic, _ATOMIC_SEMANTICS)
    ptr = _integer_pointer("atomic_cas", ptr, _semantic)
    bits = _element_bits(ptr)
    element = ptr.dtype.element_ty
    compare, value = (_semantic.cast(_semantic.to_tensor(v), element) for v in (compare, value))
    c = _CONSTRAINT[bits]
    return _asm(f"mov.b{bits} $0, 0; @%p atom.{semantic}.{scope}.global.cas.b{bits} $0, [$2], $3, $4;",
                f"={c},r,l,{c},{c}", [_pred(pred, _semantic), address(ptr, _semantic), compare, value], element,
                _semantic)


@core.builtin
def _trap_if_fewer_threads_than(count, _semantic=None):
    count = _semantic.cast(_semantic.to_tensor(count), tl.int32)
    return core.inline_asm_elementwise(
        "{ .reg .u32 %n; .reg .pred %p; mov.u32 %n, %ntid.x; setp.lt.u32 %p, %n, $1; mov.u32 $0, 0; @%p trap; }",
        "=r,r", [count], dtype=tl.int32, is_pure=False, pack=1, _semantic=_semantic)


@triton.jit
def wait(ptr, wait_value, pred=1, scope: tl.constexpr = tl.constexpr("sys"),
         cmp: tl.constexpr = tl.constexpr("ge"), timeout_ns: tl.constexpr = None):
    """This thread spins (acquire at ``scope``) until its own signal ``*ptr`` compares true with
    ``wait_value`` (``>=`` or ``==``, 32- or 64-bit, as :func:`dl.wait`), where ``pred`` holds;
    bounded by the wait timeout like every wait, with the same report and trap."""
    TIMEOUT_NS, DEBUG_BARRIERS = _signals._settings(timeout_ns)
    failed, observed, waited = _signals._spin(ptr, 1, wait_value, TIMEOUT_NS, pred, scope, "acquire", False, cmp)
    if TIMEOUT_NS != 0:
        if failed != 0:
            _signals._timed_out(0, ptr, wait_value, observed, waited, _signals._comparison_code(cmp))
    return failed


@triton.jit
def barrier_all_ranks(signals, epoch, scope: tl.constexpr = tl.constexpr("sys")):
    """A barrier of every rank, one CTA per rank, in which thread ``i`` signals rank ``i`` and waits for
    rank ``i``'s signal (as many threads as ranks are needed: ``num_warps * 32 >= world``; a program with fewer traps
    rather than skip ranks).
    ``signals``: a symmetric uint64 array of ``world`` slots, slot ``r`` written by rank ``r`` with
    ``epoch`` (monotonic: one epoch per use). Every thread's earlier writes (a CTA barrier first) are
    released to the peers before its signal; each thread acquires its peer's."""
    me = _signals.rank()
    world = _signals.num_ranks()
    _trap_if_fewer_threads_than(world)
    peer = tid(0)
    active = peer < world
    tl.debug_barrier()
    # Threads past the world point at this rank, not at a PE that does not exist: the address is
    # formed (nvshmem_ptr reads a table by PE) even where the store is predicated off.
    st(_signals.symm_at(signals + me, tl.where(active, peer, me)), epoch.to(tl.uint64), scope, "release", active)
    wait(signals + peer, epoch.to(tl.uint64), active, scope)
    tl.debug_barrier()
