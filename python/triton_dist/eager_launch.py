"""Eager launches from C++: the variants of a ``triton_dist.jit`` kernel (or of a plain
``triton.jit`` one wrapped in :class:`EagerKernel`) that Triton has loaded,
each handed to ``_C.KernelLauncher`` with the rules Triton specialised it under.

Why: Triton's launch path re-derives a kernel's specialisation from every argument in Python,
builds its cache key and calls a generated launcher, several times the driver call's own host
time per kernel (measured on the GPU machine for issue 21, not kept in a result file); the
library's small collectives launch one to three kernels per call. Here the first launch of each (device, keyword arguments)
goes through Triton, which compiles or finds the variant and loads it; the variant is then
learnt: its function handle, launch shape and, per runtime argument, Triton's kind (i32, i64,
pointer of a dtype, ...), whether it assumed divisibility by 16, and the runtime arguments it
folded into constants. Later launches with the same keywords try the learnt variants in C++,
which checks each argument against those rules and launches; arguments that break every learnt
variant's rules take Triton's path again (and teach it their variant, up to
:data:`MAX_VARIANTS`). A C++ launch therefore only ever runs a variant whose assumptions the
arguments meet, which is what Triton would guarantee too (Triton might pick a more specialised
variant; running the less specialised one is correct).

Triton's path is kept whenever the C++ one would differ: a launch hook is installed (profilers
see every launch), the grid is a callable, an argument is a tuple, or the variant needs per-launch
scratch memory or clusters. Runtime arguments after a kernel's constexprs, which launches give by
name (the GEMMs' epilogue operands, the collectives' signal layout), go into their slots in the
kernel's order; they are no part of the key.
Host tensor descriptors (``triton.tools.tensor_descriptor.TensorDescriptor``) take the C++ path
only with ``Config.eager_tensor_descriptors`` and where Triton lowered them to TMA: the variant is
Triton's for the descriptor's dtype and block shape (its whole specialisation), and the C++
launcher encodes each call's CUtensorMap with the variant's ``tensordesc_meta``
(:func:`tensor_map_rule`), as Triton's launcher does.
"""

from __future__ import annotations

import dataclasses
import functools

import triton

from . import config as _config

MAX_VARIANTS = 8
"""Variants tried per (device, keyword arguments); arguments of later ones always take Triton's
path."""

_torch_c = None  # torch._C, bound on first use (triton_dist imports torch lazily)


def _device_and_stream() -> tuple[int, int]:
    global _torch_c
    if _torch_c is None:
        import torch

        _torch_c = torch._C
    device = _torch_c._cuda_getDevice()
    return device, _torch_c._cuda_getCurrentRawStream(device)


def _launch_hooked() -> bool:
    """Whether a launch-enter hook is installed (a profiler), which must see every launch: a
    HookChain in Triton 3.6, its hooks in ``.calls``."""
    hook = triton.knobs.runtime.launch_enter_hook
    return hook is not None and bool(getattr(hook, "calls", True))


