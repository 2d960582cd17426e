"""AllGather (bf16 and fp32): ours (sm_push, ce_push, ce_chunked, ce_pull, ring, ll; zero-copy into a
symmetric out) vs torch.distributed.all_gather_into_tensor (NCCL).

    torchrun --nproc-per-node=2 bench/allgather.py [--quick] [--dtypes bfloat16,float32]

Per-rank input sizes 8 KiB .. 128 MiB in x4 steps, 256 MiB and 1 GB
(:data:`triton_dist.bench.script.COLLECTIVE_SWEEP_BYTES`; ``--quick``: 8 KiB, 256 KiB, 16 MiB,
256 MiB), swept once per element type (bf16, then fp32). For each:

- ours: :func:`triton_dist.ops.all_gather` with one context of the largest size into an
  ordinary (torch.empty) ``out``, methods ``sm_push``, ``ce_push``, ``ce_chunked``, ``ce_pull``,
  ``ring`` and (up to ``LL_MAX_BYTES`` per rank) ``ll``; ``ours_us`` is the fastest, each is also
  recorded (``sm_push_us``, ``ce_push_us``, ``ce_chunked_us``, ``ce_pull_us``, ``ring_us``,
  ``ll_us``, ``method``);
- zero-copy (from :data:`ZERO_COPY_MIN_BYTES` per rank): the same call into a symmetric ``out``
  (``tdist.symm_empty``), methods ``ce_zero_copy`` and ``sm_zero_copy`` (``ce_zero_copy_us``,
  ``sm_zero_copy_us``; ``zero_copy_us`` the faster, ``zero_copy_method``). Not in ``ours_us``:
  NCCL writes an ordinary tensor, the zero-copy methods need the output on the symmetric heap;
- ``torch_nccl_us``: ``torch.distributed.all_gather_into_tensor`` on the same data.

Every result is checked once against NCCL before timing (exact equality). Timing:
:mod:`triton_dist.bench.timing` (fixed counts on every rank, synchronise, host and GPU barriers per sample,
median per rank, MAX over ranks); small sizes time several back-to-back calls per sample queued
behind a GPU delay, so host launch latency is not what is measured (the same for every contender).

``algbw_gbps`` = world * bytes / t (the gathered output per unit time); ``busbw_gbps`` = (w-1) *
bytes / t (NCCL's bus bandwidth for AllGather: what each rank receives over the link).
``bound_us`` = max(2.9 us, (w-1) * bytes / 384 GB/s): every rank must receive (w-1) * bytes over
its link, at best at the measured bidirectional copy-engine put bandwidth (bench/language_floors,
2 x H200, both GPUs pushing), and no call can beat one measured signal round trip.
``link_fraction`` / ``zero_copy_link_fraction`` = busbw / LINK_GBPS: the share of that peer-copy
bandwidth reached (the large-message target is >= 0.9); ``zero_copy_algbw_gbps`` /
``zero_copy_busbw_gbps`` as above for the zero-copy time. The heap must hold the context
(``3 * world`` times the largest size) plus the symmetric out (``world`` times): the default is
``4 * world + 4`` GiB; pass ``--heap-size`` for another.
Writes bench/results/<gpu>-x<world>/allgather.json.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
try:
    import triton_dist._C  # noqa: F401  an installed build
except ImportError:
    sys.path.insert(0, str(HERE.parent / "python"))

import triton_dist as tdist  # noqa: E402
from triton_dist import bench  # noqa: E402
from triton_dist import ops  # noqa: E402
from triton_dist.kernels import AllGatherContext  # noqa: E402
from triton_dist.kernels.collectives.allgather import LL_MAX_BYTES  # noqa: E402

KIB, MIB = bench.script.KIB, bench.script.MIB
LINK_GBPS = bench.script.LINK_GBPS
ROUND_TRIP_US = bench.script.ROUND_TRIP_US

log = bench.script.logger("allgather")

ZERO_COPY_MIN_BYTES = 2 * MIB
"""Per-rank sizes from which the symmetric-out (zero-copy) methods are measured."""

all_ok = bench.script.all_ranks_ok


def main() -> int:
    import os

    world = int(os.environ.get("WORLD_SIZE", "1"))
    # Heap: the 1 GB context (3 * world times the largest size) and the symmetric out (world times).
    return bench.script.collective_main(
        "allgather", __doc__, HERE / "results", log, sweep, heap_size=f"{4 * world + 4}G",
        quick_sizes=[8 * KIB, 256 * KIB, 16 * MIB, 256 * MIB],
        extra=("bytes", "method", "sm_push_us", "ce_push_us", "ce_chunked_us", "ce_pull_us", "ring_us", "ll_us",
               "busbw_gbps", "zero_copy_us", "zero_copy_method", "zero_copy_busbw_gbps", "zero_copy_link_fraction",
               "torch_nccl_busbw_gbps"))


def sweep(dtype, sizes: list[int], iters: int, world: int, rank: int, device, gpu: str) -> list[dict]:
    """Every per-rank size of ``sizes`` (bytes) in ``dtype``: checked, then timed; one record each."""
    import torch
    import torch.distributed as dist

    dtype_name = str(dtype).replace("torch.", "")
    n_max = max(sizes) // dtype.itemsize
    ctx = AllGatherContext(max(sizes), dtype)  # collective; preloads every kernel
    g = torch.Generator(device=device)
    g.manual_seed(2000 + rank)
    x_all = torch.randn(n_max, device=device, dtype=torch.float32, generator=g).to(dtype)
    out_all = torch.empty(world * n_max, device=device, dtype=dtype)
    nccl_out_all = torch.empty_like(out_all)
    symm_out_all = tdist.symm_empty((world * n_max, ), dtype)  # collective, like the context
    bench.sync_and_barrier()

    records = []
    for nbytes in sizes:
        n = nbytes // dtype.itemsize
        x, out, nccl_out = x_all[:n], out_all[:world * n], nccl_out_all[:world * n]
        ref = torch.empty_like(out)
        dist.all_gather_into_tensor(ref, x)

        symm_out = symm_out_all[:world * n]

        def ours(method, x=x, out=out):
            return lambda: ops.all_gather(x, out=out, method=method, context=ctx)

        methods = ["sm_push", "ce_push", "ce_chunked", "ce_pull", "ring"] + (["ll"] if nbytes <= LL_MAX_BYTES else [])
        zero_copy = ["ce_zero_copy", "sm_zero_copy"] if nbytes >= ZERO_COPY_MIN_BYTES else []
        fns = {m: ours(m) for m in methods}
        fns.update({m: ours(m, out=symm_out) for m in zero_copy})
        fns["torch_nccl"] = lambda x=x, o=nccl_out: dist.all_gather_into_tensor(o, x)

        checks = {}
        for name in methods + zero_copy:
            target = symm_out if name in zero_copy else out
            target.fill_(float("nan"))
            fns[name]()
            torch.cuda.synchronize()
            checks[name] = all_ok(bool(torch.equal(target, ref)))
        bench.sync_and_barrier()

        group = max(1, min(16, (4 * MIB) // nbytes))
        delay = 50.0  # the GPU waits while the host queues the sample, so launch latency is outside it
        times = {}
        for name, fn in fns.items():
            times[name] = bench.median_us(fn, warmup=5, iters=iters, group=group, gpu_delay_us=delay, graph=True)
        verified = [m for m in methods if checks[m]]
        best = min(verified or methods, key=times.get)
        ours_us = times[best]
        bus = (world - 1) * nbytes
        bound = max(ROUND_TRIP_US, bus / (LINK_GBPS * 1e3))
        zc = {}
        if zero_copy:
            zc_verified = [m for m in zero_copy if checks[m]]
            zc_best = min(zc_verified or zero_copy, key=times.get)
            zc_us = times[zc_best]
            zc = dict(zero_copy_us=zc_us, zero_copy_method=zc_best, ce_zero_copy_us=times["ce_zero_copy"],
                      sm_zero_copy_us=times["sm_zero_copy"], zero_copy_algbw_gbps=world * nbytes / (zc_us * 1e3),
                      zero_copy_busbw_gbps=bus / (zc_us * 1e3), zero_copy_link_fraction=bus / (zc_us * 1e3) / LINK_GBPS)
        per_method = "  ".join(f"{m} {times[m]:9.2f} us" for m in methods + zero_copy)
        log(f"{dtype_name:>8} {nbytes:>10d} B  {per_method}  NCCL {times['torch_nccl']:9.2f} us  "
            f"bound {bound:8.2f} us  "
            f"link {bus / (ours_us * 1e3) / LINK_GBPS:.2f}"
            + (f" (zero-copy {zc['zero_copy_link_fraction']:.2f})" if zc else "") + f"  checks {checks}")
        records.append(
            bench.record("all_gather", shape=[n], dtype=dtype_name, world_size=world, gpu=gpu, ours_us=ours_us,
                         baselines={"torch_nccl_us": times["torch_nccl"]}, bound_us=bound, bytes=nbytes,
                         method=best, sm_push_us=times["sm_push"], ce_push_us=times["ce_push"], ring_us=times["ring"],
                         ce_pull_us=times["ce_pull"],
                         ce_chunked_us=times["ce_chunked"], ll_us=times.get("ll"),
                         algbw_gbps=world * nbytes / (ours_us * 1e3), busbw_gbps=bus / (ours_us * 1e3),
                         link_gbps=LINK_GBPS, link_fraction=bus / (ours_us * 1e3) / LINK_GBPS, **zc,
                         torch_nccl_busbw_gbps=bus / (times["torch_nccl"] * 1e3),
                         verified=all(checks.values()), checks=checks,
                         timing={"iters": iters, "group": group, "gpu_delay_us": delay, "cuda_graph": True,
                                 "gpu_barrier": True},
                         bound_method=f"max({ROUND_TRIP_US} us, (w-1)*bytes / {LINK_GBPS} GB/s)"))

    del ctx, symm_out_all, symm_out  # symmetric memory goes before the next sweep's and the runtime
    return records


if __name__ == "__main__":
    sys.exit(main())
