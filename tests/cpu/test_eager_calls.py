"""A repeated op call replays the recorded call's LaunchPlan only when everything the key does not
fix checks out (device, contiguity, alignment, out's shape and dtype); anything else takes the full
path (triton_dist.eager_calls). Without torch: stand-ins for tensors and torch._C."""

import types

import pytest

from triton_dist import config, eager_calls


class Tensor:
    """What replay() reads of a torch.Tensor."""

    def __init__(self, shape, dtype="bf16", device=0, address=4096, contiguous=True):
        self.shape, self.dtype, self.device = tuple(shape), dtype, device
        self.address, self.contiguous = address, contiguous

    def get_device(self):
        return self.device

    def is_contiguous(self):
        return self.contiguous

    def data_ptr(self):
        return self.address


def empty(shape, *, dtype, device):
    """torch.empty's stand-in."""
    return Tensor(shape, dtype, device, address=1 << 20)


def empty_like(like, *, memory_format):
    """torch.empty_like's stand-in (a same-shaped output)."""
    assert memory_format is eager_calls._contiguous
    return Tensor(like.shape, like.dtype, like.device, address=1 << 21)


class Plan:
    """A LaunchPlan stand-in."""

    arity = 2

    def __init__(self):
        self.launched = []

    def launch(self, x, out):
        self.launched.append((x, out))


@pytest.fixture
def calls(monkeypatch):
    monkeypatch.setattr(eager_calls, "_Tensor", Tensor)
    monkeypatch.setattr(eager_calls, "_empty", empty)
    monkeypatch.setattr(eager_calls, "_empty_like", empty_like)
    monkeypatch.setattr(eager_calls, "_contiguous", object())  # torch.contiguous_format's stand-in
    current = types.SimpleNamespace(device=0, capturing=False)
    monkeypatch.setattr(eager_calls, "_torch_c", types.SimpleNamespace(
        _cuda_getDevice=lambda: current.device, _cuda_isCurrentStreamCapturing=lambda: current.capturing))
    monkeypatch.setattr(config, "get", lambda: types.SimpleNamespace(check_collective_calls=False, eager_replay=True))
    eager_calls.clear()
    yield current
    eager_calls.clear()


def record(op="all_gather", shape=(64, 32), out_shape=(256, 32), out_given=False, method="auto"):
    plan = Plan()
    x = Tensor(shape)
    eager_calls.record(op, x, Tensor(out_shape), out_given, method, plan)
    return plan


def test_a_call_like_the_recorded_one_launches_its_plan(calls):
    plan = record()
    x = Tensor((64, 32), address=8192)
    out = eager_calls.replay("all_gather", x, None, "auto")
    assert out.shape == (256, 32) and out.dtype == "bf16" and out.address == 1 << 20 and plan.launched == [(x, out)]
    given = Tensor((256, 32), address=1 << 30)
    plan_out = record(out_given=True)
    assert eager_calls.replay("all_gather", x, given, "auto") is given and plan_out.launched == [(x, given)]


def test_a_same_shaped_output_is_allocated_like_the_input(calls):
    plan = Plan()
    eager_calls.record("all_reduce", Tensor((4096,)), Tensor((4096,)), False, "ll", plan)
    x = Tensor((4096,), dtype="bf16", address=8192)
    out = eager_calls.replay("all_reduce", x, None, "ll")
    assert (out.shape, out.dtype, out.device, out.address) == ((4096,), "bf16", 0, 1 << 21)
    assert plan.launched == [(x, out)]


@pytest.mark.parametrize("why,x", [
    ("another shape", Tensor((32, 32))),
    ("another dtype", Tensor((64, 32), dtype="fp32")),
    ("another device", Tensor((64, 32), device=1)),
    ("a CPU tensor", Tensor((64, 32), device=-1)),
    ("not contiguous", Tensor((64, 32), contiguous=False)),
    ("misaligned", Tensor((64, 32), address=4098)),
    ("not a tensor", [[0.0] * 32] * 64),
])
def test_an_input_the_plan_does_not_fit_takes_the_full_path(calls, why, x):
    plan = record()
    assert eager_calls.replay("all_gather", x, None, "auto") is None, why
    assert plan.launched == []


@pytest.mark.parametrize("why,out", [
    ("another shape", Tensor((128, 32))),
    ("another dtype", Tensor((256, 32), dtype="fp32")),
    ("another device", Tensor((256, 32), device=1)),
    ("not contiguous", Tensor((256, 32), contiguous=False)),
    ("misaligned", Tensor((256, 32), address=4100)),
    ("not a tensor", "out"),
])
def test_an_out_the_plan_does_not_fit_takes_the_full_path(calls, why, out):
    plan = record(out_given=True)
    assert eager_calls.replay("all_gather", Tensor((64, 32)), out, "auto") is None, why
    assert plan.launched == []


