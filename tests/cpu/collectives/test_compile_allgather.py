"""The AllGather kernels (sm_push, ll, ce_push signalling, ce_chunked's chunk signal and
copy-out, sm_zero_copy) compile for sm_90 for fp32 and bf16 and
world sizes 2 and 4, and carry the instructions their protocols need: acquire spins and release
atomics for sm_push and ce_push; for ll, one 64-bit relaxed system-scope store per word of
combined payload and flag, relaxed system-scope spinning loads, and no signal atomics."""

import re

import pytest

from triton_dist.kernels.collectives import allgather, policy
from triton_dist.kernels.common import ring
from triton_dist.kernels.common.signal_layout import SignalLayout
from triton_dist.tools.compile_check import (compile_for_hopper, ptx_calls, without_call_entry,
                                             without_wait_timeout_report)

_SPIN = "ld.acquire.sys.global.u64"
_RELEASE = r"atom\.global\.sys\.release\.exch\.b64|atom\.release\.sys\.global\.exch"
_ANY_ATOMIC = r"\batom\.|\bred\."
_DTYPES = {"fp32": 4, "bf16": 2}


def _push(dt, world=2, aligned=True, kernel=allgather.all_gather_push_kernel):
    """``kernel``: sm_push's, or the ring's (the same signature)."""
    return compile_for_hopper(kernel,
                              {"x": f"*{dt}", "out": f"*{dt}", "gathered": f"*{dt}", "signals": "*u64", "n": "i32",
                               "calls": "*i64", "slot_tiles": "i32", "max_programs": "i32"},
                              dict(WORLD=world, BLOCK=2048, ALIGNED=aligned),
                              num_warps=8).asm["ptx"]


