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


def _learner(kernel, monkeypatch):
    """EagerLaunches of ``kernel`` with Triton's sm_90 binder installed for device 0."""
    backend = CUDABackend(GPUTarget("cuda", 90, 32))
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    monkeypatch.setitem(kernel.device_caches, 0, ({}, {}, backend.target, backend, binder))
    monkeypatch.setattr(eager_launch, "_device_and_stream", lambda: (0, 0))
    monkeypatch.setattr(eager_launch, "_torch_c", None)  # PreparedLaunch.stream asks the stand-in above
    return eager_launch.EagerLaunches(kernel)


@pytest.fixture
def launches(monkeypatch):
    return _learner(scaled_copy, monkeypatch)


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


def test_runtime_arguments_by_keyword_take_their_place_in_order(launches):
    """The GEMMs pass the runtime parameters after their constexprs by name: the C++ launch puts
    each in its slot, and the per-call values by name are no part of the key."""
    args = example()
    launches.learn(loaded(), args[:-1], dict(META, scale=0.5))
    assert launches.variants() == 1
    assert launches.launch(NONE, args[:-1], dict(META, scale=2.0))
    assert launches.launch(NONE, args[:3], dict(META, one=1, count=9, scale=2.0))  # any order by name
    assert launches.launch(NONE, args, META)  # the same variant, all by position
    assert not launches.launch(NONE, args[:3], dict(META, one=1, scale=2.0))  # count missing: Triton's path
    assert not launches.launch(NONE, args[:3], dict(META, one=2, count=9, scale=2.0))  # not the folded 1


@triton.jit
def after_constexpr(x, n, C: tl.constexpr, m, extra=0):
    """Runtime parameters after a constexpr, as the GEMMs have."""
    offs = tl.arange(0, C)
    tl.store(x + offs, tl.load(x + offs) + n + m + extra)


@pytest.fixture
def after(monkeypatch):
    return _learner(after_constexpr, monkeypatch)


def test_runtime_arguments_after_a_constexpr_go_into_their_slots(after):
    x = FakeTensor(4096, FP32)
    after.learn(loaded(), (x, 17), dict(C=16, m=7, num_warps=4))
    assert after.variants() == 1
    assert after._runtime_args((x, 17), dict(C=16, m=9, num_warps=4)) == (x, 17, 9, 0)
    assert after._runtime_args((x, 17), dict(C=16, extra=5, m=9, num_warps=4)) == (x, 17, 9, 5)
    assert after.launch(NONE, (x, 18), dict(C=16, m=9, num_warps=4))
    assert not after.launch(NONE, (x, 18), dict(C=32, m=9, num_warps=4))  # another constexpr: another key


def test_a_constexpr_given_by_position_is_never_taken_for_a_runtime_argument(after):
    """Triton binds positional arguments in the signature's order: (x, 17, 16, 7) is C=16, m=7."""
    x = FakeTensor(4096, FP32)
    after.learn(loaded(), (x, 17, 16, 7), dict(num_warps=4))
    assert after.variants() == 0
    assert after._runtime_args((x, 17, 16, 7), {}) is None
    assert after._runtime_args((x, 17), dict(n=3, C=16, m=7)) is None  # n twice: Triton raises


def test_runtime_arguments_by_name_take_the_cpp_path_without_the_descriptors_switch(after, monkeypatch):
    """The collectives pass their signal layout by name: that must not depend on the switch for
    tensor descriptors."""
    from triton_dist import config

    monkeypatch.setattr(config, "get", lambda: types.SimpleNamespace(eager_tensor_descriptors=False))
    after.learn(loaded(), (FakeTensor(4096, FP32), 17), dict(C=16, m=7, num_warps=4))
    assert after.variants() == 1


