"""Kernels compiled in worker processes land under the key Triton's JIT looks up
(triton_dist.parallel_compile). Without a GPU: Triton's binder for sm_90, stand-in tensors, and
Triton's compilation listener to see the parent's own compile of the same variant hit the cache."""

import types

import pytest
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import CUDABackend
from triton.runtime.jit import create_function_from_signature

from triton_dist import config, parallel_compile
from triton_dist.language import support_library
from triton_dist.kernels.common.rank_barrier import rank_barrier_kernel


class FakeTensor:
    def __init__(self, address: int, dtype):
        self.address, self.dtype = address, dtype

    def data_ptr(self) -> int:
        return self.address


@pytest.fixture
def cpu_binder(monkeypatch, tmp_path):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    fn = rank_barrier_kernel.fn
    backend = CUDABackend(GPUTarget("cuda", 90, 32))
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    monkeypatch.setitem(fn.device_caches, 0, ({}, {}, backend.target, backend, binder))
    monkeypatch.setattr(parallel_compile, "_device", lambda: 0)
    monkeypatch.setattr(config, "_current", config.Config(local_world_size=2))  # what init() would install


def preload(world: int) -> parallel_compile.Preload:
    args = (FakeTensor(4096, tl.uint64), FakeTensor(8192, tl.int64))
    return parallel_compile.Preload(rank_barrier_kernel, args, (1, ), dict(PHASE=0, PHASES=1, WORLD=world, num_warps=1))


def test_workers_compile_what_the_jit_looks_up(cpu_binder):
    variants = [parallel_compile.variant_of(preload(w)) for w in (2, 4)]
    assert not any(parallel_compile.is_cached(v) for v in variants)
    parallel_compile.compile_variants(variants, workers=2)
    assert all(parallel_compile.is_cached(v) for v in variants)
    # The parent compiling the same variant the way the JIT does is a cache hit.
    hits = []
    triton.knobs.compilation.listener = lambda **info: hits.append(info["cache_hit"])
    try:
        for v in variants:
            src, options = parallel_compile._source_and_options(v)
            triton.compile(src, target=v.target, options=options)
    finally:
        triton.knobs.compilation.listener = None
    assert hits == [True, True]


def test_recording_defers_preloads_and_keeps_their_arguments():
    with parallel_compile.deferred_preloads() as recorded:
        assert rank_barrier_kernel.preload("signals", "epoch", grid=(1, ), PHASE=0, PHASES=1, WORLD=2) is None
    assert parallel_compile.recording() is None
    assert len(recorded) == 1 and recorded[0].args == ("signals", "epoch") and recorded[0].kwargs["WORLD"] == 2


def test_kernels_a_worker_cannot_import_are_left_to_the_preload():
    kernel = types.SimpleNamespace(fn=types.SimpleNamespace(fn=types.SimpleNamespace(__module__="__main__",
                                                                                    __qualname__="k")))
    assert parallel_compile.variant_of(parallel_compile.Preload(kernel, (), (1, ), {})) is None


def test_worker_count_follows_the_config(monkeypatch):
    monkeypatch.setattr(config, "_current", config.Config(compile_workers=3))
    assert parallel_compile._workers(10) == 3 and parallel_compile._workers(2) == 2
    monkeypatch.setattr(config, "_current", config.Config(compile_workers=0))
    assert 1 <= parallel_compile._workers(10) <= 10


def test_the_setting_is_read_from_the_environment(monkeypatch):
    monkeypatch.setenv("TRITON_DIST_COMPILE_WORKERS", "5")
    assert config.Config.from_environment().compile_workers == 5
    monkeypatch.setenv("TRITON_DIST_COMPILE_WORKERS", "-1")
    with pytest.raises(ValueError, match="TRITON_DIST_COMPILE_WORKERS"):
        config.Config.from_environment()


def test_workers_never_touch_the_gpu(monkeypatch):
    """A worker that opened the GPU would be one more CUDA context (under MPS, one more client)."""
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", "/tmp/mps-pipe")
    monkeypatch.setenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "25")
    monkeypatch.setenv("TRITON_CACHE_DIR", "/tmp/some-cache")
    env = parallel_compile.worker_environment()
    assert env["CUDA_VISIBLE_DEVICES"] == ""
    assert not [k for k in env if k.startswith("CUDA_MPS_")]
    assert env["TRITON_CACHE_DIR"] == "/tmp/some-cache"  # the cache the ranks will read


