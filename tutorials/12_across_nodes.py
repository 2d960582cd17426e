"""Tutorial 12: collectives across nodes - within a node over NVLink, between nodes only by
NVSHMEM put-with-signal - proven on one host by declaring nodes.

    TRITON_DIST_LOCAL_WORLD_SIZE=2 torchrun --nproc-per-node=4 tutorials/12_across_nodes.py

``TRITON_DIST_LOCAL_WORLD_SIZE=L`` makes the runtime treat every block of ``L`` consecutive ranks
as one node (``tdist.node()``, ``tdist.num_nodes()``), whatever the hosts are. The ``"2d"``
methods then keep every load and store inside a node and send across nodes only with
``dl.shmem.putmem_signal_block`` (NVSHMEM carries the data, then sets the receiver's signal):

- ``all_gather(method="2d")``: each rank puts its input to the rank of its local index on every
  other node, then every rank forwards what it received to the ranks of its node;
- ``reduce_scatter(method="2d")``: the ranks of a node first sum each shard among themselves,
  then each rank puts its node's fp32 partial of the other nodes' shards to their owners;
- ``all_reduce(method="2d")``: the two above, one after the other.

Across several nodes ``"auto"`` picks them. At one node they are the push methods. On one host
the puts travel over NVLink like everything else, so this proves the protocols (and runs with
several ranks per GPU under MPS, scripts/gpu-test --local-world L --ranks-per-gpu K), not the
speed across real nodes, which nothing here has measured.
"""

import torch

import triton_dist as tdist
from triton_dist import host_collectives, ops


def _fresh(n: int, seed: int, dtype=torch.bfloat16):
    g = torch.Generator(device="cuda")
    g.manual_seed(seed * 1009 + tdist.rank())
    return torch.randn(n, device="cuda", generator=g).to(dtype)


def _report(ok: bool, what: str) -> bool:
    if tdist.rank() == 0 or not ok:
        print(f"rank {tdist.rank()}: {what}: {'ok' if ok else 'WRONG'}")
    return ok


def run_all() -> bool:
    """Each ``"2d"`` collective and ``"auto"`` against references through host memory, on fresh
    data with poisoned outputs, back to back."""
    world = tdist.world_size()
    print(f"rank {tdist.rank()}: node {tdist.node()} of {tdist.num_nodes()}, local rank {tdist.local_rank()} "
          f"of {tdist.local_world_size()}")
    ok = True
    for method in ("2d", "auto"):
        for n in (1, 4099, 3 * 2048 * 7 + 5):
            x = _fresh(n, seed=n)
            gathered = torch.full((world * n, ), float("nan"), device="cuda", dtype=x.dtype)
            ops.all_gather(x, out=gathered, method=method)
            ok &= _report(torch.equal(gathered, host_collectives.all_gather(x)), f"all_gather {method} n={n}")

            rows = _fresh(world * n, seed=n + 1)
            shard = torch.full((n, ), float("nan"), device="cuda", dtype=rows.dtype)
            ops.reduce_scatter(rows, out=shard, method=method)
            want = host_collectives.reduce_scatter(rows.float()).to(rows.dtype)
            ok &= _report(torch.allclose(shard.float(), want.float(), rtol=2e-2, atol=1e-2),
                          f"reduce_scatter {method} n={n}")

            total = ops.all_reduce(x, method=method)
            want = host_collectives.all_reduce(x.float()).to(x.dtype)
            same = host_collectives.same_on_every_rank(total)
            ok &= _report(same and torch.allclose(total.float(), want.float(), rtol=2e-2, atol=1e-2),
                          f"all_reduce {method} n={n} (the same bits on every rank: {same})")
    torch.cuda.synchronize()
    tdist.barrier()
    ops.clear_contexts()
    return ok


def main():
    tdist.init()
    rank = tdist.rank()
    ok = run_all()
    tdist.finalize()
    print(f"rank {rank}: tutorial 12 {'passed' if ok else 'FAILED'}")
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