def test_none_or_a_tensor_by_name_are_two_variants(launches):
    args = example()
    launches.learn(loaded(), args[:3], dict(META, one=1, count=3, scale=0.5))  # y: None, folded
    assert not launches.launch(NONE, args[:1], dict(META, y=FakeTensor(8192, BF16), n=17, one=1, count=3, scale=0.5))
    launches.learn(loaded(), args[:1], dict(META, y=FakeTensor(8192, BF16), n=17, one=1, count=3, scale=0.5))
    assert launches.variants() == 2
    assert launches.launch(NONE, args[:1], dict(META, y=FakeTensor(1 << 20, BF16), n=17, one=1, count=3, scale=0.5))
    assert launches.launch(NONE, args[:3], dict(META, one=1, count=3, scale=0.5))


def test_runtime_arguments_by_keyword_leave_nothing_behind(launches):
    """Each call's tensors passed by keyword must not be kept (in a key of the attempts, say)."""
    for address in range(4096, 4096 + 64 * 16, 16):
        kwargs = dict(META, x=FakeTensor(address, BF16))
        launches.launch(NONE, (), kwargs)
        launches.learn(loaded(), (), dict(kwargs, y=None, n=17, one=1, count=3, scale=0.5))
    assert launches.variants() <= eager_launch.MAX_VARIANTS and len(launches._attempts) == 1
    held = [v for key in list(launches._attempts) + list(launches._launchers) for v in key]
    assert not any(isinstance(v, FakeTensor) for v in held)


def test_a_launch_hook_or_a_callable_grid_keeps_tritons_path(launches, monkeypatch):
    launches.learn(loaded(), example(), META)
    assert not launches.launch(lambda meta: (1, ), example(), META)
    hooks = triton.knobs.runtime.launch_enter_hook
    monkeypatch.setattr(hooks, "calls", [lambda metadata: None])
    assert not launches.launch(NONE, example(), META)


# Prepared launches (what a LaunchPlan keeps): the key looked up once, later variants shared.

def test_a_prepared_launch_takes_the_variants_learnt_before_and_after_it(launches):
    prepared = launches.prepare(NONE, META)
    assert not prepared.launch(example())  # nothing learnt yet: the caller takes Triton's path
    launches.learn(loaded(), example(), META)
    assert prepared.launch(example())
    assert prepared.launch((FakeTensor(1 << 40, BF16), None, 33, 1, 1, 2.0))
    assert launches.prepare(NONE, META).launch(example())
    assert not prepared.launch((FakeTensor(4104, BF16), None, 17, 1, 3, 0.5))  # misaligned: no variant
    launches.learn(loaded(), (FakeTensor(4104, BF16), None, 17, 1, 3, 0.5), META)
    assert prepared.launch((FakeTensor(4104, BF16), None, 17, 1, 3, 0.5))


@triton.jit
def trailing_defaults(x, n, C: tl.constexpr, extra=0, flag=None):
    """Runtime parameters after a constexpr, each with a default, as the GEMM's epilogue operands."""
    offs = tl.arange(0, C)
    tl.store(x + offs, tl.load(x + offs) + n + extra)


def test_a_prepared_launch_appends_the_left_out_trailing_defaults(monkeypatch):
    """A plan gives only the leading runtime arguments (AllGather+GEMM's consumer: ten of the
    GEMM's seventeen); the C++ launcher takes every one, so the prepared launch completes them
    instead of falling back to Triton's path on every call."""
    learner = _learner(trailing_defaults, monkeypatch)
    x = FakeTensor(4096, FP32)
    meta = dict(C=16, num_warps=4)
    learner.learn(loaded(), (x, 17), meta)
    assert learner.variants() == 1
    prepared = learner.prepare(NONE, meta)
    assert prepared.launch([x, 18])
    assert prepared.launch((x, 18, 0, None))  # complete already: unchanged
    assert not prepared.launch([x])  # a required one missing: not completed, refused


def test_a_prepared_launch_is_per_keyword_arguments_and_device(launches, monkeypatch):
    launches.learn(loaded(), example(), META)
    assert not launches.prepare(NONE, dict(BLOCK=256, num_warps=4)).launch(example())
    prepared = launches.prepare(NONE, META)
    monkeypatch.setattr(eager_launch, "_device_and_stream", lambda: (1, 0))
    assert not prepared.launch(example())  # another current device: Triton's path
    assert launches.prepare(lambda meta: (1, ), META) is None
    assert launches.prepare(NONE, dict(META, x=FakeTensor(4096, BF16))) is None


