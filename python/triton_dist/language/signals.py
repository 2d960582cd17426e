"""The tile-centric signalling model of Triton-distributed: rank queries, ``symm_at``, ``wait``,
``notify`` and ``consume_token``. Kernels using them are decorated with ``triton_dist.jit``.

A producer finishes a tile's stores, then ``notify`` publishes with release semantics at the scope
the consumer lives in; a consumer ``wait``s with acquire semantics and passes the returned token
through ``consume_token`` to what it loads through (pointers, TMA coordinates or a descriptor),
which makes those loads depend on the wait, so the compiler cannot hoist them above it.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language import core

from .. import config as _config
from . import shmem
from . import support_library
from .memory import SCOPES, _choice, _qualifier, address, tid

_SIG_OPS = ("set", "add")
_WAIT_SEMANTICS = ("acquire", "volatile", "relaxed")


_AXES = (None, "world", "intra_node", "inter_node")


def _ranks_per_node(what, _semantic) -> int:
    shmem.require_distributed_jit(what, _semantic)
    local = support_library.local_world_size()
    if local <= 0:
        raise RuntimeError(f"{what}: the ranks per node are not known yet; compile after triton_dist.init(), or "
                           "declare them with TRITON_DIST_LOCAL_WORLD_SIZE")
    return local


@core.builtin
def rank(axis=None, _semantic=None):
    """This rank's number: in the world (``axis`` None or ``"world"``, the NVSHMEM PE), among the ranks
    of its node (``"intra_node"``) or the number of its node (``"inter_node"``). Nodes are the
    runtime's: contiguous blocks of ``local_world_size`` ranks, discovered from host names or
    declared (``TRITON_DIST_LOCAL_WORLD_SIZE``), which is part of the kernel's cache key."""
    axis = _choice("axis", core._unwrap_if_constexpr(axis), _AXES)
    me = shmem.my_pe(_semantic=_semantic)
    if axis in (None, "world"):
        return me
    local = _ranks_per_node(f"dl.rank({axis!r})", _semantic)
    return _semantic.mod(me, local) if axis == "intra_node" else _semantic.floordiv(me, local)


@core.builtin
def num_ranks(axis=None, _semantic=None):
    """Number of ranks: in the world (``axis`` None or ``"world"``), on one node (``"intra_node"``),
    or the number of nodes (``"inter_node"``); see :func:`rank`."""
    axis = _choice("axis", core._unwrap_if_constexpr(axis), _AXES)
    world = shmem.n_pes(_semantic=_semantic)
    if axis in (None, "world"):
        return world
    local = _ranks_per_node(f"dl.num_ranks({axis!r})", _semantic)
    if axis == "intra_node":
        return _semantic.to_tensor(local)
    return _semantic.floordiv(world, local)


@core.builtin
def symm_at(ptr, pe, _semantic=None):
    """``ptr`` (a pointer into a symmetric tensor) as rank ``pe`` holds it, for loads and stores.
    Only ranks on this node can be reached this way."""
    return shmem.ptr(ptr, pe, _semantic=_semantic)


_COMPARISONS = {"ge": 0, "eq": 1}
"""``dl.wait``'s ``cmp`` -> the code the timeout report carries (WaitTimeoutRecord::comparison)."""


def _signal_kind(ptr, _semantic):
    """``(bits, signed)`` of the signals ``ptr`` points to: 32 or 64-bit integers."""
    if ptr.type.is_block() or not ptr.dtype.is_ptr():
        raise TypeError(f"wait expects a scalar pointer to 32- or 64-bit integer signals, got {ptr.type}")
    element = ptr.dtype.element_ty
    if not element.is_int() or element.primitive_bitwidth not in (32, 64):
        raise TypeError(f"wait expects a scalar pointer to 32- or 64-bit integer signals, got {ptr.type}")
    return element.primitive_bitwidth, element.is_int_signed()


