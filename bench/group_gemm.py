"""The MoE grouped GEMM alone (one GPU) against ``torch._grouped_mm`` (where this torch has it) and a
loop of cuBLAS matmuls, one per non-empty expert, on MoE layer shapes: Mixtral-8x7B (8 experts,
top-2), Qwen3-30B-A3B (128 experts, top-8) and a DeepSeek-V3-style rank of 32 local experts,
prefill and decode token counts, uniform and skewed routing (a Zipf-like spread with empty
experts). CUDA-graph timing, median of 30 replays, bf16, tokens packed by expert with offsets.

    python bench/group_gemm.py [--quick]

``bound_us`` is the faster baseline: the bar is ours <= bound. ``config_us``: every config of
:func:`sweep_configs` (the swapped decode configs where an expert averages at most 128 rows), each
first checked against the cuBLAS loop; a config that errs or misses ``REL_TOL`` is left out of it
and listed in ``config_errors``. ``baseline_kernels``: the kernels one call of each baseline
launches (the cuBLAS loop's distinct ones, torch._grouped_mm's), whose names carry the tiles they
chose. Writes bench/results/<gpu>-x1/group_gemm.json.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
try:
    import triton_dist._C  # noqa: F401  an installed build
except ImportError:
    sys.path.insert(0, str(HERE.parent / "python"))

from triton_dist import bench  # noqa: E402
from triton_dist import residency  # noqa: E402
from triton_dist.kernels.gemm.split_k import SPLIT_K_MAX_M  # noqa: E402
from triton_dist.kernels.moe.group_gemm import CONFIGS, group_gemm, pick_group_gemm_config  # noqa: E402
from triton_dist.kernels.moe.group_gemm_swapped import CONFIG_NAMES as SWAPPED_CONFIGS  # noqa: E402

SHAPES = [
    # name, experts, routed rows (tokens x topk), N, K
    ("mixtral_up_prefill", 8, 4096 * 2, 14336, 4096),
    ("mixtral_down_prefill", 8, 4096 * 2, 4096, 14336),
    ("mixtral_up_decode", 8, 64 * 2, 14336, 4096),
    ("qwen3_up_prefill", 128, 4096 * 8, 1536, 2048),
    ("qwen3_down_prefill", 128, 4096 * 8, 2048, 768),
    ("qwen3_up_decode", 128, 128 * 8, 1536, 2048),
    ("deepseek_rank_up", 32, 8192, 4096, 7168),
    ("deepseek_rank_down_decode", 32, 256, 7168, 2048),
]
"""(name, experts, rows, N, K): a layer's up (gate and up fused) or down projection."""

ROUTINGS = ("uniform", "skewed")

REL_TOL = 1e-2
"""The largest relative error (``max |got - ref| / max |ref|``) a config may have against the
cuBLAS loop and still be timed."""


def sweep_configs(rows: int, experts: int) -> list[str]:
    """The configs timed for ``config_us``: every one of :data:`CONFIGS`, and the swapped decode
    configs where an expert averages at most ``SPLIT_K_MAX_M`` rows (at prefill every ``BM`` rows
    of an expert would read its weights once more)."""
    return list(CONFIGS) + (list(SWAPPED_CONFIGS) if rows <= SPLIT_K_MAX_M * experts else [])


