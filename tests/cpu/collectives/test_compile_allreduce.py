"""The AllReduce kernels (one-shot, two-shot) compile for sm_90 for fp32 and bf16, spin with
acquire loads, publish with release atomics, and copy with 16-byte vectors; the LL kernel sends
one 64-bit relaxed system-scope store of packed payload and flag per word and rank, spins with
relaxed loads (no atomics, no acquire spins, no fences) and accumulates in fp32 like one-shot;
ops.all_reduce validates its arguments before touching the GPU."""

import re

import pytest

from triton_dist.kernels.collectives import allreduce, policy
from triton_dist.kernels.common import ll_protocol
from triton_dist.tools.compile_check import (compile_for_hopper, ptx_calls, without_call_entry,
                                             without_wait_timeout_report)

_META = {"WORLD": 2, "BLOCK": 2048}
_SPIN = "ld.acquire.sys.global.u64"
_RELEASE = r"atom\.global\.sys\.release\.exch\.b64|atom\.release\.sys\.global\.exch"


def _one_shot(dt, world=2):
    return compile_for_hopper(allreduce.all_reduce_one_shot_kernel,
                              {"x": f"*{dt}", "out": f"*{dt}", "stage": f"*{dt}", "signals": "*u64", "n": "i32",
                               "calls": "*i64", "half_tiles": "i32", "max_programs": "i32"}, dict(_META, WORLD=world),
                              num_warps=8).asm["ptx"]


def _two_shot(dt, world=2):
    return compile_for_hopper(allreduce.all_reduce_two_shot_kernel,
                              {"x": f"*{dt}", "out": f"*{dt}", "stage": f"*{dt}", "gather": f"*{dt}",
                               "signals": "*u64", "n": "i32", "calls": "*i64", "shard_tiles": "i32",
                               "half_tiles": "i32", "max_programs": "i32"},
                              dict(_META, WORLD=world), num_warps=8).asm["ptx"]


_ANY_ATOMIC = r"\batom\.|\bred\."
_LL_STORE = r"st\.relaxed\.sys\.global\.b64"
_LL_LOAD = r"ld\.relaxed\.sys\.global\.b64"
_ELEMS = {"fp32": 1, "bf16": 2, "fp16": 2}


def _ll(dt, world=2, scatter=False):
    block = ll_protocol.LL_BLOCK
    return compile_for_hopper(allreduce.ll_reduce_kernel,
                              {"x": f"*{dt}", "out": f"*{dt}", "ll": "*i64", "n": "i32", "words": "i32",
                               "calls": "*i64", "ll_slot": "i32"},
                              dict(WORLD=world, BLOCK_W=block, ELEMS=_ELEMS[dt], SCATTER=scatter),
                              num_warps=8).asm["ptx"]


def _check(ptx, waits, notifies):
    assert ".target sm_90" in ptx
    assert not [c for c in ptx_calls(ptx) if c.startswith("nvshmem")], ptx_calls(ptx)
    # Each dl.wait spins with two acquire loads (the first try, then the timed loop).
    assert ptx.count(_SPIN) == 2 * waits, ptx.count(_SPIN)
    assert len(re.findall(_RELEASE, ptx)) == notifies
    # Whole tiles are copied with 16-byte vectors (the masked tail tile may use scalars).
    assert re.search(r"ld\.global(\.[a-z0-9]+)*\.v4\.b32", ptx)
    assert re.search(r"st\.global(\.[a-z0-9]+)*\.v4\.b32", ptx)


@pytest.mark.parametrize("dt", ["fp32", "bf16"])
def test_one_shot_compiles(dt):
    _check(_one_shot(dt), waits=1, notifies=1)


@pytest.mark.parametrize("dt", ["fp32", "bf16"])
def test_two_shot_compiles(dt):
    _check(_two_shot(dt), waits=2, notifies=2)


def _ring(dt, world=2):
    return compile_for_hopper(allreduce.all_reduce_ring_kernel,
                              {"x": f"*{dt}", "out": f"*{dt}", "inbox": "*fp32", "stage": f"*{dt}",
                               "signals": "*u64", "n": "i32", "calls": "*i64", "shard_tiles": "i32",
                               "half_tiles": "i32", "max_programs": "i32"},
                              dict(_META, WORLD=world), num_warps=8).asm["ptx"]


@pytest.mark.parametrize("world", [2, 4, 8])
@pytest.mark.parametrize("dt", ["fp32", "bf16"])
def test_ring_compiles_with_a_wait_and_notify_per_step(dt, world):
    """world - 1 reduce-scatter steps, then world - 1 all-gather steps, one signal each."""
    _check(_ring(dt, world), waits=2 * (world - 1), notifies=2 * (world - 1))


