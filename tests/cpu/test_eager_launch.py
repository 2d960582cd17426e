"""The eager launch path learns a variant's rules from Triton's own specialisation and launches
only arguments that meet them (triton_dist.eager_launch). Without a GPU: Triton's binder for
sm_90, a stand-in for the loaded kernel, and zero-sized grids (checked, never launched)."""

import types

import pytest
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import CUDABackend
from triton.runtime.jit import create_function_from_signature

from triton_dist import eager_launch


@triton.jit(do_not_specialize=["count"])
def scaled_copy(x, y, n, one, count, scale, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x + offs, tl.load(x + offs) * scale + n + one + count)


class FakeTensor:
    """What the binder and the C++ classifier read of a tensor: data_ptr() and dtype."""

    def __init__(self, address: int, dtype):
        self.address, self.dtype = address, dtype

    def data_ptr(self) -> int:
        return self.address


BF16, FP32 = tl.bfloat16, tl.float32


def loaded(**metadata):
    """A stand-in for a CompiledKernel whose handles are initialised (function is never called)."""
    md = dict(global_scratch_size=0, profile_scratch_size=0, num_ctas=1, num_warps=4, shared=0,
              launch_cooperative_grid=False, launch_pdl=False)
    md.update(metadata)
    return types.SimpleNamespace(name="scaled_copy", function=0x1, metadata=types.SimpleNamespace(**md))


@pytest.fixture
def launches(monkeypatch):
    backend = CUDABackend(GPUTarget("cuda", 90, 32))
    binder = create_function_from_signature(scaled_copy.signature, scaled_copy.params, backend)
    monkeypatch.setitem(scaled_copy.device_caches, 0, ({}, {}, backend.target, backend, binder))
    monkeypatch.setattr(eager_launch, "_device_and_stream", lambda: (0, 0))
    return eager_launch.EagerLaunches(scaled_copy)


def example():
    return (FakeTensor(4096, BF16), None, 17, 1, 3, 0.5)


META = dict(BLOCK=128, num_warps=4)
NONE = (0, )  # a zero-sized grid: every check runs, nothing is launched


def test_arguments_of_the_learnt_variant_launch_from_cpp(launches):
    assert not launches.launch(NONE, example(), META)  # nothing learnt yet: Triton's path
    launches.learn(loaded(), example(), META)
    assert launches.variants() == 1
    assert launches.launch(NONE, example(), META)
    # Another 16-aligned address, other unspecialised or undivided values: the same variant.
    assert launches.launch(NONE, (FakeTensor(1 << 40, BF16), None, 33, 1, 1, 2.0), META)
    # Less specialised than Triton would pick (n divisible by 16) is still correct.
    assert launches.launch(NONE, (FakeTensor(4096, BF16), None, 32, 1, 16, -1.0), META)


@pytest.mark.parametrize("why,args", [
    ("misaligned pointer", (FakeTensor(4104, BF16), None, 17, 1, 3, 0.5)),
    ("another dtype", (FakeTensor(4096, FP32), None, 17, 1, 3, 0.5)),
    ("a raw int for a pointer", (4096, None, 17, 1, 3, 0.5)),
    ("n past 32 bits", (FakeTensor(4096, BF16), None, 1 << 31, 1, 3, 0.5)),
    ("unspecialised count past 32 bits", (FakeTensor(4096, BF16), None, 17, 1, 1 << 40, 0.5)),
    ("not the folded constant 1", (FakeTensor(4096, BF16), None, 17, 2, 3, 0.5)),
    ("a bool for the folded 1", (FakeTensor(4096, BF16), None, 17, True, 3, 0.5)),
    ("a pointer where None was compiled in", (FakeTensor(4096, BF16), FakeTensor(8192, BF16), 17, 1, 3, 0.5)),
    ("an int for the float", (FakeTensor(4096, BF16), None, 17, 1, 3, 2)),
    ("too few arguments", (FakeTensor(4096, BF16), None, 17, 1, 3)),
    ("a string", (FakeTensor(4096, BF16), None, "17", 1, 3, 0.5)),
])
def test_arguments_of_another_variant_take_tritons_path(launches, why, args):
    launches.learn(loaded(), example(), META)
    assert not launches.launch(NONE, args, META), why


def test_variants_are_per_keyword_arguments(launches):
    launches.learn(loaded(), example(), META)
    assert not launches.launch(NONE, example(), dict(BLOCK=256, num_warps=4))
    assert not launches.launch(NONE, example(), dict(BLOCK=128, num_warps=8))
    launches.learn(loaded(), (FakeTensor(4104, BF16), None, 17, 1, 3, 0.5), META)  # a second variant
    assert launches.variants() == 2
    assert launches.launch(NONE, (FakeTensor(4104, BF16), None, 17, 1, 3, 0.5), META)
    for _ in range(2 * eager_launch.MAX_VARIANTS):
        launches.learn(loaded(), example(), META)
    assert launches.variants() == eager_launch.MAX_VARIANTS


@pytest.mark.parametrize("metadata", [dict(global_scratch_size=64), dict(profile_scratch_size=8), dict(num_ctas=2)])
def test_variants_needing_per_launch_resources_are_not_learnt(launches, metadata):
    launches.learn(loaded(**metadata), example(), META)
    assert launches.variants() == 0
    assert not launches.launch(NONE, example(), META)
    # Nor tried again and again: after MAX_VARIANTS attempts even a good variant is not learnt.
    for _ in range(eager_launch.MAX_VARIANTS):
        launches.learn(loaded(**metadata), example(), META)
    launches.learn(loaded(), example(), META)
    assert launches.variants() == 0


def test_runtime_arguments_by_keyword_are_not_learnt(launches):
    args = example()
    launches.learn(loaded(), args[:-1], dict(META, scale=0.5))
    assert launches.variants() == 0


def test_runtime_arguments_by_keyword_leave_nothing_behind(launches):
    """Each call's tensors passed by keyword must not be kept (in a key of the attempts, say)."""
    for address in range(4096, 4096 + 64 * 16, 16):
        kwargs = dict(META, x=FakeTensor(address, BF16))
        assert not launches.launch(NONE, (None, 17, 1, 3, 0.5), kwargs)
        launches.learn(loaded(), (None, 17, 1, 3, 0.5), kwargs)
    assert launches.variants() == 0 and not launches._attempts and not launches._launchers


def test_a_launch_hook_or_a_callable_grid_keeps_tritons_path(launches, monkeypatch):
    launches.learn(loaded(), example(), META)
    assert not launches.launch(lambda meta: (1, ), example(), META)
    hooks = triton.knobs.runtime.launch_enter_hook
    monkeypatch.setattr(hooks, "calls", [lambda metadata: None])
    assert not launches.launch(NONE, example(), META)
