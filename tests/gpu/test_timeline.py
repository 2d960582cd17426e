"""The timeline on a GPU: ag_gemm and gemm_rs recorded at any world size. Every rank's trace holds
each output tile of every call exactly once, its phases in order inside it (wait, compute,
epilogue), on one clock across ranks; results are the same with and without the recording; the
trace JSON loads; a plain call after the recording runs without stamps."""

import json

import pytest
import torch
import torch.distributed as dist

import triton_dist as tdist
from conftest import all_ranks_agree, rank_randn
from triton_dist import ops
from triton_dist.kernels import AllGatherGemmContext


def _tiles_ok(spans, expected_tiles):
    tiles = [s for s in spans if s["name"] == "tile"]
    ok = len(tiles) == expected_tiles
    for s in spans:
        ok &= s["end"] >= s["start"]
    by_program = {}
    for s in spans:
        by_program.setdefault(s["program"], []).append(s)
    for program_spans in by_program.values():
        for tile in (s for s in program_spans if s["name"] == "tile"):
            inside = [s for s in program_spans if s["name"] != "tile" and tile["start"] <= s["start"] <= tile["end"]]
            ok &= [s["name"] for s in inside][-2:] == ["compute", "epilogue"]
    return ok


@pytest.mark.parametrize("producer", ["ce_push", "sm_push_inline"])  # sm_push_inline: its GEMM pushes first
def test_ag_gemm_timeline(tmp_path, producer):
    m, n, k = 512, 1024, 512
    world = dist.get_world_size()
    ctx = AllGatherGemmContext(m, k, torch.bfloat16, method=producer)
    a = rank_randn((m, k), torch.bfloat16, 1)
    b = rank_randn((n, k), torch.bfloat16, 2)
    plain = ops.ag_gemm(a, b, context=ctx)
    timeline = tdist.timeline.Timeline()
    with tdist.timeline.recording(timeline):  # compiles the stamped variant: ranks start it apart
        ops.ag_gemm(a, b, context=ctx)
    torch.cuda.synchronize()
    tdist.barrier()
    with tdist.timeline.recording(timeline):
        recorded = [ops.ag_gemm(a, b, context=ctx)]  # a launch's records replace the previous launch's
    torch.cuda.synchronize()
    spans = tdist.timeline.gather(timeline)
    tiles = (world * m // 128) * (n // 128 if n < 2048 else n // 256)  # the consumer's config for this shape
    ok = all(torch.equal(r, plain) for r in recorded) and sorted(spans) == list(range(world))
    ok &= _tiles_ok(spans[dist.get_rank()], tiles if world > 1 else 0)  # one rank: the plain GEMM, unstamped
    if world > 1:
        ok &= any(s["name"] == "wait" for s in spans[dist.get_rank()])
        # One clock: the call's spans of every rank fit in 50 ms (the call takes far less; a
        # world-8 trace of a call that compiled its stamped variants once had ranks 1.7 s apart).
        every = [s for rank_spans in spans.values() for s in rank_spans]
        ok &= max(s["end"] for s in every) - min(s["start"] for s in every) < 50e6
    path = tdist.timeline.write_chrome_trace(spans, str(tmp_path / "ag_gemm.json"), "ag_gemm")
    with open(path) as f:
        ok &= len(json.load(f)["traceEvents"]) > 0
    after = ops.ag_gemm(a, b, context=ctx)  # outside the recording: the unstamped variant, same result
    torch.cuda.synchronize()
    ok &= torch.equal(after, plain)
    all_ranks_agree(ok, f"ag_gemm {producer} timeline: {tdist.timeline.summary(spans).get(dist.get_rank())}")


def test_gemm_rs_timeline():
    world = dist.get_world_size()
    m, n, k = 256, 512, 256
    a = rank_randn((world * m, k), torch.bfloat16, 3)
    b = rank_randn((n, k), torch.bfloat16, 4)
    want = ops.gemm_rs(a, b, method="fused")
    timeline = tdist.timeline.Timeline()
    with tdist.timeline.recording(timeline):
        got = ops.gemm_rs(a, b, method="fused")
    torch.cuda.synchronize()
    spans = tdist.timeline.gather(timeline)
    ok = torch.equal(got, want)
    mine = spans[dist.get_rank()]
    tiles = sum(1 for s in mine if s["name"] == "tile")
    ok &= (tiles > 0 or world == 1) and all(s["end"] >= s["start"] for s in mine)
    all_ranks_agree(ok, f"gemm_rs timeline: {tdist.timeline.summary(spans).get(dist.get_rank())}")
