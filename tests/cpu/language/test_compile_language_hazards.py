"""Two hazards of the language that once failed silently, now either safe or a compile error:

1. a token bound inside control flow (``x = dl.consume_token(desc_or_ptr, token)`` under ``if k ==
   0:``) keeps ordering the loads after the block, or the kernel does not compile, with a message
   that says how to write it;
2. every setting that changes a wait's code is part of the kernel's cache key, and a plain
   ``@triton.jit`` kernel that uses the device API is refused with a message naming
   ``@triton_dist.jit`` (it would link nothing and key nothing).
"""

import dataclasses
import re

import pytest
import triton
import triton.language as tl

import triton_dist
import triton_dist.language as dl
from triton_dist import config
from triton_dist.language import support_library
from triton_dist.tools.compile_check import compile_for_hopper, depends_on, ops_matching, results

_SPIN = "ld.acquire.sys.global.u64"
_SIGNATURE = {"a_desc": "tensordesc<bf16[64, 64]>", "signals": "*u64", "out": "*fp32", "k_tiles": "i32"}


@triton_dist.jit
def bound_on_one_path_only(a_desc, signals, out, k_tiles):
    acc = tl.zeros([64, 16], tl.float32)
    x = a_desc
    for k in range(k_tiles):
        if k == 0:
            token = dl.wait(signals, 1, "sys", "acquire", 1)
            x = dl.consume_token(a_desc, token)
        acc = tl.dot(x.load([0, k * 64]), tl.full([64, 16], 1.0, tl.bfloat16), acc)
    tl.store(out + tl.arange(0, 64)[:, None] * 16 + tl.arange(0, 16)[None, :], acc)


@triton_dist.jit
def bound_before_the_loop(a_desc, signals, out, k_tiles):
    acc = tl.zeros([64, 16], tl.float32)
    x = dl.consume_token(a_desc, tl.zeros((), tl.int32))
    for k in range(k_tiles):
        if k == 0:
            token = dl.wait(signals, 1, "sys", "acquire", 1)
            x = dl.consume_token(a_desc, token)
        acc = tl.dot(x.load([0, k * 64]), tl.full([64, 16], 1.0, tl.bfloat16), acc)
    tl.store(out + tl.arange(0, 64)[:, None] * 16 + tl.arange(0, 16)[None, :], acc)


@triton_dist.jit
def pointer_bound_in_if(a, signals, out, first):
    offs = tl.arange(0, 128)
    p = a
    if first != 0:
        token = dl.wait(signals, 1, "sys", "acquire", 1)
        p = dl.consume_token(a, token)
    tl.store(out + offs, tl.load(p + offs))


@triton.jit
def plain_jit_wait(signals):
    dl.wait(signals, 1, "sys", "acquire", 1)


@triton.jit
def plain_jit_wait_forever(signals):
    dl.wait(signals, 1, "sys", "acquire", 1, timeout_ns=0)


@triton.jit
def plain_jit_rank(out):
    tl.store(out, dl.rank())


@triton_dist.jit
def distributed_wait(signals):
    dl.wait(signals, 1, "sys", "acquire", 1)


def test_a_descriptor_bound_on_one_path_only_is_a_compile_error_that_says_how():
    with pytest.raises(triton.CompilationError) as caught:
        compile_for_hopper(bound_on_one_path_only, dict(_SIGNATURE))
    text = str(caught.value)
    assert "bound to a dl.wait token" in text and "bind it on every path" in text, text


def test_a_descriptor_bound_before_the_block_keeps_its_wait_through_if_and_loop():
    compiled = compile_for_hopper(bound_before_the_loop, dict(_SIGNATURE))
    ttgir = compiled.asm["ttgir"]
    spins = results(ops_matching(ttgir, re.escape(_SPIN)))
    loads = ops_matching(ttgir, r"tt\.descriptor_load|async_tma_copy_global_to_local")
    assert spins and loads
    for load in loads:  # through the scf.if's result and the loop-carried value
        assert depends_on(ttgir, load, spins), f"a TMA load after the if does not depend on the wait: {load}"
    assert "fence.proxy.async.global" in compiled.asm["ptx"]  # the descriptor kept its proxy fence