@core.builtin
def _spin(ptr, num_barriers, wait_value, timeout_ns, pred, scope, semantic, pure, cmp, _semantic=None):
    """The spin loop of :func:`wait` in every thread: returns ``(failed, observed, waited_ns)``;
    ``failed`` is 0, or 1 + the index of the signal that did not arrive within ``timeout_ns``.
    ``observed`` is the last value read, widened to 64 bits."""
    scope = _choice("scope", scope, SCOPES)
    semantic = _choice("semantic", semantic, _WAIT_SEMANTICS)
    cmp = _choice("cmp", cmp, tuple(_COMPARISONS))
    ptr = _semantic.to_tensor(ptr)
    bits, signed = _signal_kind(ptr, _semantic)
    count = _semantic.cast(_semantic.to_tensor(num_barriers), tl.int32)
    value = _semantic.cast(_semantic.to_tensor(wait_value), tl.uint64)
    timeout = _semantic.cast(_semantic.to_tensor(timeout_ns), tl.uint64)
    enabled = _semantic.cast(_semantic.to_tensor(pred), tl.int32)
    width = "u64" if bits == 64 else "u32"
    load = f"ld.{_qualifier(semantic, scope)}.global.{width}"
    # ">=" compares as the signal's signedness; "==" bit for bit. 32-bit signals compare their low
    # half of the (widened) expected value.
    test = f"setp.{cmp}.{('s' if signed else 'u') if cmp == 'ge' else 'b'}{bits}"
    if bits == 64:
        declare, read, compare, widen = ".reg .u64 %v;", "%v", "%v, $5", "mov.u64 $1, %v;"
    else:
        declare = ".reg .u32 %v, %e;"
        read, compare = "%v", "%v, %e"
        widen = f"cvt.{'s' if signed else 'u'}64.{'s' if signed else 'u'}32 $1, %v;"
    step = bits // 8
    setup = "" if bits == 64 else "cvt.u32.u64 %e, $5;"
    # The clock is read only once a load has failed, so a signal that is already there costs one
    # load. %globaltimer is in nanoseconds on every GPU since Volta.
    asm = f"""{{
    .reg .pred %p<4>; {declare} .reg .u64 %a, %t0, %t; .reg .u32 %i;
    mov.u32 $0, 0; mov.u64 $1, 0; mov.u64 $2, 0;
    mov.u64 %a, $3; mov.u32 %i, 0; {setup}
    setp.eq.s32 %p3, $7, 0;
    @%p3 bra done_${{:uid}};
    next_${{:uid}}:
    setp.ge.s32 %p0, %i, $4;
    @%p0 bra done_${{:uid}};
    {load} {read}, [%a];
    {test} %p1, {compare};
    @%p1 bra arrived_${{:uid}};
    mov.u64 %t0, %globaltimer;
    spin_${{:uid}}:
    {load} {read}, [%a];
    {test} %p1, {compare};
    @%p1 bra arrived_${{:uid}};
    mov.u64 %t, %globaltimer;
    sub.u64 %t, %t, %t0;
    setp.eq.u64 %p2, $6, 0;
    @%p2 bra spin_${{:uid}};
    setp.lt.u64 %p2, %t, $6;
    @%p2 bra spin_${{:uid}};
    add.u32 $0, %i, 1; {widen} mov.u64 $2, %t;
    bra done_${{:uid}};
    arrived_${{:uid}}:
    add.u64 %a, %a, {step}; add.u32 %i, %i, 1;
    bra next_${{:uid}};
    done_${{:uid}}:
    }}"""
    return core.inline_asm_elementwise(asm, "=r,=l,=l,l,r,l,l,r", [address(ptr, _semantic), count, value, timeout,
                                                                   enabled], dtype=(tl.int32, tl.uint64, tl.uint64),
                                       is_pure=core._unwrap_if_constexpr(pure), pack=1, _semantic=_semantic)


@core.builtin
def _comparison_code(cmp, _semantic=None):
    return core.constexpr(_COMPARISONS[_choice("cmp", cmp, tuple(_COMPARISONS))])


@core.builtin
def _settings(timeout_ns, _semantic=None):
    """``(timeout_ns, debug_barriers)`` for a wait: the call's timeout, else the configured one."""
    shmem.require_distributed_jit("dl.wait", _semantic)
    cfg = _config.get()
    timeout_ns = core._unwrap_if_constexpr(timeout_ns)
    return core.constexpr(cfg.wait_timeout_ns if timeout_ns is None else timeout_ns), core.constexpr(
        cfg.debug_barriers)


