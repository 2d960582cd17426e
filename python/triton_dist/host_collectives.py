"""Reference collectives through host memory, for checking results at any world size.

Tests, tutorials and benchmarks compare our ops with torch. ``torch.distributed`` on CUDA tensors
means NCCL, and NCCL refuses two ranks on one GPU, so a check written with it cannot run in the
several-ranks-per-GPU mode (:mod:`triton_dist.placement`). These copy the tensor to the host and
run the collective over the process group triton_dist was initialised with (gloo serves CPU
tensors in every mode), then copy the result back to the tensor's device. They are slow and exact:
references, not a data path.

Sums of 16-bit floats are taken in float32 and rounded once; gathers move bits, whatever the dtype.
"""

from __future__ import annotations

from . import runtime as _runtime


def _group():
    return _runtime.process_group()


def _world() -> int:
    import torch.distributed as dist

    return dist.get_world_size(_group())


def _as_bytes(t):
    import torch

    return t.detach().contiguous().reshape(-1).view(torch.uint8).cpu()


def all_reduce(t, op: str = "sum"):
    """A new tensor, on ``t``'s device and of its dtype: the elementwise ``op`` ("sum" or "max")
    of ``t`` over every rank."""
    import torch
    import torch.distributed as dist

    ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}
    if op not in ops:
        raise ValueError(f"host_collectives.all_reduce: op must be one of {sorted(ops)}, got {op!r}")
    wide = torch.float32 if t.dtype in (torch.float16, torch.bfloat16) else t.dtype
    host = t.detach().to("cpu", wide).contiguous()
    dist.all_reduce(host, op=ops[op], group=_group())
    return host.to(t.device, t.dtype)


def all_gather_list(t) -> list:
    """Every rank's ``t`` (same shape and dtype on every rank), in rank order, on ``t``'s device."""
    import torch
    import torch.distributed as dist

    mine = _as_bytes(t)
    every = [torch.empty_like(mine) for _ in range(_world())]
    dist.all_gather(every, mine, group=_group())
    return [e.to(t.device).view(t.dtype).reshape(t.shape) for e in every]


def all_gather(t):
    """Every rank's ``t`` concatenated along dim 0, in rank order (``all_gather_into_tensor``)."""
    import torch

    return torch.cat(all_gather_list(t), dim=0)


def reduce_scatter(t):
    """This rank's part (dim 0 cut into world equal parts) of the sum over ranks of ``t``
    (``reduce_scatter_tensor``)."""
    world, me = _world(), _runtime.rank()
    if t.shape[0] % world:
        raise ValueError(f"host_collectives.reduce_scatter: dim 0 ({t.shape[0]}) must be a multiple of the world "
                         f"size {world}")
    part = t.shape[0] // world
    return all_reduce(t)[me * part:(me + 1) * part]


def same_on_every_rank(t) -> bool:
    """Whether every rank holds the same bits in ``t`` (same shape and dtype everywhere)."""
    import torch

    mine = _as_bytes(t)
    return all(torch.equal(_as_bytes(e), mine) for e in all_gather_list(t))