class EagerLaunches:
    """The learnt variants of one ``triton.jit`` function (``fn``), by device and keyword
    arguments (constexprs and options)."""

    def __init__(self, fn: triton.runtime.JITFunction):
        self.fn = fn
        self._launchers: dict = {}
        self._attempts: dict = {}
        self._runtime_params = [p for p in fn.params if not p.is_constexpr]
        self._runtime_names = frozenset(p.name for p in self._runtime_params)
        # Trailing runtime parameters with defaults (the GEMM's optional epilogue operands) that a
        # launch may leave out: the C++ launcher takes every runtime argument.
        defaults = []
        for p in reversed(self._runtime_params):
            if not p.has_default:
                break
            defaults.append(p.default)
        self._defaults = tuple(reversed(defaults))
        self._required = len(self._runtime_params) - len(self._defaults)
        # Triton binds positional arguments in the signature's order, constexprs included: only the
        # parameters before the first constexpr can be given by position among the runtime ones.
        self._leading = next((i for i, p in enumerate(fn.params) if p.is_constexpr), len(fn.params))

    def _complete(self, args):
        """``args`` (a tuple or list) with the left-out trailing defaults appended (unchanged when
        complete, or too short to complete: the C++ launcher then refuses them)."""
        missing = len(self._runtime_params) - len(args)
        if missing <= 0 or len(args) < self._required:
            return args
        return (*args, *self._defaults[len(self._defaults) - missing:])

    def _runtime_args(self, args: tuple, kwargs: dict) -> tuple | None:
        """Every runtime argument in the kernel's order, as the C++ launcher takes them: ``args``
        (the leading ones), then each later one from ``kwargs`` or its default (the GEMMs pass
        those after their constexprs by name); None when one is missing, given twice, or when a
        positional argument binds to a constexpr (Triton binds them in the signature's order)."""
        if len(args) > self._leading:
            return None
        if self._runtime_names.isdisjoint(kwargs):
            return self._complete(args)
        if any(p.name in kwargs for p in self.fn.params[:len(args)]):
            return None  # Triton raises "multiple values" for it
        full = list(args)
        for p in self._runtime_params[len(args):]:
            if p.name in kwargs:
                full.append(kwargs[p.name])
            elif p.has_default:
                full.append(p.default)
            else:
                return None
        return tuple(full)

    def _key(self, device: int, kwargs: dict):
        # Runtime arguments given by keyword (a tensor, a count) are per-call values, not part of
        # the key: tensors hash by identity, so every call would add one (holding its tensors).
        if not self._runtime_names.isdisjoint(kwargs):
            kwargs = {name: value for name, value in kwargs.items() if name not in self._runtime_names}
        try:
            key = (device, *kwargs.items())
            hash(key)
        except TypeError:  # an unhashable keyword value: never learnt
            return None
        return key

    def run(self, grid, args: tuple, kwargs: dict):
        """Launch ``fn[grid](*args, **kwargs)``: from C++ through a learnt variant (returns None),
        else through Triton (returns its CompiledKernel), whose variant is then learnt."""
        if self.launch(grid, args, kwargs):
            return None
        compiled = self.fn.run(*args, grid=grid, warmup=False, **kwargs)
        self.learn(compiled, args, kwargs)
        return compiled

    def preload(self, grid, args: tuple, kwargs: dict):
        """Compile and load the variant ``args``/``kwargs`` select, without launching it, and
        learn it; returns the CompiledKernel."""
        compiled = self.fn.warmup(*args, grid=grid, **kwargs)
        compiled._init_handles()
        self.learn(compiled, args, kwargs)
        return compiled

    def launch(self, grid, args: tuple, kwargs: dict) -> bool:
        """Launch through a learnt variant; False (nothing launched) when none takes these
        arguments, so that the caller runs Triton's path."""
        if _launch_hooked() or callable(grid):
            return False
        device, stream = _device_and_stream()
        launchers = self._launchers.get(self._key(device, kwargs))
        if not launchers:
            return False
        args = self._runtime_args(args, kwargs)
        if args is None:
            return False
        size = len(grid)
        gx = grid[0]
        gy = grid[1] if size > 1 else 1
        gz = grid[2] if size > 2 else 1
        for launcher in launchers:
            if launcher.launch(gx, gy, gz, stream, *args):
                return True
        return False

    def prepare(self, grid, kwargs: dict) -> PreparedLaunch | None:
        """A :class:`PreparedLaunch` of ``grid`` with these keywords on the current device: the
        learnt variants of its key, looked up once (later ones join it), or None when the keywords
        can never be learnt or hold a runtime argument (a prepared launch takes them all by position)."""
        if callable(grid) or not self._runtime_names.isdisjoint(kwargs):
            return None
        device, _ = _device_and_stream()
        key = self._key(device, kwargs)
        if key is None:
            return None
        return PreparedLaunch(self._launchers.setdefault(key, []), tuple(grid) + (1, ) * (3 - len(grid)), device,
                              _config._current, self._complete)

    def learn(self, compiled, args: tuple, kwargs: dict) -> None:
        """Add the variant Triton loaded for ``args``/``kwargs`` (``compiled``, a CompiledKernel
        with its handles initialised), if the C++ path can launch it."""
        device, _ = _device_and_stream()
        key = self._key(device, kwargs)
        if key is None:
            return
        # Attempts count, not only successes: a kernel the C++ path cannot launch (tensor
        # descriptors, say) stops paying for the attempt after MAX_VARIANTS calls.
        tried = self._attempts.get(key, 0)
        if tried >= MAX_VARIANTS or compiled is None or getattr(compiled, "function", None) is None:
            return
        self._attempts[key] = tried + 1
        launcher = self._launcher_for(compiled, args, kwargs, device)
        if launcher is not None:
            self._launchers.setdefault(key, []).append(launcher)

    def _launcher_for(self, compiled, args: tuple, kwargs: dict, device: int):
        from . import _C
        from . import runtime as _runtime

        md = compiled.metadata
        descriptors = _config.get().eager_tensor_descriptors
        if not launchable(md, descriptors):
            return None
        given = args
        # Left-out defaults and runtime arguments by name, whatever the descriptors' switch: the
        # collectives pass their signal layout by name (a descriptor argument without the switch
        # is refused by argument_rules below).
        args = self._runtime_args(args, kwargs)
        if args is None or len(args) != len(self._runtime_params):
            return None
        binder = self.fn.device_caches[device][4]
        _, specialization, _ = binder(*given, **kwargs)  # it fills the defaults in itself
        rules = argument_rules(self._runtime_params, specialization, args,
                               getattr(md, "tensordesc_meta", None) if descriptors else None)
        if rules is None:
            return None
        rank = _runtime.rank() if _runtime.is_initialized() else -1
        maps = rules.tensor_maps if any(m is not None for m in rules.tensor_maps) else None
        return _C.KernelLauncher(compiled.name, rank, compiled.function, rules.types, rules.divisible,
                                 rules.constants, rules.is_none, rules.dtypes, 32 * md.num_warps, md.shared, 1,
                                 bool(md.launch_cooperative_grid), bool(md.launch_pdl), maps)

    def variants(self) -> int:
        """How many variants have been learnt (all devices and keywords)."""
        return sum(len(v) for v in self._launchers.values())