@core.builtin
def _timed_out(index, ptr, expected, observed, waited_ns, cmp_code=0, _semantic=None):
    args = [shmem.my_pe(_semantic=_semantic), index, address(ptr, _semantic), expected, observed, waited_ns, cmp_code]
    types = (tl.int32, tl.int32, tl.int64, tl.uint64, tl.uint64, tl.uint64, tl.int32)
    args = [_semantic.cast(_semantic.to_tensor(a), t) for a, t in zip(args, types)]
    return core.extern_elementwise(support_library.NAME, "", args,
                                   {types: (support_library.WAIT_TIMED_OUT, tl.int32)}, is_pure=False,
                                   _semantic=_semantic)


@core.builtin
def _barrier_and_fence(_semantic=None):
    core.debug_barrier(_semantic=_semantic)
    return core.inline_asm_elementwise("fence.sc.sys; mov.u32 $0, 0;", "=r", [], dtype=tl.int32, is_pure=False,
                                       pack=1, _semantic=_semantic)


@triton.jit
def wait(ptr, num_barriers, scope: tl.constexpr = tl.constexpr("gpu"), semantic: tl.constexpr = tl.constexpr("acquire"),
         wait_value=1, pred=None, timeout_ns: tl.constexpr = None, cmp: tl.constexpr = tl.constexpr("ge")):
    """Spin until each of the ``num_barriers`` signals at ``ptr`` is ``>= wait_value`` (``cmp="ge"``,
    the epoch convention) or ``== wait_value`` (``cmp="eq"``, for flags that take several states);
    returns a token for :func:`consume_token`.

    Signals are 64-bit (the signal pads') or 32-bit integers (int32 flags), as ``ptr``'s element
    type says: the spin loads that width, ``>=`` compares as the type's signedness, ``==`` bit for
    bit (a 32-bit signal against the low half of ``wait_value``).

    Every thread of the program spins, so every thread acquires. ``scope`` is where the notifier
    lives: ``"gpu"`` for this GPU, ``"sys"`` for a peer. With ``cmp="eq"`` on a flag that moves on
    to further states, put a CTA barrier (``tl.debug_barrier()``) between the wait and whatever lets
    a peer move the flag on: a thread that has not yet seen the state would otherwise miss it and
    spin until the timeout.

    ``pred``: for waits in a software-pipelined loop (``tl.range(..., num_stages > 1)``). Without
    it the wait is ordered with every memory operation around it, which Triton's pipeliner cannot
    schedule ahead. With it, the wait is ordered only through its token — loads that must follow
    it have to go through :func:`consume_token`, and a wait whose token is unused is removed — so
    the pipeliner may issue it stages ahead, also for iterations past the loop's end: pass the
    iteration's in-range condition (e.g. ``k < num_k``), and the wait spins only where it holds.

    ``timeout_ns`` (a constant): give up after this long, report rank, signal index, expected and
    observed values (the runtime prints the report to stderr; the device path makes no function
    call, which would serialise a kernel's wgmma) and trap (the host then sees a CUDA error). A
    kernel whose module was loaded before ``triton_dist.init()`` has no report address and traps
    without a message. Defaults to the configured
    ``wait_timeout_ns`` (TRITON_DIST_WAIT_TIMEOUT_NS); 0 waits forever. With
    ``debug_barriers`` configured, the wait is fenced by CTA barriers and system fences.
    """
    TIMEOUT_NS, DEBUG_BARRIERS = _settings(timeout_ns)
    if DEBUG_BARRIERS:
        _barrier_and_fence()
    if pred is None:
        failed, observed, waited = _spin(ptr, num_barriers, wait_value, TIMEOUT_NS, 1, scope, semantic, False, cmp)
    else:
        failed, observed, waited = _spin(ptr, num_barriers, wait_value, TIMEOUT_NS, pred, scope, semantic, True, cmp)
    if TIMEOUT_NS != 0:
        if failed != 0:
            _timed_out(failed - 1, ptr + failed - 1, wait_value, observed, waited, _comparison_code(cmp))
    if DEBUG_BARRIERS:
        _barrier_and_fence()
    return _as_token(failed)