def test_ring_partials_travel_in_fp32():
    ptx = _ring("bf16")
    assert re.search(r"add(\.rn)?\.f32", ptx)
    assert re.search(r"st\.global(\.[a-z0-9]+)*\.v4\.(b32|f32)", ptx)


def test_world_of_four_waits_and_notifies_per_peer():
    _check(_one_shot("bf16", world=4), waits=3, notifies=3)
    _check(_two_shot("bf16", world=4), waits=6, notifies=6)


def test_bf16_accumulates_in_fp32():
    ptx = _one_shot("bf16")
    assert re.search(r"cvt\.f32\.bf16|cvt\.rn\.f32\.bf16|mov\.b32 .*\{.*\}", ptx) or "add.f32" in ptx
    assert re.search(r"add(\.rn)?\.f32", ptx)
    assert "cvt.rn.bf16" in ptx  # rounded once, at the end


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("dt", ["fp32", "bf16", "fp16"])
def test_ll_compiles_with_combined_stores_and_no_signals(dt, world):
    ptx = _ll(dt, world)
    assert ".target sm_90" in ptx
    assert not [c for c in ptx_calls(ptx) if c.startswith("nvshmem")], ptx_calls(ptx)
    # Payload and flag travel in one 64-bit relaxed system-scope store; the receiver spins with
    # relaxed system-scope loads of its own buffer.
    assert re.search(_LL_STORE, ptx)
    assert re.search(_LL_LOAD, ptx)
    # No separate signal: no atomics, no acquire spins, no fences (but the timeout report's and
    # the call counter's, enter_call).
    protocol = without_call_entry(without_wait_timeout_report(ptx))
    assert not re.search(_ANY_ATOMIC, protocol)
    assert _SPIN not in protocol
    assert "fence." not in protocol
    assert "%globaltimer" in ptx  # the spin has a timeout
    assert re.search(r"shl\.b64 [^;]*, 32;", ptx)  # the flag goes into the high half


def test_ll_stores_to_every_rank_and_spins_on_every_slot():
    """Each word is stored once per rank (own slot included) and spun on once per rank."""
    two, four = _ll("bf16", 2), _ll("bf16", 4)
    stores = [len(re.findall(_LL_STORE, p)) for p in (two, four)]
    loads = [len(re.findall(_LL_LOAD, p)) for p in (two, four)]
    assert stores[0] > 0 and stores[1] == 2 * stores[0], stores
    assert loads[0] > 0 and loads[1] == 2 * loads[0], loads


@pytest.mark.parametrize("world", [2, 4])
def test_ll_scatter_packs_each_destinations_shard(world):
    """ReduceScatter's LL (SCATTER): the same stores and spins as AllReduce's, but the payload is
    loaded once per destination (its own shard of x) instead of once for all."""
    gather_all, scatter = _ll("bf16", world), _ll("bf16", world, scatter=True)
    for pattern in (_LL_STORE, _LL_LOAD):
        assert len(re.findall(pattern, scatter)) == len(re.findall(pattern, gather_all)) > 0
    loads = [len(re.findall(r"ld\.global(\.[a-z0-9]+)*\.(v\d\.)?b16", p)) for p in (gather_all, scatter)]
    assert loads[1] == world * loads[0] > 0, loads
    protocol = without_call_entry(without_wait_timeout_report(scatter))
    assert not re.search(_ANY_ATOMIC, protocol) and "fence." not in protocol


@pytest.mark.parametrize("dt", ["fp32", "bf16"])
def test_ll_accumulates_in_fp32_like_one_shot(dt):
    """fp32 adds starting from 0 (as one-shot's, so the bits match one-shot's, -0.0 included),
    and for bf16 one rounding at the end."""
    ll, one = _ll(dt), _one_shot(dt)
    zero_add = r"add(\.rn)?\.f32\s+%r\d+, %r\d+, 0f00000000;"
    assert re.search(zero_add, ll) and re.search(zero_add, one)
    assert len(re.findall(r"add(\.rn)?\.f32", ll)) >= 2 * len(re.findall(zero_add, ll))
    if dt == "bf16":
        assert "cvt.f32.bf16" in ll
        assert "cvt.rn.bf16" in ll


def test_methods_and_ll_limit():
    ctx = allreduce.AllReduceContext
    assert ctx.METHODS == ("auto", "one_shot", "two_shot", "ll", "ce_two_shot", "ring", "2d")
    assert ctx.LL_MAX_BYTES == 64 * 1024
    assert ctx.LL_MAX_BYTES < policy.ALL_REDUCE_ONE_SHOT_MAX_BYTES


