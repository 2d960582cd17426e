"""The Python API's behaviour on a machine without a GPU: inert import, clear errors."""

import ctypes
import subprocess
import sys

import pytest

import triton_dist
from triton_dist import _C, kernels, ops


def test_import_is_inert():
    # A fresh interpreter: importing must not pull in torch or start CUDA.
    code = ("import sys, triton_dist, triton_dist.language; "
            "assert 'torch' not in sys.modules, 'torch imported'; "
            "assert not triton_dist.is_initialized(); print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env())
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


@pytest.mark.parametrize("first", ["triton_dist.moe_ops", "triton_dist.ops", "triton_dist.kernels.gemm.gemm_rs",
                                   "triton_dist.kernels.collectives.policy", "triton_dist.kernels.moe"])
def test_any_module_can_be_imported_first(first):
    # A fresh interpreter each: no import circle that only works in one order.
    code = f"import {first}; import triton_dist.ops as o; assert o.group_gemm and o.gemm_rs; print('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env())
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_init_without_torch_says_how_to_install_it():
    # A fresh interpreter in which torch cannot be imported (None in sys.modules blocks the import).
    code = ("import sys; sys.modules['torch'] = None; import triton_dist\n"
            "try:\n    triton_dist.init()\nexcept ImportError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env())
    assert out.returncode == 0, out.stderr
    assert "triton_dist init: PyTorch is not installed" in out.stdout
    assert "pip install 'triton-dist[torch]'" in out.stdout


def _env():
    import os

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return env


@pytest.mark.parametrize("call", [
    lambda: triton_dist.rank(),
    lambda: triton_dist.world_size(),
    lambda: triton_dist.local_rank(),
    lambda: triton_dist.local_world_size(),
    lambda: triton_dist.node(),
    lambda: triton_dist.num_nodes(),
    lambda: triton_dist.barrier(),
    lambda: triton_dist.finalize(),
    lambda: triton_dist.symm_empty((4, 4)),
    lambda: triton_dist.symm_zeros(16),
    lambda: triton_dist.peer_tensor(object(), 1),
    lambda: triton_dist.SignalPad(4),
    lambda: ops.ep_dispatch(None, None, None, context=None),
    lambda: ops.ep_combine(None, None),
    lambda: kernels.EPContext(16, 128, 8, 2, None),
])
def test_calls_before_init_say_so(call):
    with pytest.raises(RuntimeError, match=r"not initialised; call triton_dist.init\(\) first"):
        call()


def test_core_calls_before_init_say_so():
    assert not _C.initialized()
    for call in (_C.rank, _C.heap_stats, lambda: _C.allocate(16, "x"), lambda: _C.peer_address(0, 0)):
        with pytest.raises(RuntimeError, match="not initialised"):
            call()
    assert _C.initialize_module(0) is False  # Triton's load hook is a no-op before init


def test_missing_nvshmem_names_the_package(monkeypatch, tmp_path):
    monkeypatch.delenv("LD_LIBRARY_PATH", raising=False)
    with pytest.raises(RuntimeError, match="pip install nvidia-nvshmem-cu13") as info:
        _C.init(0, 1, lambda blob: [blob], 1 << 20, 0, str(tmp_path))
    assert str(tmp_path) in str(info.value)
    assert not _C.initialized()  # a failed init leaves nothing half-built


def test_callback_bootstrap_validates_the_callback():
    with pytest.raises(RuntimeError, match="returned 2 blobs for a world of size 1"):
        _C.init(0, 1, lambda blob: [blob, blob], 1 << 20, 0, "")
    with pytest.raises(RuntimeError, match="outside a world of size 2"):
        _C.init(2, 2, lambda blob: [blob, blob], 1 << 20, 0, "")
    assert not _C.initialized()


def _driver_present() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
        return True
    except OSError:
        return False


@pytest.mark.skipif(_driver_present(), reason="a CUDA driver is installed here")
def test_stream_ops_without_driver_say_so():
    with pytest.raises(RuntimeError, match="No NVIDIA driver|libcuda"):
        _C.stream_write_value64(0, 0, 1)
    with pytest.raises(RuntimeError, match="No NVIDIA driver|libcuda"):
        _C.stream_copy_2d(0, 0, 256, 0, 256, 128, 2)


def test_stream_copy_2d_rejects_pitch_below_row():
    with pytest.raises(RuntimeError, match="stream_copy_2d.*pitches"):
        _C.stream_copy_2d(0, 0, 64, 0, 256, 128, 2)


def test_stream_schedule_records_without_a_gpu_and_batches_memops():
    schedule = _C.StreamSchedule()
    schedule.wait_value64(0x1000, 1)
    schedule.write_value64(0x1000, 0)
    schedule.copy_2d(0x200000, 512, 0x300000, 1024, 256, 8)
    schedule.write_value64(0x1008, 1)
    assert len(schedule) == 4
    assert schedule.driver_calls == 3  # wait+write share a batch; the copy splits it
    with pytest.raises(RuntimeError, match="StreamSchedule.copy_2d.*pitches"):
        schedule.copy_2d(0, 64, 0, 256, 128, 2)


@pytest.mark.skipif(_driver_present(), reason="a CUDA driver is installed here")
def test_stream_schedule_enqueue_without_driver_says_so():
    schedule = _C.StreamSchedule()
    schedule.write_value64(0x1000, 1)
    with pytest.raises(RuntimeError, match="No NVIDIA driver|libcuda"):
        schedule.enqueue(0)


def test_named_words_outside_a_pad_get_their_region_in_the_report():
    # What ll_buffer does for an LL buffer (2 halves x 2 ranks x 4 words here): the timed-out
    # wait's address maps to the half, the sender and the word.
    base, slot = 0x7e0000100000, 4
    regions = [(f"half{h}.from_rank{r}", (h * 2 + r) * slot, slot) for h in range(2) for r in range(2)]
    naming = _C.name_signals(base, 4 * slot, 8, "AllReduceContext LL", regions)
    try:
        assert _C.signal_name(base + 8 * (3 * slot + 1)) == \
            "signal 13 of AllReduceContext LL's buffer: half1.from_rank1[1]"
        assert _C.signal_name(base + 8 * 4 * slot) == ""  # one past the buffer
        _C.forget_signals(base, naming + 1)  # another naming's removal leaves these names
        assert _C.signal_name(base) != ""
    finally:
        _C.forget_signals(base, naming)
    assert _C.signal_name(base) == ""


def test_init_rejects_a_keep_nvshmem_that_is_not_a_bool():
    with pytest.raises(TypeError, match="keep_nvshmem must be True, False or None"):
        triton_dist.init(keep_nvshmem="yes")
