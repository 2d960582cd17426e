"""What every collective's context holds: symmetric buffers split in two halves, a signal pad, a
device-side call counter, and the grid limits its kernels obey.

The call counter lives on the GPU and advances by one per call in stream order: a method of one
kernel reads one past it as its epoch, and the last of its programs to enter advances it; a
method of several first bumps it with a one-thread kernel on the caller's stream, and its kernels
read the bumped value (:mod:`~triton_dist.kernels.common.call_counter`). Signals are set to the
epoch and waited for with ``>=``, buffers alternate halves by its parity. Both are stream
operations, so a CUDA graph that captured a call replays with a fresh epoch every time, which a
host-side counter baked into the captured launch could not give.

Why parity halves are enough: a rank cannot start call ``e + 2`` before it finished call ``e + 1``,
which needs a signal from every peer's call ``e + 1``, sent only after that peer's call ``e``
finished (calls on one stream run in order). So the half written in call ``e + 2`` is never one a
peer still reads for call ``e``.
"""

from __future__ import annotations

from ... import parallel_compile as _parallel_compile
from ... import residency as _residency
from ... import runtime as _runtime
from ...signals import SignalPad
from ...symmetric import symm_empty
from . import call_counter as _call_counter
from . import reach as _reach
from .launch_plan import OUT, X, LaunchPlan, PlanCache
from .ll_protocol import LL_BLOCK
from .host_math import cdiv

DTYPES = ("float32", "bfloat16", "float16")
MAX_NUMEL = 2**31 // 4  # element counts reach the kernels as 32-bit ints


def smallest_on_any_rank(*values: int) -> tuple[int, ...]:
    """Each of ``values``, the smallest any rank passed (collective)."""
    if _runtime.world_size() == 1:
        return values
    import torch.distributed as dist

    every: list = [None] * _runtime.world_size()
    dist.all_gather_object(every, tuple(int(v) for v in values), group=_runtime.process_group())
    return tuple(min(column) for column in zip(*every))


class OneRankCopy:
    """A collective's whole call at one rank, ``out = x``, as a plan of two tensors: what the
    collectives' ``run`` returns there, so that :mod:`triton_dist.eager_calls` replays a repeated
    call (a copy) without the op's full path (issue 21: that path cost 20-25 µs of host time at
    one rank, bench/results/h200-x1/host_overhead.json, around a copy of 7.8)."""

    __slots__ = ()
    arity = 2

    def launch(self, x, out) -> None:
        """``out = x`` on the current stream (nothing when they alias)."""
        if out.data_ptr() != x.data_ptr():
            out.copy_(x)

    def __repr__(self) -> str:
        return "OneRankCopy()"


ONE_RANK_COPY = OneRankCopy()


