"""tdist/device.cuh on the GPUs: CUDA C++ kernels (tests/gpu/cuda/device_primitives.cu), built with
nvcc on every rank and driven through ctypes: a checked producer/consumer, a notify/wait
ping-pong, and a wait that times out."""

import ctypes
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest
import torch
import torch.distributed as dist

import triton_dist as tdist
from conftest import all_ranks_agree, skip_if_ranks_share_gpus
from triton_dist.device_map import SymmetricMap, symmetric_map, symmetric_map_bytes

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.abspath(os.path.join(_HERE, "..", ".."))
_SOURCE = os.path.join(_HERE, "cuda", "device_primitives.cu")
_TIMEOUT_NS = 30 * 10**9  # a hang in (a) or (b) becomes a trap with a message, not a stuck job


def _nvcc():
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    candidate = os.path.join(home, "bin", "nvcc")
    return candidate if os.access(candidate, os.X_OK) else shutil.which("nvcc")


def _build(nvcc: str, out_dir: str) -> tuple[str | None, str]:
    major, minor = torch.cuda.get_device_capability()
    lib = os.path.join(out_dir, "device_primitives.so")
    cmd = [nvcc, f"-arch=sm_{major}{minor}", "-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC", "-I",
           os.path.join(_ROOT, "csrc", "include"), _SOURCE, "-o", lib]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        return None, f"{' '.join(cmd)}\n{proc.stdout}{proc.stderr}"
    return lib, ""


def _declare(lib):
    u64, ptr, i32 = ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int
    lib.tdist_test_symmetric_map_size.restype = i32
    lib.tdist_test_error_name.argtypes, lib.tdist_test_error_name.restype = [i32], ctypes.c_char_p
    lib.tdist_test_produce.argtypes = [ptr, ptr, i32, i32, i32, u64, ctypes.c_char_p, ptr]
    lib.tdist_test_consume.argtypes = [ptr, ptr, ptr, i32, i32, u64, u64, ctypes.c_char_p, ptr]
    lib.tdist_test_ping_pong.argtypes = [ptr, i32, u64, ctypes.c_char_p, ptr]
    for fn in (lib.tdist_test_produce, lib.tdist_test_consume, lib.tdist_test_ping_pong):
        fn.restype = i32
    return lib


@pytest.fixture(scope="module")
def build():
    """(path of this rank's library, loaded CDLL): one nvcc build per rank, into its own directory."""
    nvcc = _nvcc()
    have = [None] * dist.get_world_size()
    dist.all_gather_object(have, nvcc is not None)
    if not all(have):
        pytest.skip(f"nvcc not found on ranks {[r for r, h in enumerate(have) if not h]} "
                    "(set CUDA_HOME or put nvcc on PATH)")
    out_dir = tempfile.mkdtemp(prefix=f"tdist-device-cuh-rank{tdist.rank()}-")
    try:
        path, log = _build(nvcc, out_dir)
        all_ranks_agree(path is not None, f"nvcc failed on rank {tdist.rank()}: {log[-4000:]}")
        lib = _declare(ctypes.CDLL(path))
        all_ranks_agree(lib.tdist_test_symmetric_map_size() == ctypes.sizeof(SymmetricMap),
                        "SymmetricMap size differs between C++ and Python")
        yield path, lib
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)


def _check(lib, err: int, what: str) -> None:
    if err != 0:
        raise RuntimeError(f"{what}: {lib.tdist_test_error_name(err).decode()}")


def _skip_unless_reachable(pe: int | None) -> None:
    """Skip on every rank unless each rank can reach its `pe` with loads and stores (same node)."""
    reachable = [None] * dist.get_world_size()
    dist.all_gather_object(reachable, pe is None or symmetric_map().base[pe] != 0)
    if not all(reachable):
        pytest.skip(f"ranks {[r for r, ok in enumerate(reachable) if not ok]} cannot map their peer "
                    "(another node): symm_at needs NVLink/PCIe peer mappings")


def _expected_tiles(epoch: int, num_tiles: int, tile_elems: int) -> torch.Tensor:
    tile = torch.arange(num_tiles, device="cuda", dtype=torch.int64).repeat_interleave(tile_elems)
    elem = torch.arange(tile_elems, device="cuda", dtype=torch.int64).repeat(num_tiles)
    return (epoch << 32) | (tile << 16) | elem


