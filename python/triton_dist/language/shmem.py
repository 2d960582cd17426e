"""The OpenSHMEM device API over NVSHMEM's bitcode, for kernels decorated with ``triton_dist.jit``.

Names follow NVSHMEM without its prefixes (``nvshmem_my_pe`` -> ``my_pe``,
``nvshmemx_putmem_block`` -> ``putmem_block``). Pointers may be Triton pointers or int64
addresses; they cross into NVSHMEM as int64.

Which threads call: a Triton extern runs in **every thread** of the program (CTA). That is what
the ``_block`` variants require (all threads of the block, same arguments) and harmless for
queries (``my_pe``, ``ptr``) and waits. For the thread-scope variants (``putmem``, ``signal_op``
with ADD, ...) every thread performs the operation: use the ``_block`` or ``_warp`` forms, or
make the operation idempotent (SET), until the language layer offers single-thread issue.
Void NVSHMEM functions return a dummy int32 here (Triton externs cannot return void).
"""

from __future__ import annotations

import triton.language as tl
from triton.language import core

SIGNAL_SET = 9
SIGNAL_ADD = 10
CMP_EQ, CMP_NE, CMP_GT, CMP_LE, CMP_LT, CMP_GE = range(6)
TEAM_WORLD = 0

_LIB = "libnvshmem_device"
# Argument kinds: how each parameter is passed into NVSHMEM.
_KINDS = {"ptr": tl.int64, "size": tl.int64, "int": tl.int32, "u64": tl.uint64}


def _to(value, dtype, _semantic):
    value = _semantic.to_tensor(value)
    if value.dtype == dtype:
        return value
    return _semantic.cast(value, dtype)


def require_distributed_jit(what: str, _semantic) -> None:
    """Raise, at compile time, unless the kernel being compiled links NVSHMEM's device library and
    the language's support library for the settings in force, as ``triton_dist.jit`` arranges.

    A plain ``triton.jit`` kernel lacks both: NVSHMEM's symbols do not resolve, and the settings
    that change the code of a wait (timeout, debug barriers) would be missing from Triton's cache
    key, so a kernel compiled under one setting would be reused under another."""
    from . import support_library

    options = getattr(getattr(_semantic, "builder", None), "options", None)
    if options is None:  # not compiling (the interpreter): nothing to link
        return
    libs = dict(getattr(options, "extern_libs", None) or ())
    if _LIB not in libs or support_library.NAME not in libs:
        raise RuntimeError(f"{what} needs a kernel decorated with @triton_dist.jit, not @triton.jit: it links "
                           "NVSHMEM's device library and the language's support library, whose settings are part "
                           "of the kernel's cache key")
    if libs[support_library.NAME] != support_library.path():
        raise RuntimeError(f"{what}: the kernel was given extern_libs for other language settings than those in "
                           "force (wait timeout, debug barriers); let triton_dist.jit supply extern_libs")


def _define(name: str, symbol: str, params: list[tuple[str, str]], returns, doc: str):
    arg_types = tuple(_KINDS[kind] for _, kind in params)

    def call(*args, _semantic=None):
        if len(args) != len(params):
            names = ", ".join(p for p, _ in params)
            raise TypeError(f"shmem.{name}({names}) takes {len(params)} arguments, got {len(args)}")
        require_distributed_jit(f"shmem.{name}", _semantic)
        values = [_to(a, t, _semantic) for a, t in zip(args, arg_types)]
        return core.extern_elementwise(_LIB, "", values, {arg_types: (symbol, returns)}, is_pure=False,
                                       _semantic=_semantic)

    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"{symbol}({', '.join(p for p, _ in params)}): {doc}"
    return core.extern(call)


_VOID = tl.int32  # the dummy result of void functions
_P, _S, _I, _U = "ptr", "size", "int", "u64"