def test_a_descriptor_kernel_defined_with_triton_jit_compiles_in_a_worker(monkeypatch, tmp_path, request):
    """The GEMM's kernel is a plain ``triton.jit`` function at module level (its DistributedKernels
    wrap it in other modules), taking TMA descriptors: the worker must find it by name too."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    from triton_dist.kernels.gemm import ag_gemm as allgather_gemm
    from triton_dist.kernels.gemm import dense as gemm

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    # The support library lives in the cache directory, and its path is remembered per process.
    support_library._write.cache_clear()
    request.addfinalizer(support_library._write.cache_clear)
    kernel = allgather_gemm.ag_gemm_consumer_kernel
    fn = kernel.fn
    backend = CUDABackend(GPUTarget("cuda", 90, 32))
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    monkeypatch.setitem(fn.device_caches, 0, ({}, {}, backend.target, backend, binder))
    monkeypatch.setattr(parallel_compile, "_device", lambda: 0)
    monkeypatch.setattr(config, "_current", config.Config(local_world_size=2))
    base = FakeTensor(1 << 20, tl.bfloat16)
    blocks = gemm.config_params("small")
    descs = [TensorDescriptor(base, [512, 512], [512, 1], [blocks[r], blocks[c]])
             for r, c in (("BM", "BK"), ("BN", "BK"), ("BM", "BN"))]
    args = (*descs, 2, 2, 2, FakeTensor(4096, tl.int64), FakeTensor(8192, tl.int64), 2, 2)
    variant = parallel_compile.variant_of(parallel_compile.Preload(kernel, args, (1, ), gemm.kernel_meta("small", True)))
    assert variant.name == "gemm_kernel" and not parallel_compile.is_cached(variant)
    parallel_compile.compile_variants([variant, variant], workers=2)
    assert parallel_compile.is_cached(variant)


def test_the_compiling_rank_reaches_the_barrier_whatever_fails(monkeypatch, capsys):
    """The other ranks wait at the barrier: a compiling rank that raised past it would meet their
    next collective with another of its own (seen on the GPU: a hang two contexts later)."""
    barriers = []
    monkeypatch.setattr(parallel_compile._runtime, "local_rank", lambda: 0)
    monkeypatch.setattr(parallel_compile._runtime, "barrier", lambda: barriers.append(1))

    def broken(_preload):
        raise AttributeError("no such kernel")

    monkeypatch.setattr(parallel_compile, "variant_of", broken)
    parallel_compile.compile_once_per_node([object()])
    assert barriers == [1]
    assert "compile one by one instead" in capsys.readouterr().err


def test_a_compile_is_announced_and_a_cached_context_is_silent(monkeypatch, capsys):
    """A first use that compiles says so on stderr (it can take tens of seconds); nothing to compile,
    nothing printed."""
    monkeypatch.setattr(parallel_compile._runtime, "local_rank", lambda: 0)
    monkeypatch.setattr(parallel_compile._runtime, "barrier", lambda: None)
    compiled = []
    monkeypatch.setattr(parallel_compile, "compile_variants", lambda variants, **kw: compiled.append(variants))
    variant = parallel_compile.Variant("triton_dist.kernels.collectives.allgather_kernels", "k", {}, {}, {}, {}, None)
    monkeypatch.setattr(parallel_compile, "variant_of", lambda preload: variant)
    monkeypatch.setattr(parallel_compile, "is_cached", lambda v: False)
    parallel_compile.compile_once_per_node([object(), object()])
    err = capsys.readouterr().err
    assert compiled == [[variant, variant]]
    assert "compiling 2 kernel variants (allgather_kernels) for their first use" in err
    assert "compiled 2 kernel variants in" in err
    monkeypatch.setattr(parallel_compile, "is_cached", lambda v: True)
    parallel_compile.compile_once_per_node([object()])
    assert capsys.readouterr().err == "" and compiled == [[variant, variant]]
