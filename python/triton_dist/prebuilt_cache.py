"""The prebuilt set: library kernels compiled ahead of time into a Triton cache beside the package,
consulted before the user's own cache. ``python -m triton_dist.prebuilt_cache`` fills it.

Why (issue 21): a context compiles the kernels it may launch on first use, tens of seconds on a
fresh install with an empty Triton cache. Compiling needs no GPU, and Triton's cache key depends
only on Triton's build, the source, the backend (ptxas version, target), the options (libraries by
content) and Triton's cache-invalidating environment variables, never on the machine's GPU or the
cache's path. So the variants a recorded run used (:mod:`triton_dist.variant_list`; the package's
list is ``prebuilt/variants.jsonl``) are compiled once after install, into ``prebuilt/cache``
inside the installed package (or :attr:`Config.prebuilt_cache_dir
<triton_dist.config.Config.prebuilt_cache_dir>`), under the keys the JIT will look up.

At run time :func:`triton_dist.init` installs :class:`PrebuiltFirstCacheManager` as Triton's cache
manager: a lookup finds a key's files in the prebuilt directory first, else in the user's cache
(``TRITON_CACHE_DIR``, unchanged); every write goes to the user's cache. The prebuilt directory is
read-only to it: it is shared by every user of the installation (often not theirs to write), and
whatever the JIT adds is per user. A variant outside the set compiles on first use as before, and
the context that compiles it says so on stderr, with how to add it. A variant keyed for another
Triton build, Python or ptxas is simply not found: slower, never wrong.

This is not :mod:`triton_dist.tools.prebuild`, which writes single kernels as a cubin and a
manifest for C++ programs (``tdist::PrebuiltKernel``); this one fills Triton's own cache, for the
Python path.
"""

from __future__ import annotations

import argparse
import errno
import dataclasses
import json
import os
import sys
import time

import triton
from triton.runtime.cache import CacheManager, FileCacheManager

from . import config as _config

_PACKAGE = os.path.dirname(os.path.abspath(__file__))


def default_variant_list() -> str:
    """The package's list of prebuilt variants (may be absent: then there is nothing to prebuild)."""
    return os.path.join(_PACKAGE, "prebuilt", "variants.jsonl")


def directory() -> str:
    """The prebuilt cache directory under the settings in force (:attr:`Config.prebuilt_cache_dir
    <triton_dist.config.Config.prebuilt_cache_dir>`, else ``prebuilt/cache`` in the package)."""
    configured = _config.get().prebuilt_cache_dir
    return os.path.expanduser(configured) if configured else os.path.join(_PACKAGE, "prebuilt", "cache")


class PrebuiltFirstCacheManager(CacheManager):
    """Triton's cache manager with the prebuilt directory in front: ``get_file``/``get_group`` look
    in :attr:`directory` first, then in the user's cache; ``put``/``put_group`` always write to the
    user's cache (a ``FileCacheManager``, created only when needed, so a hit in the prebuilt
    directory writes nothing, not even the key's empty directory). Dump and override managers
    (``TRITON_KERNEL_DUMP``, ``TRITON_KERNEL_OVERRIDE``) are the user's alone."""

    directory: str = ""
    """The prebuilt directory (set by :func:`install`); "" consults none."""

    def __init__(self, key, override=False, dump=False):
        self.key = key
        self._user_args = (key, override, dump)
        self._user_manager = None
        prebuilt = type(self).directory
        self._prebuilt = os.path.join(prebuilt, key) if prebuilt and not (override or dump) else None

    def _user(self) -> FileCacheManager:
        if self._user_manager is None:
            self._user_manager = FileCacheManager(*self._user_args)
        return self._user_manager

    def _prebuilt_file(self, filename: str) -> str | None:
        if self._prebuilt is None:
            return None
        path = os.path.join(self._prebuilt, filename)
        return path if os.path.isfile(path) else None

    def has_file(self, filename) -> bool:
        """Whether either layer holds ``filename`` under this key."""
        return self._prebuilt_file(filename) is not None or self._user().has_file(filename)

    def get_file(self, filename):
        """The prebuilt file, else the user's cache's (or None)."""
        return self._prebuilt_file(filename) or self._user().get_file(filename)

    def get_group(self, filename):
        """The prebuilt group, complete, else the user's cache's (or None)."""
        group = self._prebuilt_group(filename)
        return group if group is not None else self._user().get_group(filename)

    def _prebuilt_group(self, filename: str) -> dict | None:
        # A group file lists absolute paths of where it was built; the children are found by name
        # beside it instead, so the directory may be built in one place and installed in another.
        path = self._prebuilt_file(f"__grp__{filename}")
        if path is None:
            return None
        try:
            with open(path) as f:
                children = json.load(f).get("child_paths")
        except (OSError, ValueError, AttributeError):
            return None
        if not isinstance(children, dict):
            return None
        group = {}
        for child in children:
            found = self._prebuilt_file(child)
            if found is None:  # incomplete: the user's cache, or a compile, gives the whole group
                return None
            group[child] = found
        return group

    def put(self, data, filename, binary=True) -> str:
        """Write into the user's cache."""
        return self._user().put(data, filename, binary)

    def put_group(self, filename, group) -> str:
        """Write into the user's cache."""
        return self._user().put_group(filename, group)

    def __getattr__(self, name):
        # Anything else a caller may ask of a FileCacheManager (cache_dir, lock_path) is the user's.
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._user(), name)