def _counts(rows: int, experts: int, routing: str, gen):
    """Rows per expert: uniform random, or skewed (weights 1 / rank^1.2 in a random order, a quarter
    of the experts empty)."""
    import torch

    if routing == "uniform":
        weights = torch.ones(experts)
    else:
        weights = 1.0 / torch.arange(1, experts + 1, dtype=torch.float32) ** 1.2
        weights[-(experts // 4):] = 0
        weights = weights[torch.randperm(experts, generator=gen)]
    picks = torch.multinomial(weights, rows, replacement=True, generator=gen)
    return torch.bincount(picks, minlength=experts)


def _grouped_mm_baseline(x, w_kn, offsets, ref):
    """A call of ``torch._grouped_mm`` (its output is a new tensor, as torch offers no ``out``), or
    None when this torch has none, refuses the shape or disagrees with ``ref``."""
    import torch

    fn = getattr(torch, "_grouped_mm", None)
    if fn is None:
        return None
    try:
        got = fn(x, w_kn, offs=offsets)
    except (RuntimeError, TypeError, ValueError) as e:
        print(f"[group_gemm] torch._grouped_mm refused {tuple(x.shape)} x {tuple(w_kn.shape)}: {e}".splitlines()[0])
        return None
    error = bench.script.relative_error(got, ref)
    if not error < 1e-2:
        print(f"[group_gemm] torch._grouped_mm disagrees with the cuBLAS loop (rel error {error:.2e}): not timed")
        return None
    return lambda: fn(x, w_kn, offs=offsets)


def main() -> int:
    args = bench.script.argument_parser(__doc__, HERE / "results").parse_args()
    bench.script.guard(args)
    import torch

    records = []
    shapes = SHAPES[::3] if args.quick else SHAPES
    for name, experts, rows, n, k in shapes:
        for routing in ROUTINGS[:1] if args.quick else ROUTINGS:
            gen = torch.Generator().manual_seed(experts * rows + n + k)
            counts = _counts(rows, experts, routing, gen)
            offsets = torch.cumsum(counts, 0).to(torch.int32).cuda()
            x = (torch.randn(rows, k, device="cuda") * k ** -0.25).bfloat16()
            w = (torch.randn(experts, n, k, device="cuda") * k ** -0.25).bfloat16()
            out = torch.empty(rows, n, device="cuda", dtype=torch.bfloat16)
            ref = torch.empty_like(out)
            bounds = [0] + torch.cumsum(counts, 0).tolist()
            used = [(e, bounds[e], bounds[e + 1]) for e in range(experts) if bounds[e + 1] > bounds[e]]

            def cublas_loop():
                for e, s, t in used:
                    torch.matmul(x[s:t], w[e].t(), out=ref[s:t])

            cublas_loop()
            group_gemm(x, w, offsets=offsets, out=out)
            torch.cuda.synchronize()
            error = bench.script.relative_error(out, ref)
            ours = bench.median_us(lambda: group_gemm(x, w, offsets=offsets, out=out, check_rows=False), warmup=5,
                                   iters=30, graph=True)
            loop = bench.median_us(cublas_loop, warmup=5, iters=30, graph=True)
            # Every config, so that the pick rule can be read from the results (ours: its pick),
            # each checked first: the swapped ones have not run on a GPU before.
            picked = pick_group_gemm_config(rows, experts, n, residency.sm_count())
            config_us, config_errors = {}, {}
            check = torch.empty_like(out)
            for c in sweep_configs(rows, experts):
                if c == picked:
                    config_us[c] = ours
                    continue
                check.fill_(float("nan"))
                try:
                    group_gemm(x, w, offsets=offsets, out=check, config=c)
                    torch.cuda.synchronize()
                except Exception as e:  # noqa: BLE001  one GPU: a config that cannot build or run this shape
                    config_errors[c] = f"{type(e).__name__}: {e}".splitlines()[0]
                    continue
                err = bench.script.relative_error(check, ref)
                if not err < REL_TOL:
                    config_errors[c] = err if err < float("inf") else None  # None: a NaN or an Inf
                    continue
                config_us[c] = bench.median_us(
                    lambda c=c: group_gemm(x, w, offsets=offsets, out=out, config=c, check_rows=False), warmup=5,
                    iters=30, graph=True)
            del check
            grouped = _grouped_mm_baseline(x, w.transpose(1, 2), offsets, ref)
            grouped_us = bench.median_us(grouped, warmup=5, iters=30, graph=True) if grouped else None
            bound = min(v for v in (loop, grouped_us) if v is not None)
            tflops = 2 * rows * n * k / ours / 1e6
            weight_gbps = len(used) * n * k * 2 / ours / 1e3  # the weights each expert with rows must read
            print(f"[group_gemm] {name} {routing}: ours {ours:.1f} us ({tflops:.0f} TFLOP/s, weights at "
                  f"{weight_gbps:.0f} GB/s), cuBLAS loop {loop:.1f} us, torch._grouped_mm "
                  f"{'-' if grouped_us is None else f'{grouped_us:.1f} us'}, ours/bound speed {bound / ours:.3f}, "
                  f"rel error {error:.2e}; configs: " + ", ".join(f"{c} {t:.1f} us" for c, t in config_us.items()) +
                  f" (picked {picked})" + (f"; NOT TIMED (errors): {config_errors}" if config_errors else ""))
            extra = {"config_errors": config_errors} if config_errors else {}
            # What the baselines chose for this row (their kernels' names): where ours is short,
            # the configuration to try.
            extra["baseline_kernels"] = {"cublas_loop": bench.kernels_launched(cublas_loop),
                                         **({"grouped_mm": bench.kernels_launched(grouped)} if grouped else {})}
            records.append(bench.record(
                "group_gemm", shape=[experts, rows, n, k], dtype="bfloat16", world_size=1, gpu=bench.gpu_slug(),
                ours_us=ours, baselines={"torch_cublas_loop_us": loop, "torch_grouped_mm_us": grouped_us},
                bound_us=bound, layer=name, routing=routing, empty_experts=experts - len(used), tflops=tflops,
                weight_gbps=weight_gbps, max_rel_error=error, config=picked, config_us=config_us,
                timing={"iters": 30, "cuda_graph": True}, **extra))
    bench.print_table(records, extra=("tflops", "weight_gbps", "max_rel_error"))
    print(f"[group_gemm] wrote {bench.write_results(records, 'group_gemm', root=args.out, rank=0)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
