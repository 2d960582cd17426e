"""Tutorial 05: the torch-facing ops - collectives and overlapped GEMMs - in a tensor-parallel MLP.

    torchrun --nproc-per-node=2 tutorials/05_ops.py

A tensor-parallel MLP block, ``y = relu(x @ W1.T) @ W2.T`` with ``W1`` split by rows (columns of
the hidden activation) and ``W2`` by columns (its contraction), written three ways, each checked
against the same computation in fp32, its collectives through host memory
(:mod:`triton_dist.host_collectives`: exact, and free of NCCL, so it runs with several ranks per GPU):

1. prefill, sequence-parallel input: ``ops.ag_gemm`` gathers every rank's rows of ``x`` while
   multiplying by this rank's ``W1`` shard, and ``ops.gemm_rs`` multiplies by the ``W2`` shard
   while reduce-scattering the result back to this rank's rows; then ``ag_gemm`` again with each
   of the gather's producers (an ``AllGatherGemmContext`` passed as ``context``);
2. decode (a few rows, replicated input): the first GEMM needs no communication, and
   ``ops.gemm_ar`` multiplies by the ``W2`` shard and all-reduces in one kernel, with the same
   bits on every rank;
3. the same decode step captured in a CUDA graph and replayed (contexts are created by a first,
   uncaptured call: creating one is collective and allocates symmetric memory).

Then the plain collectives: ``ops.all_reduce``, ``ops.all_gather`` (also into a symmetric output,
which the zero-copy methods write directly) and ``ops.reduce_scatter``; and eager loops of one
small all_reduce and of the prefill MLP with the overlapped GEMMs' few-launch methods, whose
repeated calls replay the first ones' recorded launches.

Every op is collective: each rank makes the same calls with the same shapes.
"""

import torch

import triton_dist as tdist
from triton_dist import host_collectives, ops


def _randn(*shape, seed, dtype=torch.bfloat16, same_on_every_rank=False):
    g = torch.Generator(device="cuda")
    g.manual_seed(seed if same_on_every_rank else seed * 1009 + tdist.rank())
    return (torch.randn(*shape, device="cuda", generator=g) / shape[-1] ** 0.25).to(dtype)


def _close(got, want, what: str) -> bool:
    err = ((got.float() - want).abs().max() / want.abs().max().clamp_min(1e-6)).item()
    ok = err < 2e-2  # bf16 rounding of the intermediate and the output
    if tdist.rank() == 0 or not ok:
        print(f"rank {tdist.rank()}: {what}: max relative error {err:.2e} {'ok' if ok else 'TOO LARGE'}")
    return ok


def mlp_prefill(x_rows, w1_shard, w2_shard) -> bool:
    """Sequence-parallel prefill: ``x_rows`` is this rank's ``[m, d]`` rows of the sequence."""
    h = torch.relu(ops.ag_gemm(x_rows, w1_shard))  # [world * m, f / world]: every row, this rank's columns
    y = ops.gemm_rs(h, w2_shard)  # [m, d]: this rank's rows, summed over every rank's columns
    torch.cuda.synchronize()
    # The reference: gather the rows, both GEMMs in fp32, sum the partial products over ranks.
    x_all = host_collectives.all_gather(x_rows)
    partial = torch.relu(x_all.float() @ w1_shard.float().T).to(x_rows.dtype).float() @ w2_shard.float().T
    return _close(y, host_collectives.reduce_scatter(partial), "prefill: ag_gemm + gemm_rs")


def check_ag_gemm_producers(x_rows, w1_shard) -> bool:
    """The gather's producer is a context's choice: the copy engine pushes the rows by default;
    ``"sm_push"`` has a kernel on a few SMs push them instead (one launch, lower latency, SMs
    taken from the GEMM); ``"ce_pull"`` has each rank's copy engine fetch the peers' rows;
    ``"sm_push_inline"`` has the GEMM's own programs push first (one launch a call on the caller's
    stream, no side stream: for eager calls whose host time exceeds their GPU time)."""
    from triton_dist.kernels import AllGatherGemmContext

    want = ops.ag_gemm(x_rows, w1_shard)
    ok = True
    for producer in ("sm_push", "ce_pull", "sm_push_inline"):
        ctx = AllGatherGemmContext(x_rows.shape[0], x_rows.shape[1], x_rows.dtype, method=producer)  # collective
        ok &= _close(ops.ag_gemm(x_rows, w1_shard, context=ctx), want.float(), f"ag_gemm, producer {producer}")
    return ok


def mlp_decode(x, w1_shard, w2_shard, out=None):
    """Decode: ``x`` ``[m, d]``, the same on every rank; returns ``[m, d]`` on every rank."""
    h = torch.relu(torch.matmul(x, w1_shard.T))  # no communication: this rank's hidden columns
    return ops.gemm_ar(h, w2_shard, out=out)


def decode_reference(x, w1_shard, w2_shard):
    partial = torch.relu(x.float() @ w1_shard.float().T).to(x.dtype).float() @ w2_shard.float().T
    return host_collectives.all_reduce(partial)


def check_decode(x, w1_shard, w2_shard) -> bool:
    y = mlp_decode(x, w1_shard, w2_shard)
    torch.cuda.synchronize()
    same = host_collectives.same_on_every_rank(y)
    if not same:
        print(f"rank {tdist.rank()}: decode results differ between ranks")
    return _close(y, decode_reference(x, w1_shard, w2_shard), "decode: gemm_ar") and same


