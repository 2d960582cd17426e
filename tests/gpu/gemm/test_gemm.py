"""The persistent GEMM, the split-K GEMM and the wave-tail GEMM against torch (fp32 reference;
split-K and wave-tail: the same bits over back-to-back calls and in a CUDA graph), and
triton_dist.ops.ag_gemm (every producer; under TRITON_DIST_LOCAL_WORLD_SIZE "sm_2d" crosses
declared nodes) against torch.distributed.all_gather_into_tensor + matmul: back-to-back calls
with fresh inputs (a tile read before its rows landed, or from a previous call, shows up as a
large error or a NaN from the poisoned output), CUDA graph replay, bad inputs."""

import pytest
import torch
import torch.distributed as dist

import triton_dist as tdist
from conftest import (all_ranks_agree, check_repeated_calls, graph_replay_errors, raises_everywhere, rank_randn,
                      tolerance_ratio)
from triton_dist import host_collectives, ops
from triton_dist.kernels import AllGatherGemmContext
from triton_dist.kernels.gemm import dense as gemm_module
from triton_dist.kernels.gemm import split_k as split_k_module
from triton_dist.kernels.gemm import wave_tail
from triton_dist.kernels.gemm.dense import gemm

_TOL = 1.0  # tolerance_ratio: every element within its own bound (conftest)


def _reference(a_shard, b):
    return host_collectives.all_gather(a_shard).float() @ b.float().T


def _check_same_bits_every_call(what, a, b, run, calls):
    """``run(out)`` ``calls`` times back to back, each into its own NaN-poisoned ``out``: every call
    the same bits as the first (a sum in a fixed order), and the first right (a ticket a call left
    non-zero would leave a later call's tile unsummed, still NaN)."""
    outs = [torch.full((a.shape[0], b.shape[0]), float("nan"), device="cuda", dtype=a.dtype) for _ in range(calls)]
    for out in outs:
        run(out)
    torch.cuda.synchronize()
    differ = [i for i, out in enumerate(outs) if not torch.equal(out, outs[0])]
    err = tolerance_ratio(outs[0], a.float() @ b.float().T)
    all_ranks_agree(not differ and err < _TOL, f"{what}: calls whose bits differ from the first {differ}, "
                                                f"error/tolerance {err}")


def _check_graph_replays(what, a, b, run, *, captured_calls, replays, seed):
    """``run(out)`` once uncaptured (compiles, makes the device's ticket counters), then
    ``captured_calls`` times in a CUDA graph; each of ``replays`` replays with a new A (seed
    ``seed + replay``) into a NaN-poisoned ``out`` must be right and the same bits as an eager
    ``run`` of the same inputs."""
    out = torch.empty((a.shape[0], b.shape[0]), device="cuda", dtype=a.dtype)
    run(out)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        for _ in range(captured_calls):
            run(out)
    errors, same = [], []
    for replay in range(replays):
        a.copy_(rank_randn(tuple(a.shape), a.dtype, seed + replay))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        errors.append(tolerance_ratio(out, a.float() @ b.float().T))
        eager = torch.empty_like(out)
        run(eager)
        same.append(torch.equal(out, eager))
    all_ranks_agree(all(e < _TOL for e in errors) and all(same),
                    f"{what} graph replays: error/tolerance {errors}, same bits as eager {same}")


def _check_gemm(m, n, k, dtype, config, seed):
    """``gemm`` into a NaN-poisoned ``out`` against the fp32 reference, on every rank."""
    a, b = rank_randn((m, k), dtype, seed), rank_randn((n, k), dtype, seed + 1)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
    got = gemm(a, b, out=out, config=config)
    torch.cuda.synchronize()
    err = tolerance_ratio(got, a.float() @ b.float().T)
    chosen = config or gemm_module.pick_gemm_config(m, n, k, gemm_module.num_sms())
    all_ranks_agree(got is out and err < _TOL, f"gemm {m}x{n}x{k} {dtype} config {chosen}: error/tolerance {err}")


