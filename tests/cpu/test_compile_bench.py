"""The benchmarks' Triton kernels compile for sm_90 with the instructions they are meant to time."""

import importlib.util
import os
import re

import pytest

from triton_dist.tools.compile_check import compile_for_hopper

_ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def _load(name):
    path = os.path.join(_ROOT, "bench", f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"bench_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


floors = _load("language_floors")


@pytest.mark.parametrize("cfg", floors.SM_STORE_CONFIGS)
def test_sm_store_put_uses_16_byte_vectors(cfg):
    ptx = compile_for_hopper(floors.put_sm_store_kernel, {"dst": "*i32", "src": "*i32", "peer": "i32",
                                                          "num_tiles": "i32"}, {"BLOCK": cfg["BLOCK"]},
                             num_warps=cfg["num_warps"]).asm["ptx"]
    assert "nvshmemi_device_state_d" in ptx  # the peer address comes from symm_at
    stores = re.findall(r"st\.global[a-z0-9.]*\s", ptx)
    loads = re.findall(r"ld\.global[a-z0-9.]*\s", ptx)
    loads = [x for x in loads if ".nc.b64" not in x]  # nvshmem's peer-base lookup
    assert stores and all(".v4." in s for s in stores), stores
    assert loads and all(".v4." in x for x in loads), loads
    per_thread = cfg["BLOCK"] // (32 * cfg["num_warps"]) // 4
    assert len(stores) == per_thread
