"""A context's kernels compiled before its first call: in parallel worker processes, once per node.

Why: a context preloads every kernel it may launch (triton_dist.distributed_jit explains why it
must), and Triton compiles them one after another, 3-7 s each on the GPU machine: first calls of
20-80 s (issue 21). Compiling needs no GPU, and Triton's cache (one directory per user unless
``TRITON_CACHE_DIR`` says otherwise) is shared by the ranks of a node. So inside
:func:`deferred_preloads` a context's ``preload`` calls are recorded instead of run; then
:func:`compile_once_per_node` has the node's first rank compile every variant not yet in the cache
at once, in :attr:`~triton_dist.config.Config.compile_workers` processes, while the other ranks wait
at a barrier; then every rank performs the recorded preloads, which find their kernels in the
cache and only load them.

A variant is described exactly as Triton's JIT builds it for the same arguments (its binder's
specialisation, its options), so a worker compiles under the key the JIT looks up; workers run
under the parent's :class:`~triton_dist.config.Config` (the language reads settings while it
compiles). Should a key ever differ, the preload compiles as before: slower, never wrong. A worker
that fails is ignored for the same reason: the preload then raises Triton's own error.

Variants in the prebuilt set (:mod:`triton_dist.prebuilt_cache`, which fills it with
:func:`compile_variants` too) count as cached: nothing is compiled for them, and the stderr line
about what is compiled says it is outside that set.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import hashlib
import os

import triton

from . import config as _config
from . import runtime as _runtime

_RECORDING: contextvars.ContextVar = contextvars.ContextVar("triton_dist_deferred_preloads", default=None)


@dataclasses.dataclass(frozen=True)
class Variant:
    """What Triton compiles for one launch of a kernel: the module-level kernel by name, and the
    ``ASTSource`` and options the JIT would build."""

    module: str
    name: str
    signature: dict
    constexprs: dict
    attrs: dict
    options: dict
    target: object


@dataclasses.dataclass
class Preload:
    """One recorded ``kernel.preload(*args, grid=grid, **kwargs)``."""

    kernel: object
    args: tuple
    grid: tuple
    kwargs: dict


def recording() -> list | None:
    """The list preloads are recorded into, when inside :func:`deferred_preloads`."""
    return _RECORDING.get()


@contextlib.contextmanager
def deferred_preloads():
    """Record the ``triton_dist.jit`` preloads made inside; yields the list of :class:`Preload`."""
    recorded: list = []
    token = _RECORDING.set(recorded)
    try:
        yield recorded
    finally:
        _RECORDING.reset(token)


def preload_in_parallel(preload) -> None:
    """Collective: ``preload()`` (a context's kernel preloads, which may use their results only when
    they are not None) with its kernels compiled first, in parallel, once per node (module notes)."""
    with deferred_preloads() as preloads:
        preload()
    compile_once_per_node(preloads)
    preload()


def compile_once_per_node(preloads: list) -> None:
    """Collective: the node's first rank compiles every variant of ``preloads`` missing from
    Triton's cache, in parallel; every rank waits for it (module notes)."""
    if _runtime.local_rank() == 0:
        # Whatever goes wrong here, this rank must reach the barrier: the others wait there, and a
        # rank that left would meet their next collective with a different one of its own.
        try:
            variants = [v for v in (variant_of(p) for p in preloads) if v is not None and not is_cached(v)]
            _compile_saying_so(variants)
        except Exception as error:  # noqa: BLE001  the preload compiles what is missing (module notes)
            _warn_once(f"triton_dist: compiling a context's kernels in parallel failed ({type(error).__name__}: "
                       f"{error}); they compile one by one instead")
    _runtime.barrier()


MISSES_EXPLAINED = 3
"""Variants a first-use compile explains (:func:`_why_not_prebuilt`); more would bury the message."""


def _why_not_prebuilt(variants: list) -> list[str]:
    """For each variant, how it differs from the closest of the package's list
    (:func:`~triton_dist.variant_list.explain_missing`): what to record, or that the set is stale.
    Nothing when there is no list; a failure to explain is never a failure to compile."""
    from . import prebuilt_cache, variant_list
    from .language import support_library

    try:
        listed = variant_list.read([prebuilt_cache.default_variant_list()])
        settings = tuple(support_library.settings().items())
        lines = []
        for v in variants:
            libs = tuple(name for name, _ in v.options.get("extern_libs") or () if name != "libdevice")
            lines.append(variant_list.explain_missing(variant_list.RecordedVariant(v, libs, settings), listed))
        return lines
    except (ValueError, OSError, ImportError, AttributeError, TypeError, KeyError, IndexError):
        return []


