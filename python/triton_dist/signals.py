"""Signal pads and stream memory operations: how producers tell consumers that a tile is ready."""

from __future__ import annotations

from .runtime import _core, _require_initialized


class SignalPad:
    """Collective: ``num_signals`` uint64 flags on the symmetric heap, zeroed, with an epoch.

    Each call of an op takes ``epoch = pad.next_epoch()`` (1, 2, 3, ... on every rank alike);
    producers set a flag to the epoch when its tile is ready and consumers wait for ``>= epoch``,
    so the pad never needs resetting between calls. (Flags set by copy streams inside a CUDA graph
    cannot follow an epoch: those protocols use 0/1 flags that their consumer resets, e.g.
    ``"fused_ce"`` in :mod:`triton_dist.kernels.gemm.gemm_rs`.)
    """

    def __init__(self, num_signals: int, owner: str = "", regions=()):
        """``owner`` (e.g. the context's class) and ``regions`` (``(name, first, count)`` runs of
        the signals, or a :class:`~triton_dist.kernels.common.signal_layout.SignalLayout`) name the
        signals in the report of a wait that times out on one of them: "signal 5 of
        AllGatherGemmContext's pad: ack[1]"."""
        _require_initialized("SignalPad")
        import torch

        if not isinstance(num_signals, int) or num_signals <= 0:
            raise ValueError(f"triton_dist SignalPad: num_signals must be a positive int, got {num_signals!r}")
        regions = regions.regions() if hasattr(regions, "regions") else list(regions)
        self._pad = _core().SignalPad(num_signals, owner, regions)
        self.signals = self._pad.bytes_tensor().view(torch.uint64)
        """The local flags, a uint64 CUDA tensor of ``num_signals`` elements."""
        self.signals.zero_()

    def __len__(self) -> int:
        return self._pad.size

    @property
    def epoch(self) -> int:
        """The epoch of the latest call (0 before the first)."""
        return self._pad.epoch

    def next_epoch(self) -> int:
        """Advance to and return the next call's epoch. Call once per op call on every rank."""
        return self._pad.next_epoch()


def u64_address(tensor, index: int, op: str) -> int:
    """The address of ``tensor[index]``, a uint64/int64 CUDA signal; raises naming ``op`` otherwise."""
    import torch

    if not isinstance(tensor, torch.Tensor) or not tensor.is_cuda or tensor.dtype not in (torch.uint64, torch.int64):
        raise TypeError(f"triton_dist {op}: expected a CUDA uint64/int64 tensor of signals")
    if not 0 <= index < tensor.numel():
        raise IndexError(f"triton_dist {op}: signal index {index} out of range for {tensor.numel()} signals")
    if tensor.is_contiguous():
        return tensor.data_ptr() + index * 8
    # A strided view (view(-1) would refuse it): the element's offset from its strides.
    offset = 0
    for size, stride in zip(reversed(tensor.shape), reversed(tensor.stride())):
        offset += (index % size) * stride
        index //= size
    return tensor.data_ptr() + offset * 8


def stream_write_value64(signals, index: int, value: int, stream=None) -> None:
    """Enqueue ``signals[index] = value`` on ``stream`` (default: current), after its earlier work.

    This is how a copy-engine producer publishes a chunk: the copy, then this write on the same
    stream. ``signals`` may be a peer's view (:func:`triton_dist.peer_tensor`).
    """
    import torch

    address = u64_address(signals, index, "stream_write_value64")
    stream = stream or torch.cuda.current_stream()
    _core().stream_write_value64(stream.cuda_stream, address, value)


def _equal(cmp: str, op: str) -> bool:
    if cmp not in ("ge", "eq"):
        raise ValueError(f"triton_dist {op}: cmp must be 'ge' (>=, the epoch convention) or 'eq' (==), got {cmp!r}")
    return cmp == "eq"


def stream_wait_value64(signals, index: int, value: int, stream=None, cmp: str = "ge") -> None:
    """Hold ``stream`` (default: current) until ``signals[index] >= value`` (``cmp="ge"``) or
    ``== value`` (``cmp="eq"``). With :func:`stream_write_value64`, this is how the host sets a
    signal and waits for one, in stream order, without a kernel."""
    import torch

    equal = _equal(cmp, "stream_wait_value64")
    address = u64_address(signals, index, "stream_wait_value64")
    stream = stream or torch.cuda.current_stream()
    _core().stream_wait_value64(stream.cuda_stream, address, value, equal)


def stream_copy_2d(dst, src, stream=None) -> None:
    """Enqueue ``dst.copy_(src)`` on ``stream`` (default: current) as ONE copy-engine copy, for 2-D
    views whose rows are contiguous (``stride(1) == 1``) but not each other's neighbours: a tile
    column of a matrix, say. ``dst`` may be a peer's view (:func:`triton_dist.peer_tensor`): the
    copy crosses NVLink. No SM runs it (torch would launch a kernel for a strided copy), so it
    overlaps a kernel that holds every SM; publish it with :func:`stream_write_value64` after it
    on the same stream."""
    import torch

    stream = stream or torch.cuda.current_stream()
    _core().stream_copy_2d(stream.cuda_stream, *copy_2d_geometry(dst, src, "stream_copy_2d"))


def copy_2d_geometry(dst, src, op: str) -> tuple[int, int, int, int, int, int]:
    """``(dst address, dst pitch, src address, src pitch, row bytes, rows)`` of a 2-D copy
    ``dst <- src`` (both 2-D CUDA tensors with contiguous rows, same shape and dtype); raises a
    ValueError naming ``op`` otherwise."""
    import torch

    for name, t in (("dst", dst), ("src", src)):
        if not isinstance(t, torch.Tensor) or not t.is_cuda or t.dim() != 2 or (t.size(1) > 1 and t.stride(1) != 1):
            raise ValueError(f"triton_dist {op}: {name} must be a 2-D CUDA tensor with contiguous rows "
                             f"(stride(1) == 1), got {type(t).__name__} "
                             f"{tuple(t.shape) if isinstance(t, torch.Tensor) else ''}")
        if t.size(0) > 1 and t.stride(0) < t.size(1):
            raise ValueError(f"triton_dist {op}: {name}'s rows overlap (stride(0) = {t.stride(0)} < "
                             f"{t.size(1)} elements per row); pass distinct rows")
    if dst.shape != src.shape or dst.dtype != src.dtype:
        raise ValueError(f"triton_dist {op}: dst is {tuple(dst.shape)} {dst.dtype}, src "
                         f"{tuple(src.shape)} {src.dtype}; they must match")
    item = src.element_size()
    # A single row's stride may be anything (torch reports 1 for [1, n]): its pitch is the row.
    return (dst.data_ptr(), max(dst.stride(0), dst.size(1)) * item, src.data_ptr(),
            max(src.stride(0), src.size(1)) * item, src.size(1) * item, src.size(0))
