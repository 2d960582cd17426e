"""A LaunchPlan launches its kernel with each call's tensors in place of its slots (X, OUT, ...): through
Triton's path the first time (which learns the variant), then through the prepared C++ launch, and
through Triton's path again whenever the prepared launch declines (triton_dist.kernels.common.launch_plan)."""

import pytest

from triton_dist.kernels.common.launch_plan import OUT, X, LaunchPlan, LaunchSequence, Slot


class Prepared:
    """A PreparedLaunch stand-in: records what it was asked to launch, and says whether it did."""

    def __init__(self):
        self.takes, self.launched, self.is_current = True, [], True

    def current(self):
        return self.is_current

    def launch(self, args):
        if self.takes:
            self.launched.append(list(args))
        return self.takes

    def bind(self, args, slots, arity):
        return Bound(self, list(args), slots, arity)


class Bound:
    """A BoundLaunch stand-in: the call's tensors into their slots of the fixed arguments, then its
    prepared launch's answer (recorded in the same list)."""

    def __init__(self, prepared, args, slots, arity):
        self.prepared, self.args, self.slots, self.arity = prepared, args, slots, arity
        self.launches = 0

    def launch(self, tensors):
        assert len(tensors) == self.arity
        args = list(self.args)
        for at, index, block in self.slots:
            args[at] = tensors[index] if block is None else (tensors[index], block)
        self.launches += 1
        return self.prepared.launch(args)


class Kernel:
    """A DistributedKernel stand-in: its run() is Triton's path; prepare() hands out one Prepared."""

    def __init__(self, preparable=True):
        self.ran, self.prepared, self.preparable = [], Prepared(), preparable
        self.prepare_calls = 0

    def run(self, *args, grid, **meta):
        self.ran.append((list(args), grid, meta))

    def prepare(self, grid, meta):
        self.prepare_calls += 1
        return self.prepared if self.preparable else None


SIGNALS, COUNTER = object(), object()
META = dict(WORLD=4, BLOCK=2048, num_warps=8)


def test_the_first_launch_takes_tritons_path_and_the_next_the_prepared_one():
    kernel = Kernel()
    plan = LaunchPlan(kernel, [3], (X, OUT, SIGNALS, 1000, COUNTER), META)
    plan.launch("x1", "out1")
    assert kernel.ran == [(["x1", "out1", SIGNALS, 1000, COUNTER], (3, ), META)]
    plan.launch("x2", "out2")
    plan.launch("x3", "x3")  # in place
    assert kernel.prepared.launched == [["x2", "out2", SIGNALS, 1000, COUNTER], ["x3", "x3", SIGNALS, 1000, COUNTER]]
    assert len(kernel.ran) == 1 and kernel.prepare_calls == 1
    assert plan.args == [X, OUT, SIGNALS, 1000, COUNTER]  # the template is never overwritten
    assert plan._bound.launches == 2  # both through the bound launch (only the tensors passed)


def test_a_declined_prepared_launch_falls_back_to_tritons_path():
    kernel = Kernel()
    plan = LaunchPlan(kernel, (2, ), (OUT, 7, X), META)
    plan.launch("x1", "out1")
    kernel.prepared.takes = False
    plan.launch("x2", "out2")
    assert [args for args, _, _ in kernel.ran] == [["out1", 7, "x1"], ["out2", 7, "x2"]]
    assert kernel.prepare_calls == 1


def test_a_kernel_that_cannot_be_prepared_is_asked_once():
    kernel = Kernel(preparable=False)
    plan = LaunchPlan(kernel, (1, ), (X, OUT), META)
    for i in range(3):
        plan.launch(f"x{i}", f"out{i}")
    assert len(kernel.ran) == 3 and kernel.prepare_calls == 1


@pytest.mark.parametrize("args", [(OUT, 1), (Slot(0, "a"), Slot(2, "c")), (Slot(1, "b", (64, 64)), )])
def test_slot_indices_must_be_0_to_k_minus_1(args):
    with pytest.raises(ValueError, match="0 .. k - 1"):
        LaunchPlan(Kernel(), (1, ), args, META)


def test_with_an_arity_a_plan_may_leave_slots_to_another_plan_of_its_sequence():
    """ag_gemm's inline push takes the shard (slot 0), its GEMM ``b`` and ``out`` (slots 1, 2)."""
    push, gemm = Kernel(), Kernel()
    consumer = LaunchPlan(gemm, (4, ), (Slot(1, "b"), Slot(2, "out"), 5), META, arity=3)
    assert consumer.arity == 3
    sequence = LaunchSequence(LaunchPlan(push, (1, ), (X, COUNTER), META), consumer)
    assert sequence.arity == 3
    sequence.launch("a", "b", "out")
    assert push.ran[0][0] == ["a", COUNTER] and gemm.ran[0][0] == ["b", "out", 5]
    with pytest.raises(ValueError, match="below arity=2"):
        LaunchPlan(gemm, (4, ), (Slot(1, "b"), Slot(2, "out")), META, arity=2)


class Param:
    def __init__(self, name, constexpr=False, default=None, has_default=False):
        self.name, self.is_constexpr, self.default, self.has_default = name, constexpr, default, has_default


def _kernel_with_params():
    """``k(x, n, C: constexpr, extra=0, D: constexpr, out=None, flag=None)``: runtime parameters
    after constexprs, each with a default, as the GEMMs' epilogue operands."""
    kernel = Kernel()
    kernel.fn = type("Fn", (), {"params": [Param("x"), Param("n"), Param("C", True),
                                           Param("extra", default=0, has_default=True), Param("D", True),
                                           Param("out", has_default=True), Param("flag", has_default=True)]})
    return kernel


