"""The prebuild tool (triton_dist.tools.prebuild) compiles the one-shot AllReduce for sm_90 without
a GPU and writes the cubin, the PTX and a manifest whose parameters are the kernel's, with the rules
the eager launch path derives; the C++ example passes exactly those arguments. A change to the
kernel's parameters fails here before it fails on a GPU."""

import pathlib
import re

import pytest
import triton.language as tl

from triton_dist.kernels.collectives.allreduce_kernels import all_reduce_one_shot_kernel
from triton_dist.tools import prebuild

_ROOT = pathlib.Path(__file__).resolve().parents[2]

# What csrc/examples/all_reduce_example.cc passes, in order: change both together.
_PARAMS = ["param x *fp32 D", "param out *fp32 D", "param stage *fp32 D", "param signals *u64 D",
           "param n i32 -", "param calls *i64 D", "param half_tiles i32 -", "param max_programs i32 -"]


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    out = tmp_path_factory.mktemp("prebuilt")
    paths = prebuild.prebuild("all_reduce_one_shot", 2, "float32", str(out))
    return out, paths


def _manifest(out) -> list[str]:
    return (out / "all_reduce_one_shot.manifest").read_text().splitlines()


def test_the_three_files_are_written(written):
    out, paths = written
    assert [pathlib.Path(p).name for p in paths] == [f"all_reduce_one_shot.{s}" for s in ("cubin", "ptx", "manifest")]
    cubin = (out / "all_reduce_one_shot.cubin").read_bytes()
    assert cubin[:4] == b"\x7fELF" and b"all_reduce_one_shot_kernel" in cubin
    ptx = (out / "all_reduce_one_shot.ptx").read_text()
    assert ".target sm_90" in ptx and ".entry all_reduce_one_shot_kernel(" in ptx
    # The globals PrebuiltKernel's module set-up fills (Runtime::initialize_module reads the PTX).
    assert "nvshmemi_device_state_d" in ptx and "triton_dist_wait_report" in ptx


def test_the_manifest_gives_the_launch_and_the_kernels_parameters(written):
    lines = [line for line in _manifest(written[0]) if not line.startswith("#")]
    assert lines[:6] == ["tdist-prebuilt 1", "symbol all_reduce_one_shot_kernel", "threads 256", "shared 8",
                         "cooperative 0", "pdl 0"]
    assert lines[6:8] == ["constexpr WORLD 2", "constexpr BLOCK 2048"]
    assert lines[8:] == ["params 8"] + _PARAMS
    runtime = [p.name for p in all_reduce_one_shot_kernel.fn.params if not p.is_constexpr]
    assert [line.split()[1] for line in lines[9:]] == runtime


def test_the_manifest_says_what_it_was_compiled_under(written):
    comments = "\n".join(line for line in _manifest(written[0]) if line.startswith("#"))
    assert "allreduce_kernels.all_reduce_one_shot_kernel" in comments
    assert re.search(r"wait_timeout_ns=\d+ debug_barriers=[01] local_world_size=\d+", comments)


def test_the_cpp_example_passes_one_argument_of_each_parameters_kind():
    source = (_ROOT / "csrc/examples/all_reduce_example.cc").read_text()
    call = source[source.index("all_reduce.launch("):]
    call = call[:call.index(");")]
    kinds = re.findall(r"tdist::(pointer|i32|i64|f32|none)_arg\(", call)
    expected = ["pointer" if p.split()[2].startswith("*") else p.split()[2] for p in _PARAMS]
    assert kinds == expected


def test_the_rules_are_the_eager_launch_paths():
    """The manifest's rules are eager_launch.argument_rules of the binder's specialisation, as a
    Python launch with 16-byte aligned tensors of the same dtype would learn them."""
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import CUDABackend
    from triton.runtime.jit import create_function_from_signature

    from triton_dist import eager_launch

    kernel, args, kwargs = prebuild.VARIANTS["all_reduce_one_shot"](2, tl.float32)
    fn = kernel.fn
    binder = create_function_from_signature(fn.signature, fn.params, CUDABackend(GPUTarget("cuda", 90, 32)))
    _, specialization, _ = binder(*args, **kernel._options(dict(kwargs)))
    runtime = [p for p in fn.params if not p.is_constexpr]
    named = tuple(kwargs[p.name] for p in runtime[len(args):])  # after the constexprs: given by name
    rules = eager_launch.argument_rules(runtime, specialization, args + named)
    assert rules.types == [p.split()[2] for p in _PARAMS]
    assert rules.divisible == [p.split()[3] == "D" for p in _PARAMS]


@pytest.mark.parametrize("argv,message", [
    (["no_such_kernel", "--out", "x", "--world", "2"], "no variant named 'no_such_kernel'; known: all_reduce_one_shot"),
    (["--out", "x", "--world", "0"], "the world size must be positive"),
])
def test_bad_requests_say_what_to_pass(argv, message, capsys):
    assert prebuild.main(argv) == 2
    assert message in capsys.readouterr().err
