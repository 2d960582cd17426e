"""Tutorial 07: long-context decode over ranks (distributed flash decoding).

    torchrun --nproc-per-node=2 tutorials/07_flash_decode.py [--tokens N]   (default 262144)

One sequence of 256K tokens is too long for one GPU's decode step to be fast: its KV cache is cut
along the sequence, rank ``r`` holding tokens ``[r * L / world, (r + 1) * L / world)`` in its own
paged cache. Every rank gets the same query (one new token, 32 query heads over 8 KV heads), attends
over its own part (``paged_decode``, split over the SMs), and ``ops.flash_decode`` combines the
ranks' partial outputs by their log-sum-exp, on the GPU, through symmetric memory and signals:
every rank ends with the attention over the whole sequence.

The check: every rank rebuilds the whole KV from seeds and computes the attention in fp32.
``--tokens`` shortens the sequence (the same kernels on smaller shapes: what compute-sanitizer runs,
scripts/gpu-test --parts faults).
"""

import argparse

import torch

import triton_dist as tdist
from triton_dist import ops


def _generator(seed: int) -> torch.Generator:
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    return g


def check(length: int = 256 * 1024, q_heads: int = 32, kv_heads: int = 8, head_dim: int = 128, page: int = 64,
          rounds: int = 3) -> bool:
    """``rounds`` decode steps with fresh queries over one sequence of ``length`` tokens split over
    the ranks; True when every step matched the fp32 reference on this rank."""
    world, me = tdist.world_size(), tdist.rank()
    k = torch.randn((length, kv_heads, head_dim), generator=_generator(1), device="cuda").bfloat16()
    v = torch.randn((length, kv_heads, head_dim), generator=_generator(2), device="cuda").bfloat16()
    lo, hi = me * length // world, (me + 1) * length // world
    pages = -(-(hi - lo) // page)
    # This rank's part as a paged cache (pages in order here; any order works through the table).
    k_cache = torch.zeros((pages, page, kv_heads, head_dim), device="cuda", dtype=torch.bfloat16)
    v_cache = torch.zeros_like(k_cache)
    k_cache.view(-1, kv_heads, head_dim)[:hi - lo] = k[lo:hi]
    v_cache.view(-1, kv_heads, head_dim)[:hi - lo] = v[lo:hi]
    table = torch.arange(pages, device="cuda", dtype=torch.int32)[None, :]
    lens = torch.tensor([hi - lo], device="cuda", dtype=torch.int32)
    ok = True
    for step in range(rounds):
        q = torch.randn((1, 1, q_heads, head_dim), generator=_generator(100 + step), device="cuda").bfloat16()
        out, lse = ops.flash_decode(q, k_cache, v_cache, table, lens)
        torch.cuda.synchronize()
        # fp32 reference over the whole sequence.
        group = q_heads // kv_heads
        scores = torch.einsum("hd,lhd->hl", q[0, 0].float(), k.float().repeat_interleave(group, 1)) * head_dim ** -0.5
        want = torch.einsum("hl,lhd->hd", torch.softmax(scores, -1), v.float().repeat_interleave(group, 1))
        err = ((out[0, 0].float() - want).abs().max() / want.abs().max()).item()
        lse_err = (lse[0, 0] - torch.logsumexp(scores, -1)).abs().max().item()
        ok = ok and err < 1e-2 and lse_err < 1e-2
        if me == 0:
            print(f"step {step}: max relative error {err:.1e}, LSE error {lse_err:.1e}", flush=True)
    tdist.barrier()
    ops.clear_contexts()
    return ok


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=256 * 1024, help="sequence length (default 262144)")
    args = parser.parse_args()
    tdist.init()
    ok = check(length=args.tokens)
    print(f"rank {tdist.rank()}: distributed flash decoding {'matches' if ok else 'DIFFERS FROM'} the reference")
    tdist.finalize()
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
