"""Compile kernels for Hopper without a GPU and read what came out.

Triton compiles for a target given explicitly without loading libcuda, so CI (no GPU) proves
that every kernel builds for sm_90 and carries the instructions the memory model needs.
"""

from __future__ import annotations

import re

import triton
from triton.backends.compiler import GPUTarget

from .. import nvshmem as _nvshmem
from ..distributed_jit import DistributedKernel

HOPPER = GPUTarget("cuda", 90, 32)


def compile_for_hopper(kernel, signature: dict, constexprs: dict | None = None, **options):
    """Compile ``kernel`` (triton.jit or triton_dist.jit) for sm_90; returns Triton's CompiledKernel.

    ``signature`` maps each non-constexpr parameter to a Triton type string (``"*fp32"``, ``"i64"``).
    """
    fn = kernel
    if isinstance(kernel, DistributedKernel):
        fn = kernel.fn
        options.setdefault("extern_libs", _nvshmem.extern_libs())
    constexprs = dict(constexprs or {})
    for name in constexprs:
        signature.setdefault(name, "constexpr")
    source = triton.compiler.ASTSource(fn=fn, signature=signature,
                                       constexprs={(fn.arg_names.index(k), ): v for k, v in constexprs.items()})
    return triton.compile(source, target=HOPPER, options=options)


def ptx_calls(ptx: str) -> list[str]:
    """Names of the functions a PTX module calls."""
    return re.findall(r"call(?:\.uni)?\s+(?:\([^)]*\),\s*)?([A-Za-z_$][\w$]*)", ptx)
