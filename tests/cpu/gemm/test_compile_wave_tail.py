"""The wave-tail GEMM (kernels/gemm/wave_tail.py) compiles for sm_90: wgmma not serialised, a
pipelined TMA K loop (one: whole tiles and slices share it), no spills, its fp32 partials read
only after the ticket that collects them; its slice rule leaves whole waves alone and cuts the
last wave into at most the SMs' worth of slices of at least MIN_TAIL_SLICE_STEPS K steps. Host
rules need no GPU."""

import re

import pytest
import triton

from triton_dist.kernels.gemm import dense as gemm_module
from triton_dist.kernels.gemm import wave_tail
from triton_dist.tools.compile_check import (compile_for_hopper, ops_matching, spill_bytes, ticket_order_problems,
                                             wgmma_serialized)

_SMEM_LIMIT = 232448  # bytes of shared memory one program may use on sm_90


def _compile(config, dtype="bf16"):
    c = gemm_module.config_params(config)
    signature = {"a_desc": f"tensordesc<{dtype}[{c['BM']}, {c['BK']}]>",
                 "b_desc": f"tensordesc<{dtype}[{c['BN']}, {c['BK']}]>",
                 "c_desc": f"tensordesc<{dtype}[{c['BM']}, {c['BN']}]>", "partials": "*fp32", "tickets": "*i32",
                 "M": "i32", "N": "i32", "K": "i32", "full_tiles": "i32", "split": "i32"}
    meta = dict(BM=c["BM"], BN=c["BN"], BK=c["BK"], GROUP_M=c["GROUP_M"], NUM_STAGES=c["NUM_STAGES"])
    return compile_for_hopper(wave_tail.gemm_wave_tail_kernel, signature, meta, num_warps=c["num_warps"],
                              num_stages=c["NUM_STAGES"])


@pytest.mark.parametrize("config,dtype", [(c, "bf16") for c in wave_tail.CONFIG_NAMES] + [("small_tail_split", "fp16")])
def test_wave_tail_gemm_uses_wgmma_without_spills(config, dtype):
    """The base config's wgmma and pipelined TMA loop, once (whole tiles and slices run the same
    loop), not serialised by ptxas, no spills (the sum of partials beside the freed accumulator),
    TMA stores of ``C`` and 16-byte stores of the partials."""
    c = gemm_module.config_params(config)
    compiled = _compile(config, dtype)
    ptx = compiled.asm["ptx"]
    assert re.search(rf"wgmma\.mma_async\.sync\.aligned\.m64n{c['BN']}k16", ptx)
    assert not wgmma_serialized(ptx)
    assert spill_bytes(ptx) == (0, 0), config
    assert compiled.metadata.shared <= _SMEM_LIMIT
    ttgir = compiled.asm["ttgir"]
    loads = ops_matching(ttgir, r"async_tma_copy_global_to_local")
    assert 2 * c["NUM_STAGES"] <= len(loads) <= 4 * c["NUM_STAGES"]  # one pipelined loop, not two
    assert "cp.async.bulk.tensor.2d.global.shared" in ptx  # C through TMA, whole tiles and sums alike
    assert all(".v4." in op for op in re.findall(r"st\.global[a-z0-9.]*", ptx))


def test_wave_tail_gemm_reads_partials_after_the_ticket():
    """As the split-K GEMM: a slice stores its fp32 partial, then a CTA barrier and one acq_rel add
    at GPU scope (the ticket); only then, in the last program, the relaxed reset and the partials'
    loads, not through the read-only path."""
    compiled = _compile("large_tail_split")
    assert ticket_order_problems(compiled) == []
    ttir = compiled.asm["ttir"].splitlines()
    assert len([line for line in ttir if "tt.store" in line]) == 1  # the partial: whole tiles and sums go by TMA
    assert len([line for line in ttir if "tt.descriptor_store" in line]) == 2  # a whole tile; a tail tile's sum


def test_tail_split_rule():
    """Issue 22's row (1024 x 14336 on 132 SMs): "large" has 448 tiles, 3 whole waves and 52 in
    the last: 2 slices each (104 programs); "small" 896, a last wave of 104: too wide to cut."""
    pick = wave_tail.pick_tail_split
    assert pick(448, 128, 132) == 2 and wave_tail.tail_split_for(1024, 14336, 8192, "large_tail_split", 132) == 2
    assert pick(896, 128, 132) == 1 and wave_tail.tail_split_for(1024, 14336, 8192, "small_tail_split", 132) == 1
    assert pick(264, 128, 132) == 1  # two whole waves: nothing to cut
    assert pick(133, 128, 132) == wave_tail.MAX_TAIL_SLICES  # one tile left over
    assert pick(140, 15, 132) == 1  # 15 K steps: too short for two slices of 8
    for tiles in (1, 7, 52, 100, 131, 132, 133, 200, 264, 448, 896, 1000):
        for steps in (1, 8, 15, 16, 17, 33, 64, 128, 224):
            for sms in (16, 78, 132):
                s = pick(tiles, steps, sms)
                tail = tiles % sms
                assert 1 <= s <= wave_tail.MAX_TAIL_SLICES
                if tail == 0:
                    assert s == 1  # whole waves only: the base kernel
                if s > 1:
                    assert tail * s <= sms  # every program runs at most one slice
                    assert steps // s >= wave_tail.MIN_TAIL_SLICE_STEPS  # the shortest slice
                elif tail and steps >= 2 * wave_tail.MIN_TAIL_SLICE_STEPS:
                    assert 2 * tail > sms  # no room for a second slice
    with pytest.raises(ValueError, match="not a wave-tail config"):
        wave_tail.tail_split_for(1024, 1024, 1024, "large", 132)


def test_wave_tail_configs():
    """Named by gemm, with their base configs' tiles; not gemm_kernel's (the overlapped GEMMs'
    kernel_meta and grid_for refuse them); the default rule's pick where they cut the last wave."""
    assert list(wave_tail.CONFIG_NAMES) == ["large_tail_split", "small_tail_split"]
    for name, base in wave_tail.CONFIG_NAMES.items():
        assert name in gemm_module.config_names()
        assert gemm_module.config_params(name) == gemm_module.CONFIGS[base]
        with pytest.raises(ValueError, match="wave-tail kernel"):
            gemm_module.kernel_meta(name, False)
        with pytest.raises(ValueError, match="wave-tail kernel"):
            gemm_module.grid_for(1024, 4096, name, 132)
    for m in (129, 1000, 1024, 2048, 8192):
        for n, k in ((4096, 4096), (14336, 8192), (8192, 14336)):
            for sms in (78, 132):
                picked = gemm_module.pick_gemm_config(m, n, k, sms)
                base = wave_tail.CONFIG_NAMES.get(picked, picked)
                c = gemm_module.CONFIGS[base]
                cut = wave_tail.pick_tail_split(triton.cdiv(m, c["BM"]) * triton.cdiv(n, c["BN"]),
                                                triton.cdiv(k, c["BK"]), sms) > 1
                assert (picked in wave_tail.CONFIG_NAMES) == cut, (m, n, k, sms, picked)
    assert gemm_module.pick_gemm_config(8192, 14336, 8192, 132) == "large_tail_split"  # 20 tiles in 4 slices
    assert gemm_module.pick_gemm_config(1024, 14336, 8192, 132) == "small"  # a last wave of 104: nothing cut
    assert triton.cdiv(14336, gemm_module.CONFIGS["large"]["BN"]) * 8 == 448  # the docstring's count