def test_a_prepared_launch_declines_under_another_config(launches, monkeypatch):
    from triton_dist import config

    launches.learn(loaded(), example(), META)
    prepared = launches.prepare(NONE, META)
    assert prepared.current() and prepared.launch(example())
    monkeypatch.setattr(config, "_current", object())  # its keywords (extern_libs) may differ now
    assert not prepared.current() and not prepared.launch(example())


def test_a_prepared_launch_keeps_tritons_path_under_a_launch_hook(launches, monkeypatch):
    launches.learn(loaded(), example(), META)
    prepared = launches.prepare(NONE, META)
    monkeypatch.setattr(triton.knobs.runtime.launch_enter_hook, "calls", [lambda metadata: None])
    assert not prepared.launch(example())


# Bound launches (what a LaunchPlan launches again and again): the fixed arguments classified once
# in C++, a call's tensors in their slots.

# scaled_copy(x, y, n, one, count, scale): x is the call's tensor 0, the rest fixed.
X_SLOT = [(0, 0, None)]


def test_a_bound_launch_classifies_only_the_calls_tensors(launches):
    prepared = launches.prepare(NONE, META)
    bound = prepared.bind(["x", None, 17, 1, 3, 0.5], X_SLOT, 1)
    assert not bound.launch((FakeTensor(4096, BF16), ))  # nothing learnt yet
    launches.learn(loaded(), example(), META)
    assert bound.launch((FakeTensor(4096, BF16), ))
    assert bound.launch((FakeTensor(1 << 40, BF16), ))
    assert not bound.launch((FakeTensor(4104, BF16), ))  # misaligned: no bound variant takes it
    assert not bound.launch((FakeTensor(4096, FP32), ))  # another dtype
    assert not bound.launch((4096, ))  # a raw int is no tensor
    assert not bound.launch((FakeTensor(4096, BF16), FakeTensor(4096, BF16)))  # another count of tensors
    launches.learn(loaded(), (FakeTensor(4104, BF16), None, 17, 1, 3, 0.5), META)
    assert bound.launch((FakeTensor(4104, BF16), ))  # the variant learnt later is bound on the next call


@pytest.mark.parametrize("why,fixed", [
    ("another folded constant", ["x", None, 17, 2, 3, 0.5]),
    ("a value where None was folded", ["x", FakeTensor(4096, BF16), 17, 1, 3, 0.5]),
    ("an i64 where the variant takes i32", ["x", None, 1 << 40, 1, 3, 0.5]),
])
def test_a_variant_whose_rules_the_fixed_arguments_break_is_not_bound(launches, why, fixed):
    launches.learn(loaded(), example(), META)
    prepared = launches.prepare(NONE, META)
    assert prepared.launchers[0].bind(0, 1, 1, fixed, X_SLOT, 1) is None, why
    assert not prepared.bind(fixed, X_SLOT, 1).launch((FakeTensor(4096, BF16), ))


def test_a_bound_launch_declines_where_the_prepared_one_does(launches, monkeypatch):
    from triton_dist import config

    launches.learn(loaded(), example(), META)
    bound = launches.prepare(NONE, META).bind(["x", None, 17, 1, 3, 0.5], X_SLOT, 1)
    assert bound.launch((FakeTensor(4096, BF16), ))
    monkeypatch.setattr(eager_launch, "_device_and_stream", lambda: (1, 0))
    assert not bound.launch((FakeTensor(4096, BF16), ))  # another device
    monkeypatch.setattr(eager_launch, "_device_and_stream", lambda: (0, 0))
    monkeypatch.setattr(triton.knobs.runtime.launch_enter_hook, "calls", [lambda metadata: None])
    assert not bound.launch((FakeTensor(4096, BF16), ))  # a profiler's hook sees every launch
    monkeypatch.setattr(triton.knobs.runtime.launch_enter_hook, "calls", [])
    monkeypatch.setattr(config, "_current", object())
    assert not bound.launch((FakeTensor(4096, BF16), ))  # another Config