def check_decode_graph(x, w1_shard, w2_shard) -> bool:
    static_x = x.clone()
    out = torch.empty_like(x)
    mlp_decode(static_x, w1_shard, w2_shard, out=out)  # creates the context, uncaptured
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    # thread_local: another thread's CUDA calls (a process group's watchdog) must not break the capture.
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        mlp_decode(static_x, w1_shard, w2_shard, out=out)
    ok = True
    for step in range(5):
        static_x.copy_(_randn(*x.shape, seed=900 + step, same_on_every_rank=True))
        graph.replay()
        torch.cuda.synchronize()
        ok &= _close(out, decode_reference(static_x, w1_shard, w2_shard), f"decode in a CUDA graph, replay {step}")
    return ok


def check_collectives() -> bool:
    world = tdist.world_size()
    x = _randn(1_000_003, seed=7, dtype=torch.float32)
    want = host_collectives.all_reduce(x)
    ok = _close(ops.all_reduce(x), want, "all_reduce")

    rows = _randn(4099, 8, seed=8, dtype=torch.float32)
    want = host_collectives.all_gather(rows)
    ok &= _close(ops.all_gather(rows), want, "all_gather")
    symmetric_out = tdist.symm_empty((world * 4099, 8), torch.float32)  # on the heap: peers write it directly
    ok &= _close(ops.all_gather(rows, out=symmetric_out, method="sm_zero_copy"), want, "all_gather, zero-copy")

    full = _randn(world * 1000, 16, seed=9, dtype=torch.float32)
    want = host_collectives.reduce_scatter(full)
    ok &= _close(ops.reduce_scatter(full), want, "reduce_scatter")
    return ok


def check_eager_loop() -> bool:
    """An eager loop of one small all_reduce, as a decode step makes: after the first call of a
    shape (the full path: context, method, checks), each call like it replays the launch recorded
    then (:mod:`triton_dist.eager_calls`), checking only the tensors. Host µs per call printed."""
    import time

    from triton_dist import eager_calls

    x = _randn(4096, seed=11)  # 8 KiB of bf16
    out = torch.empty_like(x)
    want = host_collectives.all_reduce(x.float())
    ops.all_reduce(x, out=out)  # the full path, recorded
    torch.cuda.synchronize()
    tdist.barrier()
    start = time.perf_counter()
    for _ in range(100):
        ops.all_reduce(x, out=out)  # replayed
    issue_us = (time.perf_counter() - start) * 1e6 / 100
    torch.cuda.synchronize()
    if tdist.rank() == 0:
        print(f"rank 0: 100 eager all_reduce calls: {issue_us:.1f} us of host time each to issue, "
              f"{eager_calls.plans()} call(s) recorded for replay", flush=True)
    return _close(out, want, "all_reduce, 100 eager calls")


def check_eager_mlp_loop(x_rows, w1_shard, w2_shard) -> bool:
    """The prefill MLP in an eager loop with the few-launch methods (``ag_gemm``'s
    ``"sm_push_inline"`` and ``gemm_rs``'s ``"fused"``, one launch a call each): after a step's first
    calls, each later step replays both ops' recorded launches. Host µs per step printed, the last
    step's result checked."""
    import time

    def step():
        h = torch.relu(ops.ag_gemm(x_rows, w1_shard, method="sm_push_inline"))
        return ops.gemm_rs(h, w2_shard, method="fused")

    step()  # the full paths, recorded
    torch.cuda.synchronize()
    tdist.barrier()
    start = time.perf_counter()
    for _ in range(20):
        y = step()
    issue_us = (time.perf_counter() - start) * 1e6 / 20
    torch.cuda.synchronize()
    if tdist.rank() == 0:
        print(f"rank 0: 20 eager MLP steps (ag_gemm sm_push_inline, relu, gemm_rs fused): {issue_us:.1f} us of "
              f"host time each to issue", flush=True)
    x_all = host_collectives.all_gather(x_rows)
    partial = torch.relu(x_all.float() @ w1_shard.float().T).to(x_rows.dtype).float() @ w2_shard.float().T
    return _close(y, host_collectives.reduce_scatter(partial), "prefill MLP, 20 eager steps")


def run_all() -> bool:
    """Every check of this tutorial (an initialised runtime needed); True when all passed."""
    world = tdist.world_size()
    d, f, m = 1024, 4096, 256  # model width, MLP width, rows per rank
    w1_shard = _randn(f // world, d, seed=1)  # this rank's rows of W1 [f, d]
    w2_shard = _randn(d, f // world, seed=2)  # this rank's columns of W2 [d, f]
    x_rows = _randn(m, d, seed=3)
    ok = mlp_prefill(x_rows, w1_shard, w2_shard)
    ok &= check_ag_gemm_producers(x_rows, w1_shard)
    decode_x = _randn(8, d, seed=4, same_on_every_rank=True)
    ok &= check_decode(decode_x, w1_shard, w2_shard)
    ok &= check_decode_graph(decode_x, w1_shard, w2_shard)
    ok &= check_collectives()
    ok &= check_eager_loop()
    ok &= check_eager_mlp_loop(x_rows, w1_shard, w2_shard)
    tdist.barrier()
    ops.clear_contexts()
    return ok


def main():
    tdist.init()
    rank = tdist.rank()
    ok = run_all()
    tdist.finalize()
    print(f"rank {rank}: tutorial 05 {'passed' if ok else 'FAILED'}")
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
