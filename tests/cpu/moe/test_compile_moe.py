"""The expert-parallel AllToAll kernels (routing layout, dispatch in its three phase variants,
combine) compile for sm_90 at worlds 1, 2, 4 and 8 with the memory ordering of the protocol in
triton_dist.kernels.moe.alltoall: every wait spins with system-scope acquire loads, every notify
is a system-scope release, the layout uses no atomics (the same layout on every run), the peer
copies are 16-byte vectors at hidden 7168, and combine adds in fp32 and rounds to the dtype on the store."""

import re

import pytest

from triton_dist.kernels.moe import alltoall, layout
from triton_dist.tools.compile_check import compile_for_hopper, ptx_calls

_SPIN = "ld.acquire.sys.global.u64"
_RELEASE = r"atom\.global\.sys\.release\.exch\.b64|atom\.release\.sys\.global\.exch"
_ST_V4 = r"st\.global(\.[a-z0-9]+)*\.v4\.b32"
_INT = {n: "*i32" for n in ("topk_idx", "slots", "positions", "layout_counts", "recv_route", "recv_counts",
                             "out_counts", "row_of", "recv_tokens")}
_FP32 = {n: "*fp32" for n in ("topk_weights", "recv_weight", "out_weight", "weight_of")}


def _shape(world, hidden=7168, experts=256, topk=8, tokens=128):
    local = experts // world
    return dict(H=hidden, T=tokens, K=topk, KP=1 << (topk - 1).bit_length(), E=experts, L=local,
                LP=1 << (local - 1).bit_length(), WORLD=world, MAX_PROGRAMS=32, BH=min(1024, 1 << (hidden - 1).bit_length()))


def dispatch_ptx(world, send=True, recv=True, dt="bf16", fp8=False, packed=False, **shape):
    moved = "fp8e4nv" if fp8 else dt
    sig = dict(_INT, **_FP32, x=f"*{dt}", recv_x=f"*{moved}", out_x=f"*{moved}", signals="*u64", epoch_ptr="*i64",
               handle_epoch="*i64", tokens="i32", capacity="i32")
    meta = dict(_shape(world, **shape), SEND=send, RECV=recv, FP8=fp8, QB=128, QG=8 if fp8 else 1, PACKED=packed,
                HALVES=1 if packed else 2)
    if fp8:
        sig.update(recv_scale="*fp32", out_scale="*fp32")
    else:
        meta.update(recv_scale=None, out_scale=None)
    return compile_for_hopper(alltoall.ep_dispatch_kernel, sig, meta, num_warps=4).asm["ptx"]


def combine_ptx(world, dt="bf16", halves=2, **shape):
    sig = dict(y=f"*{dt}", row_of="*i32", weight_of="*fp32", recv_tokens="*i32", slots="*i32", comb_x=f"*{dt}",
               signals="*u64", out=f"*{dt}", handle_epoch="*i64", tokens="i32")
    meta = {k: v for k, v in _shape(world, **shape).items() if k not in ("E", "L", "LP")} | dict(HALVES=halves)
    return compile_for_hopper(alltoall.ep_combine_kernel, sig, meta, num_warps=4).asm["ptx"]


def _no_nvshmem_calls(ptx):
    assert ".target sm_90" in ptx
    assert not [c for c in ptx_calls(ptx) if c.startswith("nvshmem")], ptx_calls(ptx)


@pytest.mark.parametrize("world", [1, 2, 4, 8])
def test_dispatch_both_halves(world):
    ptx = dispatch_ptx(world)
    _no_nvshmem_calls(ptx)
    # Two waits (freed before sending, dispatched before receiving), each a first try and a loop.
    assert ptx.count(_SPIN) == 4, ptx.count(_SPIN)
    # A dispatched and a freed notify per rank, unrolled.
    assert len(re.findall(_RELEASE, ptx)) == 2 * world
    assert re.search(_ST_V4, ptx)


@pytest.mark.parametrize("send,recv,waits,notifies", [(True, False, 1, 1), (False, True, 1, 1)])
def test_dispatch_split_phases(send, recv, waits, notifies):
    ptx = dispatch_ptx(4, send, recv)
    assert ptx.count(_SPIN) == 2 * waits
    assert len(re.findall(_RELEASE, ptx)) == notifies * 4