def install() -> str:
    """Put the prebuilt directory in front of Triton's cache (``triton.knobs.cache.manager_class``)
    for this process; returns the directory, or "" when nothing was installed: the directory does
    not exist (nothing prebuilt), or the user chose a cache manager of their own
    (``TRITON_CACHE_MANAGER`` or ``triton.knobs.cache.manager_class``), which is theirs to keep:
    a layer in front of it would change where their kernels come from. init() calls it."""
    path = directory()
    # The directory first, and the user's manager only looked for, never imported: reading the
    # knob imports what TRITON_CACHE_MANAGER names, and a bad name would fail init() after the
    # runtime came up (Triton itself fails on it only at the first compile).
    if not os.path.isdir(path) or _users_manager_set():
        return ""
    PrebuiltFirstCacheManager.directory = path
    triton.knobs.cache.manager_class = PrebuiltFirstCacheManager
    return path


def _users_manager_set() -> bool:
    """Whether the user chose a cache manager (the knob set in this process, or
    ``TRITON_CACHE_MANAGER``), without importing it."""
    return "manager_class" in vars(triton.knobs.cache) or bool(os.environ.get("TRITON_CACHE_MANAGER"))


def uninstall() -> None:
    """Give Triton back the cache manager :func:`install` replaced (finalize() calls it)."""
    if vars(triton.knobs.cache).get("manager_class") is PrebuiltFirstCacheManager:
        # Unset, not None: Triton then reads TRITON_CACHE_MANAGER again, as before install().
        del triton.knobs.cache.manager_class


# ---------------------------------------------------------------------------------------------
# Filling it.


@dataclasses.dataclass
class BuildReport:
    """What :func:`build` did."""

    compiled: int = 0
    """Variants compiled into the directory."""
    already: int = 0
    """Variants the directory already held."""
    failed: list = dataclasses.field(default_factory=list)
    """``"file:line module.name: why"`` of each variant that is not in the directory afterwards."""
    launchers: str = ""
    """Why the kernels' launchers were not built beside them ("" when they were)."""
    seconds: float = 0.0


def build(recorded: list, out: str, workers: int | None = None) -> BuildReport:
    """Compile the :class:`~triton_dist.variant_list.RecordedVariant` s missing from ``out`` into it
    (a Triton cache directory), ``workers`` processes at a time. A variant that fails is reported
    and the rest go on."""
    from . import parallel_compile
    from .language import support_library

    start = time.perf_counter()
    report = BuildReport()
    os.makedirs(out, exist_ok=True)
    groups: dict = {}
    for r in recorded:
        groups.setdefault(r.settings, []).append(r)
    saved = _config._current
    with triton.knobs.cache.scope():  # restores Triton's cache settings and their variables
        # This process and its workers compile into ``out`` with Triton's plain file cache. The
        # language compiles a kernel only with the support library's file of the process's own
        # Triton cache (language/shmem.py), so this process and its workers must agree on it: it
        # is written into ``out`` too, and the file this process chose before is forgotten (and
        # again afterwards).
        os.environ["TRITON_CACHE_DIR"] = triton.knobs.cache.dir = out
        triton.knobs.cache.manager_class = FileCacheManager
        env = dict(parallel_compile.worker_environment(), TRITON_CACHE_DIR=out)
        env.pop("TRITON_CACHE_MANAGER", None)
        support_library._write.cache_clear()
        report.launchers = parallel_compile.launcher_unavailable()
        try:
            if not report.launchers:
                _build_driver_utilities()
            for settings, members in groups.items():
                _config._set(dataclasses.replace(saved or _config.Config.from_environment(), **dict(settings)))
                variants = []
                for r in members:
                    try:
                        variants.append((r, _resolve(r)))
                    except (ValueError, ImportError, AttributeError, TypeError) as error:  # reported; the rest go on
                        report.failed.append(f"{_named(r)}: {type(error).__name__}: {error}")
                missing = [(r, v) for r, v in variants if not parallel_compile.is_cached(v)]
                report.already += len(variants) - len(missing)
                # With launchers, the variants already there too: a cache hit, then their launcher.
                todo = [v for _, v in (variants if not report.launchers else missing)]
                parallel_compile.compile_variants(todo, workers, env=env, launchers=not report.launchers)
                for r, v in missing:
                    if parallel_compile.is_cached(v):
                        report.compiled += 1
                    else:
                        report.failed.append(f"{_named(r)}: did not compile (Triton's error is above)")
        finally:
            _config._set(saved)
            support_library._write.cache_clear()
    report.seconds = time.perf_counter() - start
    return report


