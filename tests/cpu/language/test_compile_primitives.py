"""The language's newer primitives compile for sm_90 with the instructions the memory model needs:
waits on 32-bit signals and equality waits, and the rest of NVSHMEM's device API (typed p/g and
put/get, team collectives, signal_fetch), every binding a function the device bitcode defines."""

import re

import pytest
import triton.language as tl

import triton_dist
import triton_dist.language as dl
from triton_dist import nvshmem
from triton_dist.language import shmem
from triton_dist.tools.compile_check import compile_for_hopper


@triton_dist.jit
def wait_int32(flags, value):
    dl.wait(flags, 2, "sys", "acquire", value)


@triton_dist.jit
def wait_uint32(flags, value):
    dl.wait(flags, 1, "gpu", "acquire", value)


@triton_dist.jit
def wait_equal(flags, value):
    dl.wait(flags, 1, "sys", "acquire", value, cmp="eq")


@triton_dist.jit
def wait_equal_int32(flags, value):
    dl.wait(flags, 1, "sys", "acquire", value, cmp="eq")


@pytest.mark.parametrize("kernel,signal,load,compare", [
    (wait_int32, "*i32", "ld.acquire.sys.global.u32", "setp.ge.s32"),
    (wait_uint32, "*u32", "ld.acquire.gpu.global.u32", "setp.ge.u32"),
    (wait_equal, "*u64", "ld.acquire.sys.global.u64", "setp.eq.b64"),
    (wait_equal_int32, "*i32", "ld.acquire.sys.global.u32", "setp.eq.b32"),
])
def test_waits_load_the_signal_width_and_compare_as_asked(kernel, signal, load, compare):
    ptx = compile_for_hopper(kernel, {"flags": signal, "value": "i32"}).asm["ptx"]
    assert load in ptx and compare in ptx, (load, compare)
    assert "trap;" in ptx  # the timeout path is kept


@triton_dist.jit
def wait_float(flags):
    dl.wait(flags, 1, "sys", "acquire", 1)


def test_a_wait_on_floats_is_refused():
    import triton

    with pytest.raises(triton.CompilationError) as caught:
        compile_for_hopper(wait_float, {"flags": "*fp32"})
    assert "32- or 64-bit integer signals" in f"{caught.value} {caught.value.__cause__}"


def test_every_shmem_binding_is_a_function_of_the_device_bitcode():
    """Each bound NVSHMEM symbol is in libnvshmem_device.bc's symbol names (a missing one would only
    fail when a kernel using it is compiled)."""
    with open(nvshmem.device_bitcode(), "rb") as f:
        bitcode = f.read()
    missing = [symbol for symbol in shmem.symbols().values() if symbol.encode() not in bitcode]
    assert not missing, missing
    assert len(shmem.symbols()) > 500  # typed RMA, collectives and reductions for every type


@triton_dist.jit
def typed_and_team_calls(ints, floats, signals, out, n):
    me = dl.rank()
    right = (me + 1) % dl.num_ranks()
    if dl.tid(0) == 0:
        shmem.int32_p(ints, me, right)
        tl.store(out, shmem.float_g(floats, right))
    shmem.int32_put_block(ints + 16, ints, n, right)
    shmem.bfloat16_get_nbi_block(floats + 16, floats, n, right)
    shmem.quiet()
    shmem.barrier_block(shmem.TEAM_WORLD)
    shmem.int32_sum_reduce_block(shmem.TEAM_WORLD, ints + 64, ints, n)
    shmem.fcollectmem_block(shmem.TEAM_NODE, ints + 128, ints, n * 4)
    shmem.team_sync_block(shmem.TEAM_WORLD)
    tl.store(out + 1, shmem.signal_fetch(signals).to(tl.float32))


def test_typed_rma_and_team_collectives_link():
    ptx = compile_for_hopper(typed_and_team_calls, {"ints": "*i32", "floats": "*fp32", "signals": "*u64",
                                                    "out": "*fp32", "n": "i32"}).asm["ptx"]
    assert re.search(r"\.entry typed_and_team_calls", ptx)


@triton_dist.jit
def per_thread_barrier(signals, epoch):
    dl.simt.barrier_all_ranks(signals, epoch)


@triton_dist.jit
def per_thread_atomics(flags, counts, out):
    t = dl.tid(0)
    old = dl.simt.atomic_add(counts + t, 1, "sys", "release", t < 8)
    swapped = dl.simt.atomic_cas(flags + t, 0, 1, "gpu", "acq_rel", t < 8)
    dl.simt.st(out + t, old + swapped.to(tl.int32), "gpu", "relaxed", t < 8)


def test_per_thread_barrier_stores_and_spins_in_every_thread():
    ptx = compile_for_hopper(per_thread_barrier, {"signals": "*u64", "epoch": "i64"}, num_warps=1).asm["ptx"]
    assert re.search(r"@%p\d* st\.release\.sys\.global\.b64", ptx), "the release store is not per-thread"
    assert "ld.acquire.sys.global.u64" in ptx and "trap;" in ptx  # a bounded acquire spin, with its report
    assert ptx.count("bar.sync") >= 2  # the program's writes before, every peer's arrival after
    assert "%ntid.x" in ptx  # a program with fewer threads than ranks traps instead of skipping ranks


@triton_dist.jit
def float_atomic(x):
    dl.simt.atomic_add(x + dl.tid(0), 1.0)


def test_per_thread_atomics_refuse_floats():
    import triton

    with pytest.raises(triton.CompilationError) as caught:
        compile_for_hopper(float_atomic, {"x": "*fp32"})
    assert "pointers to 32- or 64-bit integers" in f"{caught.value} {caught.value.__cause__}"


def test_per_thread_atomics_are_predicated_asm():
    ptx = compile_for_hopper(per_thread_atomics, {"flags": "*u64", "counts": "*i32", "out": "*i32"}).asm["ptx"]
    assert re.search(r"@%p\d* atom\.release\.sys\.global\.add\.u32", ptx)
    assert re.search(r"@%p\d* atom\.acq_rel\.gpu\.global\.cas\.b64", ptx)
    assert re.search(r"@%p\d* st\.relaxed\.gpu\.global\.b32", ptx)


@triton_dist.jit
def ranks_by_axis(out):
    tl.store(out + 0, dl.rank())
    tl.store(out + 1, dl.rank("intra_node"))
    tl.store(out + 2, dl.rank("inter_node"))
    tl.store(out + 3, dl.num_ranks("intra_node"))
    tl.store(out + 4, dl.num_ranks("inter_node"))


def test_rank_by_axis_uses_the_declared_node_size(monkeypatch):
    import dataclasses

    from triton_dist import config

    saved = config._current
    try:
        config._set(dataclasses.replace(config.Config.from_environment(), local_world_size=4))
        ptx = compile_for_hopper(ranks_by_axis, {"out": "*i32"}).asm["ptx"]
        assert "rem.s32" in ptx or "and.b32" in ptx  # my_pe % 4
        config._set(dataclasses.replace(config.Config.from_environment(), local_world_size=0))
        import triton

        with pytest.raises(triton.CompilationError) as caught:
            compile_for_hopper(ranks_by_axis, {"out": "*i32"})
        assert "ranks per node are not known" in f"{caught.value} {caught.value.__cause__}"
    finally:
        config._set(saved)
