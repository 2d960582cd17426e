"""ReduceScatter (sum; bf16 and fp32): ours (push, ring, ll) vs torch.distributed.reduce_scatter_tensor (NCCL).

    torchrun --nproc-per-node=2 bench/reduce_scatter.py [--quick] [--dtypes bfloat16,float32]

Input sizes (the whole input, all ``world`` shards) 8 KiB .. 128 MiB in x4 steps, 256 MiB and 1 GB
(:data:`triton_dist.bench.script.COLLECTIVE_SWEEP_BYTES`; ``--quick``: 256 KiB, 4 MiB, 64 MiB),
swept once per element type (bf16, then fp32). For each:

- ours: :func:`triton_dist.ops.reduce_scatter` with one context of the largest size, methods
  ``push``, ``ring`` and (inputs up to its limit) ``ll``; ``ours_us`` is the fastest, each is also
  recorded (``push_us``, ``ring_us``, ``ll_us``, ``method``);
- ``torch_nccl_us``: ``torch.distributed.reduce_scatter_tensor`` (NCCL) on the same data.

Every result is checked once against an fp32 NCCL reference before timing. Timing:
:mod:`triton_dist.bench.timing` (fixed counts on every rank, synchronise, host and GPU barriers per sample,
median per rank, MAX over ranks); small sizes time several back-to-back calls per sample queued
behind a GPU delay, so host launch latency is not what is measured (the same for every contender).

``busbw_gbps`` = (w-1)/w * input_bytes / t (NCCL's bus bandwidth for reduce-scatter).
``bound_us`` = max(2.9 us, (w-1)/w * input_bytes / 384 GB/s): the bytes each rank must send over
its links at the measured bidirectional copy-engine put bandwidth (bench/language_floors, 2 x
H200), but never less than one measured signal round trip (a rank cannot finish before it heard
from its peers). Writes bench/results/<gpu>-x<world>/reduce_scatter.json.
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
from triton_dist import ops  # noqa: E402
from triton_dist.kernels import ReduceScatterContext  # noqa: E402

KIB, MIB = bench.script.KIB, bench.script.MIB
LINK_GBPS = bench.script.LINK_GBPS
ROUND_TRIP_US = bench.script.ROUND_TRIP_US
METHODS = ("push", "ring")

log = bench.script.logger("reduce_scatter")

all_ok = bench.script.all_ranks_ok


def main() -> int:
    # Heap: the 1 GB context's staging buffers and fp32 ring inbox.
    return bench.script.collective_main(
        "reduce_scatter", __doc__, HERE / "results", log, sweep, heap_size="12G",
        quick_sizes=[256 * KIB, 4 * MIB, 64 * MIB],
        extra=("bytes", "method", "push_us", "ring_us", "ll_us", "busbw_gbps", "torch_nccl_busbw_gbps"))


def sweep(dtype, sizes: list[int], iters: int, world: int, rank: int, device, gpu: str) -> list[dict]:
    """Every input size of ``sizes`` (bytes) in ``dtype``: checked, then timed; one record each."""
    import torch
    import torch.distributed as dist

    dtype_name = str(dtype).replace("torch.", "")
    n_max = max(sizes) // dtype.itemsize
    n_max -= n_max % world
    ctx = ReduceScatterContext(n_max * dtype.itemsize, dtype)  # collective; preloads every kernel
    g = torch.Generator(device=device)
    g.manual_seed(2000 + rank)
    x_all = torch.randn(n_max, device=device, dtype=torch.float32, generator=g).to(dtype)
    out_all = torch.empty(n_max // world, device=device, dtype=dtype)
    nccl_out = torch.empty_like(out_all)
    bench.sync_and_barrier()

    records = []
    for nbytes in sizes:
        n = nbytes // dtype.itemsize
        n -= n % world
        m = n // world
        x, out = x_all[:n], out_all[:m]
        ref = torch.empty(m, device=device, dtype=torch.float32)
        dist.reduce_scatter_tensor(ref, x.float())
        ref = ref.to(dtype)

        def ours(method, x=x, out=out):
            return lambda: ops.reduce_scatter(x, out=out, method=method, context=ctx)

        methods = [*METHODS, *(["ll"] if nbytes <= ctx.ll_max_bytes else [])]
        fns = {name: ours(name) for name in methods}
        fns["torch_nccl"] = lambda x=x, o=nccl_out[:m]: dist.reduce_scatter_tensor(o, x)

        checks = {}
        for name in (*methods, "torch_nccl"):
            target = nccl_out[:m] if name == "torch_nccl" else out
            target.fill_(float("nan"))
            fns[name]()
            torch.cuda.synchronize()
            checks[name] = all_ok(bool(torch.equal(target, ref)) or
                                  bool(torch.allclose(target.float(), ref.float(), rtol=1e-2, atol=1e-2)))
        bench.sync_and_barrier()

        group = max(1, min(16, (4 * MIB) // nbytes))
        delay = 50.0  # the GPU waits while the host queues the sample, so launch latency is outside it
        times = {}
        for name, fn in fns.items():
            times[name] = bench.median_us(fn, warmup=5, iters=iters, group=group, gpu_delay_us=delay, graph=True)
        best = min(methods, key=times.get)
        ours_us = times[best]
        bus = (world - 1) / world * nbytes
        bound = max(ROUND_TRIP_US, bus / (LINK_GBPS * 1e3))
        log(f"{dtype_name:>8} {nbytes:>10d} B  push {times['push']:9.2f} us  ring {times['ring']:9.2f} us  "
            f"ll {times.get('ll', float('nan')):9.2f} us  "
            f"NCCL {times['torch_nccl']:9.2f} us  bound {bound:8.2f} us  checks {checks}")
        records.append(
            bench.record("reduce_scatter", shape=[n], dtype=dtype_name, world_size=world, gpu=gpu, ours_us=ours_us,
                         baselines={"torch_nccl_us": times["torch_nccl"]}, bound_us=bound, bytes=nbytes,
                         busbw_gbps=bus / (ours_us * 1e3), torch_nccl_busbw_gbps=bus / (times["torch_nccl"] * 1e3),
                         method=best, push_us=times["push"], ring_us=times["ring"], ll_us=times.get("ll"),
                         verified=all(checks[name] for name in methods), checks=checks,
                         timing={"iters": iters, "group": group, "gpu_delay_us": delay, "cuda_graph": True,
                                 "gpu_barrier": True},
                         bound_method=f"max({ROUND_TRIP_US} us, (w-1)/w*bytes / {LINK_GBPS} GB/s)"))

    del ctx  # symmetric memory goes before the next sweep's and the runtime
    return records


if __name__ == "__main__":
    sys.exit(main())
