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
- ``all_reduce(method="2d")``: the two above, one after the other;
- ``ag_gemm(method="sm_2d")``: the AllGather across nodes feeding the GEMM as rows land, which
  walks its own node's tiles first;
- ``gemm_rs(method="push_2d")``: each GEMM tile stored in the node rank that gathers its
  destination's node partial, whose reduce kernel sums and puts it across, tile by tile, while
  the GEMM runs (``"2d"``: the GEMM, then ``reduce_scatter`` ``"2d"``).

Across several nodes ``"auto"`` picks the ``"2d"`` collectives, ``"sm_2d"`` and ``gemm_rs``'s ``"2d"``. At one node they are the push methods. On one host
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
    ok &= _overlapped_gemms(world)
    torch.cuda.synchronize()
    tdist.barrier()
    ops.clear_contexts()
    return ok


def _overlapped_gemms(world: int) -> bool:
    """AllGather+GEMM and GEMM+ReduceScatter across nodes against fp32 references through host
    memory (bf16 output: a relative tolerance per element)."""
    ok = True
    m, n, k = 1000, 1024, 512  # m: not a multiple of the 128-row tile
    b = _fresh(n * k, 7).view(n, k)
    for method in ("sm_2d", "auto"):
        for call in range(3):
            a_shard = _fresh(m * k, 100 + call).view(m, k)
            out = torch.full((world * m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
            ops.ag_gemm(a_shard, b, out=out, method=method)
            ref = host_collectives.all_gather(a_shard).float() @ b.float().T
            ok &= _report(_close(out, ref), f"ag_gemm {method} call {call}")
    for method in ("push_2d", "2d", "auto"):
        for call in range(3):
            a = _fresh(world * m * k, 200 + call).view(world * m, k)
            out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
            ops.gemm_rs(a, b, out=out, method=method)
            ref = host_collectives.reduce_scatter(a.float() @ b.float().T)
            ok &= _report(_close(out, ref), f"gemm_rs {method} call {call}")
    return ok


def _close(out, ref) -> bool:
    """Every element within the rounding of bf16 partials and output of the fp32 reference (1 %
    of the element, plus 2 % of the reference's RMS for elements near zero, whose error is the
    partials' rounding), and no NaN left; a missing or stale partial is off by about one RMS."""
    torch.cuda.synchronize()
    rms = ref.pow(2).mean().sqrt()
    return bool(((out.float() - ref).abs() <= 1e-2 * ref.abs() + 2e-2 * rms).all())


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
