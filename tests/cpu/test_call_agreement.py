"""The debugging check that ranks call a collective alike (triton_dist.call_agreement): what it
compares of each argument and which ranks it names; off by default, and its setting's variable."""

from triton_dist import call_agreement, config


class _Tensor:
    def __init__(self, shape, dtype):
        self.shape, self.dtype = shape, dtype


def test_tensors_are_compared_by_shape_and_dtype_and_the_rest_by_value():
    assert call_agreement.describe(_Tensor((4, 8), "torch.bfloat16")) == ((4, 8), "bfloat16")
    assert call_agreement.describe("auto") == "auto"
    assert call_agreement.describe(None) is None


def test_the_ranks_that_differ_from_rank_0_are_named():
    same = {"x": ((4, 8), "bfloat16"), "method": "auto"}
    other = {"x": ((8, 8), "bfloat16"), "method": "auto"}
    assert call_agreement.differing([same, same, same]) == []
    assert call_agreement.differing([same, other, same, other]) == [1, 3]


def test_off_by_default_and_on_through_its_variable(monkeypatch):
    monkeypatch.delenv("TRITON_DIST_CHECK_COLLECTIVE_CALLS", raising=False)
    assert not config.Config.from_environment().check_collective_calls
    call_agreement.check("all_reduce", x=_Tensor((1, ), "float32"))  # off: returns before any collective
    monkeypatch.setenv("TRITON_DIST_CHECK_COLLECTIVE_CALLS", "1")
    assert config.Config.from_environment().check_collective_calls


def test_rows_that_may_differ_are_compared_without_their_count(monkeypatch):
    seen = {}
    monkeypatch.setattr(config, "get", lambda: config.Config(check_collective_calls=True))

    class _Dist:
        @staticmethod
        def all_gather_object(every, mine, group=None):
            seen.update(mine)
            every[:] = [mine]

    import sys
    import types

    torch = types.ModuleType("torch")
    torch.distributed = _Dist
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "torch.distributed", _Dist)
    monkeypatch.setattr(call_agreement._runtime, "world_size", lambda: 1)
    monkeypatch.setattr(call_agreement._runtime, "process_group", lambda: None)
    call_agreement.check("ep_dispatch", rows_may_differ=("x", ), x=_Tensor((7, 64), "torch.bfloat16"), send_only=False)
    assert seen == {"x": ((64, ), "bfloat16"), "send_only": False}