@pytest.mark.parametrize("dtype,config", [(torch.bfloat16, None), (torch.bfloat16, "large"), (torch.float16, None)],
                         ids=["bf16", "bf16-large", "fp16"])
def test_gemm_matches_torch(dtype, config):
    _check_gemm(1000, 512, 768, dtype, config, seed=1)


@pytest.mark.parametrize("m,n,k", [(1, 4096, 776), (40, 520, 1032), (64, 8192, 512), (7, 24, 136),
                                   (16, 16384, 512)])
@pytest.mark.parametrize("skinny", [False, True], ids=["default", "skinny"])
def test_small_m_gemm_matches_torch(m, n, k, skinny):
    """Decode-sized M: the default (split-K) and the skinny configs GEMM+AllReduce takes (64-row
    tiles; rows past M, columns past N and the K tail are outside the TMA boxes)."""
    config = gemm_module.pick_skinny_config(m, n, gemm_module.num_sms()) if skinny else None
    _check_gemm(m, n, k, torch.bfloat16, config, seed=5)


_SPLIT_K_CASES = [(m, c) for c, bm in split_k_module.CONFIG_NAMES.items() for m in (1, 7, 16, 64, 128) if m <= bm]


@pytest.mark.parametrize("m,config", _SPLIT_K_CASES)
@pytest.mark.parametrize("n,k", [(520, 8248), (1032, 200)], ids=["slices", "one_slice"])
def test_split_k_gemm_matches_torch(m, config, n, k):
    """Every split-K config at every M it holds; N and K odd multiples of 8 (a masked tail of
    columns, K steps that do not divide into equal slices): 520 x 8248 (5 n-tiles) is cut into
    several slices at 8 to 132 SMs, MPS shares included (the tickets and the sum; 2056 wide, 17
    n-tiles, took one slice at 17-25 SMs), 200 deep into one (stored straight into ``out``)."""
    slices = split_k_module.pick_split_k(m, n, k, gemm_module.num_sms(), config)
    all_ranks_agree((slices > 1) == (k > 1000), f"split-K {m}x{n}x{k} {config}: {slices} slices")
    _check_gemm(m, n, k, torch.bfloat16, config, seed=11 + m)


@pytest.mark.parametrize("slices,programs", [(1, 7), (2, 132), (3, 7), (5, 132), (8, 7), (8, 132)])
def test_split_k_gemm_any_slice_count(slices, programs):
    """Slice counts other than the rule's (unequal slices of 65 K steps), and a grid of 7 programs
    that walks several (slice, n-tile) pairs each."""
    m, n, k = 7, 2056, 8248
    a, b = rank_randn((m, k), torch.bfloat16, 21), rank_randn((n, k), torch.bfloat16, 22)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    split_k_module.gemm_split_k(a, b, out, "split_k_m16", min(programs, gemm_module.num_sms()), split_k=slices)
    torch.cuda.synchronize()
    err = tolerance_ratio(out, a.float() @ b.float().T)
    all_ranks_agree(err < _TOL, f"split-K {slices} slices on {programs} programs: error/tolerance {err}")


@pytest.mark.parametrize("config", list(split_k_module.CONFIG_NAMES))
def test_split_k_gemm_is_deterministic(config):
    """200 back-to-back calls on the same inputs, each into its own NaN-poisoned output, give the
    same bits (the partials are summed in slice order, whichever program finishes last) and are
    right: a ticket not reset by a call would leave a later call's ``out`` poisoned."""
    m, n, k = min(split_k_module.CONFIG_NAMES[config], 16), 520, 8248
    a, b = rank_randn((m, k), torch.bfloat16, 31), rank_randn((n, k), torch.bfloat16, 32)
    _check_same_bits_every_call(f"split-K {config}", a, b, lambda out: gemm(a, b, out=out, config=config), 200)


def test_split_k_gemm_cuda_graph_replay():
    """Captured on the capture stream (its own ticket counters, handed out without GPU work),
    replayed with new inputs: right, and the same bits as an eager call."""
    m, n, k, config = 16, 520, 8248, "split_k_m16"
    a = rank_randn((m, k), torch.bfloat16, 41)
    b = rank_randn((n, k), torch.bfloat16, 42)
    _check_graph_replays("split-K", a, b, lambda out: gemm(a, b, out=out, config=config), captured_calls=2,
                         replays=3, seed=50)


