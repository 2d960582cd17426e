"""The plain GEMM's operand checks (:func:`check_operands`) and TMA's alignment
(:func:`aligned_for_tma`), shared by :func:`~triton_dist.kernels.gemm.dense.gemm` and the MoE
grouped GEMMs."""

from __future__ import annotations


def check_operands(a, b, out) -> None:
    """Refuse what :func:`~triton_dist.kernels.gemm.dense.gemm` cannot take, naming the operand and the fix."""
    import torch

    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"triton_dist gemm: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 2:
            raise ValueError(f"triton_dist gemm: {name} must be 2-D, got shape {tuple(t.shape)}")
        if t.dtype not in (torch.bfloat16, torch.float16):
            raise TypeError(f"triton_dist gemm: {name} is {t.dtype}; only torch.bfloat16 and torch.float16 are "
                            f"supported")
        if not t.is_cuda:
            raise ValueError(f"triton_dist gemm: {name} is on {t.device}, not on a CUDA device")
    if a.dtype != b.dtype:
        raise TypeError(f"triton_dist gemm: a is {a.dtype} but b is {b.dtype}")
    if a.device != b.device:
        raise ValueError(f"triton_dist gemm: a is on {a.device} but b is on {b.device}")
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"triton_dist gemm: a is [M, K] = {list(a.shape)} and b is [N, K] = {list(b.shape)}: "
                         f"K differs (C = a @ b.T)")
    k, n = a.shape[1], b.shape[0]
    if k % 8 or n % 8:
        raise ValueError(f"triton_dist gemm: K ({k}) and N ({n}) must be multiples of 8 (TMA needs 16-byte aligned "
                         f"rows)")
    if out is not None:
        shape = (a.shape[0], n)
        if not isinstance(out, torch.Tensor) or out.dtype != a.dtype or tuple(out.shape) != shape or \
                out.device != a.device or not out.is_contiguous():
            got = (f"{tuple(out.shape)} {out.dtype} on {out.device}" if isinstance(out, torch.Tensor) else
                   type(out).__name__)
            raise ValueError(f"triton_dist gemm: out must be a contiguous {shape} {a.dtype} tensor on {a.device}; "
                             f"got {got}")


def aligned_for_tma(t):
    """``t`` contiguous with a 16-byte aligned base (TMA's requirement), copied if it is not."""
    t = t.contiguous()
    return t if t.data_ptr() % 16 == 0 else t.clone()
