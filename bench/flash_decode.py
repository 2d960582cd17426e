"""Paged decode attention on one GPU against torch SDPA (flash backend, ``enable_gqa``, contiguous
KV holding the same values): KV bytes read per second, 32 query heads of head_dim 128, bf16, one new
token, batch 1, 8 and 64, KV 4K to 1M tokens (as far as 32 GiB of KV allows), pages of 16 and 64
tokens in a random order, GQA 4 and 8. Sustained timing: a CUDA graph of 10 calls per sample.

    python bench/flash_decode.py [--quick] [--sweep-splits]

``--sweep-splits`` times ours, at batch 1 and 8 with KV 32K to 128K and pages of 16, at every split count from 8 to 256
besides the default rule's (:func:`~triton_dist.kernels.attention.decode.pick_splits`), to see
whether the split rule or the fixed cost of the two stages is what holds the short rows back;
it writes flash_decode_splits.json instead.

``bound_us`` is the KV bytes over the HBM3e peak the issue names (4.8 TB/s). Writes
bench/results/<gpu>-x1/flash_decode.json. The distributed rows (local decode + the cross-rank
combine against local decode + NCCL all-gather of the partials) are the two-GPU issue's.
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

PEAK_TBPS = 4.8
KV_BUDGET_BYTES = 32 << 30
Q_HEADS, HEAD_DIM = 32, 128


SWEPT_SPLITS = (8, 16, 24, 32, 48, 64, 96, 128, 192, 256)


def _cases(quick: bool, sweep: bool):
    batches = (1, 8) if quick or sweep else (1, 8, 64)
    lengths = (32 << 10, ) if quick else tuple(4096 << s for s in (range(3, 6) if sweep else range(0, 9)))
    for batch in batches:
        for length in lengths:
            for gqa in ((8, ) if quick else (4, 8)):
                kv_heads = Q_HEADS // gqa
                if batch * length * kv_heads * HEAD_DIM * 2 * 2 > KV_BUDGET_BYTES:
                    continue
                for page in ((16, ) if quick or sweep else (16, 64)):
                    yield batch, length, kv_heads, page


def main() -> int:
    parser = bench.script.argument_parser(__doc__, HERE / "results")
    parser.add_argument("--sweep-splits", action="store_true", help="time every split count (see above)")
    args = parser.parse_args()
    bench.script.guard(args)
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from triton_dist import residency
    from triton_dist.kernels.attention import paged_decode
    from triton_dist.kernels.attention.decode import pick_splits

    records = []
    for batch, length, kv_heads, page in _cases(args.quick, args.sweep_splits):
        g = torch.Generator(device="cuda").manual_seed(batch * 7 + length + page)
        q = torch.randn((batch, 1, Q_HEADS, HEAD_DIM), device="cuda", generator=g).bfloat16()
        k = torch.randn((batch, kv_heads, length, HEAD_DIM), device="cuda", generator=g).bfloat16()
        v = torch.randn((batch, kv_heads, length, HEAD_DIM), device="cuda", generator=g).bfloat16()
        pages = length // page
        order = torch.randperm(batch * pages, device="cuda", generator=g)
        table = order.view(batch, pages).to(torch.int32)
        # [blocks, page, kv_heads, D]: block table[b, j] holds positions j*page .. of sequence b.
        k_cache = torch.empty((batch * pages, page, kv_heads, HEAD_DIM), device="cuda", dtype=torch.bfloat16)
        v_cache = torch.empty_like(k_cache)
        k_cache[order] = k.permute(0, 2, 1, 3).reshape(batch * pages, page, kv_heads, HEAD_DIM)
        v_cache[order] = v.permute(0, 2, 1, 3).reshape(batch * pages, page, kv_heads, HEAD_DIM)
        lens = torch.full((batch, ), length, device="cuda", dtype=torch.int32)
        out = torch.empty_like(q)
        lse = torch.empty(q.shape[:3], device="cuda")
        q_sdpa = q.permute(0, 2, 1, 3).contiguous()  # [B, Hq, 1, D]
        sdpa_out = torch.empty_like(q_sdpa)

        def ours(splits=None):
            paged_decode(q, k_cache, v_cache, table, lens, out=out, lse=lse, check_table=False, num_splits=splits)

        def sdpa():
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                sdpa_out.copy_(torch.nn.functional.scaled_dot_product_attention(q_sdpa, k, v, enable_gqa=True))

        ours()
        sdpa()
        torch.cuda.synchronize()
        error = float((out.float() - sdpa_out.permute(0, 2, 1, 3).float()).abs().max() /
                      sdpa_out.float().abs().max())
        kv_bytes = 2 * k.numel() * k.element_size()
        ours_us = bench.median_us(ours, warmup=3, iters=20, group=10, graph=True)
        sdpa_us = bench.median_us(sdpa, warmup=3, iters=20, group=10, graph=True)
        sweep = {}
        if args.sweep_splits:
            default = pick_splits(batch, kv_heads, length, residency.sm_count(q.device))
            for splits in sorted({default, *SWEPT_SPLITS}):
                sweep[splits] = bench.median_us(lambda: ours(splits), warmup=3, iters=20, group=10, graph=True)
            best = min(sweep, key=sweep.get)
            print(f"[flash_decode] batch {batch} KV {length} kv_heads {kv_heads} page {page}: default splits "
                  f"{default} {sweep[default]:.1f} us, best {best} {sweep[best]:.1f} us ("
                  + ", ".join(f"{s}: {t:.1f}" for s, t in sweep.items()) + ")", flush=True)
        records.append(bench.record(
            "paged_decode", shape=[batch, length, Q_HEADS, kv_heads, HEAD_DIM], dtype="bfloat16", world_size=1,
            gpu=bench.gpu_slug(), ours_us=ours_us, baselines={"torch_sdpa_us": sdpa_us},
            bound_us=kv_bytes / (PEAK_TBPS * 1e12) * 1e6, verified=error < 2e-2, page=page,
            ours_tbps=kv_bytes / ours_us / 1e6, sdpa_tbps=kv_bytes / sdpa_us / 1e6, max_rel_error=error,
            timing={"iters": 20, "graph_calls": 10}, **({"splits_us": sweep} if sweep else {})))
        print(f"[flash_decode] batch {batch} KV {length} kv_heads {kv_heads} page {page}: ours "
              f"{records[-1]['ours_tbps']:.2f} TB/s, SDPA {records[-1]['sdpa_tbps']:.2f} TB/s, err {error:.1e}",
              flush=True)
        del k, v, k_cache, v_cache
        torch.cuda.empty_cache()
    bench.print_table(records, extra=("page", "ours_tbps", "sdpa_tbps"))
    name = "flash_decode_splits" if args.sweep_splits else "flash_decode"
    print(f"[flash_decode] wrote {bench.write_results(records, name, root=args.out, rank=0)}")
    return 0 if all(r["verified"] for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