# The default rule's split-K pick (1 row), and its wave-tail pick on 132 or 78 SMs ("small" 4 x 81
# tiles, a last wave cut in 2 slices).
_DEFAULT_SLICED = [(1, 520, 8248), (512, 10248, 1032)]


@pytest.mark.parametrize("m,n,k", _DEFAULT_SLICED)
def test_default_gemm_captured_before_any_uncaptured_call(monkeypatch, m, n, k):
    """A user's first gemm inside a capture where the default rule slices K: no ticket counters
    yet (as in a fresh process), so the call runs in one slice instead of zeroing counters in the
    graph; right on replay."""
    monkeypatch.setattr(split_k_module, "_slabs", {})
    monkeypatch.setattr(split_k_module, "_ranges", {})
    a, b = rank_randn((m, k), torch.bfloat16, 71), rank_randn((n, k), torch.bfloat16, 72)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    gemm(a, b, out=out)  # compiles every variant outside the capture; leaves no counters behind:
    picked = gemm_module.pick_gemm_config(m, n, k, gemm_module.num_sms())
    if picked in wave_tail.CONFIG_NAMES:  # one slice inside the capture is its base config's kernel
        gemm(a, b, out=out, config=wave_tail.CONFIG_NAMES[picked])
    split_k_module._slabs.clear()
    split_k_module._ranges.clear()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        gemm(a, b, out=out)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    err = tolerance_ratio(out, a.float() @ b.float().T)
    all_ranks_agree(err < _TOL and not split_k_module._slabs, f"first gemm in a capture: error/tolerance {err}")


def test_default_gemm_takes_the_wave_tail_where_it_cuts():
    """Above 128 rows the default rule runs the wave-tail variant where that cuts the last wave:
    right with a new output and into a NaN-poisoned one that is not 16-byte aligned (computed
    aside and copied), twice (the tickets left zero)."""
    m, n, k = _DEFAULT_SLICED[1]
    picked = gemm_module.pick_gemm_config(m, n, k, gemm_module.num_sms())
    if picked not in wave_tail.CONFIG_NAMES:
        pytest.skip(f"{gemm_module.num_sms()} SMs: the rule picks {picked!r} here")
    a, b = rank_randn((m, k), torch.bfloat16, 75), rank_randn((n, k), torch.bfloat16, 76)
    want = a.float() @ b.float().T
    errors = [tolerance_ratio(gemm(a, b), want)]
    for _ in range(2):
        storage = torch.full((m * n + 1,), float("nan"), device="cuda", dtype=torch.bfloat16)
        out = storage[1:].view(m, n)  # 2 bytes past an aligned base
        gemm(a, b, out=out)
        errors.append(tolerance_ratio(out, want))
    torch.cuda.synchronize()
    all_ranks_agree(max(errors) < _TOL, f"default gemm ({picked}) {m}x{n}x{k}: error/tolerance {errors}")


@pytest.mark.parametrize("m,n,k", [(16, 1032, 2048), _DEFAULT_SLICED[1], (256, 1024, 520)],
                         ids=["split_k", "wave_tail_or_base", "persistent"])
