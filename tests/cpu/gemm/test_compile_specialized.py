"""The warp-specialized GEMM (kernels/gemm/specialized.py) compiles for sm_90 as Triton's Hopper
warp specialization: three warpgroups (a producer that gives its registers up, two consumers that
take them), wgmma of the config's tile width not serialised, no spills, 16-byte stores."""

import re

import pytest

from triton_dist.kernels.gemm import dense as gemm_module
from triton_dist.kernels.gemm import specialized
from triton_dist.tools.compile_check import compile_for_hopper, spill_bytes, wgmma_serialized

_SMEM_LIMIT = 232448  # bytes of shared memory one program may use on sm_90


@pytest.mark.parametrize("config,dtype", [(c, "bf16") for c in specialized.CONFIGS] + [("small_ws", "fp16")])
def test_warp_specialized_gemm_compiles_as_three_warpgroups(config, dtype):
    c = specialized.CONFIGS[config]
    signature = {"a_desc": f"tensordesc<{dtype}[{c['BM']}, {c['BK']}]>",
                 "b_desc": f"tensordesc<{dtype}[{c['BN']}, {c['BK']}]>", "c": f"*{dtype}", "M": "i32", "N": "i32",
                 "K": "i32"}
    meta = dict(BM=c["BM"], BN=c["BN"], BK=c["BK"], GROUP_M=c["GROUP_M"], NUM_STAGES=c["NUM_STAGES"])
    compiled = compile_for_hopper(specialized.gemm_ws_kernel, signature, meta, num_warps=c["num_warps"],
                                  num_stages=c["NUM_STAGES"])
    ptx = compiled.asm["ptx"]
    assert compiled.metadata.num_warps == 3 * c["num_warps"]  # producer + two consumer warpgroups
    assert re.search(r"setmaxnreg\.dec\.sync\.aligned\.u32\s+40", ptx)  # the producer's registers given up
    assert re.search(rf"wgmma\.mma_async\.sync\.aligned\.m64n{c['BN']}k16", ptx)
    assert not wgmma_serialized(ptx)
    assert spill_bytes(ptx) == (0, 0), config
    assert compiled.metadata.shared <= _SMEM_LIMIT
    assert all(".v4." in op for op in re.findall(r"st\.global[a-z0-9.]*", ptx))


def test_warp_specialized_configs_are_gemms_not_gemm_kernels():
    for name, c in specialized.CONFIGS.items():
        assert name in gemm_module.config_names()
        assert gemm_module.config_params(name) == c
        with pytest.raises(ValueError, match="specialized kernel"):
            gemm_module.kernel_meta(name, False)