def test_every_tile_read_is_fresh(build):
    # Each rank writes num_tiles tiles into its right neighbour's inbox (st through symm_at), then
    # notify_block per tile; the neighbour's consumer, on another stream, wait_blocks per tile and
    # copies it out. Values encode (epoch, tile, element): a tile read before its
    # signal still holds the previous epoch's values (or, in the first round, zeros).
    _, lib = build
    me, world = tdist.rank(), tdist.world_size()
    right = (me + 1) % world
    _skip_unless_reachable(right)
    num_tiles, tile_elems = 64, 1024
    inbox = tdist.symm_zeros((num_tiles * tile_elems,), torch.int64)
    pad = tdist.SignalPad(num_tiles)
    out = torch.empty(num_tiles * tile_elems, device="cuda", dtype=torch.int64)
    m = symmetric_map_bytes()
    producer_stream = torch.cuda.current_stream()
    consumer_stream = torch.cuda.Stream()
    # Load the module and both kernels (epoch 0 returns at once) before any consumer spins:
    # loading a module may wait for the device, which would wait on the spinning consumer.
    _check(lib, lib.tdist_test_produce(inbox.data_ptr(), pad.signals.data_ptr(), right, num_tiles, tile_elems, 0,
                                       m, producer_stream.cuda_stream), "produce (warm-up)")
    _check(lib, lib.tdist_test_consume(inbox.data_ptr(), pad.signals.data_ptr(), out.data_ptr(), num_tiles,
                                       tile_elems, 0, _TIMEOUT_NS, m, consumer_stream.cuda_stream),
           "consume (warm-up)")
    torch.cuda.synchronize()
    tdist.barrier()
    bad = []
    for _ in range(200):
        epoch = pad.next_epoch()
        expected = _expected_tiles(epoch, num_tiles, tile_elems)  # before the consumer spins
        out.fill_(-1)
        poisoned = torch.cuda.Event()
        poisoned.record(producer_stream)
        # The producer is enqueued first: under MPS two streams of one process may share one work
        # queue (docs/getting-started.md), and a consumer ahead of it there would hold it back while
        # waiting for the left neighbour, whose producer waits the same way: a ring of waits. The
        # consumer still races its left neighbour's producer, in another process.
        _check(lib, lib.tdist_test_produce(inbox.data_ptr(), pad.signals.data_ptr(), right, num_tiles, tile_elems,
                                           epoch, m, producer_stream.cuda_stream), "produce")
        consumer_stream.wait_event(poisoned)  # the poison lands before the copy
        _check(lib, lib.tdist_test_consume(inbox.data_ptr(), pad.signals.data_ptr(), out.data_ptr(), num_tiles,
                                           tile_elems, epoch, _TIMEOUT_NS, m, consumer_stream.cuda_stream),
               "consume")
        torch.cuda.synchronize()
        if not torch.equal(out, expected):
            wrong = (out != expected).nonzero().flatten()
            bad.append(f"epoch {epoch}: {wrong.numel()} wrong, first at {int(wrong[0])}: "
                       f"{int(out[wrong[0]]):#x} != {int(expected[wrong[0]]):#x}")
        tdist.barrier()  # nobody overwrites an inbox before its owner has checked it
    all_ranks_agree(not bad, f"a consumer read a stale or early tile: {bad[:3]}")


def test_ping_pong_10000_rounds(build):
    _, lib = build
    if tdist.world_size() < 2:
        pytest.skip("ping-pong needs two ranks")
    me = tdist.rank()
    _skip_unless_reachable(1 - me if me < 2 else None)
    pad = tdist.SignalPad(1)
    m = symmetric_map_bytes()
    stream = torch.cuda.current_stream()
    rounds = 10_000
    if me < 2:  # ranks 0 and 1 play; any others only check in
        _check(lib, lib.tdist_test_ping_pong(pad.signals.data_ptr(), 0, _TIMEOUT_NS, m, stream.cuda_stream),
               "ping_pong (warm-up)")
    torch.cuda.synchronize()
    tdist.barrier()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    if me < 2:
        start.record()
        _check(lib, lib.tdist_test_ping_pong(pad.signals.data_ptr(), rounds, _TIMEOUT_NS, m, stream.cuda_stream),
               "ping_pong")
        stop.record()
    torch.cuda.synchronize()
    final = int(pad.signals.view(torch.int64)[0])
    all_ranks_agree(me >= 2 or final == rounds, f"rank {me}: flag ended at {final}, expected {rounds}")
    if me == 0:
        print(f"\ndevice.cuh ping-pong: {rounds} round trips, {start.elapsed_time(stop) * 1000 / rounds:.2f} us each")
    tdist.barrier()


_TIMEOUT_CHILD = textwrap.dedent("""
    import ctypes, sys
    lib = ctypes.CDLL(sys.argv[1])
    lib.tdist_test_wait_timeout.argtypes = [ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint64,
                                            ctypes.c_int]
    lib.tdist_test_error_name.restype = ctypes.c_char_p
    err = lib.tdist_test_wait_timeout(int(sys.argv[2]), 5, 7, 200_000_000, 3)
    print("CUDA error:", err, lib.tdist_test_error_name(err).decode(), flush=True)
    sys.exit(0 if err == 0 else 1)
""")


def test_wait_times_out_with_a_message(build):
    # A separate process: the trap leaves its CUDA context unusable. Only rank 0 runs it; the
    # others wait for the verdict. The child waits (as "rank 3") for signal value 7 on a signal
    # holding 5, with a 200 ms timeout.
    skip_if_ranks_share_gpus()
    path, _ = build
    ok, why = True, ""
    if tdist.rank() == 0:
        t0 = time.monotonic()
        try:
            proc = subprocess.run([sys.executable, "-c", _TIMEOUT_CHILD, path, str(torch.cuda.current_device())],
                                  capture_output=True, text=True, timeout=60)
            output, code = proc.stdout + proc.stderr, proc.returncode
        except subprocess.TimeoutExpired as e:
            output, code = f"{e.stdout or ''}{e.stderr or ''}", None
        elapsed = time.monotonic() - t0
        ok = code == 1 and "CUDA error:" in output and elapsed < 30
        why = f"exit {code} after {elapsed:.1f} s; output:\n{output[-3000:]}"
        # The kernel's printf lives in a device buffer that the driver copies out at
        # synchronisation; after a trap that copy is not guaranteed by CUDA's documentation. So the
        # message is required to be right when present, and only reported when absent.
        if "wait timed out" in output:
            ok = ok and ("rank 3: wait timed out after 200000000 ns on signal 0" in output
                         and "expected >= 7, observed 5" in output)
        else:
            print(f"\nnote: the trapped kernel's printf did not reach the output ({why})")
    all_ranks_agree(ok, f"a timed-out wait did not end in a CUDA error with its message: {why}")