# name -> (NVSHMEM symbol, parameters, result, what it does)
_TABLE = {
    "my_pe": ("nvshmem_my_pe", [], tl.int32, "this PE's number."),
    "n_pes": ("nvshmem_n_pes", [], tl.int32, "number of PEs."),
    "team_my_pe": ("nvshmem_team_my_pe", [("team", _I)], tl.int32, "this PE's number in `team`."),
    "team_n_pes": ("nvshmem_team_n_pes", [("team", _I)], tl.int32, "number of PEs in `team`."),
    "fence": ("nvshmem_fence", [], _VOID, "orders this thread's puts to each PE."),
    "quiet": ("nvshmem_quiet", [], _VOID, "completes this thread's outstanding puts."),
    "barrier_all": ("nvshmem_barrier_all", [], _VOID, "barrier of all PEs (one thread per PE)."),
    "barrier_all_block": ("nvshmemx_barrier_all_block", [], _VOID, "barrier of all PEs, all threads of one CTA per PE."),
    "sync_all": ("nvshmem_sync_all", [], _VOID, "synchronisation of all PEs without completing puts."),
    "sync_all_block": ("nvshmemx_sync_all_block", [], _VOID, "sync_all, all threads of one CTA per PE."),
    "signal_op": ("nvshmemx_signal_op", [("sig_addr", _P), ("signal", _U), ("sig_op", _I), ("pe", _I)], _VOID,
                  "atomically SET or ADD `signal` at `sig_addr` on `pe` (every calling thread does it)."),
    "signal_wait_until": ("nvshmem_signal_wait_until", [("sig_addr", _P), ("cmp", _I), ("cmp_value", _U)],
                          tl.uint64, "spin until the local signal compares true; returns its value."),
}
for _scope in ("", "_warp", "_block"):
    _prefix = "nvshmem" if _scope == "" else "nvshmemx"
    _TABLE.update({
        f"putmem{_scope}": (f"{_prefix}_putmem{_scope}", [("dest", _P), ("source", _P), ("nbytes", _S), ("pe", _I)],
                            _VOID, "copy `nbytes` from local `source` to `dest` on `pe`; returns when `source` is reusable."),
        f"putmem_nbi{_scope}": (f"{_prefix}_putmem_nbi{_scope}", [("dest", _P), ("source", _P), ("nbytes", _S),
                                                               ("pe", _I)], _VOID,
                                "non-blocking putmem; complete with quiet."),
        f"getmem{_scope}": (f"{_prefix}_getmem{_scope}", [("dest", _P), ("source", _P), ("nbytes", _S), ("pe", _I)],
                            _VOID, "copy `nbytes` from `source` on `pe` to local `dest`."),
        f"getmem_nbi{_scope}": (f"{_prefix}_getmem_nbi{_scope}", [("dest", _P), ("source", _P), ("nbytes", _S),
                                                               ("pe", _I)], _VOID,
                                "non-blocking getmem; complete with quiet."),
        f"putmem_signal{_scope}": (f"{_prefix}_putmem_signal{_scope}", [("dest", _P), ("source", _P), ("nbytes", _S),
                                                                      ("sig_addr", _P), ("signal", _U), ("sig_op", _I),
                                                                      ("pe", _I)], _VOID,
                                   "putmem, then update the signal on `pe` once the data has arrived."),
        f"putmem_signal_nbi{_scope}": (f"{_prefix}_putmem_signal_nbi{_scope}",
                                       [("dest", _P), ("source", _P), ("nbytes", _S), ("sig_addr", _P),
                                        ("signal", _U), ("sig_op", _I), ("pe", _I)], _VOID,
                                       "non-blocking putmem_signal."),
    })

for _name, (_symbol, _params, _returns, _doc) in _TABLE.items():
    globals()[_name] = _define(_name, _symbol, _params, _returns, _doc)


@core.extern
def ptr(dest, pe, _semantic=None):
    """nvshmem_ptr(dest, pe): `dest` as `pe` maps it into this PE (same pointer type), or 0 when
    `pe` cannot be reached with loads and stores."""
    require_distributed_jit("shmem.ptr (dl.symm_at)", _semantic)
    dest = _semantic.to_tensor(dest)
    address = core.extern_elementwise(_LIB, "", [_to(dest, tl.int64, _semantic), _to(pe, tl.int32, _semantic)],
                                      {(tl.int64, tl.int32): ("nvshmem_ptr", tl.int64)}, is_pure=True,
                                      _semantic=_semantic)
    return _semantic.cast(address, dest.dtype) if dest.dtype.is_ptr() else address


__all__ = ["SIGNAL_SET", "SIGNAL_ADD", "CMP_EQ", "CMP_NE", "CMP_GT", "CMP_LE", "CMP_LT", "CMP_GE", "TEAM_WORLD", "ptr"
           ] + list(_TABLE)
