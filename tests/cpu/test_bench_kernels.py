"""triton_dist.bench.kernels_launched: the distinct GPU kernel names of one profiled call, in
first-launch order, after a warm-up call; a profiler failure is one line, not an exception.
Without torch: a stand-in torch with a profiler that reports the kernels the call 'launched'."""

import sys
import types

from triton_dist import bench


def _fake_torch(monkeypatch, fail: bool = False):
    cuda, cpu = object(), object()
    launched = []

    class Profile:
        def __init__(self, activities):
            assert activities == ["CUDA"]

        def __enter__(self):
            if fail:
                raise RuntimeError("CUPTI unavailable\nsecond line")
            launched.clear()
            return self

        def __exit__(self, *exc):
            return False

        def events(self):
            return [types.SimpleNamespace(name=name, device_type=device) for name, device in launched]

    torch = types.ModuleType("torch")
    torch.cuda = types.SimpleNamespace(synchronize=lambda: None)
    torch.autograd = types.SimpleNamespace(DeviceType=types.SimpleNamespace(CUDA=cuda))
    profiler = types.ModuleType("torch.profiler")
    profiler.profile = Profile
    profiler.ProfilerActivity = types.SimpleNamespace(CUDA="CUDA")
    torch.profiler = profiler
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "torch.profiler", profiler)
    return launched, cuda, cpu


def test_the_distinct_kernel_names_in_launch_order(monkeypatch):
    launched, cuda, cpu = _fake_torch(monkeypatch)
    calls = []

    def fn():
        calls.append(1)
        launched.extend([("nvjet_128x64_splitK", cuda), ("aten::mm", cpu), ("reduce_kernel", cuda),
                         ("nvjet_128x64_splitK", cuda)])

    assert bench.kernels_launched(fn) == ["nvjet_128x64_splitK", "reduce_kernel"]
    assert len(calls) == 2  # a warm-up call, then the profiled one


def test_a_profiler_failure_is_one_line(monkeypatch):
    _fake_torch(monkeypatch, fail=True)
    assert bench.kernels_launched(lambda: None) == ["profiler failed: RuntimeError: CUPTI unavailable"]
