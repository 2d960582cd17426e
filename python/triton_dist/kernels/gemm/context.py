"""The base of every overlapped-GEMM context (AllGather+GEMM, GEMM+ReduceScatter, GEMM+AllReduce
and the grouped ones of :mod:`triton_dist.kernels.moe`): the constructor checks they share, the
rank facts, the SM count grids are sized from, the device call counter, and the end of
construction (parallel compile of :meth:`preload`, then a barrier, so that every rank's signals are
zeroed before any rank's first call can write them)."""

from __future__ import annotations

from ... import parallel_compile as _parallel_compile
from ... import runtime as _runtime
from . import dense as _gemm
from ..common import reach as _reach
from ..common.context import smallest_on_any_rank


class OverlappedGemmContext:
    """Collective to create: every rank, same arguments, same order as its other symmetric
    allocations. Subclasses allocate their buffers, then call :meth:`ready`.

    ``op``: the class name errors carry. ``aligned``: which of ``sizes`` is a row length that TMA
    or 16-byte vectors read (a multiple of 8); every size must be a positive int.
    ``protocol_on_one_rank``: with a single rank, still run the overlapped protocol (instead of the
    plain GEMM) so that one GPU can test it.
    """

    METHODS: tuple[str, ...] = ()
    """``method=`` values :meth:`check_method` accepts (subclasses with several methods)."""

    eager_plans = None
    """The ops' recorded calls made with this context (:class:`triton_dist.eager_calls.ContextPlans`),
    replayed by later calls like them; set by the first."""

    def __init__(self, op: str, dtype, *, aligned: str, protocol_on_one_rank: bool = False, **sizes):
        _runtime._require_initialized(op)
        import torch

        _check_sizes(op, dtype, aligned, sizes)
        self.op = op
        self.world = _runtime.world_size()
        self.rank = _runtime.rank()
        self.unmapped = _reach.unmapped_ranks()
        """Ranks whose memory this process cannot map (other hosts; :mod:`~triton_dist.kernels.common.reach`)."""
        self.dtype = dtype
        self.device = torch.device("cuda", torch.cuda.current_device())
        # The GEMM config, and with it the tile -> signal layout the ranks share, is picked from
        # this, and ranks may see different SM counts (MPS shares, mixed GPUs): every rank takes
        # the smallest, as the collectives' grids do (collective, like the allocations).
        self.num_sms, = smallest_on_any_rank(_gemm.num_sms(self.device))
        self.calls = torch.zeros(2, dtype=torch.int64, device=self.device)
        """The device-side call counter (this call's epoch once bumped); the second element is
        :func:`~triton_dist.kernels.common.call_counter.enter_call`'s count, for a method whose
        first kernel takes its epoch itself (AllGather+GEMM's ``"sm_push_inline"``)."""
        self._protocol = self.world > 1 or bool(protocol_on_one_rank)

    def ready(self) -> None:
        """End of construction: compile and load the kernels once per node in parallel (when the
        protocol runs), then synchronise and barrier."""
        import torch

        if self._protocol:
            _parallel_compile.preload_in_parallel(self.preload)
        torch.cuda.synchronize()
        _runtime.barrier()

    def preload(self) -> None:
        """Compile and load every kernel with the specialisation of real calls. Subclasses."""
        raise NotImplementedError

    def check_method(self, method: str) -> None:
        """A clear error for a ``method`` outside :attr:`METHODS`."""
        if method not in self.METHODS:
            raise ValueError(f"triton_dist {self.op}.run: method must be one of {self.METHODS}, got {method!r}")

    def plain_gemm(self, a, b, out):
        """Without the protocol (one rank), ``out = a @ b.T`` by the plain GEMM: returns its
        launched :class:`~triton_dist.kernels.gemm.plain_plan.PlainGemmPlan` (the call's launch,
        which :mod:`triton_dist.eager_calls` replays), or None; with the protocol nothing runs and
        it returns False."""
        if self._protocol:
            return False
        return _gemm.launch_gemm(a, b, out)[1]


def _check_sizes(op: str, dtype, aligned: str, sizes: dict) -> None:
    import torch

    for name, v in sizes.items():
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ValueError(f"triton_dist {op}: {name} must be a positive int, got {v!r}")
    if dtype not in (torch.bfloat16, torch.float16):
        raise TypeError(f"triton_dist {op}: dtype must be torch.bfloat16 or torch.float16, got {dtype!r}")
    if sizes[aligned] % 8:
        raise ValueError(f"triton_dist {op}: {aligned} ({sizes[aligned]}) must be a multiple of 8 (16-byte aligned "
                         f"rows)")
