"""The AllGather kernels (sm_push, ll, ce_push signalling) compile for sm_90 for fp32 and bf16 and
world sizes 2 and 4, and carry the instructions their protocols need: acquire spins and release
atomics for sm_push and ce_push; for ll, one 64-bit relaxed system-scope store per word of
combined payload and flag, relaxed system-scope spinning loads, and no signal atomics."""

import re

import pytest

from triton_dist.kernels import allgather
from triton_dist.tools.compile_check import compile_for_hopper, ptx_calls

_SPIN = "ld.acquire.sys.global.u64"
_RELEASE = r"atom\.global\.sys\.release\.exch\.b64|atom\.release\.sys\.global\.exch"
_ANY_ATOMIC = r"\batom\.|\bred\."
_DTYPES = {"fp32": 4, "bf16": 2}


def _push(dt, world=2, aligned=True):
    return compile_for_hopper(allgather.all_gather_push_kernel,
                              {"x": f"*{dt}", "out": f"*{dt}", "gathered": f"*{dt}", "signals": "*u64", "n": "i32",
                               "epoch_ptr": "*i64"},
                              dict(WORLD=world, SLOT=4 * 2048, MAX_PROGRAMS=128, BLOCK=2048, ALIGNED=aligned),
                              num_warps=8).asm["ptx"]


def _ll(dt, world=2):
    return compile_for_hopper(allgather.all_gather_ll_kernel,
                              {"x": f"*{dt}", "out": f"*{dt}", "ll": "*i64", "n": "i32", "words": "i32",
                               "epoch_ptr": "*i64"},
                              dict(WORLD=world, LL_SLOT=4 * allgather.LL_BLOCK, BLOCK_W=allgather.LL_BLOCK,
                                   ELEMS=4 // _DTYPES[dt]), num_warps=8).asm["ptx"]


def _ce(phase, world=2):
    return compile_for_hopper(allgather.all_gather_ce_signal_kernel, {"signals": "*u64", "k_ptr": "*i64"},
                              dict(PHASE=phase, WORLD=world, READY=world * 128, ACK=world * 129),
                              num_warps=1).asm["ptx"]


def _common(ptx):
    assert ".target sm_90" in ptx
    assert not [c for c in ptx_calls(ptx) if c.startswith("nvshmem")], ptx_calls(ptx)


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("dt", ["fp32", "bf16"])
def test_sm_push_compiles(dt, world):
    ptx = _push(dt, world)
    _common(ptx)
    # One dl.wait per peer (two acquire loads each: the first try, then the timed loop), one
    # release notify per peer.
    assert ptx.count(_SPIN) == 2 * (world - 1), ptx.count(_SPIN)
    assert len(re.findall(_RELEASE, ptx)) == world - 1
    assert re.search(r"ld\.global(\.[a-z0-9]+)*\.v4\.b32", ptx)
    assert re.search(r"st\.global(\.[a-z0-9]+)*\.v4\.b32", ptx)


@pytest.mark.parametrize("dt", ["fp32", "bf16"])
def test_sm_push_aligned_variant_vectorises_out(dt):
    """With n a multiple of ALIGN_ELEMENTS, the stores into out's slots are 16-byte vectors too."""
    vec = r"st\.global(\.[a-z0-9]+)*\.v4\.b32"
    assert len(re.findall(vec, _push(dt, aligned=True))) > len(re.findall(vec, _push(dt, aligned=False)))


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("dt", ["fp32", "bf16"])
def test_ll_compiles_with_combined_stores_and_no_signals(dt, world):
    ptx = _ll(dt, world)
    _common(ptx)
    # Data and flag travel in one 64-bit relaxed store at system scope, one per word.
    assert re.search(r"st\.relaxed\.sys\.global\.b64", ptx)
    assert re.search(r"ld\.relaxed\.sys\.global\.b64", ptx)
    # No separate signal: no atomics, no acquire spins, no fences.
    assert not re.search(_ANY_ATOMIC, ptx)
    assert _SPIN not in ptx
    assert "fence." not in ptx
    assert "%globaltimer" in ptx  # the spin has a timeout
    # The flag goes into the high half: a 32-bit shift of a 64-bit value.
    assert re.search(r"shl\.b64 [^;]*, 32;", ptx)


def test_ll_sends_one_store_per_peer_and_word():
    stores = [len(re.findall(r"st\.relaxed\.sys\.global\.b64", _ll("bf16", w))) for w in (2, 4)]
    assert stores[1] == 3 * stores[0], stores


@pytest.mark.parametrize("world", [2, 4])
def test_ce_signal_kernels_compile(world):
    wait, notify_wait, ack = (_ce(p, world) for p in (0, 1, 2))
    for ptx in (wait, notify_wait, ack):
        _common(ptx)
    assert wait.count(_SPIN) == 2 * (world - 1) and not re.search(_RELEASE, wait)
    assert notify_wait.count(_SPIN) == 2 * (world - 1)
    assert len(re.findall(_RELEASE, notify_wait)) == world - 1
    assert _SPIN not in ack and len(re.findall(_RELEASE, ack)) == world - 1


def test_methods_and_auto_placeholders():
    assert allgather.AllGatherContext.METHODS == ("auto", "sm_push", "ce_push", "ll")
    assert allgather.AUTO_LL_MAX_BYTES <= allgather.LL_MAX_BYTES < allgather.AUTO_SM_MAX_BYTES


def test_all_gather_needs_init():
    from triton_dist import ops

    with pytest.raises(RuntimeError, match="init"):
        ops.all_gather(object())
