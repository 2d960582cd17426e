"""Lifecycle checks that cannot share a process with the pytest session (run under torchrun).

    torchrun --nproc-per-node=N tests/gpu/lifecycle.py exit-without-finalize
    torchrun --nproc-per-node=N tests/gpu/lifecycle.py world-size-mismatch

Each mode prints "PASS <mode>" on every rank and exits 0, or raises.
"""

import os
import sys

import torch

import triton_dist as tdist


def exit_without_finalize() -> None:
    # Symmetric tensors alive at interpreter exit, no finalize(): the process must still exit.
    tdist.init(heap_size="256M")
    x = tdist.symm_zeros((1 << 20,), torch.float32)
    torch.cuda.synchronize()
    tdist.barrier()  # every rank zeroed before its neighbour writes
    peer = tdist.peer_tensor(x, (tdist.rank() + 1) % tdist.world_size())
    peer.fill_(1.0)
    torch.cuda.synchronize()
    tdist.barrier()
    assert float(x.sum()) == float(1 << 20)
    globals()["kept_alive"] = (x, peer)


def world_size_mismatch() -> None:
    tdist.init(heap_size="256M")
    tdist.finalize()
    assert not tdist.is_initialized()
    import torch.distributed as dist

    dist.init_process_group(backend="cpu:gloo,cuda:nccl")  # the real world, then a wrong environment
    real = os.environ["WORLD_SIZE"]
    os.environ["WORLD_SIZE"] = str(int(real) + 1)
    try:
        tdist.init()
        raise AssertionError("init accepted a WORLD_SIZE that disagrees with the process group")
    except RuntimeError as e:
        assert "WORLD_SIZE=" in str(e), e
    finally:
        os.environ["WORLD_SIZE"] = real
    assert not tdist.is_initialized()


if __name__ == "__main__":
    mode = sys.argv[1]
    {"exit-without-finalize": exit_without_finalize, "world-size-mismatch": world_size_mismatch}[mode]()
    print(f"PASS {mode} rank {os.environ.get('RANK')}", flush=True)
