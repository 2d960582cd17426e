"""CPU self-check: what can be proven without a GPU, in one command.

    python -m triton_dist.selfcheck

1. the C++ core loads and its bootstrap exchanges bytes among several processes over loopback;
2. every bundled device binding compiles for sm_90 with NVSHMEM's bitcode linked in.
Exits non-zero on the first failure.
"""

from __future__ import annotations

import multiprocessing as mp
import sys
import time


def _rank_main(rank: int, world: int, unique_id: str, queue) -> None:
    from triton_dist import _C

    try:
        boot = _C.TcpBootstrap.connect(rank, world, unique_id, timeout_ms=30000)
        for round_ in range(20):
            blobs = boot.allgather(f"{rank}:{round_}".encode() * (rank + 1))
            assert blobs == [f"{r}:{round_}".encode() * (r + 1) for r in range(world)]
        boot.barrier()
        queue.put((rank, "ok"))
    except Exception as e:  # reported to the parent, which fails the check
        queue.put((rank, repr(e)))


def check_bootstrap(world: int = 4) -> str:
    """Run ``world`` processes through the TCP bootstrap's allgathers and barrier; a one-line result."""
    from triton_dist import _C

    root = _C.TcpBootstrap.create_root(world, "127.0.0.1", 0, timeout_ms=30000)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_rank_main, args=(r, world, root.unique_id, queue)) for r in range(1, world)]
    for p in procs:
        p.start()
    for round_ in range(20):
        blobs = root.allgather(f"0:{round_}".encode())
        assert blobs == [f"{r}:{round_}".encode() * (r + 1) for r in range(world)], blobs
    root.barrier()
    results = dict(queue.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(timeout=30)
    bad = {r: v for r, v in results.items() if v != "ok"}
    if bad:
        raise AssertionError(f"bootstrap ranks failed: {bad}")
    return f"TCP bootstrap: {world} processes, 20 allgathers + barrier"


def check_compile() -> str:
    """Compile a kernel that links NVSHMEM's bitcode for sm_90 without a GPU; a one-line
    result."""
    import triton_dist
    from triton_dist.language import shmem
    from triton_dist.tools.compile_check import compile_for_hopper

    @triton_dist.jit
    def ring_put(dst, src, sig, nbytes, epoch):
        peer = (shmem.my_pe() + 1) % shmem.n_pes()
        shmem.putmem_signal_block(dst, src, nbytes, sig, epoch, shmem.SIGNAL_SET, peer)
        shmem.signal_wait_until(sig, shmem.CMP_GE, epoch)

    compiled = compile_for_hopper(ring_put, {"dst": "*u8", "src": "*u8", "sig": "*u64", "nbytes": "i64", "epoch": "u64"})
    assert "nvshmemi_device_state_d" in compiled.asm["ptx"]
    return f"sm_90 compile with NVSHMEM bitcode: {len(compiled.asm['cubin'])} B cubin"


def main() -> int:
    """Run every check, print one line each; 0 when all passed."""
    for check in (check_bootstrap, check_compile):
        start = time.perf_counter()
        try:
            what = check()
        except Exception as e:
            print(f"FAIL  {check.__name__}: {e!r}")
            return 1
        print(f"PASS  {what} ({time.perf_counter() - start:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