def test_the_key_is_op_method_and_out_given(calls):
    record(op="all_gather", method="auto", out_given=False)
    x = Tensor((64, 32))
    assert eager_calls.replay("all_reduce", x, None, "auto") is None
    assert eager_calls.replay("all_gather", x, None, "ll") is None
    assert eager_calls.replay("all_gather", x, Tensor((256, 32)), "auto") is None


def test_another_current_device_takes_the_full_path(calls):
    plan = record()
    calls.device = 1
    assert eager_calls.replay("all_gather", Tensor((64, 32)), None, "auto") is None
    assert plan.launched == []


def test_calls_that_may_not_be_replayed_are_not_recorded(calls, monkeypatch):
    eager_calls.record("all_gather", Tensor((64, 32)), Tensor((256, 32)), False, "auto", None)
    assert eager_calls.plans() == 0
    monkeypatch.setattr(config, "get", lambda: types.SimpleNamespace(check_collective_calls=True, eager_replay=True))
    record()
    assert eager_calls.plans() == 0  # every call is checked across ranks then
    monkeypatch.setattr(config, "get", lambda: types.SimpleNamespace(check_collective_calls=False, eager_replay=False))
    record()
    assert eager_calls.plans() == 0  # switched off


def test_clear_forgets_and_the_plans_stay_bounded(calls, monkeypatch):
    record()
    eager_calls.clear()
    assert eager_calls.replay("all_gather", Tensor((64, 32)), None, "auto") is None
    monkeypatch.setattr(eager_calls, "MAX_PLANS", 4)
    for rows in range(1, 10):
        record(shape=(rows, 32), out_shape=(4 * rows, 32))
    assert 1 <= eager_calls.plans() <= 4
    assert eager_calls.replay("all_gather", Tensor((9, 32)), None, "auto") is not None


def test_an_unhashable_method_takes_the_full_path(calls):
    record()
    assert eager_calls.replay("all_gather", Tensor((64, 32)), None, ["auto"]) is None  # its error is the op's


def test_plans_recorded_under_another_config_are_dropped(calls, monkeypatch):
    plan = record()
    monkeypatch.setattr(config, "_current", object())  # init() again, or a switched setting
    assert eager_calls.replay("all_gather", Tensor((64, 32)), None, "auto") is None
    assert eager_calls.plans() == 0 and plan.launched == []
    record()
    assert eager_calls.replay("all_gather", Tensor((64, 32)), None, "auto") is not None


class Sequence:
    """A LaunchSequence stand-in: gemm_ar's bump and kernel, launched with (a, b, out)."""

    arity = 3

    def __init__(self):
        self.launched = []

    def launch(self, a, b, out):
        self.launched.append((a, b, out))


def record_gemm(out_given=False):
    plan = Sequence()
    eager_calls.record_gemm("gemm_ar", Tensor((16, 512)), Tensor((1024, 512)), Tensor((16, 1024)), out_given, "auto",
                            plan)
    return plan


def test_a_gemm_call_like_the_recorded_one_launches_its_sequence(calls):
    plan = record_gemm()
    a, b = Tensor((16, 512), address=1 << 21), Tensor((1024, 512), address=1 << 22)
    out = eager_calls.replay_gemm("gemm_ar", a, b, None, "auto")
    assert out.shape == (16, 1024) and plan.launched == [(a, b, out)]
    assert eager_calls.replay("gemm_ar", a, None, "auto") is None  # the collectives' key is another


@pytest.mark.parametrize("why,a,b", [
    ("another N", Tensor((16, 512)), Tensor((2048, 512))),
    ("another K", Tensor((16, 256)), Tensor((1024, 256))),
    ("b of another dtype", Tensor((16, 512)), Tensor((1024, 512), dtype="fp16")),
    ("b misaligned", Tensor((16, 512)), Tensor((1024, 512), address=4104)),
    ("b not contiguous", Tensor((16, 512)), Tensor((1024, 512), contiguous=False)),
    ("b on another device", Tensor((16, 512)), Tensor((1024, 512), device=1)),
    ("a misaligned", Tensor((16, 512), address=4104), Tensor((1024, 512))),
])
def test_gemm_operands_the_plan_does_not_fit_take_the_full_path(calls, why, a, b):
    plan = record_gemm()
    assert eager_calls.replay_gemm("gemm_ar", a, b, None, "auto") is None, why
    assert plan.launched == []


def test_no_gemm_call_is_replayed_while_a_timeline_records(calls, monkeypatch):
    """The GEMMs' full paths launch their instrumented variants while a timeline records; a plan
    holds the plain ones, which would record no spans."""
    from triton_dist import timeline

    plan = record_gemm()
    a, b = Tensor((16, 512)), Tensor((1024, 512))
    monkeypatch.setattr(timeline, "_current", object())
    assert eager_calls.replay_gemm("gemm_ar", a, b, None, "auto") is None and plan.launched == []
    monkeypatch.setattr(timeline, "_current", None)
    assert eager_calls.replay_gemm("gemm_ar", a, b, None, "auto") is not None and len(plan.launched) == 1


