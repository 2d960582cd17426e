"""One kernel launch of a collective call with every argument fixed but the call's input and
output: what a context's ``run`` launches for its one-kernel methods, and what
:mod:`triton_dist.eager_calls` replays for a repeated op call.

Why: a one-kernel method's arguments other than ``x`` and ``out`` (the context's buffers, its
signal pad and call counter, the element count, the grid and constexprs) depend only on the
element count and the method, so they are worked out once per ``(n, method)``; and the plan keeps
its kernel's learnt C++ launchers (:meth:`triton_dist.eager_launch.EagerLaunches.prepare`), so a
launch is one C++ call without the keyword hashing and lookups of ``kernel[grid](...)``. Nothing
of the call is on the host: the kernel reads its epoch from the device-side call counter and
advances it (:mod:`~triton_dist.kernels.common.call_counter`), so a plan launched again is a new
call.
"""

from __future__ import annotations


class _Slot:
    """A placeholder in a plan's arguments for what each launch passes."""

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return self.name.upper()


X = _Slot("x")
"""The call's input, in a :class:`LaunchPlan`'s arguments."""
OUT = _Slot("out")
"""The call's output, in a :class:`LaunchPlan`'s arguments."""


class LaunchPlan:
    """``kernel[grid](*args, **meta)`` with :data:`X` and :data:`OUT` in ``args`` replaced by each
    launch's tensors (each must appear exactly once)."""

    __slots__ = ("kernel", "grid", "args", "meta", "_x_at", "_out_at", "_prepared")

    def __init__(self, kernel, grid: tuple, args: tuple, meta: dict):
        self.kernel = kernel
        self.grid = tuple(grid)
        self.args = list(args)
        self.meta = meta
        x_at = [i for i, a in enumerate(args) if a is X]
        out_at = [i for i, a in enumerate(args) if a is OUT]
        if len(x_at) != 1 or len(out_at) != 1:
            raise ValueError(f"triton_dist LaunchPlan of {kernel!r}: X and OUT must each appear once in the "
                             f"arguments, got {args!r}")
        self._x_at, self._out_at = x_at[0], out_at[0]
        self._prepared = None

    def launch(self, x, out) -> None:
        """Launch on the current stream with ``x`` and ``out`` (tensors of the context's dtype)."""
        args = self.args.copy()
        args[self._x_at] = x
        args[self._out_at] = out
        prepared = self._prepared
        if prepared and prepared.launch(args):
            return
        # Triton's path: the first launch, another device, a launch hook, another Config, or a
        # variant not yet learnt. It learns the variant, which the prepared launch (sharing the
        # learnt list) then takes; one prepared under another Config is prepared again.
        self.kernel.run(*args, grid=self.grid, **self.meta)
        if prepared is None or (prepared and not prepared.current()):
            self._prepared = self.kernel.prepare(self.grid, self.meta) or False  # False: never launchable from C++

    def __repr__(self) -> str:
        return f"LaunchPlan({self.kernel!r}, grid={self.grid}, args={self.args!r})"
