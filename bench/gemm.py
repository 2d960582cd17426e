"""Our persistent GEMM alone against cuBLAS (torch.matmul), ``C = A @ B.T`` in bf16, on the shapes
of the overlapped ops (M=8192; (N, K) of LLaMA-3.1-70B split over 2 ranks both ways). One GPU per
process; under torchrun every rank times its own GPU and the MAX over ranks is reported.

    python bench/gemm.py            (or torchrun --nproc-per-node=N bench/gemm.py)

``bound_us`` is cuBLAS's time: the issue's bar is ours >= 95 % of cuBLAS, i.e. ours_us <= bound / 0.95.
Writes bench/results/<gpu>-x<world>/gemm.json.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
try:
    import triton_dist._C  # noqa: F401  an installed build
except ImportError:
    sys.path.insert(0, str(HERE.parent / "python"))

from triton_dist import bench  # noqa: E402
from triton_dist.kernels.gemm.dense import gemm  # noqa: E402

SHAPES = [(8192, 14336, 8192), (8192, 8192, 14336), (8192, 28672, 8192)]
"""(M, N, K): AllGather+GEMM and GEMM+ReduceScatter of LLaMA-3.1-70B on 2 ranks, and unsplit."""


def main() -> int:
    args = bench.script.argument_parser(__doc__, HERE / "results").parse_args()
    bench.script.guard(args)
    import torch
    import torch.distributed as dist

    if "RANK" in os.environ and not dist.is_initialized():
        dist.init_process_group("nccl")
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    world = dist.get_world_size() if dist.is_initialized() else 1
    log = print if not dist.is_initialized() or dist.get_rank() == 0 else (lambda *a, **k: None)
    records = []
    for m, n, k in SHAPES[:1] if args.quick else SHAPES:
        g = torch.Generator(device="cuda").manual_seed(m + n + k)
        a = torch.randn(m, k, device="cuda", generator=g).bfloat16()
        b = torch.randn(n, k, device="cuda", generator=g).bfloat16()
        out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        ref = torch.matmul(a, b.t())
        gemm(a, b, out=out)
        torch.cuda.synchronize()
        error = float((out.float() - ref.float()).abs().max() / ref.float().abs().max())
        ours = bench.median_us(lambda: gemm(a, b, out=out), warmup=5, iters=30, graph=True)
        cublas = bench.median_us(lambda: torch.matmul(a, b.t(), out=out), warmup=5, iters=30, graph=True)
        tflops = 2 * m * n * k / ours / 1e6
        log(f"[gemm] {m}x{n}x{k}: ours {ours:.1f} us ({tflops:.0f} TFLOP/s), cuBLAS {cublas:.1f} us, "
            f"ours/cuBLAS speed {cublas / ours:.3f}, max rel error {error:.2e}")
        records.append(bench.record("gemm", shape=[m, n, k], dtype="bfloat16", world_size=world, gpu=bench.gpu_slug(),
                                    ours_us=ours, baselines={"torch_cublas_us": cublas}, bound_us=cublas,
                                    tflops=tflops, max_rel_error=error, timing={"iters": 30, "cuda_graph": True}))
    if not dist.is_initialized() or dist.get_rank() == 0:
        bench.print_table(records, extra=("tflops", "max_rel_error"))
        print(f"[gemm] wrote {bench.write_results(records, 'gemm', root=args.out, rank=0)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
