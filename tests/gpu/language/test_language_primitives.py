"""The language's newer primitives across ranks: equality waits on 32-bit flags in a ping-pong,
the per-thread barrier of every rank (dl.simt), typed NVSHMEM put/get, team collectives against
the host reference, dl.rank(axis), a stream wait for equality, and peer_tensors. Any world size."""

import pytest
import torch
import triton.language as tl

import triton_dist as tdist
import triton_dist.language as dl
from conftest import all_ranks_agree
from triton_dist import host_collectives
from triton_dist.language import shmem


@tdist.jit(do_not_specialize=["rounds"])
def ping_pong_states(flags, rounds):
    # Pairs (0, 1), (2, 3), ...: the even rank writes odd states into its partner's int32 flag, the
    # odd rank even ones into the even rank's; each waits for equality with the next state.
    me = dl.rank()
    partner = me ^ 1
    if partner < dl.num_ranks():
        for i in range(rounds):
            if me % 2 == 0:
                dl.st(dl.symm_at(flags, partner), 2 * i + 1, "sys", "release")
                dl.wait(flags, 1, "sys", "acquire", 2 * i + 2, cmp="eq")
                # Every thread spins: all must have seen this state before any lets the partner
                # move the flag on (dl.wait's note on cmp="eq").
                tl.debug_barrier()
            else:
                dl.wait(flags, 1, "sys", "acquire", 2 * i + 1, cmp="eq")
                tl.debug_barrier()
                dl.st(dl.symm_at(flags, partner), 2 * i + 2, "sys", "release")


def test_equality_waits_on_int32_flags_ping_pong():
    flags = tdist.symm_zeros((4, ), torch.int32)
    torch.cuda.synchronize()
    tdist.barrier()
    rounds = 2000
    ping_pong_states[(1, )](flags, rounds)
    torch.cuda.synchronize()
    me, world = tdist.rank(), tdist.world_size()
    paired = (me ^ 1) < world
    expected = (2 * rounds if me % 2 == 0 else 2 * rounds - 1) if paired else 0
    all_ranks_agree(int(flags[0]) == expected, f"rank {me}: flag ended at {int(flags[0])}, expected {expected}")
    tdist.barrier()


@tdist.jit(do_not_specialize=["epoch"])
def barrier_exchange(data, signals, out, epoch):
    # Before the barrier each rank writes into its right neighbour; after it, each reads what its
    # left neighbour wrote: right only if the barrier orders every rank's write before every read.
    me = dl.rank()
    right = (me + 1) % dl.num_ranks()
    tl.store(dl.symm_at(data, right), epoch * 1000 + me)
    dl.simt.barrier_all_ranks(signals, epoch)
    tl.store(out, tl.load(data))


def test_per_thread_barrier_of_every_rank():
    me, world = tdist.rank(), tdist.world_size()
    data = tdist.symm_zeros((1, ), torch.int64)
    signals = tdist.symm_zeros((world, ), torch.int64)
    out = torch.zeros(1, dtype=torch.int64, device="cuda")
    barrier_exchange.preload(data, signals, out, 0, grid=(1, ), num_warps=1)
    torch.cuda.synchronize()
    tdist.barrier()
    wrong = []
    for epoch in range(1, 301):
        barrier_exchange[(1, )](data, signals, out, epoch, num_warps=1)
        torch.cuda.synchronize()
        want = epoch * 1000 + (me - 1) % world
        if int(out) != want or int(signals.min()) != epoch:
            wrong.append((epoch, int(out), want))
        tdist.barrier()  # the next round's write must not overtake this round's read
    all_ranks_agree(not wrong, f"per-thread barrier: wrong rounds (epoch, read, expected) {wrong[:4]}")


@tdist.jit
def typed_rma(ints, floats, box, n, BLOCK: tl.constexpr):
    me = dl.rank()
    right = (me + 1) % dl.num_ranks()
    left = (me + dl.num_ranks() - 1) % dl.num_ranks()
    shmem.int32_put_block(ints + BLOCK, ints, n, right)  # my first n ints into right's second block
    if dl.tid(0) == 0:
        shmem.int64_p(box, me + 1000, right)
        tl.store(box + 1, shmem.float_g(floats, left).to(tl.int64, bitcast=False))
    shmem.quiet()


def test_typed_put_and_get():
    me, world = tdist.rank(), tdist.world_size()
    block, n = 1024, 1000
    ints = tdist.symm_zeros((2 * block, ), torch.int32)
    floats = tdist.symm_empty((4, ), torch.float32)
    box = tdist.symm_zeros((2, ), torch.int64)
    ints[:block] = torch.arange(block, device="cuda", dtype=torch.int32) + me * 100_000
    floats.fill_(float(7 * me + 3))
    torch.cuda.synchronize()
    tdist.barrier()
    typed_rma[(1, )](ints, floats, box, n, BLOCK=block)
    torch.cuda.synchronize()
    tdist.barrier()
    left = (me - 1) % world
    got = ints[block:block + n]
    ok = torch.equal(got, torch.arange(n, device="cuda", dtype=torch.int32) + left * 100_000)
    ok = ok and int(ints[block + n:].abs().sum()) == 0  # nothing past n elements
    ok = ok and int(box[0]) == left + 1000 and int(box[1]) == 7 * left + 3
    all_ranks_agree(ok, f"rank {me}: typed put/p/g delivered wrong values (box {box.tolist()})")
    tdist.barrier()


