"""Symmetric tensors across ranks: peer writes, collective allocation rules, bad input."""

import pytest
import torch
import torch.distributed as dist

import triton_dist as tdist
from conftest import all_ranks_agree, raises_everywhere, rank_generator


def test_world_matches_torch():
    assert tdist.rank() == dist.get_rank()
    assert tdist.world_size() == dist.get_world_size()
    assert 0 <= tdist.local_rank() < tdist.local_world_size()
    assert tdist.is_symmetric(tdist.symm_empty(4))
    assert tdist.is_symmetric(tdist.symm_empty(64)[10:20])  # a view at an offset
    assert not tdist.is_symmetric(torch.empty(4, device="cuda"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_each_rank_writes_its_peers_tensor(dtype):
    me, world = tdist.rank(), tdist.world_size()
    right, left = (me + 1) % world, (me - 1) % world
    shape = (257, 33)  # odd sizes: no element may be missed by a vectorised path
    x = tdist.symm_empty(shape, dtype)
    peer = tdist.peer_tensor(x, right)
    assert peer.shape == x.shape and peer.dtype == x.dtype
    for it in range(200):
        x.fill_(-7 if dtype != torch.bfloat16 else float("nan"))  # poison before every round
        torch.cuda.synchronize()
        tdist.barrier()  # every rank poisoned before anyone writes
        mine = torch.randn(shape, generator=rank_generator(it, me), device="cuda").mul(1000).to(dtype)
        peer.copy_(mine)
        torch.cuda.synchronize()
        tdist.barrier()  # every write landed
        expected = torch.randn(shape, generator=rank_generator(it, left), device="cuda").mul(1000).to(dtype)
        ok = torch.equal(x, expected)
        if not ok:
            break
    all_ranks_agree(ok, f"iteration {it}: rank's tensor differs from what its left neighbour wrote")


def test_views_and_offsets_map_to_the_same_peer_elements():
    me, world = tdist.rank(), tdist.world_size()
    x = tdist.symm_zeros((64, 64), torch.float32)
    torch.cuda.synchronize()
    tdist.barrier()  # every rank zeroed before its neighbour writes (seen racing at world 8)
    view = x[3:40:2, 5:]  # strided view with a storage offset
    peer_view = tdist.peer_tensor(view, (me + 1) % world)
    assert peer_view.stride() == view.stride() and peer_view.storage_offset() == view.storage_offset()
    peer_view.fill_(me + 1)
    torch.cuda.synchronize()
    tdist.barrier()
    expected = torch.zeros(64, 64, device="cuda")
    expected[3:40:2, 5:] = (me - 1) % world + 1
    all_ranks_agree(torch.equal(x, expected), "strided peer view wrote the wrong elements")


def test_symm_zeros_is_zero_and_memory_is_reused():
    from triton_dist.runtime import _core

    start = _core().heap_stats()["bytes_in_use"]
    for _ in range(300):  # 300 x 16 MiB would exhaust the 2 GiB heap without reuse
        t = tdist.symm_zeros((4 << 20,), torch.float32)
        assert int(t.count_nonzero()) == 0
        t.fill_(1.0)
        del t
    in_use = _core().heap_stats()["bytes_in_use"]
    all_ranks_agree(in_use - start <= 2 * (16 << 20), f"heap grew by {in_use - start} B over 300 freed tensors")


def test_size_mismatch_is_an_error_on_every_rank():
    if tdist.world_size() == 1:
        pytest.skip("a size mismatch needs two ranks")
    shape = (1024,) if tdist.rank() == 0 else (2048,)
    raises_everywhere(lambda: tdist.symm_empty(shape, torch.float32), RuntimeError,
                      r"different sizes .*rank 0: 4096 B.*rank 1: 8192 B")


def test_exhausted_heap_says_how_to_enlarge():
    raises_everywhere(lambda: tdist.symm_empty((1 << 40,), torch.uint8), RuntimeError,
                      "exhausted.*TRITON_DIST_SYMMETRIC_HEAP_SIZE")
    tdist.symm_empty((16,))  # still usable afterwards


def test_bad_input_errors():
    x = tdist.symm_empty((8,))
    world = tdist.world_size()
    raises_everywhere(lambda: tdist.peer_tensor(x, world), RuntimeError, f"peer {world} is out of range")
    raises_everywhere(lambda: tdist.peer_tensor(x, -1), RuntimeError, "out of range")
    raises_everywhere(lambda: tdist.peer_tensor(torch.empty(8, device="cuda"), 0), RuntimeError,
                      "not on the symmetric heap")
    raises_everywhere(lambda: tdist.peer_tensor(torch.empty(8), 0), ValueError, "not on a CUDA device")
    raises_everywhere(lambda: tdist.symm_empty((2, -1)), ValueError, "negative dimension")
    raises_everywhere(lambda: tdist.symm_empty((2, 2), "float32"), TypeError, "torch.dtype")
    raises_everywhere(lambda: tdist.init(), RuntimeError, "already initialised")


def test_signal_pad_epochs():
    pad = tdist.SignalPad(16)
    assert len(pad) == 16 and pad.signals.dtype == torch.uint64
    assert int(pad.signals.to(torch.int64).sum()) == 0
    assert [pad.next_epoch() for _ in range(3)] == [1, 2, 3] and pad.epoch == 3


def test_stream_memory_ops_publish_to_the_peer():
    me, world = tdist.rank(), tdist.world_size()
    right, left = (me + 1) % world, (me - 1) % world
    pad = tdist.SignalPad(1)
    data = tdist.symm_empty((1 << 20,), torch.float32)
    peer_data, peer_pad = tdist.peer_tensor(data, right), tdist.peer_tensor(pad.signals, right)
    got = torch.empty_like(data)
    torch.cuda.synchronize()
    tdist.barrier()
    ok = True
    for it in range(100):
        epoch = pad.next_epoch()
        payload = torch.randn(data.shape, generator=rank_generator(it, me), device="cuda")
        peer_data.copy_(payload)  # copy engine / SM copy into the peer
        tdist.stream_write_value64(peer_pad, 0, epoch)  # ordered after the copy on this stream
        tdist.stream_wait_value64(pad.signals, 0, epoch)  # left neighbour's data has landed
        got.copy_(data)
        expected = torch.randn(data.shape, generator=rank_generator(it, left), device="cuda")
        ok = ok and torch.equal(got, expected)
        torch.cuda.synchronize()
        tdist.barrier()  # nobody overwrites `data` before its owner read it
    all_ranks_agree(ok, "data published with stream_write_value64 arrived incomplete")


def test_stream_copy_2d_sends_a_tile_column_to_the_peer():
    """One 2-D copy-engine copy of a strided block (rows of a tile column) into the right
    neighbour's symmetric matrix, published with stream_write_value64: every element of the block
    arrives, nothing around it is touched; bad views are refused before any copy."""
    me, world = tdist.rank(), tdist.world_size()
    right, left = (me + 1) % world, (me - 1) % world
    pad = tdist.SignalPad(1)
    rows, cols = 300, 1000
    dst = tdist.symm_empty((rows, cols), torch.float32)
    peer_dst, peer_pad = tdist.peer_tensor(dst, right), tdist.peer_tensor(pad.signals, right)
    ok = True
    for it in range(50):
        epoch = pad.next_epoch()
        dst.fill_(-1.0)  # poison
        torch.cuda.synchronize()
        tdist.barrier()
        src = torch.randn((rows, cols), generator=rank_generator(it, me), device="cuda")
        r0, r1, c0, c1 = 17 + it, 250, 64 + it, 777  # odd offsets and widths
        tdist.stream_copy_2d(peer_dst[r0:r1, c0:c1], src[r0:r1, c0:c1])
        tdist.stream_write_value64(peer_pad, 0, epoch)
        tdist.stream_wait_value64(pad.signals, 0, epoch)
        expected = torch.full((rows, cols), -1.0, device="cuda")
        sent = torch.randn((rows, cols), generator=rank_generator(it, left), device="cuda")
        expected[r0:r1, c0:c1] = sent[r0:r1, c0:c1]
        ok = ok and torch.equal(dst, expected)
        torch.cuda.synchronize()
        tdist.barrier()
    all_ranks_agree(ok, "stream_copy_2d: the block arrived wrong or touched its surroundings")
    a = torch.zeros((8, 8), device="cuda")
    with pytest.raises(ValueError, match="contiguous rows"):
        tdist.stream_copy_2d(a.t(), a)
    with pytest.raises(ValueError, match="overlap"):
        tdist.stream_copy_2d(a, torch.zeros(8, device="cuda").expand(8, 8))
    with pytest.raises(ValueError, match="must match"):
        tdist.stream_copy_2d(a[:4], a)


def test_stream_schedule_replays_a_chunked_push_eagerly_and_in_a_graph():
    """A StreamSchedule recorded once (contiguous and 2-D copies into the right neighbour, each
    chunk published by a 0/1 flag that the receiver waits for and resets) carries fresh data on
    every enqueue, 60 times eagerly and 60 as a replayed CUDA graph, and leaves every flag at 0."""
    me, world = tdist.rank(), tdist.world_size()
    right, left = (me + 1) % world, (me - 1) % world
    chunks, chunk = 7, 12345  # odd sizes
    pad = tdist.SignalPad(chunks)
    dst = tdist.symm_empty((chunks * chunk,), torch.float32)
    tile_dst = tdist.symm_empty((64, 300), torch.float32)
    src, tile_src = torch.empty_like(dst), torch.empty_like(tile_dst)
    peer_dst, peer_tile, peer_pad = (tdist.peer_tensor(t, right) for t in (dst, tile_dst, pad.signals))
    send, receive = tdist.StreamSchedule(), tdist.StreamSchedule()
    for c in range(chunks):
        send.copy(peer_dst[c * chunk:(c + 1) * chunk], src[c * chunk:(c + 1) * chunk])
        if c == 3:
            send.copy_2d(peer_tile[5:60, 7:251], tile_src[5:60, 7:251])
        send.write(peer_pad, c, 1)
        receive.wait(pad.signals, c, 1).write(pad.signals, c, 0)
    assert len(send) == 2 * chunks + 1 and len(receive) == 2 * chunks
    assert receive.driver_calls == 1  # 14 memory operations in a row: one batch
    torch.cuda.synchronize()
    tdist.barrier()
    graph, ok = None, True
    for it in range(120):
        if it == 60:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                send.enqueue()
                receive.enqueue()
        dst.fill_(float("nan"))
        tile_dst.fill_(-1.0)
        src.copy_(torch.randn(dst.shape, generator=rank_generator(it, me), device="cuda"))
        tile_src.copy_(torch.randn(tile_dst.shape, generator=rank_generator(it + 1000, me), device="cuda"))
        torch.cuda.synchronize()
        tdist.barrier()  # every rank's destination is poisoned before anyone sends
        if graph is None:
            send.enqueue()
            receive.enqueue()
        else:
            graph.replay()
        expected = torch.randn(dst.shape, generator=rank_generator(it, left), device="cuda")
        expected_tile = torch.full(tile_dst.shape, -1.0, device="cuda")
        sent_tile = torch.randn(tile_dst.shape, generator=rank_generator(it + 1000, left), device="cuda")
        expected_tile[5:60, 7:251] = sent_tile[5:60, 7:251]
        ok = ok and torch.equal(dst, expected) and torch.equal(tile_dst, expected_tile)
        torch.cuda.synchronize()
        tdist.barrier()
    all_ranks_agree(ok and int(pad.signals.to(torch.int64).abs().sum()) == 0,
                    "StreamSchedule: a chunk arrived wrong, or a flag was left set")
    with pytest.raises(ValueError, match="contiguous"):
        send.copy(dst[::2], src[::2])
    with pytest.raises(ValueError, match="must match"):
        send.copy(dst[:10], src[:11])
    with pytest.raises(IndexError, match="out of range"):
        send.write(pad.signals, chunks, 1)


@pytest.mark.parametrize("as_graph", [False, True])
def test_a_stream_schedule_publishes_chunks_to_the_peer(as_graph):
    """A StreamSchedule of copy-engine copies into the right neighbour, each published by a 0/1
    flag, then waits for the left neighbour's flags (resetting them): the fixed operations of a
    copy-engine protocol, enqueued one by one or as one CUDA-graph launch per call, 100 calls with
    fresh data, every element checked."""
    me, world = tdist.rank(), tdist.world_size()
    right, left = (me + 1) % world, (me - 1) % world
    chunks, chunk = 6, 40_003  # odd sizes
    flags = tdist.SignalPad(chunks)
    inbox = tdist.symm_empty((chunks * chunk, ), torch.float32)
    src = torch.empty(chunks * chunk, device="cuda")
    peer_inbox, peer_flags = tdist.peer_tensor(inbox, right), tdist.peer_tensor(flags.signals, right)
    schedule = tdist.StreamSchedule(as_graph=as_graph)
    for c in range(chunks):
        part = slice(c * chunk, (c + 1) * chunk)
        schedule.copy(peer_inbox[part], src[part]).write(peer_flags, c, 1)
    for c in range(chunks):
        schedule.wait(flags.signals, c, 1, "eq").write(flags.signals, c, 0)
    assert schedule.launches_as_graph == as_graph
    torch.cuda.synchronize()
    tdist.barrier()
    ok = True
    for it in range(100):
        inbox.fill_(float("nan"))  # poison: the neighbour writes only after the barrier below
        src.copy_(torch.randn(src.shape, generator=rank_generator(it, me), device="cuda"))
        torch.cuda.synchronize()
        tdist.barrier()
        schedule.enqueue()
        got = inbox.clone()  # ordered after the waits on this stream
        expected = torch.randn(src.shape, generator=rank_generator(it, left), device="cuda")
        ok = ok and torch.equal(got, expected)
        torch.cuda.synchronize()
        tdist.barrier()  # nobody overwrites an inbox before its owner read it
    all_ranks_agree(ok, f"StreamSchedule(as_graph={as_graph}): a chunk arrived wrong or incomplete")
    assert int(flags.signals.to(torch.int64).sum()) == 0  # every flag reset by the schedule
