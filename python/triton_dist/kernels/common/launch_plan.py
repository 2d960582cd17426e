"""Kernel launches of a call with every argument fixed but the call's tensors: what a context's
``run`` launches for its one-kernel methods (and gemm_ar's bump and split-K kernel), and what
:mod:`triton_dist.eager_calls` replays for a repeated op call.

Why: such a launch's arguments other than the call's tensors (the context's buffers, its signal
pad and call counter, the element count, the grid and constexprs) depend only on the call's sizes
and method, so they are worked out once; and the plan keeps its kernel's learnt C++ launchers
(:meth:`triton_dist.eager_launch.EagerLaunches.prepare`), so a launch is one C++ call without the
keyword hashing and lookups of ``kernel[grid](...)``. Nothing of the call is on the host: the
kernels read their epoch from the device-side call counter
(:mod:`~triton_dist.kernels.common.call_counter`), so a plan launched again is a new call.
"""

from __future__ import annotations


class Slot:
    """A placeholder in a plan's arguments for the ``index``-th tensor of each launch, or with
    ``block`` for a host TMA descriptor of it with that block shape."""

    __slots__ = ("index", "name", "block")

    def __init__(self, index: int, name: str, block: tuple | None = None):
        self.index, self.name = index, name
        self.block = None if block is None else list(block)

    def __repr__(self) -> str:
        return self.name.upper() if self.block is None else f"desc({self.name.upper()}, {self.block})"


X = Slot(0, "x")
"""A collective call's input, in a :class:`LaunchPlan`'s arguments."""
OUT = Slot(1, "out")
"""A collective call's output, in a :class:`LaunchPlan`'s arguments."""


def _descriptor(tensor, block: list):
    from triton.tools.tensor_descriptor import TensorDescriptor

    return TensorDescriptor.from_tensor(tensor, block)


def _plain_tma_operand(tensor) -> bool:
    """Whether TMA takes ``tensor`` as it is, checked without making a descriptor: contiguous, not
    empty, 16-byte aligned base and rows (the rows' stride is a multiple of the last size)."""
    return (tensor.is_contiguous() and tensor.numel() > 0 and tensor.data_ptr() % 16 == 0
            and tensor.shape[-1] * tensor.element_size() % 16 == 0)


def _check_tma_operand(tensor, block: list) -> None:
    """Raise what ``TensorDescriptor.from_tensor(tensor, block)`` raises, making one only for an
    operand that is not plain (:func:`_plain_tma_operand`)."""
    if not _plain_tma_operand(tensor):
        _descriptor(tensor, block)


class LaunchPlan:
    """``kernel[grid](*args, **named, **meta)`` with each :class:`Slot` in ``args`` and ``named``
    replaced by its tensor of the launch (or that tensor's descriptor: the prepared C++ launch takes
    a ``(tensor, block)`` pair and encodes the tensor map itself, as making a Triton
    ``TensorDescriptor`` costs 3 µs of host time; Triton's path gets the descriptor). The slots' indices are ``0
    .. k - 1``, each used; or, with ``arity``, any below it (a plan of a :class:`LaunchSequence`
    that leaves some of the call's tensors to another). ``named``: runtime arguments that come
    after a constexpr in the kernel's signature (the GEMMs' epilogue operands), which Triton takes
    only by name; ``kernel`` must then be a :func:`triton_dist.jit` kernel (its parameters say
    where each goes)."""

    __slots__ = ("kernel", "grid", "args", "meta", "arity", "_slots", "_prepared", "_bound", "_named", "_tma")

    def __init__(self, kernel, grid: tuple, args: tuple, meta: dict, arity: int | None = None,
                 named: dict | None = None):
        self.kernel = kernel
        self.grid = tuple(grid)
        # A context's meta may hold runtime parameters after the constexprs (the collectives' signal
        # layout: max_programs, ready, ...): they are per-plan arguments, named, not launch options.
        fn = getattr(kernel, "fn", None)
        runtime = {q.name for q in getattr(fn, "params", ()) if not q.is_constexpr}
        if runtime.intersection(meta):
            named = {**(named or {}), **{k: v for k, v in meta.items() if k in runtime}}
            meta = {k: v for k, v in meta.items() if k not in runtime}
        self._named = [] if not named else _trailing_names(kernel, len(args), named)
        """The runtime parameters after ``args``, in the kernel's order: what :meth:`arguments`
        appends (each from ``named``, else its default), by name on Triton's path."""
        if named:
            args = (*args, *(named.get(name, default) for name, default in self._named))
        self.args = list(args)
        self.meta = meta
        self._slots = [(at, a) for at, a in enumerate(args) if isinstance(a, Slot)]
        self._tma = [(at, slot) for at, slot in self._slots if slot.block is not None]
        used = sorted({slot.index for _, slot in self._slots})
        if used != list(range(len(used))) if arity is None else any(not 0 <= i < arity for i in used):
            raise ValueError(f"triton_dist LaunchPlan of {kernel!r}: the slots' indices must be 0 .. k - 1, each "
                             f"used, or below arity={arity}; got {args!r}")
        self.arity = len(used) if arity is None else arity
        """How many tensors :meth:`launch` takes."""
        self._prepared = None
        self._bound = None
        """The prepared launch bound to the fixed arguments (:class:`~triton_dist.eager_launch.BoundLaunch`):
        a launch from C++ that classifies only the call's tensors; None until prepared, False when
        the kernel can never launch from C++."""

    def launch(self, *tensors) -> None:
        """Launch on the current stream with ``tensors`` (:attr:`arity` of them) in the slots."""
        bound = self._bound
        if bound and bound.launch(tensors):
            return
        self.launch_arguments(self.arguments(*tensors))

    def arguments(self, *tensors) -> list:
        """The launch's arguments: ``args`` with ``tensors`` (:attr:`arity` of them) in the slots,
        a descriptor slot's as a ``(tensor, block)`` pair (:meth:`launch_arguments` makes the
        descriptor where Triton's path needs it)."""
        if len(tensors) != self.arity:
            raise ValueError(f"triton_dist LaunchPlan of {self.kernel!r}: {len(tensors)} tensors for {self.arity} "
                             f"slots")
        args = self.args.copy()
        for at, slot in self._slots:
            t = tensors[slot.index]
            args[at] = t if slot.block is None else (t, slot.block)
        return args

    def check_operands(self, args: list) -> None:
        """Raise, before anything launches, for a descriptor slot's tensor (in :meth:`arguments`'
        result) that TMA cannot take."""
        for at, _ in self._tma:
            _check_tma_operand(*args[at])

    def launch_arguments(self, args: list) -> None:
        """Launch on the current stream with :meth:`arguments`' result."""
        prepared = self._prepared
        if prepared and prepared.launch(args):
            return
        # Triton's path: the first launch, another device, a launch hook, another Config, or a
        # variant not yet learnt (or a tensor the C++ launcher's TMA checks refused: Triton's
        # descriptor raises for it). It learns the variant, which the prepared launch (sharing
        # the learnt list) then takes; one prepared under another Config is prepared again.
        for at, _ in self._tma:
            args[at] = _descriptor(*args[at])
        if self._named:
            leading = len(args) - len(self._named)
            by_name = {name: value for (name, _), value in zip(self._named, args[leading:])}
            self.kernel.run(*args[:leading], grid=self.grid, **by_name, **self.meta)
        else:
            self.kernel.run(*args, grid=self.grid, **self.meta)
        if prepared is None or (prepared and not prepared.current()):
            prepared = self._prepared = self.kernel.prepare(self.grid, self.meta) or False  # False: never from C++
            self._bound = prepared and prepared.bind(self.args, [(at, slot.index, slot.block) for at, slot in self._slots],
                                                     self.arity)

    def __repr__(self) -> str:
        return f"LaunchPlan({self.kernel!r}, grid={self.grid}, args={self.args!r})"


