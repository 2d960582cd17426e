"""One GEMM row under Nsight Compute: ours (by config, optionally a forced split-K count) and
cuBLAS (``torch.matmul``) on the same operands, each launched a few times before the profiled
range so that compiling and autotuning stay outside it.

    ncu --clock-control none --nvtx --nvtx-include "profile/" --section SpeedOfLight \\
        --section MemoryWorkloadAnalysis --section WarpStateStats --csv \\
        python -m triton_dist.tools.profile_gemm --shape 128x4096x7168 --config split_k_m128 --split-k 4

Why a separate entry point: bench/gemm.py times many contenders in CUDA graphs, which ncu profiles
as one graph launch each; here every contender is one eager launch inside an NVTX range named
``profile``. Without ncu it prints each contender's eager time (CUDA events, median of 50 calls),
which says little about speed (bench/gemm.py does) but checks that the row runs and agrees.
"""

from __future__ import annotations

import argparse
import statistics


def parse_shape(text: str) -> tuple[int, int, int]:
    """``"MxNxK"`` -> ``(M, N, K)``; a ValueError naming the expected form otherwise."""
    parts = text.lower().split("x")
    if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise ValueError(f"profile_gemm: --shape must be MxNxK with positive integers, got {text!r}")
    m, n, k = (int(p) for p in parts)
    return m, n, k


def main(argv: list[str] | None = None) -> None:
    """Run the row's contenders (module notes); ``argv``: the command line's arguments."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", required=True, help="MxNxK, C[M, N] = A[M, K] @ B[N, K]^T")
    parser.add_argument("--config", action="append", default=[],
                        help="one of gemm's config names (repeatable; default: gemm's own pick)")
    parser.add_argument("--split-k", type=int, default=None, help="slices for the split-K configs")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args(argv)
    m, n, k = parse_shape(args.shape)

    import torch

    from ..kernels.gemm import dense, split_k

    if not torch.cuda.is_available():
        raise SystemExit("profile_gemm: needs a CUDA GPU")
    dtype = getattr(torch, args.dtype)
    gen = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn((m, k), device="cuda", dtype=dtype, generator=gen)
    b = torch.randn((n, k), device="cuda", dtype=dtype, generator=gen)
    out = torch.empty((m, n), device="cuda", dtype=dtype)
    sms = dense.num_sms(a.device)
    contenders = {"cublas": lambda: torch.matmul(a, b.t(), out=out)}
    for config in args.config or [dense.pick_gemm_config(m, n, k, sms)]:
        if args.split_k is not None and config not in split_k.CONFIG_NAMES:
            raise SystemExit(f"profile_gemm: --split-k applies to the split-K configs {sorted(split_k.CONFIG_NAMES)}, "
                             f"not {config!r}")
        if config in split_k.CONFIG_NAMES and args.split_k is not None:
            contenders[f"{config}/s{args.split_k}"] = (
                lambda c=config: split_k.gemm_split_k(a, b, out, c, sms, split_k=args.split_k))
        else:
            contenders[config] = lambda c=config: dense.gemm(a, b, out=out, config=c)

    reference = (a.float() @ b.float().t())
    for name, fn in contenders.items():
        for _ in range(args.warmup):
            fn()
        torch.cuda.synchronize()
        error = ((out.float() - reference).abs().max() / reference.abs().max()).item()
        if error > 2e-2:
            raise SystemExit(f"profile_gemm: {name} differs from the fp32 reference (max relative error {error:.3g})")
        times = []
        for _ in range(50):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3)
        torch.cuda.nvtx.range_push("profile")
        fn()
        torch.cuda.nvtx.range_pop()
        torch.cuda.synchronize()
        print(f"{name}: eager median {statistics.median(times):.1f} us, max relative error {error:.2g}")


if __name__ == "__main__":
    main()