def test_a_pointer_bound_in_an_if_keeps_its_wait():
    compiled = compile_for_hopper(pointer_bound_in_if, {"a": "*fp32", "signals": "*u64", "out": "*fp32",
                                                         "first": "i32"})
    ttgir = compiled.asm["ttgir"]
    spins = results(ops_matching(ttgir, re.escape(_SPIN)))
    loads = ops_matching(ttgir, r"tt\.load ")
    assert spins and loads
    assert all(depends_on(ttgir, load, spins) for load in loads), loads


def test_depends_on_follows_values_out_of_scf_if():
    ir = """
    %0 = tt.get_program_id x : i32
    %1 = arith.cmpi eq, %0, %c0 : i32
    %2 = scf.if %1 -> (i32) {
      %3 = tt.elementwise_inline_asm "{ spin }" {pure = false} %0 : i32 -> i32
      scf.yield %3 : i32
    } else {
      scf.yield %0 : i32
    }
    %4:2 = scf.if %1 -> (i32, i32) {
      %5 = arith.addi %0, %0 : i32
      scf.yield %0, %5 : i32, i32
    } else {
      scf.yield %0, %0 : i32, i32
    }
    %6 = tt.load %2 : i32
    %7 = tt.load %4#0 : i32
    %8 = tt.load %4#1 : i32
    """
    assert depends_on(ir, "%6 = tt.load %2 : i32", {"%3"})
    assert not depends_on(ir, "%7 = tt.load %4#0 : i32", {"%5"})  # result 0 never sees %5
    assert depends_on(ir, "%8 = tt.load %4#1 : i32", {"%5"})


@pytest.mark.parametrize("kernel,what", [(plain_jit_wait, "dl.wait"), (plain_jit_wait_forever, "dl.wait"),
                                         (plain_jit_rank, "shmem.my_pe")])
def test_a_plain_triton_jit_kernel_using_the_device_api_is_refused(kernel, what):
    signature = {"out": "*i32"} if kernel is plain_jit_rank else {"signals": "*u64"}
    with pytest.raises(triton.CompilationError) as caught:
        compile_for_hopper(kernel, signature)
    text = f"{caught.value} {caught.value.__cause__}"  # Triton chains the builtin's error
    assert what in text and "@triton_dist.jit, not @triton.jit" in text, text


@pytest.fixture
def settings():
    """Set the language settings for one test and restore them after."""
    saved = config._current

    def apply(**changes):
        config._set(dataclasses.replace(config.Config.from_environment(), **changes))

    yield apply
    config._set(saved)


def test_changing_a_setting_changes_the_key_and_the_code(settings):
    """The wait timeout and debug barriers reach Triton's cache key (the support library's path and
    contents, an extern_libs entry of every triton_dist.jit kernel): each setting compiles anew."""
    seen = {}
    for timeout, barriers in ((0, False), (10**9, False), (10**9, True)):
        settings(wait_timeout_ns=timeout, debug_barriers=barriers)
        libs = dict(triton_dist.distributed_jit.extern_libs())
        ptx = compile_for_hopper(distributed_wait, {"signals": "*u64"}).asm["ptx"]
        seen[(timeout, barriers)] = (libs[support_library.NAME], ptx)
    paths = {path for path, _ in seen.values()}
    assert len(paths) == 3, "two settings share one support library: their kernels would share a cache entry"
    assert "trap;" not in seen[(0, False)][1] and "trap;" in seen[(10**9, False)][1]
    assert seen[(10**9, True)][1].count("bar.sync") > seen[(10**9, False)][1].count("bar.sync")


def test_extern_libs_from_other_settings_are_refused(settings):
    settings(wait_timeout_ns=7_777_777)  # a setting nothing else compiles: no cached kernel to reuse
    stale = triton_dist.distributed_jit.extern_libs()
    settings(wait_timeout_ns=10**9)
    with pytest.raises(triton.CompilationError) as caught:
        compile_for_hopper(distributed_wait, {"signals": "*u64"}, extern_libs=stale)
    assert "other language settings" in str(caught.value.__cause__)


def test_a_change_of_the_language_changes_every_kernels_cache_key(monkeypatch):
    # Triton keys a compiled kernel by the contents of its extern_libs, not by the sources of
    # builtins such as dl.simt's; the support library carries their hash so that a change recompiles.
    before = support_library._source(1, False, 0)
    assert f"; language sources: {support_library._language_fingerprint()}" in before
    support_library._language_fingerprint.cache_clear()
    monkeypatch.setattr(support_library, "_language_fingerprint", lambda: "0" * 16)
    assert support_library._source(1, False, 0) != before