@tdist.jit
def team_collectives(src, summed, gathered, n):
    shmem.barrier_block(shmem.TEAM_WORLD)
    shmem.int32_sum_reduce_block(shmem.TEAM_WORLD, summed, src, n)
    shmem.fcollectmem_block(shmem.TEAM_WORLD, gathered, src, n * 4)


def test_team_collectives_match_the_host_reference():
    me, world = tdist.rank(), tdist.world_size()
    n = 777
    g = torch.Generator(device="cuda")
    g.manual_seed(41 + me)
    src = tdist.symm_empty((n, ), torch.int32)
    src.copy_(torch.randint(-1000, 1000, (n, ), device="cuda", generator=g, dtype=torch.int32))
    summed = tdist.symm_empty((n, ), torch.int32)
    gathered = tdist.symm_empty((world * n, ), torch.int32)
    summed.fill_(-1)
    gathered.fill_(-1)
    torch.cuda.synchronize()
    tdist.barrier()
    team_collectives[(1, )](src, summed, gathered, n)
    torch.cuda.synchronize()
    # Both host references are collectives: every rank must call both, whatever the first says.
    want_sum, want_gathered = host_collectives.all_reduce(src), host_collectives.all_gather(src)
    ok = torch.equal(summed, want_sum) and torch.equal(gathered, want_gathered)
    all_ranks_agree(ok, "NVSHMEM team sum_reduce / fcollect differ from the host reference")
    tdist.barrier()


@tdist.jit
def ranks_by_axis(out):
    tl.store(out + 0, dl.rank("intra_node"))
    tl.store(out + 1, dl.rank("inter_node"))
    tl.store(out + 2, dl.num_ranks("intra_node"))
    tl.store(out + 3, dl.num_ranks("inter_node"))


def test_rank_by_axis_matches_the_runtime():
    out = torch.full((4, ), -1, dtype=torch.int32, device="cuda")
    ranks_by_axis[(1, )](out)
    torch.cuda.synchronize()
    local = tdist.local_world_size()
    want = [tdist.local_rank(), tdist.rank() // local, local, tdist.world_size() // local]
    all_ranks_agree(out.tolist() == want, f"rank {tdist.rank()}: dl.rank/num_ranks(axis) {out.tolist()}, want {want}")


def test_a_stream_waits_for_equality_not_for_more():
    """The stream is held until the signal is exactly 3: a 5 written first must not release it.

    Under MPS the clients of a GPU share one pool of work queues, so two streams of one process
    may be one queue, and a wait would hold the write it waits for (a hang, seen on one H200 with
    10 clients): there the writes come from another rank, and a rank either waits or writes."""
    me, world = tdist.rank(), tdist.world_size()
    pad = tdist.SignalPad(1)
    seen = torch.full((1, ), -1, dtype=torch.int64, device="cuda")
    torch.cuda.synchronize()
    tdist.barrier()
    if not tdist.mps_active():
        waiter, writer, target = True, True, pad.signals
    elif world == 1:
        pytest.skip("under MPS the write must come from another process: needs two ranks")
    else:
        paired = (me ^ 1) < world
        waiter, writer = paired and me % 2 == 0, paired and me % 2 == 1
        target = tdist.peer_tensor(pad.signals, me ^ 1) if writer else None
    waiting, writing = torch.cuda.Stream(), torch.cuda.Stream()
    if waiter:
        tdist.stream_wait_value64(pad.signals, 0, 3, stream=waiting, cmp="eq")
        with torch.cuda.stream(waiting):
            seen.copy_(pad.signals.view(torch.int64)[:1])
    tdist.barrier()  # the wait is enqueued before the 5 lands
    if writer:
        tdist.stream_write_value64(target, 0, 5, stream=writing)
        with torch.cuda.stream(writing):
            torch.cuda._sleep(20_000_000)  # ~10 ms with the 5 in place: a >= wait would go on now
        tdist.stream_write_value64(target, 0, 3, stream=writing)
    torch.cuda.synchronize()
    all_ranks_agree(not waiter or int(seen) == 3, f"rank {me}: the equality wait released at {int(seen)}")
    tdist.barrier()


def test_peer_tensors_are_every_ranks_view():
    me, world = tdist.rank(), tdist.world_size()
    x = tdist.symm_zeros((world, ), torch.int64)
    torch.cuda.synchronize()
    tdist.barrier()
    views = tdist.peer_tensors(x)
    ok = len(views) == world and views[me] is x
    for pe, view in enumerate(views):
        view[me] = 10 * me + pe  # slot `me` of every rank's x
    torch.cuda.synchronize()
    tdist.barrier()
    ok = ok and x.tolist() == [10 * r + me for r in range(world)]
    all_ranks_agree(ok, f"rank {me}: peer_tensors wrote {x.tolist()}")
    tdist.barrier()
