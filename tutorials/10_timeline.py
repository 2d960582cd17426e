"""Tutorial 10: see the overlap. Record one call of ag_gemm and one of gemm_rs, and write each as a
trace a browser opens (chrome://tracing or https://ui.perfetto.dev) and as a PNG.

    torchrun --nproc-per-node=2 tutorials/10_timeline.py [--out DIR]   (default: $OUT or the temp dir)

Each rank's persistent GEMM programs are rows of the trace; every output tile is a span split into
its wait (AllGather+GEMM: for the rows of the rank that holds them; GEMM+ReduceScatter "fused": the
epilogue of this rank's own tiles waits for the peers' partials), its K loop and its epilogue. The
summary printed is the share of tile time spent waiting, per rank; last, what recording costs a call
(meaningless where ranks share a GPU).
"""

import argparse
import json
import os
import tempfile

import torch

import triton_dist as tdist
from triton_dist import ops
from triton_dist.kernels import AllGatherGemmContext


def record(name, call, out_dir):
    timeline = tdist.timeline.Timeline()
    # The first recorded call compiles the kernels' stamped variants: ranks would start it seconds
    # apart (each rank's compile), so record the second.
    for _ in range(2):
        with tdist.timeline.recording(timeline):
            call()
        torch.cuda.synchronize()
        tdist.barrier()
    spans = tdist.timeline.gather(timeline)  # collective
    if tdist.rank() == 0:
        path = tdist.timeline.write_chrome_trace(spans, os.path.join(out_dir, f"{name}.json"), name)
        for rank, row in tdist.timeline.summary(spans).items():
            print(f"{name} rank {rank}: {row['tiles']} tiles, {row['tile']:.0f} us of tile time, "
                  f"{100 * row['wait_share']:.0f} % waiting", flush=True)
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print("wrote", path, "(no PNG: matplotlib is not installed)", flush=True)
            return
        from triton_dist.tools import plot_timeline

        with open(path) as f:
            print("wrote", path, "and", plot_timeline.plot(json.load(f), path[:-5] + ".png"), flush=True)


def cost_of_recording(name, call, out_dir, rounds=20):
    """Median time of ``call`` plain and while recording (CUDA events around each call, after the
    recorded variants are warm): the stamps' cost, printed and written to
    ``<out_dir>/timeline_overhead.json``. On ranks that share a GPU it says little."""
    def median_us():
        times = []
        for _ in range(rounds):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            tdist.barrier()
            start.record()
            call()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) * 1e3)
        return sorted(times)[rounds // 2]

    plain = median_us()
    with tdist.timeline.recording(tdist.timeline.Timeline()):
        recorded = median_us()
    if tdist.rank() == 0:
        print(f"{name}: {plain:.0f} us plain, {recorded:.0f} us recording ({100 * (recorded / plain - 1):+.1f} %)",
              flush=True)
        with open(os.path.join(out_dir, "timeline_overhead.json"), "w") as f:
            json.dump(dict(op=name, world_size=tdist.world_size(), gpu=torch.cuda.get_device_name(),
                           ranks_share_a_gpu=tdist.world_size() > torch.cuda.device_count(), plain_us=plain,
                           recording_us=recorded, rounds=rounds, method="CUDA events around one call, median"), f)


def main():
    parser = argparse.ArgumentParser()
    # $OUT: the GPU machine's folder that comes back (scripts/gpu-test runs every tutorial).
    parser.add_argument("--out", default=os.environ.get("OUT") or tempfile.gettempdir())
    args = parser.parse_args()
    tdist.init()
    world, me = tdist.world_size(), tdist.rank()
    m, n, k = 2048, 4096, 4096
    g = torch.Generator(device="cuda").manual_seed(me)
    a = torch.randn((m, k), device="cuda", generator=g).bfloat16()
    b = torch.randn((n, k), device="cuda", generator=g).bfloat16()
    ctx = AllGatherGemmContext(m, k, torch.bfloat16)
    ops.ag_gemm(a, b, context=ctx)  # compiled and warm before the recorded call
    ops.gemm_rs(torch.cat([a] * world), b, method="fused")
    torch.cuda.synchronize()
    record("ag_gemm", lambda: ops.ag_gemm(a, b, context=ctx), args.out)
    record("gemm_rs_fused", lambda: ops.gemm_rs(torch.cat([a] * world), b, method="fused"), args.out)
    cost_of_recording("ag_gemm", lambda: ops.ag_gemm(a, b, context=ctx), args.out)
    tdist.barrier()
    print(f"rank {me}: timelines recorded")
    tdist.finalize()


if __name__ == "__main__":
    main()
