"""triton_dist.language on the GPUs: ping-pong, fresh tiles under software pipelining and TMA,
wait timeouts, and the tutorials (ring AllReduce, put/get) against torch."""

import importlib.util
import os
import re
import socket
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

import triton_dist as tdist
import triton_dist.language as dl
from conftest import all_ranks_agree, skip_if_ranks_share_gpus

_ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "..")


def _tutorial(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(_ROOT, "tutorials", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _value(epoch, k):
    """What tile k holds in call `epoch`: small integers, exact in bf16 and in fp32 sums."""
    return (epoch + k) % 7 + 1


@tdist.jit(do_not_specialize=["epoch"])
def produce_tiles(a, signals, peer, epoch, rows, BK: tl.constexpr, K_TILES: tl.constexpr):
    k = tl.program_id(0)
    r = tl.arange(0, 64)
    c = tl.arange(0, BK)
    value = ((epoch + k) % 7 + 1).to(tl.bfloat16)
    remote = dl.symm_at(a, peer)
    for m in range(0, rows, 64):
        tl.store(remote + (m + r)[:, None] * (K_TILES * BK) + k * BK + c[None, :], tl.full([64, BK], 0, tl.bfloat16) +
                 value)
    dl.notify(signals + k, peer, epoch, "set", "intra_node")


@tdist.jit(do_not_specialize=["epoch", "k_tiles"])
def consume_tiles(a, signals, out, stale, epoch, k_tiles, BM: tl.constexpr, BK: tl.constexpr,
                  NUM_STAGES: tl.constexpr, TMA: tl.constexpr):
    # A GEMM-shaped consumer: the tile loads feed a dot, so Triton pipelines them NUM_STAGES deep;
    # every tile is also checked against the value of this call's epoch.
    pid = tl.program_id(0)
    rows = pid * BM + tl.arange(0, BM)
    cols = tl.arange(0, BK)
    acc = tl.zeros([BM, 16], tl.float32)
    bad = 0
    for k in tl.range(0, k_tiles, num_stages=NUM_STAGES):
        token = dl.wait(signals + k, 1, "sys", "acquire", epoch, pred=k < k_tiles)
        if TMA:
            tile = dl.consume_token(a, token).load([pid * BM, k * BK])
        else:
            tile = tl.load(dl.consume_token(a + rows[:, None] * (k_tiles * BK) + k * BK + cols[None, :], token))
        acc = tl.dot(tile, tl.full([BK, 16], 1.0, tl.bfloat16), acc)
        expected = ((epoch + k) % 7 + 1).to(tl.float32)
        bad += tl.sum(tl.sum((tile.to(tl.float32) != expected).to(tl.int32), 1), 0)
    tl.store(out + rows[:, None] * 16 + tl.arange(0, 16)[None, :], acc)
    tl.atomic_add(stale, bad)


def test_ping_pong_10000_rounds():
    ok, us = _tutorial("02_notify_wait").run(rounds=10_000)
    all_ranks_agree(ok, "the ping-pong flag did not end at the last round's value")
    if tdist.rank() == 0:
        print(f"\nping-pong: one-signal round trip {us:.2f} us (10,000 rounds, one launch)")


@pytest.mark.parametrize("num_stages,tma", [(1, False), (2, False), (3, False), (4, False), (1, True), (3, True)])
def test_every_tile_read_is_fresh(num_stages, tma):
    # Each rank produces K_TILES tiles into its right neighbour's A; the neighbour's consumer,
    # launched first on its own stream, waits per tile inside a software-pipelined loop. A tile
    # read early (before its signal, or the previous call's data) is counted and fails the test.
    me, world = tdist.rank(), tdist.world_size()
    right = (me + 1) % world
    m, bm, bk, k_tiles = 128, 64, 64, 32
    a = tdist.symm_zeros((m, k_tiles * bk), torch.bfloat16)
    pad = tdist.SignalPad(k_tiles)
    out = torch.empty((m, 16), device="cuda")
    stale = torch.zeros(1, device="cuda", dtype=torch.int32)
    source = TensorDescriptor.from_tensor(a, [bm, bk]) if tma else a
    consumer_stream = torch.cuda.Stream()

    def consume(epoch):
        consume_tiles[(m // bm, )](source, pad.signals, out, stale, epoch, k_tiles, BM=bm, BK=bk,
                                   NUM_STAGES=num_stages, TMA=tma)

    def produce(epoch):
        produce_tiles[(k_tiles, )](a, pad.signals, right, epoch, m, BK=bk, K_TILES=k_tiles)

    # Load both kernels before any consumer can spin (epoch 0 is satisfied by the zeroed pad).
    consume(0)
    produce(0)
    torch.cuda.synchronize()
    tdist.barrier()
    weights = torch.arange(k_tiles, device="cuda")
    failures = []
    for _ in range(200):
        epoch = pad.next_epoch()
        out.fill_(float("nan"))
        stale.zero_()
        consumer_stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(consumer_stream):  # the consumer first: it must wait, not read early
            consume(epoch)
        produce(epoch)
        torch.cuda.current_stream().wait_stream(consumer_stream)
        torch.cuda.synchronize()
        expected_row_sum = float(bk * ((epoch + weights) % 7 + 1).sum())
        if int(stale) != 0 or not torch.all(out == expected_row_sum):
            failures.append((epoch, int(stale)))
        tdist.barrier()  # nobody overwrites a tile its neighbour has not finished reading
    all_ranks_agree(not failures, f"stale or early tile reads (epoch, stale elements): {failures[:5]}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_wait_that_never_completes_times_out():
    # In a separate single-rank process: the trap ends that process's CUDA context.
    skip_if_ranks_share_gpus()
    ok, why = True, ""
    if tdist.rank() == 0:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHELASTIC", "GROUP_", "ROLE_"))}
        env.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(_free_port()), CUDA_VISIBLE_DEVICES=str(torch.cuda.current_device()))
        script = os.path.join(os.path.dirname(__file__), "..", "lifecycle.py")
        try:
            run = subprocess.run([sys.executable, script, "wait-timeout"], env=env, capture_output=True, text=True,
                                 timeout=120)
            output = run.stdout + run.stderr
            # The report names the rank, the signal (the wait's first and only one) and the values.
            reported = re.search(r"rank 0: wait timed out after \d+ ns on signal 0 at 0x[0-9a-f]+: "
                                 r"expected >= 7, observed 5 \(signal 2 of wait-timeout check's pad: seven\[0\]\)",
                                 output)
            ok = run.returncode == 0 and "PASS wait-timeout" in output and reported is not None
            why = output[-3000:]
            if ok:
                print("\n" + "\n".join(line for line in output.splitlines() if "timed out" in line or "PASS" in line))
        except subprocess.TimeoutExpired as e:
            ok, why = False, f"the timed-out wait hung its process: {e}"
    all_ranks_agree(ok, f"wait timeout: {why}")


@pytest.mark.parametrize("numel,dtype", [(1_000_003, torch.float32), (77_777, torch.bfloat16), (5, torch.float32)])
def test_ring_all_reduce_matches_torch(numel, dtype):
    ok = _tutorial("03_ring_allreduce").check(numel=numel, rounds=100, dtype=dtype)
    all_ranks_agree(ok, f"ring AllReduce of {numel} {dtype} differs from torch.distributed.all_reduce")


def test_put_and_get_tutorial():
    results = _tutorial("04_put_get").check(rounds=50)
    all_ranks_agree(all(results.values()), f"transfers that delivered wrong data: {results}")


def test_copy_engine_pipeline_tutorial():
    ok = _tutorial("06_copy_engine_pipeline").check(numel=1_000_003, rounds=40)
    all_ranks_agree(ok, "copy-engine pipeline tutorial: wrong data, or a flag left set")


def test_world_matches_torch():
    all_ranks_agree(dist.get_world_size() == tdist.world_size(), "world sizes differ")
