"""The signalling and memory-model primitives compile for sm_90 with the ordering the model needs:
acquire spins at the requested scope, a CTA barrier before every release, loads (plain, cp.async
and TMA, with software pipelining on) that depend on the wait through the token, a timeout path
that reports and traps, and debug barriers on request."""

import re

import pytest
import triton
import triton.language as tl

import triton_dist
import triton_dist.language as dl
from triton_dist.tools.compile_check import compile_for_hopper, depends_on, ops_matching, ptx_calls, results

_SPIN = "ld.acquire.sys.global.u64"


@triton_dist.jit
def ping_pong(flags, rounds):
    me = dl.rank()
    peer = 1 - me
    for i in range(rounds):
        value = (i + 1).to(tl.uint64)
        if me == 0:
            dl.notify(flags, peer, value, "set", "intra_node")
            dl.wait(flags, 1, "sys", "acquire", value)
        else:
            dl.wait(flags, 1, "sys", "acquire", value)
            dl.notify(flags, peer, value, "set", "intra_node")


@triton_dist.jit
def tile_consumer(a, signals, out, epoch, k_tiles, BM: tl.constexpr, BK: tl.constexpr, NUM_STAGES: tl.constexpr):
    """A GEMM-shaped consumer: tile k of ``a`` may be read once signal k arrived."""
    acc = tl.zeros([BM, 16], tl.float32)
    rows = tl.arange(0, BM)
    cols = tl.arange(0, BK)
    for k in tl.range(0, k_tiles, num_stages=NUM_STAGES):
        token = dl.wait(signals + k, 1, "sys", "acquire", epoch, pred=k < k_tiles)
        ptrs = dl.consume_token(a + rows[:, None] * (k_tiles * BK) + k * BK + cols[None, :], token)
        acc = tl.dot(tl.load(ptrs), tl.full([BK, 16], 1.0, tl.bfloat16), acc)
    tl.store(out + rows[:, None] * 16 + tl.arange(0, 16)[None, :], acc)


@triton_dist.jit
def tma_consumer(a_desc, signals, out, epoch, k_tiles, BM: tl.constexpr, BK: tl.constexpr,
                 NUM_STAGES: tl.constexpr):
    acc = tl.zeros([BM, 16], tl.float32)
    rows = tl.arange(0, BM)
    for k in tl.range(0, k_tiles, num_stages=NUM_STAGES):
        token = dl.wait(signals + k, 1, "sys", "acquire", epoch, pred=k < k_tiles)
        tile = dl.consume_token(a_desc, token).load([0, k * BK])
        acc = tl.dot(tile, tl.full([BK, 16], 1.0, tl.bfloat16), acc)
    tl.store(out + rows[:, None] * 16 + tl.arange(0, 16)[None, :], acc)


@triton_dist.jit
def producer(data, signals, peer, epoch, BLOCK: tl.constexpr):
    t = tl.program_id(0)
    remote = dl.symm_at(data, peer)
    tl.store(remote + t * BLOCK + tl.arange(0, BLOCK), tl.full([BLOCK], 1.0, tl.float32))
    dl.notify(signals + t, peer, epoch, "add", "intra_node")


@triton_dist.jit
def inter_node_producer(data, source, signals, peer, epoch, NBYTES: tl.constexpr):
    dl.shmem.putmem_nbi_block(data, source, NBYTES, peer)
    dl.notify(signals, peer, epoch, "set", "inter_node")


@triton_dist.jit
def waits_forever_unless(flags, value):
    dl.wait(flags, 1, "sys", "acquire", value, timeout_ns=0)


@triton_dist.jit
def memory_ops(p, q):
    v = dl.ld(p, "sys", "acquire")
    dl.st(q, v + dl.tid(0) + dl.laneid(), "sys", "release")
    dl.fence("gpu")
    dl.st(q, dl.ld(p, "gpu", "relaxed"), "cta", "relaxed")
    dl.st(q, dl.ld(p, "sys", "volatile"), "sys", "volatile")
    dl.barrier()
    dl.atomic_add(q, 1, scope="sys", semantic="release")
    dl.atomic_xchg(q, 2, scope="gpu", semantic="acquire")
    dl.atomic_cas(q, 2, 3, scope="sys", semantic="relaxed")


_TILE_SIGNATURE = {"signals": "*u64", "out": "*fp32", "epoch": "u64", "k_tiles": "i32"}


def _ptx(kernel, signature, constexprs=None):
    return compile_for_hopper(kernel, signature, constexprs).asm["ptx"]


