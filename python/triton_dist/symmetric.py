"""Symmetric tensors: torch tensors on the symmetric heap, and views of a peer's copy."""

from __future__ import annotations

import math

from .runtime import _core, _require_initialized, is_initialized


def _normalize_shape(shape, op: str) -> tuple[int, ...]:
    if isinstance(shape, int):
        shape = (shape,)
    try:
        shape = tuple(int(s) for s in shape)
    except TypeError:
        raise TypeError(f"triton_dist {op}: shape must be an int or a sequence of ints, got {shape!r}") from None
    if any(s < 0 for s in shape):
        raise ValueError(f"triton_dist {op}: negative dimension in shape {shape}")
    return shape


def symm_empty(shape, dtype=None):
    """Collective: an uninitialised tensor on the symmetric heap.

    Every rank must call this with the same shape and dtype, in the same order as its other
    symmetric allocations; a rank that does not gets an error naming every rank's size. The
    memory is released when the tensor (and every view of it) is gone, on all ranks.
    """
    _require_initialized("symm_empty")
    import torch

    dtype = dtype or torch.float32
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"triton_dist symm_empty: dtype must be a torch.dtype, got {dtype!r}")
    shape = _normalize_shape(shape, "symm_empty")
    nbytes = math.prod(shape) * dtype.itemsize
    raw = _core().allocate(nbytes, f"symm_empty({shape}, {dtype})")
    return raw.view(dtype).view(shape)


def symm_zeros(shape, dtype=None):
    """Collective: like :func:`symm_empty`, filled with zeros on the current stream. The zeroing
    is this rank's own stream work: peers may write into the tensor only after it is done
    (``torch.cuda.synchronize()`` then :func:`triton_dist.barrier`), or it may erase their writes."""
    return symm_empty(shape, dtype).zero_()


def is_symmetric(tensor) -> bool:
    """True when ``tensor``'s memory lies inside one live symmetric allocation."""
    import torch

    if not isinstance(tensor, torch.Tensor) or not tensor.is_cuda or not is_initialized():
        return False
    storage = tensor.untyped_storage()  # the whole storage, as check_symmetric: views at an offset count
    try:
        _core().check_symmetric(storage.data_ptr(), max(storage.nbytes(), 1), "is_symmetric")
        return True
    except RuntimeError:
        return False


def check_symmetric(tensor, op: str) -> None:
    """Raise a clear error unless ``tensor`` is a CUDA tensor on the symmetric heap."""
    _require_initialized(op)
    import torch

    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"triton_dist {op}: expected a torch.Tensor, got {type(tensor).__name__}")
    if not tensor.is_cuda:
        raise ValueError(f"triton_dist {op}: the tensor is on {tensor.device}, not on a CUDA device; "
                         "allocate it with triton_dist.symm_empty()")
    storage = tensor.untyped_storage()
    _core().check_symmetric(storage.data_ptr(), max(storage.nbytes(), 1), op)


def peer_tensor(tensor, pe: int):
    """The same symmetric tensor as rank ``pe`` holds it, mapped into this process.

    Loads and stores through the result reach ``pe``'s memory over NVLink; ordering against
    ``pe``'s own work is up to the caller (a barrier, or signals). ``pe`` must be on this node.
    """
    check_symmetric(tensor, "peer_tensor")
    if not isinstance(pe, int):
        raise TypeError(f"triton_dist peer_tensor: pe must be an int, got {type(pe).__name__}")
    storage = tensor.untyped_storage()
    raw = _core().peer_bytes(storage.data_ptr(), storage.nbytes(), pe, "peer_tensor")
    return raw.view(tensor.dtype).as_strided(tensor.size(), tensor.stride(), tensor.storage_offset())


def peer_tensors(tensor) -> list:
    """Every rank's view of the symmetric ``tensor`` in one call: element ``r`` is rank ``r``'s
    (:func:`peer_tensor`; this rank's own entry is ``tensor`` itself). Every rank must be on this
    node; for other nodes use NVSHMEM's put and get."""
    from .runtime import rank, world_size

    check_symmetric(tensor, "peer_tensors")
    me = rank()
    return [tensor if pe == me else peer_tensor(tensor, pe) for pe in range(world_size())]
