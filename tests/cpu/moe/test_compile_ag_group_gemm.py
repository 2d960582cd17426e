"""AllGather + grouped GEMM's consumer compiles for sm_90: one acquire wait per tile at system scope,
before the K loop, that every load of a gathered A row depends on; those loads vectorised and
pipelined (cp.async, one per stage) next to W's TMA loads; wgmma, no spills, within one program's
shared memory. The routing layout's rule (expert-major, stable, -1 last) needs no GPU."""

import re

import pytest

from triton_dist.kernels.gemm import dense as gemm_module
from triton_dist.kernels.moe import ag_group_gemm as agg
from triton_dist.kernels.moe import group_gemm as gg
from triton_dist.tools.compile_check import (compile_for_hopper, depends_on, ops_matching, results, spill_bytes,
                                             wgmma_serialized)

_SPIN = "ld.acquire.sys.global.u64"
_SMEM_LIMIT = 232448


def _compile(config, dtype="bf16"):
    c = gemm_module.config_params(config)
    signature = {"w_desc": f"tensordesc<{dtype}[{c['BN']}, {c['BK']}]>", "c": f"*{dtype}", "ends": "*i32",
                 "num_experts": "i32", "total_rows": "i32", "capacity": "i32", "N": "i32", "K": "i32",
                 "gathered": f"*{dtype}", "token_index": "*i32", "signals": "*u64", "calls": "*i64",
                 "m_per_rank": "i32"}
    meta = gg.kernel_meta(config)
    options = {"num_warps": meta.pop("num_warps"), "num_stages": meta.pop("num_stages")}
    meta.update(a_desc=None, GATHERED=True)
    return compile_for_hopper(agg.ag_group_gemm_kernel, signature, meta, **options)


@pytest.mark.parametrize("config,dtype", [(c, "bf16") for c in gg.CONFIGS] + [("small", "fp16")])
def test_gathered_rows_wait_then_pipeline(config, dtype):
    compiled = _compile(config, dtype)
    ptx, ttgir = compiled.asm["ptx"], compiled.asm["ttgir"]
    assert "wgmma.mma_async" in ptx and not wgmma_serialized(ptx)
    assert compiled.metadata.shared <= _SMEM_LIMIT
    assert spill_bytes(ptx) == (0, 0)
    spins = results(ops_matching(ttgir, re.escape(_SPIN)))
    assert len(spins) == 1  # one wait per tile, outside the pipelined K loop
    stages = gemm_module.config_params(config)["NUM_STAGES"]
    a_loads = ops_matching(ttgir, r"async_copy_global_to_local")
    assert len(a_loads) >= stages - 1  # gathered rows through cp.async, pipelined
    for load in a_loads:
        assert depends_on(ttgir, load, spins), f"a load of gathered A does not depend on the wait: {load}"
    assert len(ops_matching(ttgir, r"async_tma_copy_global_to_local")) >= stages - 1  # W by TMA
    assert "cp.async.cg.shared.global" in ptx or "cp.async.ca.shared.global" in ptx
    assert "trap;" in ptx  # the wait reports and traps on timeout


def test_gathered_loads_are_16_byte_vectors():
    ptx = _compile("small").asm["ptx"]
    assert re.search(r"cp\.async\.c[ag]\.shared\.global(\.L2::\w+)? \[[^]]+\], \[[^]]+\], 0x10", ptx)
