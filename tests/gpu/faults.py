"""Fault checks (one op per launch: a trap ends the CUDA context):

    TRITON_DIST_WAIT_TIMEOUT_NS=2000000000 torchrun --nproc-per-node=N tests/gpu/faults.py stops-calling OP
    TRITON_DIST_WAIT_TIMEOUT_NS=2000000000 python3 tests/gpu/faults.py launch N killed-rank OP

``killed-rank``: as ``stops-calling``, but the last rank kills itself with SIGKILL (an OOM kill, a
crash) instead of sleeping. Not under torchrun, which SIGTERMs every other rank as soon as one
dies: ``launch`` starts the N ranks itself and checks that each survivor printed its PASS (its
error within the timeout) and that all of them ended.

``stops-calling``: every rank makes three calls of ``OP`` (all_reduce, all_gather, reduce_scatter,
ag_gemm, gemm_rs, gemm_ar), then the last rank skips the fourth while the others make it. The others'
waits must time out (the runtime's report names the signal on stderr) and their call must raise
within the wait timeout plus a few seconds; the skipping rank sleeps past that and leaves. Every
rank prints ``PASS stops-calling OP`` (the others with the time to the error) and exits 0, so that
torchrun ends.
"""

import ctypes
import os
import signal
import sys
import time

import torch

import triton_dist as tdist
from triton_dist import ops

SLACK_S = 10.0
"""How long past the wait timeout a rank may take to see its error: the watcher's poll, the
trap reaching the host, a loaded machine."""


def _inputs(op: str):
    """The call of ``op`` on small fresh inputs (a closure)."""
    world = tdist.world_size()
    g = torch.Generator(device="cuda").manual_seed(tdist.rank())
    x = torch.randn((4 * world, 1024), device="cuda", generator=g)
    a = torch.randn((128 * world, 256), device="cuda", generator=g).bfloat16()
    b = torch.randn((256, 256), device="cuda", generator=g).bfloat16()
    calls = {"all_reduce": lambda: ops.all_reduce(x), "all_gather": lambda: ops.all_gather(x),
             "reduce_scatter": lambda: ops.reduce_scatter(x), "ag_gemm": lambda: ops.ag_gemm(a[:128], b),
             "gemm_rs": lambda: ops.gemm_rs(a, b), "gemm_ar": lambda: ops.gemm_ar(a[:16].contiguous(), b)}
    return calls[op]


def _leave(code: int) -> None:
    # After a trap the CUDA context is gone: no teardown (finalize would touch it); flush C stdio
    # first (the runtime's watcher printed the timeout report to stderr).
    sys.stdout.flush()
    sys.stderr.flush()
    ctypes.CDLL(None).fflush(None)
    os._exit(code)


def stops_calling(op: str, killed: bool = False) -> None:
    tdist.init(heap_size="256M")
    if tdist.world_size() < 2:
        raise SystemExit("faults.py stops-calling: needs two ranks or more (one skips, the others wait)")
    timeout_s = tdist.get_config().wait_timeout_ns / 1e9
    if not 0 < timeout_s <= 10:
        raise SystemExit(f"faults.py: set TRITON_DIST_WAIT_TIMEOUT_NS to at most 10 s (got {timeout_s} s)")
    call = _inputs(op)
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    tdist.barrier()
    me, last = tdist.rank(), tdist.world_size() - 1
    if me == last:
        if killed:
            print(f"PASS killed-rank {op}: rank {me} kills itself", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(timeout_s + SLACK_S + 1)  # past the others' deadline: they time out meanwhile
        print(f"PASS stops-calling {op}: rank {me} skipped the call", flush=True)
        _leave(0)
    mode = "killed-rank" if killed else "stops-calling"
    start = time.monotonic()
    try:
        call()
        torch.cuda.synchronize()
    except RuntimeError as error:
        elapsed = time.monotonic() - start
        first = str(error).splitlines()[0]
        ok = elapsed <= timeout_s + SLACK_S
        print(f"{'PASS' if ok else 'FAIL'} {mode} {op}: rank {me} raised after {elapsed:.1f} s "
              f"(wait timeout {timeout_s:.1f} s): {first}", flush=True)
        _leave(0 if ok else 1)
    print(f"FAIL {mode} {op}: rank {me}'s call returned though rank {last} never made it", flush=True)
    _leave(1)


def launch(world: int, mode: str, op: str) -> int:
    """Start ``world`` ranks of ``mode`` ``op`` (this file, torchrun's environment without torchrun)
    and wait for them all; 0 if every rank that should print PASS did and none outlived its limit."""
    import socket
    import subprocess

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    timeout_s = float(os.environ.get("TRITON_DIST_WAIT_TIMEOUT_NS", "0")) / 1e9
    limit = 90 + timeout_s + 3 * SLACK_S  # start-up and compiles, the timeout, the slack
    ranks = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                   LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        partitions = os.environ.get("TDIST_MPS_SM_PARTITIONS", "").split()  # scripts/mps-rank's job
        if partitions:
            env["CUDA_MPS_SM_PARTITION"] = partitions[rank % len(partitions)]
        ranks.append(subprocess.Popen([sys.executable, __file__, mode, op], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    start, outputs, failed = time.monotonic(), [], False
    for rank, process in enumerate(ranks):
        try:
            out, _ = process.communicate(timeout=max(1.0, limit - (time.monotonic() - start)))
        except subprocess.TimeoutExpired:
            process.kill()
            out, _ = process.communicate()
            out += f"\nrank {rank} still ran after {limit:.0f} s: killed\n"
            failed = True
        outputs.append(out)
        print(out, end="", flush=True)
    passed = sum(f"PASS {mode} {op}" in out for out in outputs)
    if passed != world:
        print(f"FAIL {mode} {op}: {passed} of {world} ranks passed", flush=True)
    return 1 if failed or passed != world else 0


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "launch":
        sys.exit(launch(int(sys.argv[2]), sys.argv[3], sys.argv[4]))
    if len(sys.argv) != 3 or sys.argv[1] not in ("stops-calling", "killed-rank"):
        raise SystemExit(__doc__)
    stops_calling(sys.argv[2], killed=sys.argv[1] == "killed-rank")