def test_repeated_gemm_calls_launch_their_plan_from_cpp(m, n, k, replays):
    """After a shape's first call, gemm's calls are replayed (triton_dist.eager_calls: all but the
    first with a given out) and launch the shape's plan through its bound C++ launch
    (kernels/gemm/plain_plan.py), never Triton's path again (``replays[1]``: plan launches off
    the bound launch): 60 calls, fresh inputs, a new out and a given NaN-poisoned one in turn,
    every element checked."""
    b = rank_randn((n, k), torch.bfloat16, 90)
    gemm(rank_randn((m, k), torch.bfloat16, 91), b)  # the shape's first call, through Triton
    torch.cuda.synchronize()
    replays[1] = 0
    bad = []
    for i in range(60):
        a = rank_randn((m, k), torch.bfloat16, 1000 + i)
        out = None if i % 2 == 0 else torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        got = gemm(a, b, out=out)
        if (out is not None and got is not out) or not tolerance_ratio(got, a.float() @ b.float().T) < _TOL:
            bad.append(i)
    from_cpp = tdist.config.get().eager_tensor_descriptors
    all_ranks_agree(not bad and replays[0] == 59 and (replays[1] == 0 or not from_cpp),
                    f"gemm {m}x{n}x{k}: wrong at calls {bad[:10]}; {replays[0]} of 60 calls replayed (expected 59), "
                    f"{replays[1]} launches off the bound launch")


def test_split_k_gemm_refuses_more_rows_than_its_block():
    a, b = rank_randn((17, 256), torch.bfloat16, 61), rank_randn((64, 256), torch.bfloat16, 62)
    raises_everywhere(lambda: gemm(a, b, config="split_k_m16"), ValueError, r"takes M <= 16 rows, got M = 17")
    raises_everywhere(lambda: gemm(rank_randn((129, 256), torch.bfloat16, 63), b, config="split_k_m128"), ValueError,
                      "split-K takes M <= 128")
    got = gemm(a, b, config="split_k_m32")
    torch.cuda.synchronize()
    err = tolerance_ratio(got, a.float() @ b.float().T)
    all_ranks_agree(err < _TOL, f"split_k_m32 after the refusals: error/tolerance {err}")


# M x N x K (N and K odd multiples of 8: masked column tiles, a K tail in the last slice) and the
# tail's slices on 132 SMs: "large" 456 tiles, a last wave of 60 in 2 slices, and 80 tiles in 1;
# "small" 160 tiles, a last wave of 28 in 4 slices (33 K steps: 8, 8, 8, 9), and 904 in 1; 264
# "large" tiles are two whole waves.
_WAVE_TAIL_SHAPES = [(1024, 14344, 1032), (1000, 2552, 2056), (1000, 8200, 1032)]
_WAVE_TAIL_CUT = {"large_tail_split": (1024, 14344, 1032), "small_tail_split": (1000, 2552, 2056)}


@pytest.mark.parametrize("config", list(wave_tail.CONFIG_NAMES))
@pytest.mark.parametrize("m,n,k", _WAVE_TAIL_SHAPES)
def test_wave_tail_gemm_matches_torch(m, n, k, config):
    """Each wave-tail config through ``gemm`` (this device's SMs), and on 132 programs (the
    slices of an H100's waves, whatever this device has), into NaN-poisoned outputs."""
    _check_gemm(m, n, k, torch.bfloat16, config, seed=81)
    a, b = rank_randn((m, k), torch.bfloat16, 82), rank_randn((n, k), torch.bfloat16, 83)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    wave_tail.gemm_wave_tail(a, b, out, config, 132)
    torch.cuda.synchronize()
    err = tolerance_ratio(out, a.float() @ b.float().T)
    slices = wave_tail.tail_split_for(m, n, k, config, 132)
    all_ranks_agree(err < _TOL, f"wave-tail {config} {m}x{n}x{k} on 132 programs ({slices} slices): "
                                f"error/tolerance {err}")


@pytest.mark.parametrize("config", list(wave_tail.CONFIG_NAMES))
def test_wave_tail_gemm_is_deterministic(config):
    """100 back-to-back calls whose last wave is cut (132 programs), each into its own NaN-poisoned
    output: the same bits (partials summed in slice order) and right (a ticket left non-zero by
    a call would leave a later call's tile unsummed)."""
    m, n, k = _WAVE_TAIL_CUT[config]
    assert wave_tail.tail_split_for(m, n, k, config, 132) > 1
    a, b = rank_randn((m, k), torch.bfloat16, 91), rank_randn((n, k), torch.bfloat16, 92)
    _check_same_bits_every_call(f"wave-tail {config}", a, b,
                                lambda out: wave_tail.gemm_wave_tail(a, b, out, config, 132), 100)


