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

Who calls what (NVSHMEM's rule): a plain name is called by one thread per PE (guard it with
``if dl.tid(0) == 0`` when the operation is not idempotent), ``_warp`` by every thread of one
warp, ``_block`` by every thread of the CTA, with the same arguments. Collectives (``barrier``,
``team_sync``, ``fcollect``, ``alltoall``, ``broadcast``, ``*_reduce``) are called by every PE of
``team`` (``TEAM_WORLD``; ``TEAM_NODE``, NVSHMEM's own notion of a node) in the same order, from one
program per PE. Typed forms (``int32_p``, ``float_g``, ``bfloat16_put_block``, ``int64_sum_reduce``,
...) take element counts; the ``*mem`` forms take bytes.
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
_KINDS = {"ptr": tl.int64, "size": tl.int64, "int": tl.int32, "u64": tl.uint64, "int32": tl.int32, "int64": tl.int64,
          "uint32": tl.uint32, "uint64": tl.uint64, "float": tl.float32, "double": tl.float64}


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

_TABLE.update({
    "signal_fetch": ("nvshmem_signal_fetch", [("sig_addr", _P)], tl.uint64, "the local signal's value (an atomic read)."),
})

# Teams (NVSHMEM's numbering). TEAM_NODE is NVSHMEM's node (one host), which a declared
# TRITON_DIST_LOCAL_WORLD_SIZE does not change: for the declared topology use dl.rank(axis).
TEAM_SHARED = 1
TEAM_NODE = 2
TEAM_SAME_MYPE_NODE = 3
for _scope in ("", "_warp", "_block"):
    _prefix = "nvshmem" if _scope == "" else "nvshmemx"
    _TABLE.update({
        f"barrier{_scope}": (f"{_prefix}_barrier{_scope}", [("team", _I)], tl.int32,
                             "barrier of `team` (completes earlier puts); one "
                             + {"": "thread", "_warp": "warp", "_block": "CTA"}[_scope] + " per PE calls it."),
        f"team_sync{_scope}": (f"{_prefix}_team_sync{_scope}", [("team", _I)], tl.int32,
                               "synchronisation of `team` without completing puts."),
        f"fcollectmem{_scope}": (f"{_prefix}_fcollectmem{_scope}", [("team", _I), ("dest", _P), ("source", _P),
                                                                   ("nbytes", _S)], tl.int32,
                                 "every PE's `nbytes` of `source`, concatenated in PE order, into `dest`."),
        f"alltoallmem{_scope}": (f"{_prefix}_alltoallmem{_scope}", [("team", _I), ("dest", _P), ("source", _P),
                                                                   ("nbytes", _S)], tl.int32,
                                 "block j of `source` (`nbytes` each) to PE j's block `my_pe` of `dest`."),
        f"broadcastmem{_scope}": (f"{_prefix}_broadcastmem{_scope}", [("team", _I), ("dest", _P), ("source", _P),
                                                                     ("nbytes", _S), ("pe_root", _I)], tl.int32,
                                  "`nbytes` of `source` on `pe_root` into `dest` on every PE of `team`."),
    })

# Typed forms: NVSHMEM's type name -> the Triton type of its values.
_VALUE_TYPES = {"int32": tl.int32, "int64": tl.int64, "uint32": tl.uint32, "uint64": tl.uint64, "float": tl.float32,
                "double": tl.float64}
_ELEMENT_TYPES = list(_VALUE_TYPES) + ["int8", "int16", "uint8", "uint16", "half", "bfloat16"]
_REDUCTIONS = {"sum": _ELEMENT_TYPES, "prod": _ELEMENT_TYPES, "max": _ELEMENT_TYPES, "min": _ELEMENT_TYPES,
               "and": ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"],
               "or": ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"],
               "xor": ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]}
for _t, _value in _VALUE_TYPES.items():
    _TABLE[f"{_t}_p"] = (f"nvshmem_{_t}_p", [("dest", _P), ("value", _t), ("pe", _I)], _VOID,
                         f"store one {_t} `value` at `dest` on `pe` (every calling thread stores its own).")
    _TABLE[f"{_t}_g"] = (f"nvshmem_{_t}_g", [("source", _P), ("pe", _I)], _value, f"load one {_t} from `source` on `pe`.")
for _t in _ELEMENT_TYPES:
    for _scope in ("", "_warp", "_block"):
        _prefix = "nvshmem" if _scope == "" else "nvshmemx"
        for _op, _what in (("put", "to `dest` on `pe`"), ("get", "from `source` on `pe`")):
            for _nbi in ("", "_nbi"):
                _TABLE[f"{_t}_{_op}{_nbi}{_scope}"] = (
                    f"{_prefix}_{_t}_{_op}{_nbi}{_scope}", [("dest", _P), ("source", _P), ("nelems", _S), ("pe", _I)],
                    _VOID, f"copy `nelems` {_t} elements {_what}" + ("; complete with quiet." if _nbi else "."))
        for _nbi in ("", "_nbi"):
            _TABLE[f"{_t}_put_signal{_nbi}{_scope}"] = (
                f"{_prefix}_{_t}_put_signal{_nbi}{_scope}",
                [("dest", _P), ("source", _P), ("nelems", _S), ("sig_addr", _P), ("signal", _U), ("sig_op", _I),
                 ("pe", _I)], _VOID, f"{_t}_put, then update the signal on `pe` once the data has arrived.")
        for _coll, _params, _what in (
                ("fcollect", [("team", _I), ("dest", _P), ("source", _P), ("nelems", _S)],
                 "every PE's `nelems` elements, concatenated in PE order"),
                ("alltoall", [("team", _I), ("dest", _P), ("source", _P), ("nelems", _S)],
                 "block j of `source` to PE j's block `my_pe`"),
                ("broadcast", [("team", _I), ("dest", _P), ("source", _P), ("nelems", _S), ("pe_root", _I)],
                 "`pe_root`'s `source` to every PE's `dest`")):
            _TABLE[f"{_t}_{_coll}{_scope}"] = (f"{_prefix}_{_t}_{_coll}{_scope}", _params, tl.int32,
                                               f"{_coll} of {_t}: {_what}.")
for _op, _types in _REDUCTIONS.items():
    for _t in _types:
        for _scope in ("", "_warp", "_block"):
            _prefix = "nvshmem" if _scope == "" else "nvshmemx"
            _TABLE[f"{_t}_{_op}_reduce{_scope}"] = (
                f"{_prefix}_{_t}_{_op}_reduce{_scope}", [("team", _I), ("dest", _P), ("source", _P), ("nreduce", _S)],
                tl.int32, f"every PE's `dest` = the elementwise {_op} over `team` of each PE's `source` ({_t}).")

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


__all__ = ["SIGNAL_SET", "SIGNAL_ADD", "CMP_EQ", "CMP_NE", "CMP_GT", "CMP_LE", "CMP_LT", "CMP_GE", "TEAM_WORLD",
           "TEAM_SHARED", "TEAM_NODE", "TEAM_SAME_MYPE_NODE", "ptr", "symbols"] + list(_TABLE)


def symbols() -> dict[str, str]:
    """Every function of this module -> the NVSHMEM symbol it calls (the tests check each against
    the device bitcode)."""
    return {name: entry[0] for name, entry in _TABLE.items()} | {"ptr": "nvshmem_ptr"}