def test_auto_method_by_size_and_world():
    ll = allreduce.AllReduceContext.LL_MAX_BYTES
    pick = policy.all_reduce_method
    assert pick(8 << 10, 2, ll) == "ll" and pick(32 << 10, 2, ll) == "ll"
    assert pick(8 << 10, 2, 0) == "one_shot"  # a context too small for ll
    assert pick(64 << 10, 2, ll) == "one_shot" and pick(16 << 20, 2, ll) == "one_shot"
    assert pick((16 << 20) + 2, 2, ll) == "two_shot" and pick(8 << 20, 8, ll) == "two_shot"  # 2 / w scaling
    assert pick(4 << 20, 8, ll) == "one_shot"
    assert pick((512 << 20) - 2, 2, ll) == "two_shot" and pick(512 << 20, 2, ll) == "ce_two_shot"
    assert pick(10**9, 8, ll) == "two_shot"  # ce_two_shot measured on two ranks only


def test_all_reduce_needs_init():
    from triton_dist import ops

    with pytest.raises(RuntimeError, match="init"):
        ops.all_reduce(object())


def _ce_reduce(dt, world=2):
    return compile_for_hopper(allreduce.all_reduce_ce_reduce_kernel,
                              {"x": f"*{dt}", "out": f"*{dt}", "stage": f"*{dt}", "gather": f"*{dt}", "flags": "*u64",
                               "tickets": "*i32", "n": "i32", "shard_tiles": "i32", "chunk_tiles": "i32",
                               "chunks": "i32"},
                              dict(WORLD=world, MAX_CHUNKS=16, BLOCK=2048), num_warps=8)


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("dt", ["fp32", "bf16"])
def test_ce_two_shot_reduce_waits_sums_and_publishes(dt, world):
    """The ce_two_shot reduce: one acquire wait per peer and chunk before the stage loads (which
    depend on it through the token), fp32 sums, 16-byte vectors; per chunk one acq_rel ticket
    right after a CTA barrier, then one system-scope release per peer (the "reduced" flags)."""
    compiled = _ce_reduce(dt, world)
    ptx, ttir = compiled.asm["ptx"], compiled.asm["ttir"]
    assert ptx.count(_SPIN) == 2 * (world - 1), ptx.count(_SPIN)
    assert len(re.findall(_RELEASE, ptx)) == world - 1
    assert re.search(r"atom\.(global\.)?(gpu\.)?acq_rel\.(gpu\.)?(global\.)?add|atom\.acq_rel\.gpu\.global\.add", ptx)
    assert re.search(r"ld\.global(\.[a-z0-9]+)*\.v4\.b32", ptx) and re.search(r"st\.global(\.[a-z0-9]+)*\.v4\.b32", ptx)
    assert re.search(r"add(\.rn)?\.f32", ptx)
    lines = ttir.splitlines()
    ticket = [i for i, line in enumerate(lines) if "tt.atomic_rmw" in line and "add" in line and "acq_rel" in line]
    assert len(ticket) == 1
    earlier = [line for line in lines[:ticket[0]] if re.search(r"gpu\.barrier|tt\.store|tt\.atomic|inline_asm", line)]
    assert "gpu.barrier" in earlier[-1], earlier[-3:]


def test_rank_barrier_notifies_then_waits():
    from triton_dist.kernels.common.rank_barrier import rank_barrier_kernel

    ptx = compile_for_hopper(rank_barrier_kernel, {"signals": "*u64", "epoch_ptr": "*i64"},
                             dict(PHASE=1, PHASES=4, WORLD=4), num_warps=1).asm["ptx"]
    assert len(re.findall(_RELEASE, ptx)) == 3
    assert ptx.count(_SPIN) == 2 * 3
    lines = ptx.splitlines()
    last_release = max(i for i, line in enumerate(lines) if re.search(_RELEASE, line))
    first_spin = min(i for i, line in enumerate(lines) if _SPIN in line)
    assert last_release < first_spin


def test_the_context_asks_the_policy_with_its_world_and_ll_range():
    fake = type("Ctx", (), {"world": 2, "local_world": 2, "ll_max_bytes": allreduce.AllReduceContext.LL_MAX_BYTES})()
    for nbytes in (8 << 10, 64 << 10, 16 << 20, 512 << 20):
        want = policy.all_reduce_method(nbytes, 2, fake.ll_max_bytes)
        assert allreduce.AllReduceContext.method_for(fake, nbytes) == want != "2d"
    two_nodes = type("Ctx", (), {"world": 4, "local_world": 2, "ll_max_bytes": fake.ll_max_bytes})()
    assert allreduce.AllReduceContext.method_for(two_nodes, 8 << 10) == "2d"
