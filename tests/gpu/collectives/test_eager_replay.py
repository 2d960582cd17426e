"""Repeated eager calls of all_reduce, all_gather and reduce_scatter replay their recorded launch
plan (triton_dist.eager_calls): hundreds of calls of one shape, fresh random data every call, the
forms a caller mixes (a new out, a given poisoned out, in place, a misaligned input that takes the
full path) in turn, every element checked against a reference every rank computes alone (it
redraws every rank's input from its seed). Then the replayed call captured in a CUDA graph, replays
launching through the plan's bound C++ launch, and the op's errors for inputs the plan does not
fit."""

import pytest
import torch
import torch.distributed as dist

import triton_dist as tdist
from conftest import all_ranks_agree, raises_everywhere, rank_randn, tolerance_ratio
from triton_dist import eager_calls, ops

CALLS = 240
ROWS, COLS = 8, 130  # per rank: 1040 elements, LL-sized in fp32 too


def _case(op: str, seed: int, dtype):
    """``(x, want)``: this rank's input and the op's result on this rank, from every rank's input."""
    world, me = dist.get_world_size(), dist.get_rank()
    rows = ROWS * world if op == "reduce_scatter" else ROWS
    inputs = [rank_randn((rows, COLS), dtype, seed, r) for r in range(world)]
    if op == "all_gather":
        want = torch.cat(inputs)
    else:
        want = sum(x.float() for x in inputs)
        if op == "reduce_scatter":
            want = want[me * ROWS:(me + 1) * ROWS]
    return inputs[me], want


def _misaligned(x):
    """``x``'s values at an address 2 bytes past a 16-byte boundary (the full path clones it)."""
    buffer = torch.empty(x.numel() + 1, device=x.device, dtype=x.dtype)
    buffer[1:] = x.reshape(-1)
    return buffer[1:].view(x.shape)


def _call(op: str, x, method: str, form: int, want_shape):
    """One call in the ``form``-th way: a new out, a given poisoned out, in place (all_reduce), a
    misaligned input."""
    fn = getattr(ops, op)
    if form == 1 or (form == 2 and op != "all_reduce"):
        out = torch.full(want_shape, float("nan"), device="cuda", dtype=x.dtype)
        got = fn(x, out=out, method=method)
        assert got is out
        return got
    if form == 2:
        y = x.clone()
        got = fn(y, out=y, method=method)
        assert got is y
        return got
    return fn(_misaligned(x) if form == 3 else x, method=method)


def _wrong_calls(op: str, calls: int, seed: int, dtype, call) -> list[int]:
    """The indices ``i`` of ``calls`` calls ``call(i, x, want)`` whose result is off the reference
    (every element within its tolerance, no NaN), on fresh inputs from seeds ``seed + i``."""
    bad = []
    for i in range(calls):
        x, want = _case(op, seed + i, dtype)
        if tolerance_ratio(call(i, x, want), want) > 1:
            bad.append(i)
    return bad


_ONE_LAUNCH = {"all_reduce": ["auto", "one_shot", "two_shot", "ll", "ring"],
               "all_gather": ["auto", "sm_push", "ring", "ll", "2d", "ll_2d"],
               "reduce_scatter": ["auto", "push", "ring", "ll", "2d"]}
_CASES = [(op, method) for op, methods in _ONE_LAUNCH.items() for method in methods]


@pytest.fixture(autouse=True)
def one_node():
    # Across nodes "auto" takes the methods of several launches and the others refuse unmapped
    # peers: what replays there is the "2d" family, tested by the suites under --local-world.
    if tdist.num_nodes() > 1:
        pytest.skip("replay is tested at one node (the one-kernel methods load peers' memory)")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("op,method", _CASES)
def test_repeated_calls_match_the_reference(op, method, dtype, replays):
    eager_calls.clear()
    bad = _wrong_calls(op, CALLS, 10_000, dtype, lambda i, x, want: _call(op, x, method, i % 4, want.shape))
    all_ranks_agree(not bad, f"{op} {method} {dtype}: wrong at calls {bad[:10]} of {CALLS}")
    # Forms 0-2 replay but for the first call of each key (out given or not); 3 never does. At
    # one rank the plan is the copy (kernels/common/context.py's OneRankCopy).
    expected = 3 * CALLS // 4 - 2
    all_ranks_agree(replays[0] == expected, f"{op} {method}: {replays[0]} calls replayed, expected {expected}")
    all_ranks_agree(eager_calls.plans() > 0,
                    f"{op} {method}: {eager_calls.plans()} plans recorded at world {dist.get_world_size()}")
    # The fit checked directly: a call like the recorded ones is replayed (on every rank alike).
    x, want = _case(op, 99, dtype)
    got = eager_calls.replay(op, x, None, method)
    all_ranks_agree(got is not None, f"{op} {method}: replay of a recorded call gave {got!r}")
    if got is not None:
        all_ranks_agree(tolerance_ratio(got, want) <= 1, f"{op} {method}: the direct replay is wrong")
    tdist.barrier()