def test_a_variant_whose_bind_raises_is_tried_once(launches):
    launches.learn(loaded(), example(), META)
    bound = launches.prepare(NONE, META).bind(["x", None, 17, 1, 3, 0.5], [(6, 0, None)], 1)
    with pytest.raises(Exception, match="outside 6 arguments"):
        bound.launch((FakeTensor(4096, BF16), ))
    assert not bound.launch((FakeTensor(4096, BF16), ))  # nothing bound, nothing raised: Triton's path


def test_a_slot_outside_the_arguments_is_an_error_naming_the_kernel(launches):
    launches.learn(loaded(), example(), META)
    launcher = launches.prepare(NONE, META).launchers[0]
    with pytest.raises(Exception, match="scaled_copy: slot \\(6, 0\\) outside 6 arguments"):
        launcher.bind(0, 1, 1, ["x", None, 17, 1, 3, 0.5], [(6, 0, None)], 1)
    with pytest.raises(Exception, match="or given twice"):
        launcher.bind(0, 1, 1, ["x", None, 17, 1, 3, 0.5], [(0, 0, None), (0, 0, None)], 1)


# Tensor descriptors (Config.eager_tensor_descriptors): the GEMM kernel compiled for sm_90 here.

class HostDtype:
    """A torch dtype as Triton's TensorDescriptor and binder read it (no torch here)."""

    def __init__(self, name: str, itemsize: int):
        self.name, self.itemsize, self.is_floating_point = name, itemsize, True

    def __str__(self) -> str:
        return f"torch.{self.name}"


HOST_BF16, HOST_FP32 = HostDtype("bfloat16", 2), HostDtype("float32", 4)