def _trailing_names(kernel, leading: int, named: dict) -> list[tuple[str, object]]:
    """``(name, default)`` of ``kernel``'s runtime parameters after its first ``leading`` ones, up
    to the last one ``named`` gives (later ones keep their defaults: the launchers complete them);
    raises for a name that is no such parameter or one without a default left out."""
    params = [p for p in kernel.fn.params if not p.is_constexpr][leading:]
    unknown = set(named) - {p.name for p in params}
    if unknown:
        raise ValueError(f"triton_dist LaunchPlan of {kernel!r}: {sorted(unknown)} are not runtime parameters after "
                         f"its first {leading}")
    last = max(i for i, p in enumerate(params) if p.name in named)
    missing = [p.name for p in params[:last + 1] if p.name not in named and not p.has_default]
    if missing:
        raise ValueError(f"triton_dist LaunchPlan of {kernel!r}: {missing} have no default and are not named")
    return [(p.name, p.default if p.has_default else None) for p in params[:last + 1]]


class LaunchSequence:
    """Plans launched one after another on the current stream, each with the same tensors (a call
    of several kernels, such as a bump and its GEMM)."""

    __slots__ = ("plans", "arity")

    def __init__(self, *plans: LaunchPlan):
        self.plans = plans
        self.arity = max(plan.arity for plan in plans)
        """How many tensors :meth:`launch` takes (each plan the first ``plan.arity`` of them)."""

    def launch(self, *tensors) -> None:
        """Each plan's launch with the first ``arity`` of ``tensors``, every plan's arguments made
        and TMA operands checked before the first launch: a bad tensor must raise before a bump
        has advanced this rank's call counter alone, which would leave its epochs off its peers'."""
        if len(tensors) != self.arity:
            raise ValueError(f"triton_dist LaunchSequence: {len(tensors)} tensors for {self.arity}")
        if len(self.plans) == 1:  # nothing launches before its own checks: its bound launch may take it
            plan = self.plans[0]
            plan.launch(*tensors[:plan.arity])
            return
        resolved = [(plan, plan.arguments(*tensors[:plan.arity])) for plan in self.plans]
        for plan, args in resolved[1:]:  # the first plan's own launch raises before launching anything
            plan.check_operands(args)
        for plan, args in resolved:
            plan.launch_arguments(args)


class PlanCache:
    """A context's plans by the sizes of a call, each made once; past ``limit`` of them all are
    forgotten (a caller of ever new shapes must not grow it without bound)."""

    __slots__ = ("_plans", "limit")

    def __init__(self, limit: int = 64):
        self._plans: dict = {}
        self.limit = limit

    def get(self, key, make):
        """The plan kept under ``key``, else ``make()``'s, kept unless it is None."""
        plan = self._plans.get(key)
        if plan is None:
            plan = make()
            if plan is not None:
                if len(self._plans) >= self.limit:
                    self._plans.clear()
                self._plans[key] = plan
        return plan

    def __len__(self) -> int:
        return len(self._plans)
