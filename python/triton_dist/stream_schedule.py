"""StreamSchedule: a copy-engine protocol's stream operations, recorded once and enqueued per call.

A copy-engine producer enqueues a few operations per chunk and destination (wait for the tile's
flag, reset it, copy, publish the peer's flag). Issued one by one from Python they cost
GEMM+ReduceScatter's ``"fused_ce"`` more host time per call than the GEMM takes at small M (2x
H200, eager timings in ``bench/results/h200-x2/gemm_rs.json``). The
operations' addresses and values are fixed per shape (the protocols use 0/1 flags for exactly
this reason: a CUDA graph replays them unchanged too), so a context records them once per shape
and :meth:`StreamSchedule.enqueue` hands them to the C++ core in one call, which merges
consecutive waits and writes into one ``cuStreamBatchMemOp`` and, with
``Config.stream_schedule_graphs``, from three driver calls launches them as one CUDA graph per
stream, captured at its first enqueue (csrc/include/tdist/stream_schedule.h says why it is off by
default).

Example (a chunked push to a peer, each chunk published by a flag)::

    s = StreamSchedule()
    for c in range(chunks):
        s.wait(my_tile_flags, c, 1).write(my_tile_flags, c, 0)
        s.copy(peer_rows[c], my_rows[c]).write(peer_ready, c, 1)
    s.enqueue(side_stream)          # every call; the tensors must outlive the schedule
"""

from __future__ import annotations

from .runtime import _core
from .signals import copy_2d_geometry, u64_address


class StreamSchedule:
    """Stream operations in order: :meth:`wait`, :meth:`write`, :meth:`copy`, :meth:`copy_2d`,
    each with the semantics of its one-shot counterpart in :mod:`triton_dist.signals`. Records raw
    addresses: the tensors must outlive the schedule (contexts keep both)."""

    def __init__(self, as_graph: bool | None = None):
        """``as_graph``: enqueue as one CUDA-graph launch (see :meth:`enqueue`); None takes
        ``Config.stream_schedule_graphs``."""
        from . import config

        self._schedule = _core().StreamSchedule()
        self._as_graph = config.get().stream_schedule_graphs if as_graph is None else bool(as_graph)

    def wait(self, signals, index: int, value: int, cmp: str = "ge") -> "StreamSchedule":
        """Hold the stream until ``signals[index] >= value`` (``cmp="ge"``) or ``== value`` (``"eq"``)."""
        from .signals import _equal

        equal = _equal(cmp, "StreamSchedule.wait")
        self._schedule.wait_value64(u64_address(signals, index, "StreamSchedule.wait"), value, equal)
        return self

    def write(self, signals, index: int, value: int) -> "StreamSchedule":
        """``signals[index] = value`` after everything earlier on the stream (a peer's view too)."""
        self._schedule.write_value64(u64_address(signals, index, "StreamSchedule.write"), value)
        return self

    def copy(self, dst, src) -> "StreamSchedule":
        """``dst.copy_(src)`` for contiguous tensors of the same dtype and element count; either may
        be a peer's view (the copy crosses NVLink)."""
        import torch

        for name, t in (("dst", dst), ("src", src)):
            if not isinstance(t, torch.Tensor) or not t.is_cuda or not t.is_contiguous():
                raise ValueError(f"triton_dist StreamSchedule.copy: {name} must be a contiguous CUDA tensor")
        if dst.numel() != src.numel() or dst.dtype != src.dtype:
            raise ValueError(f"triton_dist StreamSchedule.copy: dst is {dst.numel()} x {dst.dtype}, src "
                             f"{src.numel()} x {src.dtype}; they must match")
        self._schedule.copy(dst.data_ptr(), src.data_ptr(), src.numel() * src.element_size())
        return self

    def copy_2d(self, dst, src) -> "StreamSchedule":
        """One copy of a 2-D region with contiguous rows (:func:`triton_dist.stream_copy_2d`)."""
        self._schedule.copy_2d(*copy_2d_geometry(dst, src, "StreamSchedule.copy_2d"))
        return self

    def enqueue(self, stream=None) -> None:
        """Enqueue every operation on ``stream`` (default: current), in order: with
        ``Config.stream_schedule_graphs`` one launch of a CUDA graph of them where
        :attr:`launches_as_graph` (the driver calls one by one cost most of an eager
        GEMM+ReduceScatter's host time), else the driver calls. Safe under CUDA graph capture (the
        operations become graph nodes)."""
        import torch

        self._schedule.enqueue((stream or torch.cuda.current_stream()).cuda_stream, self._as_graph)

    def __len__(self) -> int:
        return len(self._schedule)

    @property
    def driver_calls(self) -> int:
        """Driver calls :meth:`enqueue` makes (waits and writes in a row share one) where it does
        not launch a graph."""
        return self._schedule.driver_calls

    @property
    def graphs(self) -> int:
        """CUDA graphs made so far (one per stream enqueued on as a graph)."""
        return self._schedule.graphs

    @property
    def graph_failure(self) -> str:
        """Why graph enqueues fell back to one driver call per operation (the failed capture,
        instantiation or launch and the driver's error), or "" while they have not."""
        return self._schedule.graph_failure

    @property
    def launches_as_graph(self) -> bool:
        """Whether :meth:`enqueue` outside a CUDA graph capture is one launch of a graph of the
        operations (``Config.stream_schedule_graphs`` on, three driver calls or more; the graph of
        a stream is made at its first such enqueue)."""
        return self._as_graph and self._schedule.launches_as_graph