def _releases_follow_barriers(ttir: str) -> int:
    """Each release atomic's closest preceding memory or synchronising op is a CTA barrier."""
    lines = ttir.splitlines()
    releases = [i for i, line in enumerate(lines) if "tt.atomic_rmw" in line and "release" in line]
    for i in releases:
        earlier = [line for line in lines[:i] if re.search(r"gpu\.barrier|tt\.store|tt\.atomic|inline_asm", line)]
        assert earlier and "gpu.barrier" in earlier[-1], lines[max(0, i - 8):i + 1]
    return len(releases)


def test_ping_pong_spins_with_acquire_and_signals_with_release():
    compiled = compile_for_hopper(ping_pong, {"flags": "*u64", "rounds": "i32"})
    ptx = compiled.asm["ptx"]
    assert _SPIN in ptx
    assert re.search(r"atom\.global\.sys\.release\.exch\.b64|atom\.release\.sys\.global\.exch", ptx)
    assert _releases_follow_barriers(compiled.asm["ttir"]) == 2


def test_wait_timeout_reports_and_traps():
    """The report goes to the runtime's record (claimed, filled, fenced, published), then the grid
    traps; no function call, so kernels with wgmma keep their pipeline."""
    ptx = _ptx(ping_pong, {"flags": "*u64", "rounds": "i32"})
    assert "%globaltimer" in ptx
    assert ptx_calls(ptx) == [] and "trap;" in ptx
    assert re.search(r"\.visible \.global \.align 8 \.u64 triton_dist_wait_report;", ptx)
    lines = ptx.splitlines()
    claim = min(i for i, line in enumerate(lines) if "atom.sys.global.cas.b32" in line)
    fence = min(i for i, line in enumerate(lines) if "fence.sc.sys;" in line)
    publish = min(i for i, line in enumerate(lines) if "st.release.sys.global.u32" in line)
    trap = min(i for i, line in enumerate(lines) if "trap;" in line)
    assert claim < fence < publish < trap


def test_timeout_zero_waits_forever():
    ptx = _ptx(waits_forever_unless, {"flags": "*u64", "value": "u64"})
    assert _SPIN in ptx
    assert "trap;" not in ptx
    assert "atom.sys.global.cas.b32" not in ptx  # no report path at all


@pytest.mark.parametrize("num_stages", [1, 2, 3, 4])
def test_pipelined_loads_depend_on_their_wait(num_stages):
    compiled = compile_for_hopper(tile_consumer, {"a": "*bf16", **_TILE_SIGNATURE},
                                  {"BM": 64, "BK": 64, "NUM_STAGES": num_stages})
    ttgir = compiled.asm["ttgir"]
    spins = results(ops_matching(ttgir, re.escape(_SPIN)))
    loads = ops_matching(ttgir, r"ttg\.async_copy_global_to_local|tt\.load ")
    # Software pipelining happened: one wait per stage in flight, loads turned into cp.async.
    assert len(spins) == num_stages
    if num_stages > 1:
        assert len(loads) == num_stages and all("async_copy" in text for text in loads)
        assert "contiguity = 8" in ttgir  # the token kept the pointers' alignment: 16-byte copies
    for load in loads:
        assert depends_on(ttgir, load, spins), f"does not depend on a wait: {load}"
    ptx = compiled.asm["ptx"]
    first_copy = min(i for i, line in enumerate(ptx.splitlines()) if re.search(r"cp\.async|ld\.global", line))
    first_spin = min(i for i, line in enumerate(ptx.splitlines()) if _SPIN in line)
    assert first_spin < first_copy


@pytest.mark.parametrize("num_stages", [1, 3])
def test_tma_loads_depend_on_their_wait(num_stages):
    compiled = compile_for_hopper(tma_consumer, {"a_desc": "tensordesc<bf16[64, 64]>", **_TILE_SIGNATURE},
                                  {"BM": 64, "BK": 64, "NUM_STAGES": num_stages})
    ttgir = compiled.asm["ttgir"]
    spins = results(ops_matching(ttgir, re.escape(_SPIN)))
    copies = ops_matching(ttgir, r"async_tma_copy_global_to_local|tt\.descriptor_load")
    assert len(spins) == num_stages and len(copies) == num_stages
    for copy in copies:
        assert depends_on(ttgir, copy, spins), f"does not depend on a wait: {copy}"
    ptx = compiled.asm["ptx"]
    assert "cp.async.bulk.tensor" in ptx
    # The acquired data reaches the async proxy through a proxy fence before each copy.
    assert ptx.count("fence.proxy.async.global") == num_stages