@core.builtin
def _signal_op_code(sig_op, _semantic=None):
    return core.constexpr(shmem.SIGNAL_SET if _choice("sig_op", sig_op, _SIG_OPS) == "set" else shmem.SIGNAL_ADD)


@core.builtin
def _release_signal(ptr, pe, signal, sig_op, comm_scope, _semantic=None):
    """One thread's release atomic on the signal, here (``gpu``) or on a peer over NVLink."""
    sig_op = _choice("sig_op", sig_op, _SIG_OPS)
    target = ptr if comm_scope == "gpu" else symm_at(ptr, pe, _semantic=_semantic)
    value = _semantic.cast(_semantic.to_tensor(signal), tl.uint64)
    atomic = core.atomic_xchg if sig_op == "set" else core.atomic_add
    return atomic(target, value, sem="release", scope="gpu" if comm_scope == "gpu" else "sys", _semantic=_semantic)


@core.builtin
def _check_comm_scope(comm_scope, _semantic=None):
    return core.constexpr(_choice("comm_scope", comm_scope, ("gpu", "intra_node", "inter_node")))


@triton.jit
def notify(ptr, pe, signal=1, sig_op: tl.constexpr = tl.constexpr("set"),
           comm_scope: tl.constexpr = tl.constexpr("intra_node")):
    """Publish ``signal`` to the uint64 signal at ``ptr`` on rank ``pe`` (``sig_op`` ``"set"`` or
    ``"add"``), after every thread of the program has finished its earlier stores.

    ``comm_scope``: ``"gpu"`` (the consumer is on this GPU; ``pe`` must be this rank),
    ``"intra_node"`` (a peer over NVLink: a release atomic at system scope), ``"inter_node"``
    (any rank, through NVSHMEM: ``nvshmem_fence`` then ``nvshmemx_signal_op``, which orders the
    signal after this thread's earlier NVSHMEM puts to ``pe``). Called by every thread of the
    program; one thread performs the update.
    """
    COMM_SCOPE: tl.constexpr = _check_comm_scope(comm_scope)
    # A CTA barrier first: Triton puts none before a release atomic, so without it other threads'
    # stores would not be covered by the release.
    tl.debug_barrier()
    if COMM_SCOPE == "inter_node":
        if tid(0) == 0:
            shmem.fence()
            shmem.signal_op(ptr, signal, _signal_op_code(sig_op), pe)
    else:
        _release_signal(ptr, pe, signal, sig_op, COMM_SCOPE)


# A token is an opaque 0 computed from the wait's status: nothing can fold it away, so whatever it
# is added to depends on the wait, and being 0 even after a timed-out wait, it never sends a load
# astray before the timeout report traps. It carries a "multiple of 4096" hint, so adding it to
# a pointer or offset keeps that value's alignment and contiguity facts: vectorised loads,
# cp.async and TMA stay possible after consume_token.
_TOKEN_DIVISIBILITY = 4096


@core.builtin
def _as_token(status, _semantic=None):
    token = core.inline_asm_elementwise("mov.u32 $0, 0;", "=r,r", [status], dtype=tl.int32, is_pure=True, pack=1,
                                        _semantic=_semantic)
    return _semantic.multiple_of(token, [_TOKEN_DIVISIBILITY])