def test_wave_tail_gemm_cuda_graph_replay():
    """Captured after an uncaptured call (which makes the device's ticket counters; the capture
    stream's are handed out without GPU work), replayed with new inputs: right, the same bits as
    an eager call."""
    config = "large_tail_split"
    m, n, k = _WAVE_TAIL_CUT[config]
    a, b = rank_randn((m, k), torch.bfloat16, 93), rank_randn((n, k), torch.bfloat16, 94)
    _check_graph_replays("wave-tail", a, b, lambda out: wave_tail.gemm_wave_tail(a, b, out, config, 132),
                         captured_calls=1, replays=2, seed=95)


@pytest.mark.parametrize("producer", ["ce_push", "sm_push", "sm_2d", "sm_push_inline"])
@pytest.mark.parametrize("m,n,calls", [(1000, 1024, 500), (1024, 1024, 500), (2048, 4096, 100)])
def test_ag_gemm_back_to_back(m, n, calls, producer):
    k, dtype = 1024, torch.bfloat16
    # The op's cached context of each producer ("auto", its choice by topology, in test_ag_gemm_new_tensor).
    method = producer
    b = rank_randn((n, k), dtype, 100 + m)  # a different weight shard on every rank, as in tensor parallelism
    inputs = [rank_randn((m, k), dtype, 1000 * m + i) for i in range(calls)]
    checked = [i for i in range(calls) if i % 10 == 0 or i == calls - 1]
    outs = {i: torch.full((dist.get_world_size() * m, n), float("nan"), device="cuda", dtype=dtype) for i in checked}
    scratch = torch.empty((dist.get_world_size() * m, n), device="cuda", dtype=dtype)
    tdist.barrier()
    for i in range(calls):  # back to back: no synchronisation between calls
        got = ops.ag_gemm(inputs[i], b, out=outs.get(i, scratch), method=method)
        assert got is outs.get(i, scratch)
    torch.cuda.synchronize()
    errors = {i: tolerance_ratio(outs[i], _reference(inputs[i], b)) for i in checked}
    bad = {i: e for i, e in errors.items() if not e < _TOL}
    all_ranks_agree(not bad, f"ag_gemm {producer} m={m} n={n} k={k}: calls with wrong results (call: error/tolerance) {bad}")


def test_ag_gemm_new_tensor():
    # m = 40 < BM: one tile holds rows of every rank (a wait on several signals). bf16 only: an
    # fp16 context would compile two more consumer variants (the plain GEMM covers fp16).
    m, n, k = 40, 256, 512
    a, b = rank_randn((m, k), torch.bfloat16, 7), rank_randn((n, k), torch.bfloat16, 8)
    got = ops.ag_gemm(a, b)
    torch.cuda.synchronize()
    ok = tuple(got.shape) == (dist.get_world_size() * m, n) and got.dtype == torch.bfloat16
    err = tolerance_ratio(got, _reference(a, b))
    all_ranks_agree(ok and err < _TOL, f"ag_gemm new tensor: shape {tuple(got.shape)}, error/tolerance {err}")


def test_ag_gemm_auto_eager_then_captured_on_the_eager_calls_context():
    """``method="auto"`` at a small shape takes ``"sm_push_inline"`` for an eager call
    (kernels/gemm/policy.py; ``"sm_2d"`` across nodes); a capture that follows finds no context of
    its own producer (``"ce_push"``) and can make none, so it runs on the eager call's: every
    replay right, no context made in the capture."""
    world, dtype = dist.get_world_size(), torch.bfloat16
    m, n, k = 64, 256, 512
    ops.clear_contexts()
    b, a = rank_randn((n, k), dtype, 61), rank_randn((m, k), dtype, 62)
    out = torch.full((world * m, n), float("nan"), device="cuda", dtype=dtype)
    ops.ag_gemm(a, b, out=out)
    torch.cuda.synchronize()
    made = sorted(key[2][2] for key in ops._CONTEXTS if key[0] == "ag_gemm")
    expected = "sm_push_inline" if tdist.num_nodes() == 1 else "sm_2d"
    eager_err = tolerance_ratio(out, _reference(a, b))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        captured = ops.ag_gemm(a, b)  # out=None: not the recorded call, so the full path runs in the capture
    errors = graph_replay_errors(graph, a, captured, lambda a: _reference(a, b), replays=20, seed=70)
    after = sorted(key[2][2] for key in ops._CONTEXTS if key[0] == "ag_gemm")
    all_ranks_agree(made == [expected] and after == made and eager_err < _TOL and all(e < _TOL for e in errors),
                    f"ag_gemm auto: contexts {made} after the eager call, {after} after the capture (expected "
                    f"[{expected!r}]); error/tolerance eager {eager_err}, replays {errors}")
    tdist.barrier()