def test_producer_stores_remote_then_adds_signal():
    compiled = compile_for_hopper(producer, {"data": "*fp32", "signals": "*u64", "peer": "i32", "epoch": "u64"},
                                  {"BLOCK": 256})
    assert "nvshmemi_device_state_d" in compiled.asm["ptx"]  # symm_at goes through nvshmem_ptr
    assert re.search(r"atom\.[a-z.]*add\.u64", compiled.asm["ptx"])
    assert _releases_follow_barriers(compiled.asm["ttir"]) == 1


def test_inter_node_notify_goes_through_nvshmem_from_one_thread():
    compiled = compile_for_hopper(inter_node_producer, {"data": "*fp32", "source": "*fp32", "signals": "*u64",
                                                        "peer": "i32", "epoch": "u64"}, {"NBYTES": 4096})
    ttir = compiled.asm["ttir"]
    # A CTA barrier, then one thread (the scf.if on the thread id) fences its puts and signals.
    assert re.search(r"gpu\.barrier[\s\S]*scf\.if[\s\S]*nvshmem_fence[\s\S]*nvshmemx_signal_op", ttir)
    assert "%tid.x" in compiled.asm["ptx"]


def test_debug_barriers_fence_every_wait(monkeypatch):
    plain = _ptx(waits_forever_unless, {"flags": "*u64", "value": "u64"})
    monkeypatch.setenv("TRITON_DIST_DEBUG_BARRIERS", "1")
    debug = _ptx(waits_forever_unless, {"flags": "*u64", "value": "u64"})
    assert "fence.sc.sys" not in plain and debug.count("fence.sc.sys") == 2
    assert debug.count("bar.sync") >= plain.count("bar.sync") + 2


def test_settings_are_part_of_the_cache_key(monkeypatch):
    paths = {}
    for timeout in ("0", "1000"):
        monkeypatch.setenv("TRITON_DIST_WAIT_TIMEOUT_NS", timeout)
        paths[timeout] = dict(triton_dist.distributed_jit.extern_libs())["triton_dist_language"]
    assert paths["0"] != paths["1000"]


def test_memory_ops():
    ptx = _ptx(memory_ops, {"p": "*i64", "q": "*i64"})
    for needle in ("ld.acquire.sys.global.b64", "st.release.sys.global.b64", "fence.acq_rel.gpu",
                   "ld.relaxed.gpu.global.b64", "st.relaxed.cta.global.b64", "ld.volatile.global.b64",
                   "st.volatile.global.b64", "%tid.x", "%laneid", "bar.sync"):
        assert needle in ptx, needle
    assert re.search(r"atom\.global\.sys\.release\.add|atom\.release\.sys\.global\.add", ptx)
    assert re.search(r"atom\.global\.gpu\.acquire\.exch|atom\.acquire\.gpu\.global\.exch", ptx)
    assert re.search(r"atom\.global\.(sys\.relaxed|relaxed\.sys)\.cas", ptx)


@triton_dist.jit
def _bad_scope(p):
    dl.ld(p, "galaxy", "acquire")


@triton_dist.jit
def _bad_semantic(p):
    dl.wait(p, 1, "sys", "eventually")


@triton_dist.jit
def _bad_sig_op(p):
    dl.notify(p, 0, 1, "multiply")


@triton_dist.jit
def _bad_comm_scope(p):
    dl.notify(p, 0, 1, "set", "galaxy")


@triton_dist.jit
def _bad_token_value(p, token):
    dl.consume_token(tl.load(p.to(tl.pointer_type(tl.float32))), token)


@pytest.mark.parametrize("kernel,match", [(_bad_scope, "scope must be one of"),
                                          (_bad_semantic, "semantic must be one of"),
                                          (_bad_sig_op, "sig_op must be one of"),
                                          (_bad_comm_scope, "comm_scope must be one of")])
def test_bad_arguments_are_compile_errors(kernel, match):
    with pytest.raises(triton.CompilationError) as error:
        _ptx(kernel, {"p": "*u64"})
    assert match in repr(error.value) or match in str(error.value.__cause__), repr(error.value)


def test_consume_token_rejects_floats():
    with pytest.raises(triton.CompilationError) as error:
        _ptx(_bad_token_value, {"p": "*u64", "token": "i32"})
    assert "consume_token takes" in repr(error.value) or "consume_token takes" in str(error.value.__cause__)