class EagerKernel:
    """A ``triton.jit`` kernel launched as ``kernel[grid](*args, **options)`` through learnt C++
    launchers (:class:`EagerLaunches`) where one takes the arguments, else through Triton, which
    teaches it the variant; what a :class:`~triton_dist.kernels.common.launch_plan.LaunchPlan`
    needs of its kernel (``run``, ``prepare``, ``fn``). The plain GEMMs, which need no NVSHMEM,
    wrap theirs in one; :class:`triton_dist.distributed_jit.DistributedKernel` adds NVSHMEM's
    libraries to the options."""

    def __init__(self, fn: triton.runtime.JITFunction):
        self.fn = fn
        self.eager = EagerLaunches(fn)
        """The variants learnt for C++ launches."""

    def _options(self, kwargs: dict) -> dict:
        """The launch options with what this kind of kernel adds to every launch (nothing here)."""
        return kwargs

    def run(self, *args, grid, warmup=False, **kwargs):
        """Launch on ``grid``, as ``triton.jit``'s ``run``: from C++ when a learnt variant takes the
        arguments (returns None then), else through Triton (returns the CompiledKernel), whose
        variant is then learnt."""
        kwargs = self._options(kwargs)
        if warmup:
            return self.fn.run(*args, grid=grid, warmup=True, **kwargs)
        return self.eager.run(grid, args, kwargs)

    def prepare(self, grid, meta: dict):
        """A :class:`PreparedLaunch` of this kernel on ``grid`` with the keywords ``meta``
        (constexprs and options), on the current device; None when such launches can never go
        through C++."""
        return self.eager.prepare(grid, self._options(dict(meta)))

    def __getitem__(self, grid):
        return functools.partial(self.run, grid=grid, warmup=False)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.fn.fn.__name__})"