def test_ag_gemm_bad_inputs():
    world = dist.get_world_size()
    a = rank_randn((64, 128), torch.bfloat16, 9)
    b = rank_randn((64, 128), torch.bfloat16, 10)
    raises_everywhere(lambda: ops.ag_gemm(a.float(), b.float()), TypeError, "bfloat16")
    raises_everywhere(lambda: ops.ag_gemm(a, b.half()), TypeError, "b is torch.float16")
    raises_everywhere(lambda: ops.ag_gemm(a, b[:, :64].contiguous()), ValueError, "K differs")
    raises_everywhere(lambda: ops.ag_gemm(a, b[:60]), ValueError, "multiple of 8")
    raises_everywhere(lambda: ops.ag_gemm(a[:, :120], b[:, :120]), ValueError, "contiguous")
    raises_everywhere(lambda: ops.ag_gemm(a.cpu(), b), ValueError, "cuda|CUDA")
    raises_everywhere(lambda: ops.ag_gemm(a.view(-1), b), ValueError, "2-D")
    wrong_rows = torch.empty((world * 64 + 1, 64), device="cuda", dtype=torch.bfloat16)  # wrong at any world size
    raises_everywhere(lambda: ops.ag_gemm(a, b, out=wrong_rows), ValueError, "out")
    small = AllGatherGemmContext(32, 128, torch.bfloat16)
    raises_everywhere(lambda: ops.ag_gemm(a, b, context=small), ValueError, "max_m_per_rank>=64")
    raises_everywhere(lambda: ops.ag_gemm(a, b, context=object()), TypeError, "AllGatherGemmContext")
    raises_everywhere(lambda: ops.ag_gemm(a, b, method="ring"), ValueError, "method must be one of")
    raises_everywhere(lambda: ops.ag_gemm(a[:32], b, method="sm_push", context=small), ValueError,
                      "the context's producer is 'ce_push'")
    for programs in (0, gemm_module.num_sms(), 2.0, True):
        raises_everywhere(lambda: AllGatherGemmContext(64, 128, torch.bfloat16, method="sm_push",
                                                       push_programs=programs), ValueError, "push_programs")
    # The op still works after the errors.
    got = ops.ag_gemm(a[:32], b, context=small)
    torch.cuda.synchronize()
    err = tolerance_ratio(got, _reference(a[:32].contiguous(), b))
    all_ranks_agree(tuple(got.shape) == (world * 32, 64) and err < _TOL, f"ag_gemm after errors: {err}")


def test_ag_gemm_inline_calls_replay_their_launches(replays):
    """200 ``method="sm_push_inline"`` calls of one shape, fresh seeded inputs, a new out and a
    given poisoned out in turn: all but the first call of each form are replayed
    (triton_dist.eager_calls: the one GEMM that pushes first, again), and every element is right."""
    from triton_dist import eager_calls

    m, n, k = 40, 256, 512
    b = rank_randn((n, k), torch.bfloat16, 61)

    def draw(i):
        a = rank_randn((m, k), torch.bfloat16, 6000 + i)
        return (a, b), _reference(a, b)

    eager_calls.clear()
    def call(a, b, out):
        return ops.ag_gemm(a, b, out=out, method="sm_push_inline")

    check_repeated_calls("ag_gemm sm_push_inline", call, draw, (dist.get_world_size() * m, n), torch.bfloat16, replays)