def _compile_saying_so(variants: list) -> None:
    """compile_variants, announced on stderr when there is anything to compile: a first use can
    take tens of seconds, which without a word looks like a hang."""
    if not variants:
        return
    import sys
    import time

    global _told_how_to_prebuild
    modules = sorted({v.module.rsplit(".", 1)[-1] for v in variants})
    # How to add them to the prebuilt set: once per process, so later contexts' lines stay short.
    how = "" if _told_how_to_prebuild else (
        " (to prebuild them: run with TRITON_DIST_RECORD_VARIANTS=FILE, then "
        "python -m triton_dist.prebuilt_cache --variants FILE)")
    _told_how_to_prebuild = True
    print(f"triton_dist: compiling {len(variants)} kernel variants ({', '.join(modules)}) for their first use: "
          f"not in the prebuilt set{how}; Triton's cache keeps them for later runs", file=sys.stderr, flush=True)
    for line in _why_not_prebuilt(variants[:MISSES_EXPLAINED]):
        print(f"triton_dist:   {line}", file=sys.stderr, flush=True)
    start = time.perf_counter()
    # Their launchers too, in the same workers: each is a C module the host compiler builds, tenths
    # of a second apiece that the first loads would otherwise pay one after another.
    compile_variants(variants, launchers=True)
    print(f"triton_dist: compiled {len(variants)} kernel variants in {time.perf_counter() - start:.1f} s",
          file=sys.stderr, flush=True)


_warned: set = set()
_told_how_to_prebuild = False


def _warn_once(message: str) -> None:
    import sys

    if message not in _warned:
        _warned.add(message)
        print(message, file=sys.stderr, flush=True)


def _device() -> int:
    return triton.runtime.driver.active.get_current_device()


def variant_of(preload: Preload) -> Variant | None:
    """The :class:`Variant` Triton's JIT would compile for ``preload`` (None for kernels a worker
    cannot import by name: defined in ``__main__`` or inside a function)."""
    kernel = preload.kernel
    fn = kernel.fn
    module, name = fn.fn.__module__, fn.fn.__qualname__
    if module == "__main__" or "." in name:
        return None
    _, _, target, backend, binder = fn.device_caches[_device()]
    return bound_variant(kernel, preload.args, preload.kwargs, target, backend, binder)[0]


def bound_variant(kernel, args: tuple, kwargs: dict, target, backend, binder) -> tuple[Variant, list]:
    """The :class:`Variant` Triton's JIT compiles for ``kernel[grid](*args, **kwargs)`` (a
    module-level ``triton_dist.jit`` kernel) on ``target``, given its ``backend`` and ``binder``
    (Triton's specialisation function for that backend), and the binder's specialisation (one
    ``(kind, attribute)`` per parameter). Needs no GPU when the binder was made for an explicit
    target (:mod:`triton_dist.tools.prebuild`)."""
    fn = kernel.fn
    module, name = fn.fn.__module__, fn.fn.__qualname__
    kwargs = kernel._options(dict(kwargs))
    # What JITFunction.run adds before it binds (triton 3.6).
    kwargs["debug"] = kwargs.get("debug", fn.debug) or triton.knobs.runtime.debug
    kwargs["instrumentation_mode"] = triton.knobs.compilation.instrumentation_mode
    bound, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound, specialization, options)
    return Variant(module, name, signature, constexprs, attrs, dict(options.__dict__), target), specialization


def _source_and_options(variant: Variant):
    import importlib

    kernel = getattr(importlib.import_module(variant.module), variant.name)
    # A module-level kernel is a JITFunction (triton.jit) or a DistributedKernel around one.
    fn = kernel if isinstance(kernel, triton.runtime.JITFunction) else kernel.fn
    # In the kernel's parameter order, whatever order the variant came in (a variant list sorts its
    # JSON keys): the cache key sorts the signature, but the launcher Triton generates lays the
    # arguments out in this order, and its cache key is the hash of that source.
    signature = {name: variant.signature[name] for name in fn.arg_names if name in variant.signature}
    src = triton.compiler.ASTSource(fn, signature, variant.constexprs, variant.attrs)
    return src, variant.options


def cache_key(variant: Variant) -> str:
    """The key ``triton.compile`` files ``variant`` under here (its ``CompiledKernel.hash``): Triton's
    version, the source, the backend, the options (libraries by content) and Triton's
    cache-invalidating environment variables."""
    return _cache_key_and_file(variant)[0]


def _cache_key_and_file(variant: Variant) -> tuple[str, str]:
    """:func:`cache_key`, and the name of the metadata file ``triton.compile`` looks up under it."""
    from triton.compiler.compiler import make_backend
    from triton.runtime.cache import get_cache_key

    from triton._C.libtriton import get_cache_invalidating_env_vars

    src, options = _source_and_options(variant)
    backend = make_backend(variant.target)
    parsed = backend.parse_options(dict(options, **src.parse_options()))
    key = get_cache_key(src, backend, parsed, env_vars=get_cache_invalidating_env_vars())
    return hashlib.sha256(key.encode("utf-8")).hexdigest(), f"{src.name[:150]}.json"


def is_cached(variant: Variant) -> bool:
    """Whether Triton's cache already holds ``variant`` (the lookup of ``triton.compile``, through
    the cache manager in force: with :mod:`triton_dist.prebuilt_cache` installed, the prebuilt set
    counts)."""
    from triton.runtime.cache import get_cache_manager

    key, name = _cache_key_and_file(variant)
    group = get_cache_manager(key).get_group(name) or {}
    return name in group