def _build_driver_utilities() -> None:
    """Triton's driver module (``cuda_utils``, one per installation, built at the first use of
    the GPU through Triton) into the cache in force."""
    import subprocess

    try:
        from triton.backends.nvidia.driver import CudaUtils

        CudaUtils()
    except (ImportError, AssertionError, OSError, RuntimeError, subprocess.CalledProcessError) as error:
        print(f"triton_dist prebuild: Triton's driver utilities not built ahead ({type(error).__name__}: {error})",
              file=sys.stderr)


def _named(r) -> str:
    return f"{r.where + ' ' if r.where else ''}{r.variant.module}.{r.variant.name}"


def _resolve(r):
    """The variant of ``r`` with this installation's libraries (under the settings in force, which
    :func:`build` made ``r``'s), its kernel imported (a line naming a missing module fails here)."""
    from . import distributed_jit, parallel_compile

    variant = r.resolve(distributed_jit.extern_libs())
    parallel_compile._source_and_options(variant)
    return variant


def main(argv: list[str] | None = None) -> int:
    """The command line (``--help``): 0 when every variant is in the directory afterwards, 1 when
    some failed (each named), 2 when a variant list cannot be read or the directory written."""
    from . import variant_list

    parser = argparse.ArgumentParser(
        prog="python -m triton_dist.prebuilt_cache",
        description="Compile the library's kernel variants ahead of time (no GPU needed) into the prebuilt "
        "cache that triton_dist.init() puts in front of Triton's own.")
    parser.add_argument("--variants", nargs="+", metavar="FILE",
                        help="variant lists (JSON lines, as TRITON_DIST_RECORD_VARIANTS writes them); default: "
                        "the package's prebuilt/variants.jsonl")
    parser.add_argument("--out", help="the cache directory to fill; default: TRITON_DIST_PREBUILT_CACHE_DIR, else "
                        "prebuilt/cache in the installed package (where init() looks)")
    parser.add_argument("--workers", type=int, help="compile processes (default: TRITON_DIST_COMPILE_WORKERS, "
                        "else one per core)")
    parser.add_argument("--write-list", metavar="FILE",
                        help="instead of compiling, write the variants read, each once, into FILE (to merge "
                        "recordings into the package's list)")
    parser.add_argument("--library-only", action="store_true",
                        help="keep only the variants of triton_dist's own kernels (a GPU test run also records "
                        "the tests' kernels, which the package's list must not name)")
    args = parser.parse_args(argv)
    if args.workers is not None and args.workers < 1:
        parser.error("--workers must be at least 1")
    paths = args.variants or [default_variant_list()]
    if args.variants is None and not os.path.isfile(paths[0]):
        print(f"triton_dist prebuild: no variant list at {paths[0]}; nothing to prebuild")
        return 0
    try:
        recorded = variant_list.read(paths)
    except ValueError as error:
        print(f"triton_dist prebuild: {error}", file=sys.stderr)
        return 2
    if args.library_only:
        kept = [r for r in recorded if r.variant.module.startswith("triton_dist.")]
        if len(kept) < len(recorded):
            print(f"triton_dist prebuild: left out {len(recorded) - len(kept)} variants of kernels outside triton_dist")
        recorded = kept
    if args.write_list:
        with open(args.write_list, "w") as f:
            f.write(variant_list.LIST_HEADER)
            f.writelines(variant_list.to_line(r) + "\n" for r in recorded)
        print(f"triton_dist prebuild: wrote {len(recorded)} variants into {args.write_list}")
        return 0
    if not recorded:
        print(f"triton_dist prebuild: no variants in {', '.join(paths)}; nothing to prebuild")
        return 0
    out = os.path.abspath(args.out or directory())
    try:
        report = build(recorded, out, args.workers)
    except OSError as error:  # not ours to write (permissions, a read-only file system)
        if error.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise
        print(f"triton_dist prebuild: cannot write into {out} ({error.strerror}); give --out DIR, and set "
              f"TRITON_DIST_PREBUILT_CACHE_DIR=DIR for the runs that should use it", file=sys.stderr)
        return 2
    for failure in report.failed:
        print(f"triton_dist prebuild: FAILED {failure}", file=sys.stderr)
    launchers = ("with their launchers (any that failed is named above)" if not report.launchers else
                 f"without their launchers ({report.launchers}; each is built at its kernel's first load)")
    print(f"triton_dist prebuild: {len(recorded)} variants in {out}: {report.compiled} compiled, {report.already} "
          f"already there, {len(report.failed)} failed ({report.seconds:.1f} s), {launchers}")
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