def test_a_gemm_out_is_checked_like_the_collectives(calls):
    plan = record_gemm(out_given=True)
    a, b = Tensor((16, 512)), Tensor((1024, 512))
    assert eager_calls.replay_gemm("gemm_ar", a, b, Tensor((16, 2048)), "auto") is None
    assert eager_calls.replay_gemm("gemm_ar", a, b, Tensor((16, 1024), address=4100), "auto") is None
    out = Tensor((16, 1024))
    assert eager_calls.replay_gemm("gemm_ar", a, b, out, "auto") is out and plan.launched == [(a, b, out)]


def test_a_plan_of_another_arity_is_refused_when_recorded(calls):
    with pytest.raises(ValueError, match="takes 3 tensors, its replay 2"):
        eager_calls.record("all_reduce", Tensor((64, 32)), Tensor((64, 32)), False, "auto", Sequence())


class Context:
    """A user-held context's stand-in: what eager_calls keeps on one."""

    eager_plans = None


def test_calls_with_a_context_replay_from_it_and_only_with_it(calls):
    """A call with ``context=`` is recorded on that context, not with the ops' cached ones: a call
    with it replays, one without it or with another context does not (and the other way round)."""
    mine, other = Context(), Context()
    plan = Plan()
    eager_calls.record("all_gather", Tensor((64, 32)), Tensor((256, 32)), False, "auto", plan, mine)
    assert eager_calls.plans() == 0 and eager_calls.plans(mine) == 1 and eager_calls.plans(other) == 0
    x = Tensor((64, 32), address=8192)
    out = eager_calls.replay("all_gather", x, None, "auto", mine)
    assert out is not None and plan.launched == [(x, out)]
    assert eager_calls.replay("all_gather", x, None, "auto") is None
    assert eager_calls.replay("all_gather", x, None, "auto", other) is None
    record()  # the cached contexts' plan of the same key
    assert eager_calls.replay("all_gather", x, None, "auto", other) is None
    assert len(plan.launched) == 1


def test_clear_and_another_config_drop_the_plans_kept_on_contexts(calls, monkeypatch):
    """finalize (through clear) frees the memory a context's plans name; a new Config may change
    what a call does: either way the context's next call takes the full path, then records anew."""
    mine = Context()
    plan = Plan()

    def record_with():
        eager_calls.record("all_reduce", Tensor((4096,)), Tensor((4096,)), True, "ll", plan, mine)

    record_with()
    eager_calls.clear()
    x, y = Tensor((4096,)), Tensor((4096,), address=1 << 22)
    assert eager_calls.replay("all_reduce", x, y, "ll", mine) is None and eager_calls.plans(mine) == 0
    record_with()
    assert eager_calls.replay("all_reduce", x, y, "ll", mine) is y
    monkeypatch.setattr(config, "_current", object())
    assert eager_calls.replay("all_reduce", x, y, "ll", mine) is None
    record_with()
    assert eager_calls.replay("all_reduce", x, y, "ll", mine) is y and len(plan.launched) == 2


def test_a_gemm_call_with_a_context_replays_from_it(calls):
    mine = Context()
    plan = Sequence()
    eager_calls.record_gemm("gemm_rs", Tensor((256, 512)), Tensor((1024, 512)), Tensor((128, 1024)), False, "fused",
                            plan, mine)
    a, b = Tensor((256, 512)), Tensor((1024, 512))
    assert eager_calls.replay_gemm("gemm_rs", a, b, None, "fused") is None
    out = eager_calls.replay_gemm("gemm_rs", a, b, None, "fused", mine)
    assert out.shape == (128, 1024) and plan.launched == [(a, b, out)]


def test_no_auto_gemm_call_is_replayed_while_capturing(calls):
    """An eager ``"auto"`` GEMM call recorded the one-kernel method that ``"auto"`` picks for eager
    calls; under graph capture it picks the copy-engine producer: the full path decides then. A
    named method replays under capture too."""
    auto, fused = Sequence(), Sequence()
    for method, plan in (("auto", auto), ("fused", fused)):
        eager_calls.record_gemm("gemm_rs", Tensor((256, 512)), Tensor((1024, 512)), Tensor((128, 1024)), True, method,
                                plan)
    a, b, out = Tensor((256, 512)), Tensor((1024, 512)), Tensor((128, 1024), address=1 << 23)
    calls.capturing = True
    assert eager_calls.replay_gemm("gemm_rs", a, b, out, "auto") is None and auto.launched == []
    assert eager_calls.replay_gemm("gemm_rs", a, b, out, "fused") is out and fused.launched == [(a, b, out)]
    calls.capturing = False
    assert eager_calls.replay_gemm("gemm_rs", a, b, out, "auto") is out and auto.launched == [(a, b, out)]