def compile_variants(variants: list, workers: int | None = None, env: dict | None = None,
                     launchers: bool = False) -> None:
    """Compile ``variants`` into Triton's cache, ``workers`` processes at a time (default
    :attr:`Config.compile_workers <triton_dist.config.Config.compile_workers>`; 1, or a single
    variant, compiles here), the workers in ``env`` (default :func:`worker_environment`); with
    ``launchers``, each variant's launcher too (:func:`build_launcher`)."""
    if not variants:
        return
    cfg = _worker_config()
    workers = _workers(len(variants)) if workers is None else min(workers, len(variants))
    if workers <= 1:
        for v in variants:
            _compile(v, None, launchers)
        return
    # Worker processes of our own (python -m triton_dist.parallel_compile), not multiprocessing's:
    # fork would copy the parent's CUDA and NCCL state and threads, and spawn re-imports the
    # user's main script, which may not guard its top level (tdist.init() in every worker).
    import pickle
    import subprocess
    import sys

    procs = []
    for i in range(workers):
        # stderr stays the parent's: a worker's failure is ignored (module notes) but not hidden.
        proc = subprocess.Popen([sys.executable, "-m", "triton_dist.parallel_compile"], stdin=subprocess.PIPE,
                                stdout=subprocess.DEVNULL, env=worker_environment() if env is None else env)
        proc.stdin.write(pickle.dumps((cfg, variants[i::workers], launchers)))
        proc.stdin.close()
        procs.append(proc)
    for proc in procs:
        proc.wait()


def worker_environment() -> dict:
    """The parent's environment, less the GPU: compiling needs none (the target is given), and a
    worker that touched it would be one more CUDA context, under MPS one more client of the
    server, which ranks sharing the GPU already crowd."""
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_MPS_")}
    env.update(PYTHONPATH=os.pathsep.join(p for p in sys.path if p), CUDA_VISIBLE_DEVICES="")
    return env


def _workers(jobs: int) -> int:
    configured = _config.get().compile_workers
    if configured > 0:
        return min(configured, jobs)
    return max(1, min(jobs, os.cpu_count() or 1, 32))


def _worker_config():
    """The settings in force, with the ranks per node the runtime found (the language reads both)."""
    cfg = _config.get()
    if _runtime.is_initialized():
        cfg = dataclasses.replace(cfg, local_world_size=_runtime.local_world_size())
    return cfg


def _compile(variant: Variant, cfg, launcher: bool = False) -> bool:
    """Compile ``variant`` (in a worker: under ``cfg``; here: ``None``, the settings in force), and
    its launcher if asked; False, and nothing raised, when the kernel fails to compile."""
    if cfg is not None:
        _config._set(cfg)
    try:
        src, options = _source_and_options(variant)
        compiled = triton.compile(src, target=variant.target, options=options)
        if launcher:
            build_launcher(compiled)
        return True
    except Exception as error:  # noqa: BLE001  the preload compiles it again and raises (module notes)
        _warn_once(f"triton_dist: compiling {variant.module}.{variant.name} ahead failed ({type(error).__name__}: "
                   f"{error}); it compiles on first use instead")
        return False


def launcher_unavailable() -> str:
    """Why this machine cannot build kernel launchers ("" when it can): Triton links each one
    against the driver's ``libcuda.so.1``, which a machine without a GPU driver lacks."""
    import subprocess

    try:
        from triton.backends.nvidia.driver import libcuda_dirs

        libcuda_dirs()  # runs ldconfig -p
    except AssertionError:
        return "no libcuda.so.1 here: a machine without the GPU driver"
    except (ImportError, OSError, RuntimeError, subprocess.CalledProcessError) as error:
        return f"{type(error).__name__}: {error}"
    return ""


def build_launcher(compiled) -> bool:
    """Build the host-side launcher of a compiled CUDA kernel into Triton's cache, as its first
    load would (a C module per signature, compiled with the host's C compiler: tenths of a second
    each, which a first call otherwise pays). False, and a line on stderr, when it cannot be built
    (it is then built at the kernel's first load, as always)."""
    import subprocess

    try:
        from triton.backends.nvidia.driver import CudaLauncher

        CudaLauncher(compiled.src, compiled.metadata)
        return True
    except (ImportError, AssertionError, OSError, RuntimeError, subprocess.CalledProcessError) as error:
        _warn_once(f"triton_dist: the launcher of {compiled.name} was not built ahead ({type(error).__name__}: "
                   f"{error}); it is built at the kernel's first load instead")
        return False


def _worker_main() -> None:
    """A worker process: compile the pickled ``(config, variants, launchers)`` on stdin."""
    import pickle
    import sys

    cfg, variants, launchers = pickle.loads(sys.stdin.buffer.read())
    for v in variants:
        _compile(v, cfg, launchers)


if __name__ == "__main__":
    _worker_main()
