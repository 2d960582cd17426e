"""AllReduce (sum; bf16 and fp32): ours (ll, one-shot, two-shot) vs torch.distributed (NCCL) vs torch symm_mem.

    torchrun --nproc-per-node=2 bench/allreduce.py [--quick] [--dtypes bfloat16,float32]

Sizes (bytes of the message) 8 KiB .. 128 MiB in x4 steps, 256 MiB and 1 GB
(:data:`triton_dist.bench.script.COLLECTIVE_SWEEP_BYTES`; ``--quick``: 8 KiB, 64 KiB, 256 KiB,
4 MiB, 64 MiB), swept once per element type (bf16, then fp32). For each:

- ours: :func:`triton_dist.ops.all_reduce` with one context of the largest size, methods
  ``one_shot``, ``two_shot``, ``ring``, for sizes up to ``AllReduceContext.LL_MAX_BYTES``
  ``ll``, and from
  2 MiB ``ce_two_shot``; ``ours_us`` is the fastest, each is also recorded (``one_shot_us``,
  ``two_shot_us``, ``ring_us``, ``ll_us``, ``ce_two_shot_us``: null where not run; ``method``);
- ``torch_nccl_us``: ``torch.distributed.all_reduce`` (NCCL) on the same data;
- ``torch_symm_mem_us``: ``torch.ops.symm_mem.one_shot_all_reduce(buf, "sum", group_name)`` on a
  ``torch.distributed._symmetric_memory`` buffer (omitted if unavailable or failing).

Every result is checked once against NCCL before timing. Timing: :mod:`triton_dist.bench.timing`
(fixed counts on every rank, synchronise, host and GPU barriers per sample, median per rank, MAX over ranks);
small sizes time several back-to-back calls per sample queued behind a GPU delay, so host launch
latency is not what is measured (the same for every contender).

``busbw_gbps`` = 2 (w-1)/w * bytes / t (NCCL's bus bandwidth). ``bound_us`` = 2 (w-1)/w * bytes /
384 GB/s + 2.9 us: the bytes each rank must move over the link at the measured bidirectional
copy-engine put bandwidth (bench/language_floors, 2 x H200), plus one measured signal round trip.
Writes bench/results/<gpu>-x<world>/allreduce.json.
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
from triton_dist.kernels import AllReduceContext  # noqa: E402

KIB, MIB = bench.script.KIB, bench.script.MIB
LINK_GBPS = bench.script.LINK_GBPS
ROUND_TRIP_US = bench.script.ROUND_TRIP_US
CE_MIN_BYTES = 2 * MIB  # ce_two_shot is timed from here up (below, its barrier and copy set-up dominate)

log = bench.script.logger("allreduce")

all_ok = bench.script.all_ranks_ok


def make_symm_mem_baseline(n_max: int, dtype, device):
    """``(buffer, fn(n))`` for torch's one-shot symmetric-memory AllReduce, or None."""
    try:
        return bench.script.symm_mem_one_shot_all_reduce(n_max, dtype, device)
    except Exception as e:  # noqa: BLE001 - the baseline is optional
        log(f"torch symm_mem one_shot_all_reduce unavailable ({type(e).__name__}: {e}); baseline omitted")
        return None


def main() -> int:
    # Heap: the 1 GB context's staging and gather buffers, two halves each, and the ring's inbox.
    return bench.script.collective_main(
        "allreduce", __doc__, HERE / "results", log, sweep, heap_size="12G",
        quick_sizes=[8 * KIB, 64 * KIB, 256 * KIB, 4 * MIB, 64 * MIB],
        extra=("bytes", "method", "ll_us", "one_shot_us", "two_shot_us", "ce_two_shot_us", "ring_us", "busbw_gbps",
               "torch_nccl_busbw_gbps"))