@pytest.mark.parametrize("op,method", [(op, "auto") for op in _ONE_LAUNCH])
def test_a_replayed_call_captured_in_a_cuda_graph(op, method):
    x, want = _case(op, 1, torch.bfloat16)
    out = torch.empty(want.shape, device="cuda", dtype=x.dtype)
    getattr(ops, op)(x, out=out, method=method)  # recorded, uncaptured
    torch.cuda.synchronize()
    tdist.barrier()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        getattr(ops, op)(x, out=out, method=method)  # replayed into the graph
    torch.cuda.synchronize()
    tdist.barrier()

    def replayed(i, fresh, want):
        x.copy_(fresh)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        return out

    bad = _wrong_calls(op, 40, 500, torch.bfloat16, replayed)
    all_ranks_agree(not bad, f"{op} replayed into a CUDA graph: wrong at replays {bad}")
    tdist.barrier()


@pytest.mark.parametrize("op", list(_ONE_LAUNCH))
def test_one_rank_on_the_full_path_while_the_others_replay(op):
    """Rank 0's input misaligned every other call: it takes the full path (a clone, the same
    kernel) while the others replay; the results stay right on every rank."""
    def call(i, x, want):
        return getattr(ops, op)(_misaligned(x) if dist.get_rank() == 0 and i % 2 else x)

    bad = _wrong_calls(op, 60, 3000, torch.bfloat16, call)
    all_ranks_agree(not bad, f"{op} with rank 0 on the full path: wrong at calls {bad}")
    tdist.barrier()


@pytest.mark.parametrize("op", list(_ONE_LAUNCH))
def test_calls_with_a_context_replay_from_it(op, replays):
    """Calls with ``context=`` are recorded on that context, not with the ops' cached ones, and
    replayed: right on fresh data every call, a new out and a given one in turn; a call without
    the context is not replayed from its plans; its plans go with it (and with clear)."""
    import gc
    import weakref

    from triton_dist.kernels import AllGatherContext, AllReduceContext, ReduceScatterContext

    context_class = {"all_reduce": AllReduceContext, "all_gather": AllGatherContext,
                     "reduce_scatter": ReduceScatterContext}[op]
    context = context_class(1 << 20, torch.bfloat16)
    eager_calls.clear()

    def call(i, x, want, context=context):  # a default, not a closure: the context is deleted below
        out = None if i % 2 == 0 else torch.full(want.shape, float("nan"), device="cuda", dtype=x.dtype)
        return getattr(ops, op)(x, out=out, context=context)

    bad = _wrong_calls(op, 60, 4000, torch.bfloat16, call)
    expected = 58  # all but the first call of each form
    recorded = (eager_calls.plans(), eager_calls.plans(context))
    all_ranks_agree(not bad and replays[0] == expected and recorded == (0, 2),
                    f"{op} with context=: wrong at {bad}; {replays[0]} replayed (expected {expected}); plans "
                    f"(cached, the context's) {recorded}")
    x, _ = _case(op, 4, torch.bfloat16)
    all_ranks_agree(eager_calls.replay(op, x, None, "auto") is None, f"{op}: a call without the context replayed")
    eager_calls.clear()
    all_ranks_agree(eager_calls.plans(context) == 0, f"{op}: the context's plans outlived clear()")
    gone = weakref.ref(context)
    del context, call
    gc.collect()
    all_ranks_agree(gone() is None, f"{op}: the context outlived its last reference (its plans hold it)")
    tdist.barrier()


@pytest.mark.parametrize("op", list(_ONE_LAUNCH))
def test_inputs_the_plan_does_not_fit_get_the_ops_errors(op):
    x, want = _case(op, 2, torch.bfloat16)
    fn = getattr(ops, op)
    fn(x)  # recorded
    torch.cuda.synchronize()
    strided = torch.empty((x.shape[1], x.shape[0]), device="cuda", dtype=x.dtype).t()  # x's shape, not contiguous
    raises_everywhere(lambda: fn(strided), ValueError, "contiguous")
    raises_everywhere(lambda: fn(x, out=torch.empty(want.shape, device="cuda", dtype=torch.float32)), ValueError,
                      "out must have shape")
    raises_everywhere(lambda: fn(x.cpu()), ValueError, "CUDA|cuda")
    got = fn(x)  # and the op still works
    torch.cuda.synchronize()
    all_ranks_agree(tolerance_ratio(got, want) <= 1, f"{op} after bad inputs")
    tdist.barrier()


@pytest.mark.parametrize("op", list(_ONE_LAUNCH))
def test_replayed_calls_launch_through_the_bound_launch(op, replays):
    """After a call's first launch, its replays launch from C++ through the plan's bound launch
    (eager_launch.BoundLaunch), never through the plan's slower paths, which would mean the bound
    launch declined (a fixed argument or a tensor it does not take)."""
    x, want = _case(op, 5, torch.bfloat16)
    out = torch.empty(want.shape, device="cuda", dtype=x.dtype)
    eager_calls.clear()
    getattr(ops, op)(x, out=out)  # recorded
    torch.cuda.synchronize()
    replays[1] = 0
    bad = _wrong_calls(op, 50, 7000, torch.bfloat16, lambda i, fresh, want: getattr(ops, op)(fresh, out=out))
    all_ranks_agree(not bad and replays[1] == 0,
                    f"{op}: wrong at {bad}; {replays[1]} of 50 replayed calls off the bound launch")
    tdist.barrier()
