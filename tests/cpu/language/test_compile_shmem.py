"""Kernels that call NVSHMEM's device API compile for sm_90 without a GPU, with the bitcode linked."""

import pytest
import triton
import triton.language as tl

import triton_dist
from triton_dist.language import shmem
from triton_dist.tools.compile_check import compile_for_hopper, ptx_calls


@triton_dist.jit
def put_signal_kernel(dst, src, sig, nbytes, epoch, out):
    me = shmem.my_pe()
    peer = (me + 1) % shmem.n_pes()
    shmem.putmem_signal_block(dst, src, nbytes, sig, epoch, shmem.SIGNAL_SET, peer)
    shmem.signal_wait_until(sig, shmem.CMP_GE, epoch)
    tl.store(out, me)


@triton_dist.jit
def every_binding_kernel(dst, src, sig, nbytes, out):
    me = shmem.my_pe()
    shmem.putmem(dst, src, nbytes, me)
    shmem.putmem_warp(dst, src, nbytes, me)
    shmem.putmem_nbi_block(dst, src, nbytes, me)
    shmem.getmem_block(dst, src, nbytes, me)
    shmem.getmem_nbi(dst, src, nbytes, me)
    shmem.putmem_signal_nbi_warp(dst, src, nbytes, sig, 1, shmem.SIGNAL_ADD, me)
    shmem.signal_op(sig, 1, shmem.SIGNAL_SET, me)
    shmem.fence()
    shmem.quiet()
    shmem.sync_all_block()
    shmem.barrier_all_block()
    remote = shmem.ptr(out, me)
    tl.store(remote, shmem.team_n_pes(shmem.TEAM_WORLD) + shmem.team_my_pe(shmem.TEAM_WORLD))


SIGNATURE = {"dst": "*u8", "src": "*u8", "sig": "*u64", "nbytes": "i64", "out": "*i32"}


def test_put_signal_kernel_links_nvshmem():
    compiled = compile_for_hopper(put_signal_kernel, dict(SIGNATURE, epoch="u64"))
    ptx = compiled.asm["ptx"]
    assert ".target sm_90" in ptx
    # NVSHMEM's device state is what nvshmemx_cumodule_init fills in at load time.
    assert "nvshmemi_device_state_d" in ptx
    assert any("put_signal" in name for name in ptx_calls(ptx)), ptx_calls(ptx)
    assert len(compiled.asm["cubin"]) > 0


def test_every_binding_compiles():
    compiled = compile_for_hopper(every_binding_kernel, dict(SIGNATURE))
    assert "nvshmemi_device_state_d" in compiled.asm["ptx"]


def test_wrong_argument_count_is_a_compile_error():
    @triton_dist.jit
    def bad(out):
        shmem.putmem_block(out, out, 4)

    with pytest.raises(triton.CompilationError, match=r"takes 4 arguments, got 3"):
        compile_for_hopper(bad, {"out": "*i32"})


def test_plain_triton_kernels_do_not_link_nvshmem():
    @triton.jit
    def plain(out):
        tl.store(out, 1)

    assert "nvshmemi_device_state_d" not in compile_for_hopper(plain, {"out": "*i32"}).asm["ptx"]
