"""The tile-centric signalling model of Triton-distributed: rank queries, ``symm_at``, ``wait``,
``notify`` and ``consume_token``. Kernels using them are decorated with ``triton_dist.jit``.

A producer finishes a tile's stores, then ``notify`` publishes with release semantics at the scope
the consumer lives in; a consumer ``wait``s with acquire semantics and passes the returned token
through ``consume_token`` to the pointers it loads from, which makes those loads depend on the wait,
so the compiler cannot hoist them above it.
"""

from __future__ import annotations

import triton.language as tl
from triton.language import core

from . import shmem
from .memory import SCOPES, _choice, _qualifier, address

_COMM_SCOPES = ("gpu", "intra_node")
_SIG_OPS = ("set", "add")


@core.builtin
def rank(_semantic=None):
    """This rank (NVSHMEM PE) number."""
    return shmem.my_pe(_semantic=_semantic)


@core.builtin
def num_ranks(_semantic=None):
    """Number of ranks."""
    return shmem.n_pes(_semantic=_semantic)


@core.builtin
def symm_at(ptr, pe, _semantic=None):
    """``ptr`` (a pointer into a symmetric tensor) as rank ``pe`` holds it, for loads and stores.
    Only ranks on this node can be reached this way."""
    return shmem.ptr(ptr, pe, _semantic=_semantic)


@core.builtin
def wait(ptr, num_barriers, scope="gpu", semantic="acquire", wait_value=1, _semantic=None):
    """Spin until each of the ``num_barriers`` uint64 signals at ``ptr`` is ``>= wait_value``.

    Every thread of the program spins (so all of them acquire); returns a token for
    :func:`consume_token`. Not yet usable inside a software-pipelined loop (``num_stages > 1``):
    Triton's pipeliner refuses to predicate this side-effecting asm. ``scope`` is where the notifier lives: ``"gpu"`` for this GPU,
    ``"sys"`` for a peer.
    """
    scope, semantic = _choice("scope", scope, SCOPES), _choice("semantic", semantic, ("acquire", "volatile",
                                                                                     "relaxed"))
    ptr = _semantic.to_tensor(ptr)
    if ptr.type.is_block() or ptr.dtype.element_ty.primitive_bitwidth != 64:
        raise TypeError(f"wait expects a scalar pointer to 64-bit signals, got {ptr.type}")
    count = _semantic.cast(_semantic.to_tensor(num_barriers), tl.int32)
    value = _semantic.cast(_semantic.to_tensor(wait_value), tl.uint64)
    load = f"ld.{_qualifier(semantic, scope)}.global.u64"
    asm = f"""{{
    .reg .pred %p<2>; .reg .u64 %v; .reg .u64 %a; .reg .u32 %i;
    mov.u64 %a, $1; mov.u32 %i, 0;
    next_${{:uid}}:
    setp.ge.s32 %p0, %i, $2;
    @%p0 bra done_${{:uid}};
    spin_${{:uid}}:
    {load} %v, [%a];
    setp.lt.u64 %p1, %v, $3;
    @%p1 bra spin_${{:uid}};
    add.u64 %a, %a, 8; add.u32 %i, %i, 1;
    bra next_${{:uid}};
    done_${{:uid}}:
    mov.u32 $0, 0;
    }}"""
    return core.inline_asm_elementwise(asm, "=r,l,r,l", [address(ptr, _semantic), count, value], dtype=tl.int32,
                                       is_pure=False, pack=1, _semantic=_semantic)


@core.builtin
def notify(ptr, pe, signal=1, sig_op="set", comm_scope="intra_node", _semantic=None):
    """Publish ``signal`` to the uint64 signal at ``ptr`` on rank ``pe`` (SET or ADD), with release
    semantics after a CTA barrier, so every thread's earlier stores are visible first.

    ``comm_scope``: ``"gpu"`` (consumer on this GPU; ``pe`` must be this rank) or
    ``"intra_node"`` (a peer over NVLink). One thread performs the atomic.
    """
    sig_op = _choice("sig_op", sig_op, _SIG_OPS)
    comm_scope = _choice("comm_scope", comm_scope, _COMM_SCOPES)
    target = ptr if comm_scope == "gpu" else symm_at(ptr, pe, _semantic=_semantic)
    scope = "gpu" if comm_scope == "gpu" else "sys"
    value = _semantic.cast(_semantic.to_tensor(signal), tl.uint64)
    # Triton puts no CTA barrier before a release atomic: without this, other threads' stores
    # are not covered by the release.
    core.debug_barrier(_semantic=_semantic)
    atomic = core.atomic_xchg if sig_op == "set" else core.atomic_add
    return atomic(target, value, sem="release", scope=scope, _semantic=_semantic)


@core.builtin
def consume_token(value, token, _semantic=None):
    """``value`` unchanged, made to depend on ``token`` (from :func:`wait`): loads through the
    returned pointer(s) cannot be moved above the wait. ``value`` is a pointer, a tensor of
    pointers, or a 32/64-bit integer (tensor). Pointer alignment facts are lost: restore them with
    ``tl.multiple_of`` where vectorised loads matter."""
    value = _semantic.to_tensor(value)
    token = _semantic.cast(_semantic.to_tensor(token), tl.int32)
    is_ptr = value.dtype.is_ptr()
    carried = _semantic.cast(value, tl.int64) if is_ptr else value
    bits = carried.dtype.primitive_bitwidth
    if bits not in (32, 64):
        raise TypeError(f"consume_token supports pointers and 32/64-bit values, got {value.dtype}")
    c = "l" if bits == 64 else "r"
    out = core.inline_asm_elementwise(f"mov.b{bits} $0, $1;", f"={c},{c},r", [carried, token], dtype=carried.dtype,
                                      is_pure=True, pack=1, _semantic=_semantic)
    return _semantic.cast(out, value.dtype) if is_ptr else out