def test_named_runtime_arguments_go_by_position_to_cpp_and_by_name_to_triton():
    """The C++ launch takes the runtime arguments in the kernel's order (those after the last
    named one left to their defaults); Triton's path takes the named ones by name."""
    kernel = _kernel_with_params()
    plan = LaunchPlan(kernel, (4, ), (X, 7), META, named=dict(out=OUT))
    assert plan.arity == 2
    plan.launch("x1", "out1")  # first: Triton's path
    assert kernel.ran[0] == (["x1", 7], (4, ), dict(extra=0, out="out1", **META))
    plan.launch("x2", "out2")  # then the prepared launch, every argument up to out by position
    assert kernel.prepared.launched == [["x2", 7, 0, "out2"]]
    with pytest.raises(ValueError, match="not runtime parameters"):
        LaunchPlan(kernel, (4, ), (X, 7), META, named=dict(C=1))


def test_descriptor_slots_get_a_tma_descriptor_of_their_tensor(monkeypatch):
    from triton_dist.kernels.common import launch_plan

    monkeypatch.setattr(launch_plan, "_descriptor", lambda t, block: ("desc", t, tuple(block)))
    kernel = Kernel()
    plan = LaunchPlan(kernel, (1, ), (Slot(0, "a", (128, 64)), Slot(1, "b", (64, 64)), 5, Slot(2, "out")), META)
    assert plan.arity == 3
    plan.launch("a1", "b1", "out1")
    assert kernel.ran[0][0] == [("desc", "a1", (128, 64)), ("desc", "b1", (64, 64)), 5, "out1"]
    # The prepared (C++) launch takes each tensor with its block and encodes the tensor map itself.
    plan.launch("a2", "b2", "out2")
    assert kernel.prepared.launched == [[("a2", [128, 64]), ("b2", [64, 64]), 5, "out2"]]
    # A pair it refuses (TMA cannot take the tensor) goes to Triton's path, whose descriptor raises.
    kernel.prepared.takes = False
    plan.launch("a3", "b3", "out3")
    assert kernel.ran[1][0] == [("desc", "a3", (128, 64)), ("desc", "b3", (64, 64)), 5, "out3"]


def test_a_sequence_launches_its_plans_in_order_with_their_share_of_the_tensors():
    first, second = Kernel(), Kernel()
    sequence = LaunchSequence(LaunchPlan(first, (1, ), (COUNTER, ), META),
                              LaunchPlan(second, (4, ), (X, OUT, COUNTER), META))
    sequence.launch("x", "out")
    assert first.ran[0][0] == [COUNTER] and second.ran[0][0] == ["x", "out", COUNTER]


def test_a_launch_prepared_under_another_config_is_prepared_again():
    kernel = Kernel()
    plan = LaunchPlan(kernel, (1, ), (X, OUT), META)
    plan.launch("x1", "out1")
    kernel.prepared.takes, kernel.prepared.is_current = False, False  # what PreparedLaunch does then
    plan.launch("x2", "out2")
    assert kernel.prepare_calls == 2 and len(kernel.ran) == 2


def test_a_launch_of_the_wrong_number_of_tensors_is_refused():
    plan = LaunchPlan(Kernel(), (1, ), (X, OUT), META)
    with pytest.raises(ValueError, match="1 tensors for 2 slots"):
        plan.launch("x")


def test_a_sequence_makes_every_plans_arguments_before_its_first_launch(monkeypatch):
    """A descriptor that cannot be made must raise before the bump launches: a counter advanced on
    one rank alone would leave its epochs off its peers'."""
    from triton_dist.kernels.common import launch_plan

    def refuse(t, block):
        raise AssertionError("base must be 16-byte aligned")

    monkeypatch.setattr(launch_plan, "_descriptor", refuse)
    monkeypatch.setattr(launch_plan, "_plain_tma_operand", lambda t: t != "a")  # "a": misaligned
    bump, gemm = Kernel(), Kernel()
    sequence = LaunchSequence(LaunchPlan(bump, (1, ), (COUNTER, ), META),
                              LaunchPlan(gemm, (4, ), (Slot(0, "a", (64, 64)), Slot(1, "out")), META))
    assert sequence.arity == 2
    with pytest.raises(AssertionError, match="aligned"):
        sequence.launch("a", "out")
    assert bump.ran == [] and gemm.ran == []
    monkeypatch.setattr(launch_plan, "_descriptor", lambda t, block: ("desc", t, tuple(block)))
    sequence.launch("a2", "out")  # a plain operand: checked without a descriptor, then launched
    assert bump.ran == [([COUNTER], (1, ), META)] and gemm.ran == [([("desc", "a2", (64, 64)), "out"], (4, ), META)]


def test_a_plan_cache_makes_each_plan_once_and_forgets_all_past_its_limit():
    from triton_dist.kernels.common.launch_plan import PlanCache

    made = []

    def make(key):
        made.append(key)
        return None if key == "none" else ("plan", key)

    cache = PlanCache(limit=2)
    assert cache.get(1, lambda: make(1)) == cache.get(1, lambda: make(1)) == ("plan", 1)
    assert cache.get("none", lambda: make("none")) is None and len(cache) == 1  # None is not kept
    cache.get(2, lambda: make(2))
    cache.get(3, lambda: make(3))  # past the limit: all forgotten, then 3 kept
    assert len(cache) == 1 and cache.get(1, lambda: make(1)) == ("plan", 1)
    assert made == [1, "none", 2, 3, 1]
