"""Kernels compiled ahead of time for C++ programs: ``python -m triton_dist.tools.prebuild``.

A C++ program that links ``libtdist`` runs a library kernel without Python through
``tdist::PrebuiltKernel`` (csrc/include/tdist/prebuilt_kernel.h), which loads what this tool
writes. Each named variant is compiled for sm_90 without a GPU, exactly as Triton's JIT would
compile it for the same arguments (the binder's specialisation, the options, NVSHMEM's bitcode and
the language's support library: :func:`triton_dist.parallel_compile.bound_variant`), and written
into the output folder as three files:

- ``<name>.cubin``: the module the C++ side loads;
- ``<name>.ptx``: its PTX, which module set-up reads to find the globals to initialise
  (``tdist::ModulePtx``);
- ``<name>.manifest``: what the launcher needs, one fact a line (C++ needs no JSON parser)::

      tdist-prebuilt 1
      symbol all_reduce_one_shot_kernel
      threads 256
      shared 0
      cooperative 0
      pdl 0
      constexpr WORLD 2                  (one line per constexpr parameter: what it was built for)
      params 7
      param x *fp32 D                    (name, Triton type, D: assumed divisible by 16, -: not)
      param n i32 -
      param one constexpr 1              (a runtime argument folded into the variant: its value,
                                          or "none"; the caller must pass exactly that)

  Lines starting with ``#`` are comments (the source, Triton's version and the language settings
  the kernel was compiled under: wait timeout, debug barriers, ranks per node).

The per-argument rules are derived as the eager launch path derives them
(:func:`triton_dist.eager_launch.argument_rules`), so a prebuilt kernel accepts exactly the
arguments its Python twin would launch from C++.

Variants (:data:`VARIANTS`) are named and describe their arguments the way their context's
``preload`` does; add one by writing a function ``(world, dtype) -> (kernel, args, kwargs)``.
"""

from __future__ import annotations

import argparse
import os
import sys

import triton
import triton.language as tl

MANIFEST_VERSION = 1
"""The manifest format (``tdist-prebuilt <version>``); the C++ parser refuses other versions."""

DTYPES = ("float32", "bfloat16", "float16")


class _Tensor:
    """What Triton's binder reads of a tensor argument: its dtype and a 16-byte aligned address
    (torch's allocations are), never its data."""

    def __init__(self, dtype):
        self.dtype = dtype

    def data_ptr(self) -> int:
        return 1 << 20


def _all_reduce_one_shot(world: int, dtype):
    """``all_reduce_one_shot_kernel`` as ``AllReduceContext`` preloads and runs it: ``x``, ``out``
    and ``stage`` of ``dtype``, the pad's uint64 signals, ``n``, the int64 call counter and
    ``half_tiles`` and ``max_programs`` (the signal layout's stride: the program slots per rank;
    all three unspecialised i32, so one variant serves every size and SM count), the context's
    constexprs."""
    from ..kernels.collectives.allreduce import AllReduceContext
    from ..kernels.collectives.allreduce_kernels import all_reduce_one_shot_kernel

    args = (_Tensor(dtype), _Tensor(dtype), _Tensor(dtype), _Tensor(tl.uint64), 2, _Tensor(tl.int64), 2)
    kwargs = dict(WORLD=world, max_programs=AllReduceContext.DEFAULT_MAX_PROGRAMS, BLOCK=AllReduceContext.BLOCK,
                  num_warps=AllReduceContext.NUM_WARPS)
    return all_reduce_one_shot_kernel, args, kwargs


VARIANTS = {"all_reduce_one_shot": _all_reduce_one_shot}
"""Name -> function ``(world, tl dtype) -> (triton_dist.jit kernel, example args, kwargs)``."""


