"""The C++ launch path (triton_dist.eager_launch) on the GPU: results equal torch's over hundreds of
launches whose arguments move between variants (alignment, sizes past 32 bits' reach of
specialisation, dtypes, the folded constant 1), the path is really taken, CUDA graphs capture it,
and the host time of both paths is printed (not asserted). Any world size: each rank on its own."""

import time

import pytest
import torch
import triton.language as tl

import triton_dist as tdist
import triton_dist.language as dl
from conftest import all_ranks_agree
from triton_dist.kernels.common import call_counter


@tdist.jit
def scale_add_rank(x, out, n, scale, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    v = tl.load(x + offs, mask=mask).to(tl.float32) * scale + dl.rank()
    tl.store(out + offs, v.to(out.dtype.element_ty), mask=mask)


BLOCK = 256


def launch(x, out, scale):
    n = x.numel()
    return scale_add_rank[(triton_cdiv(n, BLOCK), )](x, out, n, scale, BLOCK=BLOCK, num_warps=4)


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


def test_results_match_torch_across_variants_and_the_cpp_path_is_taken():
    me = tdist.rank()
    g = torch.Generator(device="cuda").manual_seed(1234 + me)
    base = torch.randn(1 << 16, device="cuda", generator=g)
    sizes = torch.randint(1, 1 << 15, (300, ), generator=torch.Generator().manual_seed(me)).tolist()
    sizes[:6] = [1, 16, 17, 256, 4096, 1 << 15]
    bad, through_cpp = [], 0
    for i, n in enumerate(sizes):
        dtype = (torch.float32, torch.bfloat16, torch.float16)[i % 3]
        offset = (0, 1, 8)[i % 5 % 3]  # 16-byte aligned or not, for every dtype
        src = base.to(dtype)[offset:offset + n]
        out = torch.full((n + offset, ), float("nan"), device="cuda", dtype=dtype)[offset:]
        scale = (0.25, 0.5, 2.0, 4.0)[i % 4]  # exact products: an FMA rounds like torch's mul then add
        through_cpp += launch(src, out, scale) is None
        want = (src.float() * scale + me).to(dtype)
        if not torch.equal(out, want):
            bad.append((i, n, dtype, offset))
    torch.cuda.synchronize()
    all_ranks_agree(not bad, f"rank {me}: {len(bad)} of {len(sizes)} launches differ from torch, first {bad[:3]}")
    # Launches of a learnt variant go through C++ (None returned) and are right too.
    src = base[:4097]
    out = torch.empty_like(src)
    launch(src, out, 4.0)
    again = launch(src, out, 4.0)
    ok = again is None and torch.equal(out, src * 4.0 + me)
    all_ranks_agree(ok and scale_add_rank.eager.variants() >= 1,
                    f"rank {me}: a repeated launch returned {again!r} (None: C++), {through_cpp} of {len(sizes)} "
                    f"from C++, {scale_add_rank.eager.variants()} variants learnt")


@tdist.jit(do_not_specialize=["scale"])
def scale_bias_after_constexpr(x, out, n, BLOCK: tl.constexpr, scale=1.0, bias=None):
    """Runtime parameters after a constexpr, which launches give by name (as the GEMMs' epilogue
    operands are)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    v = tl.load(x + offs, mask=mask).to(tl.float32) * scale
    if bias is not None:
        v += tl.load(bias + offs, mask=mask).to(tl.float32)
    tl.store(out + offs, v.to(out.dtype.element_ty), mask=mask)


def test_runtime_arguments_by_name_take_the_cpp_path():
    """300 launches passing ``scale`` and ``bias`` by name (or leaving them out), alternating the
    variants of ``bias`` None and a tensor: results equal torch's, and repeated launches of each
    variant come back from C++ (None)."""
    from triton_dist import config

    if not config.get().eager_tensor_descriptors:
        pytest.skip("runtime arguments by name take the C++ path with Config.eager_tensor_descriptors only")
    me = tdist.rank()
    g = torch.Generator(device="cuda").manual_seed(4321 + me)
    x = torch.randn(5000, device="cuda", generator=g)
    bias = torch.randn(5000, device="cuda", generator=g)
    bad, through_cpp = [], 0
    for i in range(300):
        out = torch.full_like(x, float("nan"))
        scale = (0.5, 2.0, 4.0)[i % 3]
        kwargs = dict(BLOCK=BLOCK, num_warps=4, scale=scale)
        if i % 2:
            kwargs["bias"] = bias
        if i % 7 == 0 and scale == 2.0 and "bias" not in kwargs:
            del kwargs["scale"]  # the default, 1.0
            scale = 1.0
        got = scale_bias_after_constexpr[(triton_cdiv(5000, BLOCK), )](x, out, 5000, **kwargs)
        through_cpp += got is None
        want = x * scale + (bias if i % 2 else 0)
        if not torch.allclose(out, want, rtol=1e-6, atol=1e-6):
            bad.append(i)
    torch.cuda.synchronize()
    all_ranks_agree(not bad and through_cpp >= 280,
                    f"rank {me}: wrong at launches {bad[:5]}; {through_cpp} of 300 from C++, "
                    f"{scale_bias_after_constexpr.eager.variants()} variants learnt")


def test_cuda_graphs_capture_cpp_launches_and_replays_bump_counters():
    me = tdist.rank()
    x = torch.randn(5000, device="cuda", generator=torch.Generator(device="cuda").manual_seed(77 + me))
    out = torch.empty_like(x)
    counter = torch.zeros(1, dtype=torch.int64, device="cuda")
    launch(x, out, 2.0)  # learn outside capture (Triton's path may compile)
    call_counter.bump(counter)
    assert launch(x, out, 2.0) is None
    torch.cuda.synchronize()
    out.fill_(float("nan"))
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph, stream=stream):
            launch(x, out, 2.0)
            call_counter.bump(counter)
    replays = 7
    for _ in range(replays):
        graph.replay()
    torch.cuda.synchronize()
    # One bump before capture, none during it (captured, not run), one per replay.
    ok = torch.equal(out, x * 2.0 + me) and int(counter) == 1 + replays
    all_ranks_agree(ok, f"rank {me}: graph replay wrong (counter {int(counter)}, expected {1 + replays})")


def test_host_time_of_both_paths(capsys):
    """Printed, not asserted: µs of host time per launch, C++ path against Triton's."""
    x = torch.randn(4096, device="cuda")
    out = torch.empty_like(x)
    launch(x, out, 1.0)
    calls = 2000

    def per_call(fn) -> float:
        torch.cuda.synchronize()
        torch.cuda._sleep(200_000_000)  # keep the GPU busy: time the issuing only
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        elapsed = (time.perf_counter() - start) * 1e6 / calls
        torch.cuda.synchronize()
        return elapsed

    cpp = per_call(lambda: launch(x, out, 1.0))
    triton_path = per_call(lambda: scale_add_rank.fn[(16, )](x, out, 4096, 1.0, BLOCK=BLOCK, num_warps=4,
                                                             extern_libs=tdist.distributed_jit.extern_libs()))
    counter = torch.zeros(1, dtype=torch.int64, device="cuda")
    bump = per_call(lambda: call_counter.bump(counter))
    torch_add = per_call(lambda: counter.add_(1))
    with capsys.disabled():
        print(f"\n[eager launch] rank {tdist.rank()}: host us per launch: C++ path {cpp:.1f}, Triton's "
              f"{triton_path:.1f}; counter bump {bump:.1f} against torch add_ {torch_add:.1f}")
    all_ranks_agree(cpp > 0 and triton_path > 0, "timing ran")


@pytest.mark.parametrize("bad", ["string", "too_few"])
def test_arguments_no_variant_takes_still_reach_triton(bad):
    """Arguments the C++ path refuses go to Triton, which raises its own error for bad ones."""
    x = torch.randn(64, device="cuda")
    out = torch.empty_like(x)
    launch(x, out, 1.0)
    with pytest.raises(Exception):
        if bad == "string":
            scale_add_rank[(1, )](x, out, "64", 1.0, BLOCK=BLOCK, num_warps=4)
        else:
            scale_add_rank[(1, )](x, out, 64, BLOCK=BLOCK, num_warps=4)
    torch.cuda.synchronize()