@pytest.mark.parametrize("world", [1, 2, 8])
def test_combine(world):
    ptx = combine_ptx(world)
    _no_nvshmem_calls(ptx)
    assert ptx.count(_SPIN) == 2
    assert len(re.findall(_RELEASE, ptx)) == world
    # fp32 sums, rounded to bf16 once per stored row (the masked loads' zero fill may show as a
    # bf16x2 add of -0, which is no accumulation).
    assert re.search(r"(add|fma)(\.rn)?\.f32", ptx)
    assert "cvt.rn.bf16" in ptx


def test_odd_hidden_and_topk_compile():
    """An odd hidden size (masked tails, no vectors) and a topk that is not a power of two."""
    dispatch_ptx(2, hidden=1001, topk=3, experts=6)
    combine_ptx(2, hidden=1001, topk=3, experts=6)


@pytest.mark.parametrize("world,experts", [(1, 8), (8, 256)])
def test_layout_is_deterministic(world, experts):
    ptx = compile_for_hopper(layout.ep_layout_kernel, {"topk_idx": "*i32", "slots": "*i32", "positions": "*i32",
                                                        "counts": "*i32", "tokens": "i32"},
                             dict(K=8, KP=8, E=experts, L=experts // world, WORLD=world, BT=32),
                             num_warps=4).asm["ptx"]
    assert ".target sm_90" in ptx
    assert not re.search(r"\batom\.|\bred\.", ptx)


@pytest.mark.parametrize("world", [1, 2, 8])
def test_fp8_dispatch_quantises_on_send(world):
    """FP8 dispatch: the sender converts to e4m3 with saturation (cvt.rn.satfinite), several bytes
    per store, and the protocol's waits and notifies are those of the bf16 dispatch."""
    ptx = dispatch_ptx(world, fp8=True)
    _no_nvshmem_calls(ptx)
    assert "cvt.rn.satfinite.e4m3x2.f32" in ptx
    assert ptx.count(_SPIN) == 4, ptx.count(_SPIN)
    assert len(re.findall(_RELEASE, ptx)) == 2 * world
    send = dispatch_ptx(world, True, False, fp8=True)
    assert re.search(r"st\.global(\.[a-z0-9]+)*\.v2\.b32", send) and "st.global.b8" not in send


def test_bf16_dispatch_has_no_fp8():
    assert "e4m3" not in dispatch_ptx(2)


@pytest.mark.parametrize("world", [1, 2, 8])
def test_high_throughput_phases(world):
    """High-throughput: the send waits for ``freed`` of the previous call (one half) and notifies
    ``dispatched`` per rank; the count kernel waits once for every rank's ``dispatched`` before it
    reads the counts; the packed receive waits, copies with 16-byte vectors and frees per rank;
    combine's protocol is the low-latency one."""
    send = dispatch_ptx(world, True, False, packed=True)
    recv = dispatch_ptx(world, False, True, packed=True)
    for ptx in (send, recv):
        _no_nvshmem_calls(ptx)
        assert ptx.count(_SPIN) == 2 and len(re.findall(_RELEASE, ptx)) == world
    assert re.search(_ST_V4, recv)
    for send, receive in ((True, False), (False, True)):
        assert dispatch_ptx(world, send, receive, packed=True, fp8=True).count(_SPIN) == 2
    combine = combine_ptx(world, halves=1)
    assert combine.count(_SPIN) == 2 and len(re.findall(_RELEASE, combine)) == world
    local = 256 // world
    signature = {"recv_counts": "*i32", "signals": "*u64", "handle_epoch": "*i64", "out_counts": "*i32"}
    counts = compile_for_hopper(alltoall.ep_received_counts_kernel, signature,
                                dict(L=local, LP=local, WORLD=world, MAX_PROGRAMS=32, HALVES=1), num_warps=1).asm["ptx"]
    lines = counts.splitlines()
    spin = min(i for i, line in enumerate(lines) if _SPIN in line)
    reads = [i for i, line in enumerate(lines) if re.search(r"ld\.global(\.[a-z0-9]+)*\.(v[24]\.)?b32", line)]
    assert reads and spin < min(reads)