class CollectiveContext:
    """Base of the collectives' contexts. Collective to create: every rank, same arguments, same
    order as its other symmetric allocations.

    ``max_numel``: the largest input (elements) a call may take. ``buffers``: name -> elements per
    half; each becomes a symmetric tensor of ``2 *`` that many elements of ``dtype`` (attribute of
    that name). ``signals_per_program``: signals each program slot needs in the pad.
    """

    BLOCK = 2048
    NUM_WARPS = 8
    DEFAULT_MAX_PROGRAMS = 128

    eager_plans = None
    """The ops' recorded calls made with this context (:class:`triton_dist.eager_calls.ContextPlans`),
    replayed by later calls like them; set by the first."""

    def __init__(self, op: str, dtype, max_numel: int, buffers: dict[str, int], signals_per_program: int,
                 max_programs: int | None = None):
        _runtime._require_initialized(op)
        import torch

        self.op = op
        if not isinstance(dtype, torch.dtype) or str(dtype).replace("torch.", "") not in DTYPES:
            raise TypeError(f"triton_dist {op}: dtype must be one of torch.float32, torch.bfloat16, torch.float16, "
                            f"got {dtype!r}")
        if isinstance(max_numel, bool) or not isinstance(max_numel, int) or max_numel <= 0:
            raise ValueError(f"triton_dist {op}: the maximum size must be a positive number of elements, got "
                             f"{max_numel!r}")
        if max_numel >= MAX_NUMEL:
            raise ValueError(f"triton_dist {op}: {max_numel} elements is too large (at most {MAX_NUMEL - 1}; "
                             f"element counts are 32-bit kernel arguments): split the tensor")
        if max_programs is None:
            max_programs = self.DEFAULT_MAX_PROGRAMS
        if isinstance(max_programs, bool) or not isinstance(max_programs, int) or max_programs <= 0:
            raise ValueError(f"triton_dist {op}: max_programs must be a positive int, got {max_programs!r}")
        self.dtype = dtype
        self.world = _runtime.world_size()
        self.rank = _runtime.rank()
        self.unmapped = _reach.unmapped_ranks()
        """Ranks whose memory this process cannot map (other hosts; :mod:`.reach`)."""
        self.max_numel = max_numel
        self.max_bytes = max_numel * dtype.itemsize
        device = torch.device("cuda", torch.cuda.current_device())
        # Every program of a grid must be resident at once (programs spin on their peers'
        # programs), so never more programs than this process's SMs (triton_dist.residency).
        # The grid and the pad's layout (max_programs) must be the same on every rank, and ranks
        # may see different SM counts (MPS shares, mixed GPUs): every rank takes the smallest.
        self.max_programs, self.copy_wait_programs = smallest_on_any_rank(
            min(max_programs, _residency.max_waiting_programs(device, what=op)),
            min(max_programs, _residency.max_waiting_programs(device, what=op, waits_for_copies=True)))
        self.copy_wait_programs = min(self.copy_wait_programs, self.max_programs)
        """The grid limit of kernels that wait for copies into this GPU (fewer when ranks share it)."""
        self.halves = {}
        for name, elements in buffers.items():
            half = cdiv(max(elements, 1), self.BLOCK) * self.BLOCK
            self.halves[name] = half
            setattr(self, name, symm_empty((2 * half, ), dtype))
        self.pad = SignalPad(max(1, signals_per_program * self.max_programs), owner=op)
        self._launch_plans = PlanCache(256)
        """(n, method) -> :class:`LaunchPlan` (:meth:`launch_plan`)."""
        self.calls = torch.zeros(2, dtype=torch.int64, device=device)
        """The device-side call counter: the epoch of the latest call, then the count of a one-kernel
        call's programs that have entered it, 0 between calls
        (:mod:`~triton_dist.kernels.common.call_counter`). A context's calls run on one stream at a
        time (as every collective's must, in the same order on every rank)."""

    @staticmethod
    def numel_and_world(op: str, max_bytes: int, dtype) -> tuple[int, int]:
        """``(max_numel, world)`` for a context sized in bytes: ``max_bytes`` checked, as elements of
        ``dtype`` (at least one), and the world size (1 before ``init``: the constructor then raises
        the uninitialised-runtime error, and a bad ``dtype`` its own)."""
        import torch

        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes <= 0:
            raise ValueError(f"triton_dist {op}: max_bytes must be a positive int, got {max_bytes!r}")
        itemsize = dtype.itemsize if isinstance(dtype, torch.dtype) else 1
        return max(1, max_bytes // itemsize), _runtime.world_size() if _runtime.is_initialized() else 1

    def ll_plan(self, kernel, n: int, meta: dict) -> LaunchPlan:
        """An LL kernel (:mod:`~triton_dist.kernels.common.ll_protocol`) over ``n`` elements of the
        input as 4-byte words, one program per ``LL_BLOCK`` words up to the co-resident limit:
        ``kernel(x, out, self.ll, n, words, self.calls, **meta)``, the call's only kernel (it
        advances the call counter itself)."""
        words = cdiv(n * self.dtype.itemsize, 4)
        return LaunchPlan(kernel, self.grid(cdiv(words, LL_BLOCK)), (X, OUT, self.ll, n, words, self.calls), meta)

    @staticmethod
    def aligned(x, out):
        """``(x, target)``: ``x``, cloned if misaligned, and ``out``, or if misaligned a new tensor
        like it to write instead (copy it into ``out`` afterwards). The preloaded variants assume
        16-byte aligned pointers: a misaligned tensor would compile and load another variant here,
        possibly while a peer spins."""
        if x.data_ptr() % 16:
            x = x.clone()
        return x, (out if out.data_ptr() % 16 == 0 else out.new_empty(out.shape))

    def launch_aligned(self, n: int, method: str, x, out) -> LaunchPlan:
        """Launch :meth:`launch_plan`'s plan on :meth:`aligned` tensors; returns the plan."""
        x, target = self.aligned(x, out)
        plan = self.launch_plan(n, method)
        plan.launch(x, target)
        if target is not out:
            out.copy_(target)
        return plan

    def launch_plan(self, n: int, method: str) -> LaunchPlan | None:
        """The one kernel launch of a call on ``n > 0`` elements by ``method`` (resolved, never
        ``"auto"``), made once per ``(n, method)``; None for a method of several launches or of
        host work, and with one rank (a copy, not a kernel). The caller has checked ``n`` and
        ``method`` as ``run`` does."""
        if self.world == 1:
            return None
        return self._launch_plans.get((n, method), lambda: self._make_launch_plan(n, method))

    def _make_launch_plan(self, n: int, method: str) -> LaunchPlan | None:
        """:meth:`launch_plan`'s plan, uncached. Subclasses."""
        return None

    def ran_on_one_rank(self, x, out) -> OneRankCopy | None:
        """With one rank a collective's result is its input: ``out = x`` (nothing to do when they
        alias), and the protocol is not run; returns :data:`ONE_RANK_COPY` then (what ``run``
        returns, for :mod:`triton_dist.eager_calls`), else None."""
        if self.world != 1:
            return None
        ONE_RANK_COPY.launch(x, out)
        return ONE_RANK_COPY

    def ready(self) -> None:
        """End of construction: compile (in parallel, once per node: :mod:`triton_dist.parallel_compile`)
        and load the kernels (:meth:`preload`), then make sure every rank's pad is zeroed before any
        rank's first call can signal it."""
        import torch

        if self.world > 1:
            _call_counter.preload(self.calls)
            _parallel_compile.preload_in_parallel(self.preload)
        torch.cuda.synchronize()
        _runtime.barrier()

    def preload(self) -> None:
        """Compile and load every kernel with the specialisation of real calls. Subclasses."""
        raise NotImplementedError

    def next_call(self):
        """Bump the call counter on the current stream; returns it (the kernels' ``epoch_ptr``)."""
        return _call_counter.bump(self.calls)

    def grid(self, tiles: int, waits_for_copies: bool = False) -> tuple[int]:
        """One program per tile, at most the co-resident limit (:mod:`triton_dist.residency`)."""
        limit = self.copy_wait_programs if waits_for_copies else self.max_programs
        return (max(1, min(tiles, limit)), )

    def meta(self, **extra) -> dict:
        """The launch keywords every collective kernel of the context takes (constexprs, the signal
        layout's stride ``max_programs``, an argument given by name, and warps), plus ``extra``."""
        return dict(WORLD=self.world, max_programs=self.max_programs, BLOCK=self.BLOCK, num_warps=self.NUM_WARPS,
                    **extra)