def compile_variant(name: str, world: int, dtype: str):
    """``(compiled kernel, manifest text)`` of variant ``name`` for ``world`` ranks and ``dtype``
    (one of :data:`DTYPES`), compiled for sm_90 without a GPU."""
    from triton.compiler.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature

    from .. import eager_launch, parallel_compile
    from .compile_check import HOPPER

    if name not in VARIANTS:
        raise ValueError(f"triton_dist prebuild: no variant named {name!r}; known: {', '.join(sorted(VARIANTS))}")
    if dtype not in DTYPES:
        raise ValueError(f"triton_dist prebuild: dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if world < 1:
        raise ValueError(f"triton_dist prebuild: the world size must be positive, got {world}")
    kernel, args, kwargs = VARIANTS[name](world, getattr(tl, dtype))
    fn = kernel.fn
    backend = make_backend(HOPPER)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    variant, specialization = parallel_compile.bound_variant(kernel, args, kwargs, HOPPER, backend, binder)
    src, options = parallel_compile._source_and_options(variant)
    compiled = triton.compile(src, target=HOPPER, options=options)
    runtime_params = [p for p in fn.params if not p.is_constexpr]
    # Runtime parameters after the constexprs are given by name, as the contexts launch them.
    named = tuple(kwargs[p.name] for p in runtime_params[len(args):] if p.name in kwargs)
    rules = eager_launch.argument_rules(runtime_params, specialization, args + named)
    if not eager_launch.launchable(compiled.metadata) or rules is None:
        raise ValueError(f"triton_dist prebuild: {name} needs Triton's own launcher (scratch memory, clusters, "
                         "tensor descriptors or an argument kind the C++ launcher does not pass); it cannot be "
                         "prebuilt")
    constexprs = {fn.arg_names[path[0]]: value for path, value in variant.constexprs.items()
                  if fn.params[path[0]].is_constexpr}
    return compiled, manifest_text(name, compiled.metadata, runtime_params, rules, constexprs, variant)


def manifest_text(name: str, metadata, runtime_params, rules, constexprs: dict, variant) -> str:
    """The manifest of a compiled variant (module notes give the format)."""
    from ..language import support_library

    settings = " ".join(f"{key}={int(value)}" for key, value in support_library.settings().items())
    lines = [
        f"# triton-dist prebuilt kernel {name}: {variant.module}.{variant.name}, written by "
        "python -m triton_dist.tools.prebuild",
        f"# sm_90, Triton {triton.__version__}; language settings: {settings}",
        f"tdist-prebuilt {MANIFEST_VERSION}",
        f"symbol {metadata.name}",
        f"threads {32 * metadata.num_warps}",
        f"shared {metadata.shared}",
        f"cooperative {int(bool(metadata.launch_cooperative_grid))}",
        f"pdl {int(bool(metadata.launch_pdl))}",
    ]
    for key, value in constexprs.items():
        text = str(int(value) if isinstance(value, bool) else value)
        if not text or any(c.isspace() for c in text):
            raise ValueError(f"triton_dist prebuild: constexpr {key}={text!r} cannot be written on one manifest line")
        lines.append(f"constexpr {key} {text}")
    lines.append(f"params {len(runtime_params)}")
    for param, kind, divisible, constant, is_none in zip(runtime_params, rules.types, rules.divisible,
                                                          rules.constants, rules.is_none):
        if kind == "constexpr":
            spec = "none" if is_none else str(constant)
        else:
            spec = "D" if divisible else "-"
        lines.append(f"param {param.name} {kind} {spec}")
    return "\n".join(lines) + "\n"


def prebuild(name: str, world: int, dtype: str, out_dir: str) -> list[str]:
    """Compile variant ``name`` and write its cubin, PTX and manifest into ``out_dir``; returns
    the three paths."""
    compiled, manifest = compile_variant(name, world, dtype)
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for suffix, data in ((".cubin", compiled.asm["cubin"]), (".ptx", compiled.asm["ptx"]), (".manifest", manifest)):
        path = os.path.join(out_dir, name + suffix)
        with open(path, "wb" if isinstance(data, bytes) else "w") as f:
            f.write(data)
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    """The command line (``--help``); 2 when a request cannot be met, saying why."""
    parser = argparse.ArgumentParser(prog="python -m triton_dist.tools.prebuild",
                                     description="Compile library kernels for sm_90 (no GPU needed) for "
                                     "tdist::PrebuiltKernel: a cubin, its PTX and a manifest per variant.")
    parser.add_argument("names", nargs="*", help=f"variants (default: all of {', '.join(sorted(VARIANTS))})")
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--world", type=int, required=True, help="ranks the kernels will run on")
    parser.add_argument("--dtype", default="float32", choices=DTYPES, help="element type (default float32)")
    args = parser.parse_args(argv)
    try:
        for name in args.names or sorted(VARIANTS):
            for path in prebuild(name, args.world, args.dtype, args.out):
                print(path)
    except ValueError as error:
        print(error, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