def FakeDescriptor(base, shape, strides, block_shape, padding="zero"):
    """Triton's host TensorDescriptor of a stand-in tensor."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    return TensorDescriptor(base, shape, strides, block_shape, padding)


def _compiled_gemm():
    from triton_dist.kernels.gemm import dense
    from triton_dist.tools.compile_check import compile_for_hopper

    c = dense.config_params("large")
    meta = dense.kernel_meta("large", False)
    options = {"num_warps": meta.pop("num_warps"), "num_stages": meta.pop("num_stages")}
    # The variant Triton's binder picks for dense.gemm()'s launch: the trailing integer defaults
    # as i32, the None ones folded.
    folded = dict(signals=None, calls=None, out=None, chunk_flags=None, tickets=None, timeline=None)
    signature = {"a_desc": f"tensordesc<bf16[{c['BM']}, {c['BK']}]>", "b_desc": f"tensordesc<bf16[{c['BN']}, {c['BK']}]>",
                 "c_desc": f"tensordesc<bf16[{c['BM']}, {c['BN']}]>", "M": "i32", "N": "i32", "K": "i32", "rank": "i32",
                 "m_per_rank": "i32", "half_elems": "i32", "signal_region": "i32", "chunk_n": "i32"}
    compiled = compile_for_hopper(dense.gemm_kernel, signature, {**meta, **folded}, **options)
    return dense.gemm_kernel, compiled, c, meta, options


def test_tensor_map_rules_are_what_tritons_launcher_encodes(monkeypatch):
    import triton.runtime
    from triton.backends.nvidia import driver as nvidia_driver

    _, compiled, c, _, _ = _compiled_gemm()
    seen = []
    utils = types.SimpleNamespace(fill_tma_descriptor=lambda *a: seen.append(a) or "map")
    monkeypatch.setattr(triton.runtime.driver, "_active", types.SimpleNamespace(utils=utils))
    base = FakeTensor(1 << 20, HOST_BF16)
    for desc, meta in zip([FakeDescriptor(base, [120, 4104], [4112, 1], [c["BM"], c["BK"]]),
                           FakeDescriptor(base, [4104, 4104], [4104, 1], [c["BN"], c["BK"]], "nan"),
                           FakeDescriptor(base, [120, 4104], [4104, 1], [c["BM"], c["BN"]])],
                          compiled.metadata.tensordesc_meta):
        args = nvidia_driver.make_tensordesc_arg(desc, meta)
        _, swizzle, elem_size, elem_type, block_size, shape, strides, padding = seen[-1]
        block, ours_type, ours_size, ours_swizzle, box, fp4 = eager_launch.tensor_map_rule(desc, meta)
        assert (ours_type, ours_size, ours_swizzle, box, fp4) == (elem_type, elem_size, swizzle, list(block_size), False)
        assert block == desc.block_shape and padding == (desc.padding == "nan")
        assert args[1:] == [*desc.shape, *desc.strides]  # then the kernel's own shape and strides
    assert eager_launch.tensor_map_rule(FakeDescriptor(base, [8, 8], [8, 1], [128, 256]),
                                        compiled.metadata.tensordesc_meta[2])[4] == [128, 64]  # box != block


def test_descriptor_kernels_launch_from_cpp_only_when_asked(monkeypatch):
    from triton.runtime.jit import create_function_from_signature

    from triton_dist import config

    kernel, compiled, c, meta, options = _compiled_gemm()
    backend = CUDABackend(GPUTarget("cuda", 90, 32))
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    monkeypatch.setitem(kernel.device_caches, 0, ({}, {}, backend.target, backend, binder))
    monkeypatch.setattr(eager_launch, "_device_and_stream", lambda: (0, 0))
    monkeypatch.setattr(eager_launch, "_torch_c", None)
    base = FakeTensor(1 << 20, HOST_BF16)
    args = (FakeDescriptor(base, [120, 4104], [4104, 1], [c["BM"], c["BK"]]),
            FakeDescriptor(base, [4104, 4104], [4104, 1], [c["BN"], c["BK"]]),
            FakeDescriptor(base, [120, 4104], [4104, 1], [c["BM"], c["BN"]]), 120, 4104, 4104, None, None, 0, 1)
    kwargs = {**meta, **options}
    variant = types.SimpleNamespace(name=compiled.name, function=0x1, metadata=compiled.metadata)

    monkeypatch.setattr(config, "_current", config.Config(eager_tensor_descriptors=False))
    launches = eager_launch.EagerLaunches(kernel)
    launches.learn(variant, args, kwargs)
    assert launches.variants() == 0  # switched off: Triton's launcher encodes them

    monkeypatch.setattr(config, "_current", config.Config())  # on by default
    launches = eager_launch.EagerLaunches(kernel)
    launches.learn(variant, args, kwargs)
    assert launches.variants() == 1
    (launcher, ), = launches._launchers.values()
    ptx = compiled.asm["ptx"]
    entry = ptx[ptx.index(".entry"):ptx.index(")", ptx.index(".entry"))]
    assert launcher.kernel_parameters == entry.count(".param")  # its two scratch pointers included
    assert launches.launch(NONE, args, kwargs)  # every check, no launch, no driver
    other_block = (FakeDescriptor(base, [120, 4104], [4104, 1], [64, c["BK"]]), *args[1:])
    assert not launches.launch(NONE, other_block, kwargs)
    other_dtype = (FakeDescriptor(FakeTensor(1 << 20, HOST_FP32), [120, 4104], [4104, 1], [c["BM"], c["BK"]]),
                   *args[1:])
    assert not launches.launch(NONE, other_dtype, kwargs)
    misaligned = FakeDescriptor(FakeTensor(1 << 20, HOST_BF16), [120, 4104], [4104, 1], [c["BM"], c["BK"]])
    misaligned.base = FakeTensor((1 << 20) + 8, HOST_BF16)  # TensorDescriptor itself refuses one
    assert not launches.launch(NONE, (misaligned, *args[1:]), kwargs)