def _ll(dt, world=2):
    return compile_for_hopper(allgather.all_gather_ll_kernel,
                              {"x": f"*{dt}", "out": f"*{dt}", "ll": "*i64", "n": "i32", "words": "i32",
                               "calls": "*i64", "ll_slot": "i32"},
                              dict(WORLD=world, BLOCK_W=allgather.LL_BLOCK,
                                   ELEMS=4 // _DTYPES[dt]), num_warps=8).asm["ptx"]


def _ce(phase, world=2):
    return compile_for_hopper(allgather.all_gather_ce_signal_kernel,
                              {"signals": "*u64", "k_ptr": "*i64", "ready": "i32", "ack": "i32"},
                              dict(PHASE=phase, WORLD=world),
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
    # No separate signal: no atomics, no acquire spins, no fences (but the timeout report's and
    # the call counter's, enter_call).
    protocol = without_call_entry(without_wait_timeout_report(ptx))
    assert not re.search(_ANY_ATOMIC, protocol)
    assert _SPIN not in protocol
    assert "fence." not in protocol
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


def _chunk_signal(world=2):
    return compile_for_hopper(allgather.all_gather_ce_chunk_signal_kernel,
                              {"signals": "*u64", "k_ptr": "*i64", "c": "i32", "chunk_ready": "i32"},
                              dict(WORLD=world, MAX_CHUNKS=allgather.CE_MAX_CHUNKS),
                              num_warps=1).asm["ptx"]


def _copy_out(dt, world=2, aligned=True):
    return compile_for_hopper(allgather.all_gather_ce_copy_out_kernel,
                              {"out": f"*{dt}", "ce": f"*{dt}", "signals": "*u64", "n": "i32", "chunk": "i32",
                               "k_ptr": "*i64", "slot_tiles": "i32", "chunk_ready": "i32"},
                              dict(WORLD=world, MAX_CHUNKS=allgather.CE_MAX_CHUNKS, BLOCK=2048, ALIGNED=aligned),
                              num_warps=8).asm["ptx"]


def _zero_copy(dt, world=2, aligned=True):
    return compile_for_hopper(allgather.all_gather_zero_copy_kernel,
                              {"x": f"*{dt}", "out": f"*{dt}", "signals": "*u64", "n": "i32", "epoch_ptr": "*i64",
                               "max_programs": "i32", "ready": "i32", "done": "i32"},
                              dict(WORLD=world, BLOCK=2048, ALIGNED=aligned), num_warps=8).asm["ptx"]


@pytest.mark.parametrize("world", [2, 4])
def test_ce_chunk_signal_kernel_compiles(world):
    ptx = _chunk_signal(world)
    _common(ptx)
    # Notify only: one release per peer, no waiting.
    assert len(re.findall(_RELEASE, ptx)) == world - 1
    assert _SPIN not in ptx


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("dt", ["fp32", "bf16"])
def test_ce_copy_out_kernel_compiles(dt, world):
    ptx = _copy_out(dt, world)
    _common(ptx)
    # One acquire wait per peer and chunk (inside the chunk loop), no notifies: the ack is a
    # separate kernel after it.
    assert ptx.count(_SPIN) == 2 * (world - 1), ptx.count(_SPIN)
    assert not re.search(_RELEASE, ptx)
    assert re.search(r"ld\.global(\.[a-z0-9]+)*\.v4\.b32", ptx)
    assert re.search(r"st\.global(\.[a-z0-9]+)*\.v4\.b32", ptx)


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("dt", ["fp32", "bf16"])
def test_zero_copy_kernel_compiles(dt, world):
    ptx = _zero_copy(dt, world)
    _common(ptx)
    # Handshake and done: two waits and two release notifies per peer.
    assert ptx.count(_SPIN) == 4 * (world - 1), ptx.count(_SPIN)
    assert len(re.findall(_RELEASE, ptx)) == 2 * (world - 1)
    assert "nvshmemi_device_state_d" in ptx  # peers' out through symm_at
    assert re.search(r"st\.global(\.[a-z0-9]+)*\.v4\.b32", ptx)


@pytest.mark.parametrize("dt", ["fp32", "bf16"])
def test_aligned_variants_vectorise_out(dt):
    vec = r"st\.global(\.[a-z0-9]+)*\.v4\.b32"
    for build in (_copy_out, _zero_copy):
        assert len(re.findall(vec, build(dt, aligned=True))) > len(re.findall(vec, build(dt, aligned=False)))


def test_ext_pad_layout():
    """The regions follow each other in this order (the offsets the kernels were first compiled
    with: a change moves every signal of a running job's peers)."""
    c = allgather.CE_MAX_CHUNKS
    for world, mp in ((2, 132), (4, 1), (8, 128)):
        ext = allgather._layouts(world, mp)[1]
        starts = [ext[name] for name in ("zc_ready", "zc_done", "chunk_ready", "smz_ready", "smz_done", "published",
                                         "pulled", "node_ready")]
        w = world
        assert starts == [0, w, 2 * w, 2 * w + w * c, 2 * w + w * c + w * mp, 2 * w + w * c + 2 * w * mp,
                          3 * w + w * c + 2 * w * mp, 4 * w + w * c + 2 * w * mp]
        assert ext.size == 4 * w + w * c + 3 * w * mp


def test_signal_layout_rejects_repeated_regions():
    with pytest.raises(ValueError, match="repeated"):
        SignalLayout(("ready", 2), ("ready", 2))
    layout = SignalLayout(("a", 3), ("b", 0), ("c", 5))
    assert (layout["a"], layout["b"], layout["c"], layout.size) == (0, 3, 3, 8)
    assert layout.regions() == [("a", 0, 3), ("b", 3, 0), ("c", 3, 5)]  # what SignalPad names


@pytest.mark.parametrize("world", [2, 4, 8])
@pytest.mark.parametrize("dt", ["fp32", "bf16"])
def test_ring_compiles_with_one_wait_and_notify_per_step(dt, world):
    ptx = _push(dt, world, kernel=ring.all_gather_ring_kernel)
    _common(ptx)
    assert ptx.count(_SPIN) == 2 * (world - 1), ptx.count(_SPIN)
    assert len(re.findall(_RELEASE, ptx)) == world - 1
    assert re.search(r"ld\.global(\.[a-z0-9]+)*\.v4\.b32", ptx)
    assert re.search(r"st\.global(\.[a-z0-9]+)*\.v4\.b32", ptx)


def test_ring_signals_follow_the_ce_acks_inside_the_pad():
    for world, mp in ((2, 132), (4, 1), (8, 128)):
        main = allgather._layouts(world, mp)[0]
        assert (main["sm_push_ready"], main["ce_push_ready"], main["ce_push_ack"]) == (0, world * mp, world * mp + world)
        assert main["ring"] == main["ce_push_ack"] + world
        assert main.size <= allgather.SIGNALS_PER_PROGRAM * world * mp


def test_methods_and_auto_placeholders():
    assert allgather.AllGatherContext.METHODS == ("auto", "sm_push", "ce_push", "ll", "ce_chunked", "ce_zero_copy",
                                                  "sm_zero_copy", "ring", "ce_pull", "2d", "ll_2d")
    assert set(allgather.AllGatherContext.ZERO_COPY_METHODS) < set(allgather.AllGatherContext.METHODS)
    assert policy.ALL_GATHER_LL_MAX_BYTES <= allgather.LL_MAX_BYTES < policy.ALL_GATHER_SM_MAX_BYTES
    assert allgather.CE_CHUNK_BYTES % (2048 * 4) == 0 and allgather.CE_MAX_CHUNKS >= 2


class _FakeContext:
    """Just what method_for and chunk_numel read (no GPU)."""
    BLOCK = 2048
    ll_max_bytes = allgather.LL_MAX_BYTES
    ce_chunk_bytes = allgather.CE_CHUNK_BYTES

    def __init__(self, itemsize, world=2, local_world=2):
        self.dtype = type("D", (), {"itemsize": itemsize})()
        self.world, self.local_world = world, local_world


def test_auto_picks_zero_copy_only_for_large_symmetric_out(monkeypatch):
    monkeypatch.setattr(policy, "ALL_GATHER_ZERO_COPY", True)
    ctx = _FakeContext(2)
    method_for = allgather.AllGatherContext.method_for
    big = policy.ALL_GATHER_SM_MAX_BYTES + 1
    assert method_for(ctx, 1024) == method_for(ctx, 1024, True) == "ll"
    assert method_for(ctx, policy.ALL_GATHER_SM_MAX_BYTES, True) == "sm_push"
    assert method_for(ctx, big, True) == "ce_zero_copy"
    assert method_for(ctx, big) == ("ce_chunked" if policy.ALL_GATHER_CE_CHUNKED else "ce_push")
    monkeypatch.setattr(policy, "ALL_GATHER_ZERO_COPY", False)
    assert method_for(ctx, big, True) == method_for(ctx, big)
    assert method_for(_FakeContext(2, world=4, local_world=2), 1024) == "ll_2d"  # two nodes
    assert method_for(_FakeContext(2, world=4, local_world=2), big, True) == "2d"


@pytest.mark.parametrize("itemsize", [4, 2])
@pytest.mark.parametrize("n", [1, 7, 2048, 2049, 4099 * 3, 1000003, 2**20 * 5 + 3, 2**27 + 1, 2**31 // 4 - 1])
def test_chunks_are_whole_tiles_cover_n_and_fit_the_signals(n, itemsize):
    ctx = _FakeContext(itemsize)
    chunk = allgather.AllGatherContext.chunk_numel(ctx, n)
    chunks = -(-n // chunk)
    assert chunk % ctx.BLOCK == 0 and chunk > 0
    assert 1 <= chunks <= allgather.CE_MAX_CHUNKS
    assert (chunks - 1) * chunk < n <= chunks * chunk  # no empty chunk
    if n * itemsize >= 2 * allgather.CE_CHUNK_BYTES:
        assert chunks >= 2
        assert chunk * itemsize >= allgather.CE_CHUNK_BYTES - ctx.BLOCK * itemsize


def test_all_gather_needs_init():
    from triton_dist import ops

    with pytest.raises(RuntimeError, match="init"):
        ops.all_gather(object())