@core.builtin
def consume_token(value, token, _semantic=None):
    """``value`` unchanged, made to depend on ``token`` (from :func:`wait`): loads through the
    result cannot be moved above the wait.

    ``value`` is a pointer, a tensor of pointers, an integer (tensor) such as an offset or a TMA
    coordinate, or a tensor descriptor. For a descriptor, the result's ``load``/``gather`` carry
    the token in their first coordinate, with an async-proxy fence. The binding survives ``if``
    and loop bodies; a descriptor bound on one path of a block and plain on another is a compile
    error (bind it before the block with a zero token, ``tl.zeros((), tl.int32)``, and rebind it
    after the wait). Alignment and contiguity facts of ``value`` are kept.
    """
    if isinstance(value, _TokenBoundDescriptor):  # rebinding: both tokens order the loads
        return _TokenBoundDescriptor(value, _semantic.add(_semantic.to_tensor(value.token),
                                                          _semantic.to_tensor(token), True))
    if isinstance(value, core.tensor_descriptor):
        return _TokenBoundDescriptor(value, _semantic.to_tensor(token))
    value = _semantic.to_tensor(value)
    token = _semantic.to_tensor(token)
    if value.dtype.is_ptr():
        return _semantic.add(value, token, True)
    if not value.dtype.is_int():
        raise TypeError(f"consume_token takes pointers, integers or tensor descriptors, got {value.dtype}")
    return _semantic.add(value, _semantic.cast(token, value.dtype), True)


class _TokenBoundDescriptorType(core.tensor_descriptor_type):
    """The type of a descriptor bound to a wait's token. The token is part of the value: it flows
    through ``if`` and loop bodies with the descriptor (one more IR value), so loads after the
    block still wait. A plain descriptor and a bound one are different types, so a block that binds
    it on one path only is a compile error that names the fix, never a silent loss of the wait."""

    def __init__(self, base: core.tensor_descriptor_type):
        super().__init__(base.block_type, base.shape_type, base.strides_type)

    def _unflatten_ir(self, handles, cursor):
        desc, cursor = super()._unflatten_ir(handles, cursor)
        return _TokenBoundDescriptor(desc, core.tensor(handles[cursor], tl.int32)), cursor + 1

    def _flatten_ir_types(self, builder, out) -> None:
        super()._flatten_ir_types(builder, out)
        out.append(tl.int32.to_ir(builder))

    def __str__(self) -> str:
        # Triton prints this when two paths of a block disagree: say how to write it.
        return (f"tensor_descriptor<{self.block_type}> bound to a dl.wait token (bind it on every path: before "
                "the block, x = dl.consume_token(desc, tl.zeros((), tl.int32)), then rebind it after the wait)")

    def mangle(self) -> str:
        return "TK" + super().mangle()


class _TokenBoundDescriptor(core.tensor_descriptor):
    """A tensor descriptor whose loads wait for a token: the first coordinate of each load is
    passed through :func:`consume_token`, so the TMA copy is issued after the wait. It keeps the
    token through control flow (:class:`_TokenBoundDescriptorType`)."""

    def __init__(self, desc, token):
        super().__init__(desc.handle, desc.shape, desc.strides, desc.block_type)
        self.type = _TokenBoundDescriptorType(self.type)
        self.token = token

    def _flatten_ir(self, handles) -> None:
        super()._flatten_ir(handles)
        handles.append(self.token.handle)

    def _async_proxy_token(self, _semantic):
        # TMA reads through the async proxy, which the generic-proxy acquire of the wait does not
        # order: a proxy fence between them makes the acquired data visible to the copy. It is
        # in the token's chain, so it runs after the wait and before the copy, and, being
        # "pure", it does not stop the pipeliner from issuing it stages ahead with the wait.
        token = core.inline_asm_elementwise("fence.proxy.async.global; mov.b32 $0, $1;", "=r,r", [self.token],
                                            dtype=tl.int32, is_pure=True, pack=1, _semantic=_semantic)
        return _semantic.multiple_of(token, [_TOKEN_DIVISIBILITY])

    def _bound(self, offsets, _semantic):
        offsets = list(offsets)
        offsets[0] = consume_token(_semantic.to_tensor(offsets[0]), self._async_proxy_token(_semantic),
                                   _semantic=_semantic)
        return offsets

    @core.builtin
    def load(self, offsets, _semantic=None):
        return _semantic.descriptor_load(self, self._bound(offsets, _semantic), "", "")

    @core.builtin
    def gather(self, *args, _semantic=None):
        x_offsets, y_offset = args
        y_offset = consume_token(_semantic.to_tensor(y_offset), self._async_proxy_token(_semantic),
                                 _semantic=_semantic)
        return _semantic.descriptor_gather(self, x_offsets, y_offset, "", "")