class PreparedLaunch:
    """:meth:`EagerLaunches.launch` with the key and grid worked out once: a repeated launch of the
    same kernel, grid and keywords on one device (:class:`triton_dist.kernels.common.launch_plan.LaunchPlan`)."""

    __slots__ = ("launchers", "grid", "device", "config", "complete")

    def __init__(self, launchers: list, grid: tuple, device: int, config, complete):
        self.launchers = launchers
        """The key's learnt launchers: :meth:`EagerLaunches.learn` appends to this same list."""
        self.grid = grid
        self.device = device
        self.config = config
        """The Config in force when the key was made: its keywords (``extern_libs``: the support
        library, built with the Config's timeouts) may differ under another."""
        self.complete = complete
        """The runtime arguments with the kernel's left-out trailing defaults appended
        (:meth:`EagerLaunches._complete`): the C++ launcher takes every one, and a plan may leave
        the GEMM's optional epilogue operands out (AllGather+GEMM's consumer)."""

    def current(self) -> bool:
        """Whether the Config it was prepared under is still the one in force."""
        return _config._current is self.config

    def stream(self) -> int | None:
        """The current stream, or None when a launch must take Triton's path: a launch hook is
        installed, the Config is another, or the current device is another."""
        if _launch_hooked() or _config._current is not self.config:
            return None
        # _device_and_stream inlined: every replayed eager call asks (issue 21), and the extra
        # Python call and tuple cost 0.1 of the 0.64 µs a bound launch takes in Python here.
        torch_c = _torch_c
        if torch_c is None:  # the first launch binds it
            device, stream = _device_and_stream()
            return stream if device == self.device else None
        device = torch_c._cuda_getDevice()
        return torch_c._cuda_getCurrentRawStream(device) if device == self.device else None

    def launch(self, args) -> bool:
        """Launch with the runtime arguments ``args`` (by position; left-out trailing defaults
        are appended) on the current stream; False (nothing launched) when the current device is
        another, a launch hook is installed, the Config is another, or no learnt variant takes
        them: the caller then takes Triton's path."""
        stream = self.stream()
        if stream is None:
            return False
        gx, gy, gz = self.grid
        args = self.complete(args)
        for launcher in self.launchers:
            if launcher.launch(gx, gy, gz, stream, *args):
                return True
        return False

    def bind(self, args, slots, arity: int) -> BoundLaunch:
        """This launch with every runtime argument but a call's ``arity`` tensors fixed: ``args``
        (by position; the slots' entries are placeholders), ``slots`` ``(argument, tensor index,
        descriptor block or None)`` each."""
        return BoundLaunch(self, tuple(self.complete(args)), tuple(slots), arity)


class BoundLaunch:
    """A :class:`PreparedLaunch` with its fixed arguments classified once in C++
    (``_C.KernelLauncher.bind``): a call passes only its tensors, which C++ classifies and puts into
    their slots. What a :class:`~triton_dist.kernels.common.launch_plan.LaunchPlan` launches again
    and again: its context's buffers and integers are the same every call, and classifying a
    tensor costs two Python attribute lookups and a call (``dtype``, ``data_ptr()``)."""

    __slots__ = ("prepared", "args", "slots", "arity", "_bound", "_learnt")

    def __init__(self, prepared: PreparedLaunch, args: tuple, slots: tuple, arity: int):
        self.prepared = prepared
        self.args, self.slots, self.arity = args, slots, arity
        self._bound: list = []
        self._learnt = 0
        """How many of the prepared launch's learnt variants are bound (it learns more later)."""

    def _bind_learnt(self) -> None:
        """Bind the variants the prepared launch learnt since the last call."""
        launchers = self.prepared.launchers
        gx, gy, gz = self.prepared.grid
        for launcher in launchers[self._learnt:]:
            self._learnt += 1  # first: a bind that raises is not bound, nor tried again
            bound = launcher.bind(gx, gy, gz, self.args, self.slots, self.arity)
            if bound is not None:
                self._bound.append(bound)

    def launch(self, tensors: tuple) -> bool:
        """Launch with the call's ``tensors`` on the current stream; False (nothing launched) when
        the prepared launch would decline (:meth:`PreparedLaunch.stream`) or no bound variant
        takes them."""
        prepared = self.prepared
        stream = prepared.stream()
        if stream is None:
            return False
        if self._learnt != len(prepared.launchers):
            self._bind_learnt()
        for bound in self._bound:
            if bound.launch(stream, *tensors):
                return True
        return False


_C_KINDS = frozenset(("i1", "u1", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "fp32", "fp64"))
"""Scalar kinds _C.KernelLauncher passes (tdist::param_kind_of)."""


