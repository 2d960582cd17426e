"""Expert-parallel dispatch and combine (µs): ours (triton_dist.kernels.moe, both modes)
against what frameworks do with ``torch.distributed.all_to_all_single`` and its counts exchange,
and against the bound.

    torchrun --nproc-per-node=2 bench/ep_alltoall.py [--quick]

Shapes: hidden 7168, top-8 of 256 experts, bf16 (DeepSeek-V3-class MoE layers), 128 tokens per rank
(decode, the low-latency mode) and 4,096 (prefill, ``mode="high_throughput"``: the low-latency
mode's fixed receive layout, ``[local experts, world * max_tokens, hidden]``, would take 15 GB per
rank there). Routing: uniform random top-8 per token, seeded per rank.

- ``dispatch``: ours, one call (layout and dispatch kernels); the baseline sorts the (token,
  expert) assignments by destination rank, exchanges the counts with ``all_to_all_single``, reads
  them on the host for the split sizes and sends the rows with a second ``all_to_all_single`` (a
  token goes once per expert, as frameworks send it).
- ``dispatch+combine``: the round trip with identity experts: ours ``ep_combine(d.x, d.handle)``;
  the baseline sends the rows back with the reverse ``all_to_all_single`` and adds them, weighted,
  into token order (``index_add_``).
- ``dispatch_fp8``: ours with ``fp8_dispatch=True`` (rows quantised to e4m3 by the sender, one
  scale per 128 values) against the same bf16 baseline; its bound is half the bf16 one.
- ``ep_dispatch_combine_ht``: the round trip at 4,096 tokens in high-throughput mode (its output
  sized by the counts: one host synchronisation, as the baseline's), against the same baseline.

Bound: the bytes this rank must send over the link (each token once per other destination rank:
``hidden * 2`` bytes times the distinct remote ranks of its experts; for the round trip twice) at
``LINK_GBPS`` (bench/results/h200-x2/language_floors.json), plus one signal round trip per
direction. Per-call timing (median over ranks' medians, max over ranks; no CUDA graphs: the
baseline synchronises with the host). Checked: ours' round trip against ``(sum_k w_k) * x`` per
token. Refuses to run with ranks sharing GPUs. Writes bench/results/<gpu>-x<world>/ep_alltoall.json.
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

log = bench.script.logger("ep_alltoall")
HIDDEN, EXPERTS, TOPK = 7168, 256, 8


def _routing(tokens: int, rank: int, device):
    import torch

    g = torch.Generator(device=device).manual_seed(7 + rank)
    x = torch.randn((tokens, HIDDEN), device=device, generator=g).to(torch.bfloat16)
    weights, idx = torch.rand((tokens, EXPERTS), device=device, generator=g).topk(TOPK, dim=1)
    return x, idx.to(torch.int32).contiguous(), (weights / weights.sum(1, keepdim=True)).contiguous()


def _baseline(x, idx, weights, world: int):
    """``(dispatch, round_trip)``: the all_to_all_single way (module notes)."""
    import torch
    import torch.distributed as dist

    local = EXPERTS // world
    flat_dst = (idx // local).flatten().long()
    order = torch.argsort(flat_dst, stable=True)
    token_of = order // TOPK
    send_counts = torch.bincount(flat_dst, minlength=world)

    def dispatch():
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts)
        splits_in, splits_out = send_counts.tolist(), recv_counts.tolist()
        received = x.new_empty((sum(splits_out), HIDDEN))
        dist.all_to_all_single(received, x[token_of], splits_out, splits_in)
        return received, splits_in, splits_out

    def round_trip():
        received, splits_in, splits_out = dispatch()
        back = x.new_empty((sum(splits_in), HIDDEN))
        dist.all_to_all_single(back, received, splits_in, splits_out)
        out = torch.zeros(x.shape, device=x.device, dtype=torch.float32)
        out.index_add_(0, token_of, back.float() * weights.flatten()[order, None])
        return out.to(x.dtype)

    return dispatch, round_trip


def _bound_us(idx, world: int, rank: int, round_trip: bool) -> float:
    import torch

    local = EXPERTS // world
    dst = idx // local
    remote = torch.zeros((idx.shape[0], world), dtype=torch.bool, device=idx.device)
    remote.scatter_(1, dst.long(), True)
    remote[:, rank] = False
    nbytes = int(remote.sum()) * HIDDEN * 2 * (2 if round_trip else 1)
    return nbytes / (bench.script.LINK_GBPS * 1e3) + bench.script.ROUND_TRIP_US * (2 if round_trip else 1)


def main() -> int:
    parser = bench.script.argument_parser(__doc__, HERE / "results")
    args = parser.parse_args()

    import torch

    from triton_dist.kernels import EPContext

    world, rank, device, gpu = bench.script.start(args, log)
    iters = 10 if args.quick else 50
    records = []
    for tokens in (128, ):
        x, idx, weights = _routing(tokens, rank, device)
        dispatch_only = EPContext(tokens, HIDDEN, EXPERTS, TOPK, torch.bfloat16)  # never combined
        round_trips = EPContext(tokens, HIDDEN, EXPERTS, TOPK, torch.bfloat16)

        def ours_round_trip():
            d = round_trips.dispatch(x, idx, weights, check_routing=False)
            return round_trips.combine(d.x, d.handle)

        got = ours_round_trip()
        want = (weights.sum(1, keepdim=True) * x.float()).to(x.dtype)
        err = bench.script.relative_error(got.float(), want.float())
        verified = bench.script.all_ranks_ok(err < 2e-2)
        base_dispatch, base_round_trip = _baseline(x, idx, weights, world)
        base_err = bench.script.relative_error(base_round_trip().float(), want.float())
        cases = (("ep_dispatch", lambda: dispatch_only.dispatch(x, idx, weights, check_routing=False), base_dispatch,
                  False),
                 ("ep_dispatch_combine", ours_round_trip, base_round_trip, True))
        for name, ours, theirs, both in cases:
            ours_us = bench.median_us(ours, iters=iters)
            torch_us = bench.median_us(theirs, iters=iters)
            bound = bench.max_over_ranks(_bound_us(idx, world, rank, both))
            log(f"{name} {tokens} tokens: ours {ours_us:.1f} us, all_to_all_single {torch_us:.1f} us, bound "
                f"{bound:.1f} us; rel error {err:.1e} (baseline {base_err:.1e})")
            records.append(bench.record(name, shape=[tokens, HIDDEN, EXPERTS, TOPK], dtype="bfloat16", world_size=world,
                                        gpu=gpu, ours_us=ours_us, baselines={"torch_all_to_all_us": torch_us},
                                        bound_us=bound, iters=iters, relative_error=err, verified=verified,
                                        method="per call, median of each rank, max over ranks"))
        del dispatch_only, round_trips
        # FP8 dispatch (e4m3, a scale per 128 values): half the bytes on the link. Checked through a
        # round trip of the dequantised rows, within fp8's precision.
        fp8 = EPContext(tokens, HIDDEN, EXPERTS, TOPK, torch.bfloat16, fp8_dispatch=True)
        d = fp8.dispatch(x, idx, weights, check_routing=False)
        rows = d.x.float().view(*d.x.shape[:2], -1, 128) * d.scales[..., None]
        got = fp8.combine(rows.view(d.x.shape).to(torch.bfloat16), d.handle)
        err = bench.script.relative_error(got.float(), want.float())
        verified = bench.script.all_ranks_ok(err < 0.1)
        fp8_sends = EPContext(tokens, HIDDEN, EXPERTS, TOPK, torch.bfloat16, fp8_dispatch=True)  # never combined
        ours_us = bench.median_us(lambda: fp8_sends.dispatch(x, idx, weights, check_routing=False), iters=iters)
        torch_us = bench.median_us(base_dispatch, iters=iters)
        bound = bench.max_over_ranks(_bound_us(idx, world, rank, False) / 2)  # fp8 rows; the scales add 3 %
        log(f"ep_dispatch_fp8 {tokens} tokens: ours {ours_us:.1f} us, all_to_all_single (bf16) {torch_us:.1f} us, "
            f"bound {bound:.1f} us; round-trip rel error {err:.1e}")
        records.append(bench.record("ep_dispatch_fp8", shape=[tokens, HIDDEN, EXPERTS, TOPK], dtype="float8_e4m3fn",
                                    world_size=world, gpu=gpu, ours_us=ours_us,
                                    baselines={"torch_all_to_all_us": torch_us}, bound_us=bound, iters=iters,
                                    relative_error=err, verified=verified,
                                    method="per call, median of each rank, max over ranks"))
        del fp8, fp8_sends
    records.append(_high_throughput_round_trip(world, rank, device, gpu, iters))
    return bench.script.finish("ep_alltoall", records, args, extra=("iters", ))


def _high_throughput_round_trip(world: int, rank: int, device, gpu: str, iters: int) -> dict:
    """The prefill round trip (module notes), checked like the decode one."""
    import torch

    from triton_dist.kernels import EPContext

    tokens = 4096
    x, idx, weights = _routing(tokens, rank, device)
    ctx = EPContext(tokens, HIDDEN, EXPERTS, TOPK, torch.bfloat16, mode="high_throughput")

    def ours():
        d = ctx.dispatch(x, idx, weights, check_routing=False)
        return ctx.combine(d.x, d.handle)

    want = (weights.sum(1, keepdim=True) * x.float()).to(x.dtype)
    err = bench.script.relative_error(ours().float(), want.float())
    verified = bench.script.all_ranks_ok(err < 2e-2)
    _, base_round_trip = _baseline(x, idx, weights, world)
    ours_us = bench.median_us(ours, iters=iters)
    torch_us = bench.median_us(base_round_trip, iters=iters)
    bound = bench.max_over_ranks(_bound_us(idx, world, rank, True))
    log(f"ep_dispatch_combine_ht {tokens} tokens: ours {ours_us:.1f} us, all_to_all_single {torch_us:.1f} us, bound "
        f"{bound:.1f} us; rel error {err:.1e}")
    del ctx
    return bench.record("ep_dispatch_combine_ht", shape=[tokens, HIDDEN, EXPERTS, TOPK], dtype="bfloat16",
                        world_size=world, gpu=gpu, ours_us=ours_us, baselines={"torch_all_to_all_us": torch_us},
                        bound_us=bound, iters=iters, relative_error=err, verified=verified,
                        method="per call, median of each rank, max over ranks")


if __name__ == "__main__":
    sys.exit(main())
