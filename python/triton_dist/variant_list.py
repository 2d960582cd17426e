"""The prebuilt set's variant list: kernel variants as JSON lines, recorded from real runs and read by
``python -m triton_dist.prebuilt_cache``.

Why record rather than enumerate: which variants a run needs (world sizes, dtypes, a context's
constexprs, how Triton specialised each argument: 16-divisible or not, 1 folded into a constant)
is known exactly only to Triton's JIT at the launch. With
:attr:`Config.record_variants <triton_dist.config.Config.record_variants>` set, init() installs
Triton's compilation listener, which every ``triton.compile`` calls (the JIT calls it once per
variant and process, for a compile or a load from the cache: a context's preloads, a first launch,
``warmup``; a launch of a loaded variant never does, so recording costs launches nothing). It
writes down each variant of a ``triton_dist.jit`` kernel, and of the library's plain
``triton.jit`` kernels (decode attention's), from the source and metadata Triton built, so the
list cannot drift from the launches.

One JSON object per line; blank lines and lines starting with ``#`` are comments:

- ``module``, ``name``: the module-level kernel (kernels of ``__main__`` or defined inside a
  function are not recorded: a prebuild cannot import them);
- ``signature``, ``constexprs``, ``attrs``, ``target``: what ``triton.compile`` is given
  (:class:`~triton_dist.parallel_compile.Variant`); constexprs and attrs as ``[path, value]``
  pairs, a dtype as ``{"dtype": "bf16"}``, a tuple as ``{"tuple": [...]}``, a jit function as
  ``{"jit": "module:name"}``;
- ``options``: the backend's options, **without** ``extern_libs``: their paths belong to the
  machine (NVSHMEM's wheel, the support library written into each user's Triton cache) and Triton
  keys them by content only, so the prebuild links this installation's files instead;
- ``extern_libs``: the names of those libraries (``triton_dist.jit``'s, besides Triton's own
  libdevice);
- ``settings``: the language settings the support library carried (wait timeout, debug barriers,
  ranks per node: :func:`triton_dist.language.support_library.settings`), part of the key through
  its content, so the prebuild writes the same library;
- ``key``: the cache key where it was recorded, for reference (another Triton build, Python
  version or ptxas gives another key for the same variant: the prebuild compiles under its own).

Ranks of a node write one file at once: each line goes out in one ``write`` on a descriptor opened
with ``O_APPEND``, which the kernel appends whole. Each process writes a variant once; ranks
recording the same variant each write it, and readers deduplicate.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os

from .parallel_compile import Variant

LINE_FIELDS = ("module", "name", "signature", "constexprs", "attrs", "options", "extern_libs", "settings", "target")
"""The fields a line must have (``key`` is optional)."""

SETTINGS = ("wait_timeout_ns", "debug_barriers", "local_world_size")

LIST_HEADER = """\
# The kernel variants of the prebuilt set, one JSON line each (triton_dist.variant_list), compiled after
# install by python -m triton_dist.prebuilt_cache. Recorded on a GPU machine with
# TRITON_DIST_RECORD_VARIANTS=FILE, merged here with
# python -m triton_dist.prebuilt_cache --variants FILE... --write-list python/triton_dist/prebuilt/variants.jsonl
"""
"""The comment that opens a list written by ``--write-list`` (and the package's list)."""


@dataclasses.dataclass(frozen=True)
class RecordedVariant:
    """One line of a variant list: a :class:`~triton_dist.parallel_compile.Variant` whose options
    lack ``extern_libs`` (named in :attr:`extern_libs`, linked under :attr:`settings`)."""

    variant: Variant
    extern_libs: tuple
    """Names of the libraries linked besides libdevice."""
    settings: tuple
    """``(name, value)`` of each language setting in :data:`SETTINGS`."""
    key: str = ""
    """The cache key where it was recorded ("" if not given)."""
    where: str = ""
    """``file:line`` it was read from ("" when made here)."""

    def identity(self) -> str:
        """The line without its key and origin: equal for the same variant from any machine."""
        return to_line(dataclasses.replace(self, key=""))

    def resolve(self, libs) -> Variant:
        """The variant with ``extern_libs`` from ``libs`` (``((name, path), ...)``, e.g.
        :func:`triton_dist.distributed_jit.extern_libs` under :attr:`settings`)."""
        if not self.extern_libs:
            return self.variant
        paths = dict(libs)
        missing = [name for name in self.extern_libs if name not in paths]
        if missing:
            raise ValueError(f"{self.where or 'a variant'}: links {', '.join(missing)}, which this installation "
                             f"does not provide (it has {', '.join(sorted(paths))})")
        options = dict(self.variant.options, extern_libs=tuple((name, paths[name]) for name in self.extern_libs))
        return dataclasses.replace(self.variant, options=options)


# ---------------------------------------------------------------------------------------------
# JSON <-> Python values: the cache key is made of their str(), so each must come back as the type
# it was (tuples as tuples, dtypes as dtypes).


def _encode(value):
    import triton
    import triton.language as tl

    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if type(value) is tl.dtype:
        return {"dtype": str(value)}
    if isinstance(value, tuple):
        return {"tuple": [_encode(v) for v in value]}
    if isinstance(value, triton.runtime.JITFunction):
        fn = value.fn
        if fn.__module__ == "__main__" or "." in fn.__qualname__:
            raise TypeError(f"the jit function {fn.__qualname__} cannot be imported by name")
        return {"jit": f"{fn.__module__}:{fn.__qualname__}"}
    raise TypeError(f"a constexpr of type {type(value).__name__} ({value!r}) has no JSON form")


def _decode(value):
    import importlib

    import triton
    import triton.language as tl

    if isinstance(value, dict):
        if set(value) == {"dtype"}:
            return tl.dtype(value["dtype"])
        if set(value) == {"tuple"}:
            return tuple(_decode(v) for v in value["tuple"])
        if set(value) == {"jit"}:
            module, _, name = value["jit"].partition(":")
            fn = getattr(importlib.import_module(module), name)
            return fn if isinstance(fn, triton.runtime.JITFunction) else fn.fn  # a triton_dist.jit kernel
        raise ValueError(f"unknown constexpr form {value!r}")
    if isinstance(value, list):
        raise ValueError(f"a constexpr list {value!r}: tuples are written as {{\"tuple\": [...]}}")
    return value


def _tuples(value):
    """JSON lists back into the tuples Triton built (signatures of tuple arguments, options)."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def to_line(recorded: RecordedVariant) -> str:
    """One JSON line (no newline) for ``recorded``; raises TypeError for a constexpr with no JSON form."""
    v = recorded.variant
    target = v.target
    obj = {
        "module": v.module, "name": v.name, "signature": v.signature,
        "constexprs": [[list(path), _encode(value)] for path, value in v.constexprs.items()],
        "attrs": [[list(path), value] for path, value in v.attrs.items()],
        "options": {k: val for k, val in v.options.items() if k != "extern_libs"},
        "extern_libs": list(recorded.extern_libs), "settings": dict(recorded.settings),
        "target": {"backend": target.backend, "arch": target.arch, "warp_size": target.warp_size},
    }
    if recorded.key:
        obj["key"] = recorded.key
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def from_line(text: str, where: str = "") -> RecordedVariant:
    """The variant of one line; a ValueError naming ``where`` (``file:line``) and the fault for a
    line that is not one."""
    from triton.backends.compiler import GPUTarget

    try:
        obj = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{where}: not a JSON line ({error.msg} at column {error.colno})") from None
    try:
        if not isinstance(obj, dict):
            raise ValueError("a line must be a JSON object")
        missing = [f for f in LINE_FIELDS if f not in obj]
        if missing:
            raise ValueError(f"missing field(s) {', '.join(missing)}")
        settings = obj["settings"]
        if set(settings) != set(SETTINGS):
            raise ValueError(f"settings must name exactly {', '.join(SETTINGS)}")
        t = obj["target"]
        variant = Variant(
            module=str(obj["module"]), name=str(obj["name"]),
            signature={str(k): _tuples(s) for k, s in obj["signature"].items()},
            constexprs={tuple(path): _decode(value) for path, value in obj["constexprs"]},
            attrs={tuple(path): value for path, value in obj["attrs"]},
            options={k: _tuples(val) for k, val in obj["options"].items()},
            target=GPUTarget(t["backend"], t["arch"], t["warp_size"]))
        return RecordedVariant(variant, tuple(obj["extern_libs"]), tuple((k, settings[k]) for k in SETTINGS),
                               str(obj.get("key", "")), where)
    except (ValueError, TypeError, KeyError, AttributeError, ImportError) as error:
        raise ValueError(f"{where}: not a kernel variant ({type(error).__name__}: {error})") from None


def read(paths) -> list[RecordedVariant]:
    """Every variant in the files ``paths``, in order, each once (:meth:`RecordedVariant.identity`);
    a missing file, or a line that is not a variant, raises a ValueError naming file and line."""
    found: dict = {}
    for path in paths:
        try:
            with open(path) as f:
                lines = f.read().splitlines()
        except OSError as error:
            raise ValueError(f"{path}: cannot read the variant list ({error.strerror})") from None
        for number, text in enumerate(lines, 1):
            if text.strip() and not text.lstrip().startswith("#"):
                recorded = from_line(text, f"{path}:{number}")
                found.setdefault(recorded.identity(), recorded)
    return list(found.values())


def _parameter_names(variant: Variant) -> list[str]:
    """The kernel's parameter names (constexprs and attrs are keyed by position), or [] when the
    kernel cannot be imported."""
    import importlib

    import triton

    try:
        fn = getattr(importlib.import_module(variant.module), variant.name)
    except (ImportError, AttributeError):
        return []
    while not isinstance(fn, triton.runtime.JITFunction) and hasattr(fn, "fn"):
        fn = fn.fn
    return list(getattr(fn, "arg_names", []))


def _fields(recorded: RecordedVariant, names: list[str]) -> dict:
    """What tells two variants of one kernel apart, by readable name: each constexpr and attribute
    by its parameter's name, each signature entry, option and language setting."""
    v = recorded.variant

    def named(path) -> str:
        return names[path[0]] if len(path) == 1 and path[0] < len(names) else str(list(path))

    fields = {f"{named(path)}": repr(value) for path, value in v.constexprs.items()}
    fields.update({f"{named(path)} (specialisation)": repr(value) for path, value in v.attrs.items()})
    fields.update({f"{name} (type)": repr(kind) for name, kind in v.signature.items() if kind != "constexpr"})
    fields.update({f"option {k}": repr(val) for k, val in v.options.items() if k != "extern_libs"})
    fields.update({f"setting {k}": repr(val) for k, val in recorded.settings})
    fields["libraries"] = repr(sorted(recorded.extern_libs))
    return fields


def explain_missing(wanted: RecordedVariant, listed: list) -> str:
    """Why ``wanted`` (a variant a context found in no cache) is not in the prebuilt set whose
    list is ``listed``: the fields in which the closest listed variant of the same kernel
    differs (``WORLD 4, listed 2``), or, when one matches in every field, that the set was
    built from other source, Triton or ptxas, or not built at all."""
    v = wanted.variant
    same_kernel = [r for r in listed if r.variant.module == v.module and r.variant.name == v.name]
    if not same_kernel:
        return f"{v.name}: the list has no variant of this kernel"
    names = _parameter_names(v)
    want = _fields(wanted, names)

    def differences(r) -> list[str]:
        have = _fields(r, names)
        return [f"{k} {want.get(k, '(absent)')}, listed {have.get(k, '(absent)')}"
                for k in sorted(set(want) | set(have)) if want.get(k) != have.get(k)]

    closest = min((differences(r) for r in same_kernel), key=len)
    if not closest:
        return (f"{v.name}: listed, but not found built: the prebuilt set was built from other source, Triton or "
                f"ptxas, or not built (python -m triton_dist.prebuilt_cache)")
    return f"{v.name}: the closest of {len(same_kernel)} listed differs in " + "; ".join(closest[:4])


# ---------------------------------------------------------------------------------------------
# Recording.


@functools.lru_cache(maxsize=None)
def _option_fields(target) -> tuple[str, ...]:
    """The backend's option names for ``target`` (the metadata holds them among other facts)."""
    from triton.compiler.compiler import make_backend

    return tuple(make_backend(target).parse_options({}).__dict__)


def from_compiled(src, metadata: dict) -> RecordedVariant:
    """The variant ``triton.compile`` compiled or loaded from ``src`` (an ASTSource) with the
    options and target ``metadata`` (its metadata, as a dict) holds, under the language settings in
    force; a TypeError says why it cannot be recorded."""
    from .language import support_library

    fn = src.fn.fn
    if fn.__module__ == "__main__" or "." in fn.__qualname__:
        raise TypeError(f"{fn.__qualname__} is defined in __main__ or inside a function: a prebuild cannot import it")
    target = metadata["target"]
    options = {k: _tuples(metadata[k]) for k in _option_fields(target) if k in metadata}
    libs = tuple(name for name, _ in options.get("extern_libs") or () if name != "libdevice")
    variant = Variant(fn.__module__, fn.__qualname__, dict(src.signature), dict(src.constants), dict(src.attrs),
                      options, target)
    return RecordedVariant(variant, libs, tuple(support_library.settings().items()), str(metadata["hash"]))


class _Recorder:
    """Triton's compilation listener while recording (``triton.knobs.compilation.listener``: called
    by every ``triton.compile``, a compile or a load from the cache, never at a launch of a loaded
    variant), chained to the listener it replaced."""

    def __init__(self, path: str, previous):
        self.path, self.previous, self.written = os.path.expanduser(path), previous, set()

    def __call__(self, *, src, metadata, metadata_group, times, cache_hit):
        try:
            self._record(src, metadata)
        finally:
            if self.previous is not None:
                self.previous(src=src, metadata=metadata, metadata_group=metadata_group, times=times,
                              cache_hit=cache_hit)

    def _record(self, src, metadata) -> None:
        from .language import support_library

        fn = getattr(getattr(src, "fn", None), "fn", None)  # None for IR sources
        if fn is None or metadata.get("hash") in self.written:
            return
        libs = dict(metadata.get("extern_libs") or ())
        # The library's kernels (triton.jit ones too: decode attention's) and triton_dist.jit ones,
        # which link the support library; user kernels of __main__ or inside functions cannot be
        # imported by a prebuild and are left out.
        if not (fn.__module__.startswith("triton_dist.") or support_library.NAME in libs):
            return
        if fn.__module__ == "__main__" or "." in fn.__qualname__:
            return
        self.written.add(metadata.get("hash"))
        try:
            line = to_line(from_compiled(src, metadata)) + "\n"
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line.encode())  # one write per line: appended whole (module notes)
            finally:
                os.close(fd)
        except Exception as error:  # noqa: BLE001  a recording must never fail a compile
            from .parallel_compile import _warn_once

            _warn_once(f"triton_dist: variant of {fn.__qualname__} not recorded into {self.path} "
                       f"({type(error).__name__}: {error})")


def start_recording(path: str) -> None:
    """Append every variant of the library's and ``triton_dist.jit`` kernels that Triton compiles
    or loads from now on to ``path`` (:attr:`Config.record_variants
    <triton_dist.config.Config.record_variants>`; init() calls it when that is set)."""
    import triton

    stop_recording()
    triton.knobs.compilation.listener = _Recorder(path, triton.knobs.compilation.listener)


def stop_recording() -> None:
    """Stop recording, giving Triton back the listener it had (finalize() calls it)."""
    import triton

    listener = triton.knobs.compilation.listener
    if isinstance(listener, _Recorder):
        triton.knobs.compilation.listener = listener.previous