@pytest.mark.parametrize("producer", ["ce_push", "ce_pull", "sm_push", "sm_2d", "sm_push_inline"])
def test_ag_gemm_cuda_graph_replay(producer):
    m, n, k, dtype = 512, 1024, 1024, torch.bfloat16
    ctx = AllGatherGemmContext(m, k, dtype, method=producer)
    a = torch.empty((m, k), device="cuda", dtype=dtype)
    b = rank_randn((n, k), dtype, 11)
    out = torch.empty((dist.get_world_size() * m, n), device="cuda", dtype=dtype)
    a.copy_(rank_randn((m, k), dtype, 12))
    ops.ag_gemm(a, b, out=out, context=ctx)  # one call outside the capture
    torch.cuda.synchronize()
    tdist.barrier()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        ops.ag_gemm(a, b, out=out, context=ctx)
        ops.ag_gemm(a, b, out=out, context=ctx)
    torch.cuda.synchronize()
    tdist.barrier()
    errors = graph_replay_errors(graph, a, out, lambda a: _reference(a, b), replays=3, seed=20)
    all_ranks_agree(all(e < _TOL for e in errors), f"ag_gemm {producer} graph replays: error/tolerance {errors}")


@pytest.mark.parametrize("producer", ["ce_push", "ce_pull", "sm_push", "sm_2d", "sm_push_inline"])
def test_ag_gemm_protocol_on_one_rank(producer):
    """The gather-and-signal protocol at any world size, including one rank (where ag_gemm is
    otherwise the plain GEMM): preload, the signal kernels and the waiting GEMM run on one GPU."""
    world, dtype = dist.get_world_size(), torch.bfloat16
    ctx = AllGatherGemmContext(1024, 256, dtype, method=producer, protocol_on_one_rank=True)
    b = rank_randn((512, 256), dtype, 41)
    bad = []
    for i in range(20):
        a = rank_randn((1000, 256), dtype, 400 + i)
        out = torch.full((world * 1000, 512), float("nan"), device="cuda", dtype=dtype)
        ops.ag_gemm(a, b, out=out, context=ctx)
        torch.cuda.synchronize()
        err = tolerance_ratio(out, _reference(a, b))
        if not err < _TOL:
            bad.append((i, err))
    all_ranks_agree(not bad, f"ag_gemm {producer} with the protocol forced on: wrong calls (call, error/tolerance) {bad}")


@pytest.mark.parametrize("producer", ["ce_pull", "sm_push", "sm_2d", "sm_push_inline"])
@pytest.mark.parametrize("m", [1000, 40])
def test_ag_gemm_back_to_back_with_changing_rows(m, producer):
    """60 unsynchronised calls on one context, m changing between calls (m = 40 < BM: tiles hold
    rows of several ranks): a shard rewritten before a peer copied it, or rows read before they
    landed, shows up as a wrong call. sm_push with 3 programs: shares of unequal size, and a
    masked tail tile at m = 500 and 20."""
    k, n, dtype = 512, 768, torch.bfloat16
    ctx = AllGatherGemmContext(1024, k, dtype, method=producer, push_programs=3)
    b = rank_randn((n, k), dtype, 700 + m)
    rows = [m, m // 2, m, 8, m] * 12
    inputs = [rank_randn((r, k), dtype, 7000 + i) for i, r in enumerate(rows)]
    outs = [torch.full((dist.get_world_size() * r, n), float("nan"), device="cuda", dtype=dtype) for r in rows]
    tdist.barrier()
    for x, out in zip(inputs, outs):
        ops.ag_gemm(x, b, out=out, context=ctx)
    torch.cuda.synchronize()
    errors = [tolerance_ratio(out, _reference(x, b)) for x, out in zip(inputs, outs)]
    bad = {i: e for i, e in enumerate(errors) if not e < _TOL}
    all_ranks_agree(not bad, f"ag_gemm {producer} with changing m: wrong calls (call: error/tolerance) {bad}")