def launchable(metadata, tensor_descriptors: bool = False) -> bool:
    """Whether a compiled variant (its ``metadata``) can be launched from C++: it must need no
    per-launch scratch memory and no clusters, which only Triton's launcher provides, and take
    tensor descriptors only where ``tensor_descriptors`` and every one was lowered to TMA."""
    md = metadata
    if md.global_scratch_size or md.profile_scratch_size or getattr(md, "num_ctas", 1) != 1:
        return False
    descriptors = getattr(md, "tensordesc_meta", None)
    return not descriptors or (tensor_descriptors and all(d is not None for d in descriptors))


TMA_DTYPE_DEVICE_TO_HOST = {**{i: i for i in range(16)}, 8: 10, 9: 8, 10: 9}
"""Triton's ``tensordesc_meta`` names element types by the device-side enum; cuTensorMapEncodeTiled
takes the host's ``CUtensorMapDataType``, which numbers three of them differently (Triton's
launcher maps them the same way)."""


def tensor_map_rule(descriptor, meta: dict) -> tuple:
    """``(block_shape, element_type, element_bytes, swizzle, box, fp4_padded)``: what
    ``_C.KernelLauncher`` needs to encode a descriptor argument the way Triton's launcher does, from
    the call's ``descriptor`` (its block shape: Triton's variant is per block) and the variant's
    ``tensordesc_meta`` entry ``meta``."""
    return (list(descriptor.block_shape), TMA_DTYPE_DEVICE_TO_HOST[meta["elem_type"]], meta["elem_size"],
            meta["swizzle"], list(meta["block_size"]), bool(meta["fp4_padded"]))


@dataclasses.dataclass(frozen=True)
class ArgumentRules:
    """A variant's rules for its runtime arguments, one entry per argument in the kernel's order:
    what ``tdist::KernelLauncher`` checks each value against (see the module notes). Shared with
    :mod:`triton_dist.tools.prebuild`, which writes them into a prebuilt kernel's manifest."""

    types: list
    """Triton's kind of each argument (``"*bf16"``, ``"i32"``, ``"constexpr"`` when folded)."""
    divisible: list
    """Whether the variant assumed the argument divisible by 16 (pointers: 16-byte aligned)."""
    constants: list
    """The value a folded argument was compiled with (0 for the others and for None)."""
    is_none: list
    """Whether a folded argument was None."""
    dtypes: list
    """The element type of each pointer argument's tensor, and of a descriptor's base (None for
    the others)."""
    tensor_maps: list = dataclasses.field(default_factory=list)
    """Per argument, None or a tensor descriptor's :func:`tensor_map_rule`."""


def argument_rules(runtime_params, specialization, args: tuple, tensordesc_meta=None) -> ArgumentRules | None:
    """The rules of the variant Triton's binder specialised ``args`` into (``specialization``:
    one ``(kind, attribute)`` per parameter, from the binder of the kernel's ``runtime_params``
    and constexprs), or None when an argument is of a kind the C++ launcher does not pass: tensor
    descriptors only with the variant's ``tensordesc_meta`` (one entry per descriptor, in order)."""
    rules = ArgumentRules([], [], [], [], [])
    descriptors = iter(tensordesc_meta or ())
    for param, arg in zip(runtime_params, args):
        kind, attr = specialization[param.num]
        if isinstance(kind, str) and kind.startswith("tensordesc") and tensordesc_meta:
            meta = next(descriptors, None)
            if meta is None:
                return None
            rules.types.append(kind)
            rules.divisible.append(False)
            rules.constants.append(0)
            rules.is_none.append(False)
            rules.dtypes.append(arg.base.dtype)
            rules.tensor_maps.append(tensor_map_rule(arg, meta))
            continue
        rules.tensor_maps.append(None)
        if not isinstance(kind, str) or kind.startswith("tensordesc") or kind == "nvTmaDesc":
            return None
        if kind == "constexpr":
            if arg is not None and (isinstance(arg, bool) or not isinstance(arg, int)):
                return None
            rules.constants.append(0 if arg is None else arg)
            rules.is_none.append(arg is None)
        else:
            if kind[0] != "*" and kind not in _C_KINDS:
                return None
            rules.constants.append(0)
            rules.is_none.append(False)
        rules.types.append(kind)
        rules.divisible.append(attr == "D")
        rules.dtypes.append(arg.dtype if kind[0] == "*" else None)
    if next(descriptors, None) is not None:
        return None  # more descriptor entries than descriptor arguments: not the layout this expects
    return rules
