"""What ``method="auto"`` takes for an eager call of the overlapped GEMMs and for one under CUDA
graph capture (kernels/gemm/policy.py), and ag_gemm's choice among cached contexts: a capture,
which cannot make a context, takes an eager call's context of another producer within one node.
No GPU: torch, the runtime's world and the context class are stood in for."""

import sys
import types

import pytest

import triton_dist.kernels
from triton_dist import ops, runtime
from triton_dist.kernels.gemm import ag_gemm, gemm_rs, policy

SMALL = 2.0 * 256 * 4096 * 4096  # ~14 µs of GEMM: any eager call of it waits on the host
LARGE = 2.0 * 8192 * 28672 * 4096  # ~3 ms: the host time hides behind it


def test_eager_calls_too_short_to_hide_the_copy_engines_host_time_take_the_fewest_launches():
    assert policy.ag_gemm_method(1, SMALL, eager=True) == "sm_push_inline"
    assert policy.ag_gemm_method(1, SMALL, eager=False) == "ce_push"
    assert policy.ag_gemm_method(1, LARGE, eager=True) == "ce_push"
    assert policy.ag_gemm_method(2, SMALL, eager=True) == "sm_2d"  # across nodes, eager or not
    assert policy.gemm_rs_method(128, 1, SMALL, eager=True) == "fused"
    assert policy.gemm_rs_method(128, 1, SMALL, eager=False) == policy.GEMM_RS_METHOD == "fused_ce"
    assert policy.gemm_rs_method(1024, 1, LARGE, eager=True) == "fused_ce"
    assert policy.gemm_rs_method(128, 2, SMALL, eager=True) == "2d"
    assert {"sm_push_inline", "ce_push", "sm_2d"} <= set(ag_gemm.METHODS)
    assert {"fused", "fused_ce", "2d"} <= set(gemm_rs.METHODS)


@pytest.mark.parametrize("op", sorted(policy.COPY_ENGINE_HOST_US))
def test_the_line_is_where_the_estimated_gemm_time_meets_the_copy_engine_host_time(op):
    at = policy.COPY_ENGINE_HOST_US[op] * policy.EAGER_GEMM_TFLOPS * 1e6  # flops of that many µs
    assert policy.host_bound_eager(op, 0.99 * at, eager=True)
    assert not policy.host_bound_eager(op, 1.01 * at, eager=True)
    assert not policy.host_bound_eager(op, 1.0, eager=False)


class _Shard:
    def __init__(self, m: int, k: int):
        self.shape, self.dtype = (m, k), "bf16"


class _Context:
    """A made context: what ``_ag_gemm_context`` reads (its producer and rows) and how it was made."""

    made = []

    def __init__(self, max_m, k, dtype, method):
        self.max_m, self.k, self.dtype, self.method = max_m, k, dtype, method
        _Context.made.append(method)


@pytest.fixture
def world(monkeypatch):
    """Two ranks on ``world.nodes`` nodes, capturing while ``world.capturing``; no cached context."""
    state = types.SimpleNamespace(capturing=False, nodes=1)
    cuda = types.SimpleNamespace(is_current_stream_capturing=lambda: state.capturing)
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    monkeypatch.setattr(runtime, "world_size", lambda: 2)
    monkeypatch.setattr(runtime, "num_nodes", lambda: state.nodes)
    monkeypatch.setattr(triton_dist.kernels, "AllGatherGemmContext", _Context)
    monkeypatch.setattr(ops, "_CONTEXTS", {})
    _Context.made = []
    return state


def _cache(method: str, max_m: int = 256, k: int = 4096) -> _Context:
    ctx = _Context(max_m, k, "bf16", method)
    ops._CONTEXTS[("ag_gemm", "bf16", (k, max_m, method))] = ctx
    return ctx


def test_ag_gemm_context_of_the_eager_and_the_captured_producer(world):
    inline, ce = _cache("sm_push_inline"), _cache("ce_push")
    shard = _Shard(128, 4096)
    assert ops._ag_gemm_context(shard, 4096, None, "auto") is inline
    world.capturing = True
    assert ops._ag_gemm_context(shard, 4096, None, "auto") is ce
    assert _Context.made == ["sm_push_inline", "ce_push"]  # the two cached above, nothing more


def test_a_capture_takes_an_eager_calls_context_within_one_node(world):
    inline = _cache("sm_push_inline")
    world.capturing = True
    assert ops._ag_gemm_context(_Shard(128, 4096), 4096, None, "auto") is inline
    assert ops._ag_gemm_context(_Shard(128, 4096), 4096, None, "ce_push").method == "ce_push"  # asked: made
    world.nodes = 2  # across nodes only sm_2d's loads and stores stay within a node: made, not borrowed
    assert ops._ag_gemm_context(_Shard(128, 4096), 4096, None, "auto").method == "sm_2d"
    assert _Context.made == ["sm_push_inline", "ce_push", "sm_2d"]


def test_an_eager_call_makes_its_own_producers_context(world):
    _cache("ce_push")
    ctx = ops._ag_gemm_context(_Shard(100, 4096), 4096, None, "auto")
    assert (ctx.method, ctx.max_m) == ("sm_push_inline", 128)
    big = ops._ag_gemm_context(_Shard(4096, 4096), 14336, None, "auto")  # 2 x 4096 x 14336 x 4096: ~1.6 ms
    assert (big.method, big.max_m) == ("ce_push", 4096)
