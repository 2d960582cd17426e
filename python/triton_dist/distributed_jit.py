"""``triton_dist.jit``: triton.jit plus NVSHMEM's device library.

Kernels that call :mod:`triton_dist.language` need NVSHMEM's bitcode and the language's support
library linked in and, once loaded, their module initialised with NVSHMEM's device state. The
decorator supplies the first at every launch (the ``extern_libs`` option, part of Triton's cache
key); a Triton load hook, installed by :func:`triton_dist.init`, does the second for every
module Triton loads.

Loading a module that links NVSHMEM waits for the device. A kernel that is spinning on a signal
(a consumer waiting for its peer) therefore blocks the load of any other module in the process,
and the peer's producer may be the one being loaded: a deadlock. Load every kernel before any of
them waits: :meth:`DistributedKernel.preload`, or a first launch outside the spinning phase, and
keep per-call values such as epochs out of Triton's specialisation (``do_not_specialize``), since
a value that becomes 1 or a multiple of 16 otherwise compiles and loads a new variant.
"""

from __future__ import annotations

import functools

import triton

from . import config as _config
from . import nvshmem as _nvshmem
from .eager_launch import EagerKernel
from .language import support_library as _support_library


_extern_libs_in_force: tuple = (None, ())
"""(the Config init() installed, its extern_libs): every launch asks, and working them out again
costs 1.4 µs; init() installs a new Config object, so its identity is the cache key."""


def extern_libs() -> tuple[tuple[str, str], ...]:
    """The ``extern_libs`` option of a ``triton_dist.jit`` kernel under the settings in force."""
    global _extern_libs_in_force
    installed = _config._current
    if installed is not None and _extern_libs_in_force[0] is installed:
        return _extern_libs_in_force[1]
    libs = _nvshmem.extern_libs() + ((_support_library.NAME, _support_library.path()), )
    if installed is not None:
        _extern_libs_in_force = (installed, libs)
    return libs


def _initialize_module(module, function, name, metadata_group, hash) -> None:
    from . import _C

    # The runtime looks up only the globals the module's PTX names (a failed lookup is an API
    # error to compute-sanitizer); Triton's cache group holds the PTX beside the cubin.
    ptx = next((path for file, path in metadata_group.items() if file.endswith(".ptx")), "")
    _C.initialize_module(int(module), str(ptx))


def install_module_hook() -> None:
    """Initialise every module Triton loads from now on (idempotent; init() calls it)."""
    triton.knobs.runtime.kernel_load_end_hook.add(_initialize_module)


def remove_module_hook() -> None:
    """Stop initialising the modules Triton loads (finalize() calls it)."""
    triton.knobs.runtime.kernel_load_end_hook.remove(_initialize_module)


class DistributedKernel(EagerKernel):
    """A Triton kernel launched with NVSHMEM's device library linked in.

    Launch it like a triton.jit kernel: ``kernel[grid](*args, **options)``. Modules loaded before
    :func:`triton_dist.init` are not initialised, so the first launch must come after init.
    Variants already loaded launch from C++ (:mod:`triton_dist.eager_launch`) when the runtime
    arguments go by position and the constexprs and options by keyword.
    """

    def __init__(self, fn: triton.runtime.JITFunction):
        super().__init__(fn)
        functools.update_wrapper(self, fn.fn)

    def _options(self, kwargs: dict) -> dict:
        kwargs.setdefault("extern_libs", extern_libs())
        return kwargs

    def warmup(self, *args, grid, **kwargs):
        """Compile (and load) the variant these arguments select, as ``triton.jit``'s ``warmup``,
        with the libraries linked."""
        return self.fn.warmup(*args, grid=grid, **self._options(kwargs))

    def preload(self, *args, grid, **kwargs):
        """Compile and load the variant these arguments select, without launching it.

        Call this for every kernel of an op before any of them can spin (see the module notes);
        arguments are only inspected for their types and specialisation, never read. Inside
        :func:`triton_dist.parallel_compile.deferred_preloads` the call is recorded instead (and
        returns None), to be compiled in parallel and run later.
        """
        from . import parallel_compile

        recorded = parallel_compile.recording()
        if recorded is not None:
            recorded.append(parallel_compile.Preload(self, args, grid, dict(kwargs)))
            return None
        return self.eager.preload(grid, args, self._options(kwargs))

    def __repr__(self) -> str:
        return f"triton_dist.jit({self.fn.fn.__name__})"


def jit(fn=None, **jit_options):
    """Decorator: like ``triton.jit`` (same options), for kernels that call NVSHMEM's device API."""

    def decorate(f):
        return DistributedKernel(triton.jit(f, **jit_options))

    return decorate(fn) if fn is not None else decorate
