"""The paged decode attention kernels compile for sm_90 for every supported shape family (head
dims, GQA groups, query tokens, page sizes, soft-cap), with tensor-core dots, no spills, and the
host rules (splits, row padding, input checks that need no GPU)."""

import pytest

from triton_dist.kernels.attention import decode
from triton_dist.tools.compile_check import compile_for_hopper, spill_bytes

_SPLIT = {"q": "*bf16", "k_cache": "*bf16", "v_cache": "*bf16", "block_table": "*i32", "seq_lens": "*i32",
          "part_out": "*fp32", "part_lse": "*fp32", "num_splits": "i32", "max_blocks": "i32", "num_blocks": "i32",
          "scale": "fp32", "soft_cap": "fp32", "causal": "i32"}


@pytest.mark.parametrize("head_dim,q_heads,kv_heads,tokens,page,soft_cap", [
    (128, 32, 8, 1, 16, False), (128, 32, 8, 1, 64, False), (64, 16, 16, 1, 1, False), (128, 16, 1, 8, 16, True),
    (64, 64, 4, 4, 64, False), (128, 8, 8, 2, 16, True)])
def test_split_kernel_compiles_with_tensor_cores_and_no_spills(head_dim, q_heads, kv_heads, tokens, page, soft_cap):
    group = q_heads // kv_heads
    meta = dict(Q_HEADS=q_heads, KV_HEADS=kv_heads, T=tokens, D=head_dim, PAGE=page,
                M_PAD=decode.row_pad(group, tokens), BLOCK_N=decode.BLOCK_N, SOFT_CAP=soft_cap)
    warps = decode.split_warps(meta["M_PAD"], head_dim)
    compiled = compile_for_hopper(decode.decode_split_kernel, dict(_SPLIT), meta, num_warps=warps, num_stages=2)
    ptx = compiled.asm["ptx"]
    assert "mma" in ptx, "the QK and PV products did not use tensor cores"
    assert "ex2.approx" in ptx  # the base-2 softmax
    assert spill_bytes(ptx) == (0, 0)


@pytest.mark.parametrize("splits", [1, 3, 64])
def test_combine_kernel_compiles(splits):
    import triton

    compile_for_hopper(decode.combine_splits_kernel, {"part_out": "*fp32", "part_lse": "*fp32", "out": "*bf16",
                                                      "lse": "*fp32", "num_splits": "i32"},
                       dict(ROWS_PER_BATCH=32, D=128, SPLITS=triton.next_power_of_2(splits)), num_warps=4)


def test_rows_pad_to_a_power_of_two_of_at_least_16():
    assert decode.row_pad(1, 1) == 16 and decode.row_pad(4, 1) == 16 and decode.row_pad(4, 8) == 32
    assert decode.row_pad(16, 8) == 128 and decode.row_pad(5, 3) == 16 and decode.row_pad(6, 3) == 32


def test_splits_fill_the_sms_and_stay_at_least_two_tiles_long():
    assert decode.pick_splits(1, 8, 128 * 1024, 132) == 66  # batch 1: 528 programs, about 4 waves
    assert decode.pick_splits(64, 8, 128 * 1024, 132) == 1  # a wide batch fills the GPU alone
    assert decode.pick_splits(1, 8, 100, 132) == 1  # a short sequence: one tile is all there is
    assert decode.pick_splits(1, 1, 10**7, 132) == 256  # capped


@pytest.mark.parametrize("world", [1, 2, 4, 8])
def test_cross_rank_combine_compiles_with_its_protocol(world):
    import re

    import triton

    from triton_dist.kernels.attention import flash_decode

    compiled = compile_for_hopper(
        flash_decode.flash_decode_combine_kernel,
        {"part_out": "*fp32", "part_lse": "*fp32", "parts": "*fp32", "lses": "*fp32", "signals": "*u64",
         "out": "*bf16", "out_lse": "*fp32", "rows": "i32", "epoch_ptr": "*i64", "slot_rows": "i32",
         "parts_half": "i64", "lses_half": "i64", "max_programs": "i32"},
        dict(WORLD=world, D=128, ROWS=flash_decode.ROWS_PER_TILE,
             WORLD_POW2=triton.next_power_of_2(world)), num_warps=4)
    ptx = compiled.asm["ptx"]
    assert ptx.count("ld.acquire.sys.global.u64") >= world  # one acquire spin per rank's signal
    assert re.search(r"atom\.(global\.)?(sys\.)?release|atom\.release\.sys", ptx), "no release signal"
    assert spill_bytes(ptx) == (0, 0)