def sweep(dtype, sizes: list[int], iters: int, world: int, rank: int, device, gpu: str) -> list[dict]:
    """Every size of ``sizes`` (bytes) in ``dtype``: checked, then timed; one record each."""
    import torch
    import torch.distributed as dist

    dtype_name = str(dtype).replace("torch.", "")
    n_max = max(sizes) // dtype.itemsize
    ctx = AllReduceContext(max(sizes), dtype)  # collective; preloads every kernel
    symm = make_symm_mem_baseline(n_max, dtype, device)
    symm_ok = all_ok(symm is not None)
    if not symm_ok:
        symm = None
    g = torch.Generator(device=device)
    g.manual_seed(1000 + rank)
    x_all = torch.randn(n_max, device=device, dtype=torch.float32, generator=g).to(dtype)
    out_all = torch.empty_like(x_all)
    nccl_all = x_all.clone()
    if symm is not None:
        symm[0].copy_(x_all)
    bench.sync_and_barrier()

    records = []
    for nbytes in sizes:
        n = nbytes // dtype.itemsize
        x, out = x_all[:n], out_all[:n]
        ref = x.to(torch.float32, copy=True)  # x.float() of an fp32 x is x itself, and NCCL sums in place
        dist.all_reduce(ref)
        ref = ref.to(dtype)

        def ours(method, x=x, out=out):
            return lambda: ops.all_reduce(x, out=out, method=method, context=ctx)

        mine = (("one_shot", "two_shot", "ring") + (("ll", ) if nbytes <= ctx.ll_max_bytes else ()) +
                (("ce_two_shot", ) if nbytes >= CE_MIN_BYTES else ()))
        fns = {name: ours(name) for name in mine}
        fns["torch_nccl"] = lambda t=nccl_all[:n]: dist.all_reduce(t)
        if symm is not None:
            fns["torch_symm_mem"] = symm[1](n)

        # Check each once (NCCL's in-place buffer drifts while timed; only its speed matters).
        checks = {}
        for name in mine:
            out.fill_(float("nan"))
            fns[name]()
            torch.cuda.synchronize()
            checks[name] = all_ok(bool(torch.equal(out, ref)) or
                                  bool(torch.allclose(out.float(), ref.float(), rtol=1e-2, atol=1e-2)))
        if symm is not None:
            try:
                got = fns["torch_symm_mem"]()
                torch.cuda.synchronize()
                good = bool(torch.allclose(got.float(), ref.float(), rtol=1e-2, atol=1e-2))
            except Exception as e:  # noqa: BLE001
                log(f"torch symm_mem failed at {nbytes} B: {type(e).__name__}: {e}")
                good = False
            checks["torch_symm_mem"] = all_ok(good)
        bench.sync_and_barrier()

        group = max(1, min(16, (4 * MIB) // nbytes))
        delay = 50.0  # the GPU waits while the host queues the sample, so launch latency is outside it
        times = {}
        for name, fn in fns.items():
            if name == "torch_symm_mem" and not checks.get(name):
                continue
            times[name] = bench.median_us(fn, warmup=5, iters=iters, group=group, gpu_delay_us=delay, graph=True)
        if symm is not None:
            symm[0][:n].copy_(x)  # the in-place symm_mem baseline is not in-place, but keep inputs fresh
        best = min(mine, key=times.get)
        ours_us = times[best]
        bus = 2 * (world - 1) / world * nbytes
        bound = bus / (LINK_GBPS * 1e3) + ROUND_TRIP_US
        log(f"{dtype_name:>8} {nbytes:>10d} B  ll {times.get('ll', float('nan')):9.2f} us  "
            f"one-shot {times['one_shot']:9.2f} us  two-shot {times['two_shot']:9.2f} us  "
            f"ce-two-shot {times.get('ce_two_shot', float('nan')):9.2f} us  ring {times['ring']:9.2f} us  "
            f"NCCL {times['torch_nccl']:9.2f} us  "
            f"symm_mem {times.get('torch_symm_mem', float('nan')):9.2f} us  checks {checks}")
        records.append(
            bench.record("all_reduce", shape=[n], dtype=dtype_name, world_size=world, gpu=gpu, ours_us=ours_us,
                         baselines={"torch_nccl_us": times["torch_nccl"],
                                    "torch_symm_mem_us": times.get("torch_symm_mem")},
                         bound_us=bound, bytes=nbytes, busbw_gbps=bus / (ours_us * 1e3),
                         torch_nccl_busbw_gbps=bus / (times["torch_nccl"] * 1e3), method=best,
                         one_shot_us=times["one_shot"], two_shot_us=times["two_shot"], ll_us=times.get("ll"),
                         ring_us=times["ring"],
                         ce_two_shot_us=times.get("ce_two_shot"),
                         verified=all(checks[name] for name in mine), checks=checks,
                         timing={"iters": iters, "group": group, "gpu_delay_us": delay, "cuda_graph": True,
                                 "gpu_barrier": True},
                         bound_method=f"2(w-1)/w*bytes / {LINK_GBPS} GB/s + {ROUND_TRIP_US} us"))

    del symm, ctx  # symmetric memory (ours and torch's) goes before the next sweep's, the runtime and the process group
    return records


if __name__ == "__main__":
    sys.exit(main())
