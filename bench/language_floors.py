"""Language floors: the fastest the primitives can go between two GPUs, which later bars build on.

    torchrun --nproc-per-node=2 bench/language_floors.py [--quick]

(a) ``signal_round_trip``: one uint64 signal bounced between a pair of GPUs with ``dl.notify`` /
    ``dl.wait``, R rounds in one kernel launch; ours_us = elapsed / R. Baselines: torch.distributed
    (NCCL) ``send``/``recv`` ping-pong of one 8-byte tensor per round trip (``torch_nccl_us``), and
    one 1-element ``all_reduce`` (``torch_nccl_all_reduce_us``, 100 back-to-back calls per sample).
(b) ``put_sm_store`` / ``put_copy_engine``: bytes pushed into the peer's memory, 1 MiB .. 1 GiB
    (powers of 4; ``--quick``: 16 MiB and 256 MiB), both ranks pushing at once (bidirectional, as
    collectives see it). SM stores: a persistent Triton kernel loading a local buffer and storing
    through ``dl.symm_at``, a few hand-picked configs, the best reported (``config``); copy engine:
    ``peer_tensor(dst, peer).copy_(src)`` (cudaMemcpyAsync peer to peer). Baseline: NCCL
    ``send``/``recv`` of the same bytes, both directions at once (``batch_isend_irecv``).
    ``gbps`` is per direction: bytes one rank pushes / time (1 GB = 1e9 bytes). ``bound_us`` is null:
    the link bound would be these very numbers.

Ranks are paired (0-1, 2-3, ...); the world size must be even. Every transfer is checked once
against the data the peer sent. Timing: :mod:`triton_dist.bench.timing` (per-sample barrier,
fixed counts, median per rank, MAX over ranks). Writes bench/results/<gpu>-x<world>/language_floors.json.
"""

from __future__ import annotations

import faulthandler
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
try:
    import triton_dist._C  # noqa: F401  an installed build
except ImportError:
    sys.path.insert(0, str(HERE.parent / "python"))

import triton.language as tl  # noqa: E402

import triton_dist as tdist  # noqa: E402
import triton_dist.language as dl  # noqa: E402
from triton_dist import bench  # noqa: E402

MIB = 1 << 20

# ---------------------------------------------------------------------------------------------
# Kernels. Integer arguments that change between launches are not specialised, so warm-up and
# timed launches share one binary: loading a new module while the peer spins can deadlock.


def load_ping_pong_kernel():
    """The ping-pong of tutorials/02_notify_wait.py (tested there): the even rank of each pair
    notifies, the odd one answers; signal values base+1 .. base+rounds grow across launches."""
    import importlib.util

    path = HERE.parent / "tutorials" / "02_notify_wait.py"
    spec = importlib.util.spec_from_file_location("tutorial_02_notify_wait", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.ping_pong


@tdist.jit(do_not_specialize=["peer", "num_tiles"])
def put_sm_store_kernel(dst, src, peer, num_tiles, BLOCK: tl.constexpr):
    """Persistent grid: program p copies tiles p, p + grid, ... of ``src`` into ``peer``'s ``dst``.
    The buffers are whole tiles (no mask), so loads and stores are 16-byte vectors."""
    remote = tl.multiple_of(dl.symm_at(dst, peer), 16)  # symm_at loses the alignment fact
    offs = tl.arange(0, BLOCK)
    for t in range(tl.program_id(0), num_tiles, tl.num_programs(0)):
        start = t.to(tl.int64) * BLOCK
        tl.store(remote + start + offs, tl.load(src + start + offs))


# SM-store configs swept at every size (elements are int32): BLOCK elements per tile, warps,
# and programs per SM of the persistent grid.
SM_STORE_CONFIGS = (
    {"BLOCK": 4096, "num_warps": 8, "programs_per_sm": 1},
    {"BLOCK": 8192, "num_warps": 16, "programs_per_sm": 1},
    {"BLOCK": 4096, "num_warps": 4, "programs_per_sm": 4},
)

# ---------------------------------------------------------------------------------------------


class Ctx:

    def __init__(self, args):
        import torch

        self.args = args
        self.rank, self.world = tdist.rank(), tdist.world_size()
        self.peer = self.rank ^ 1
        self.device = torch.device("cuda", torch.cuda.current_device())
        self.gpu = bench.gpu_slug()
        self.sms = torch.cuda.get_device_properties(self.device).multi_processor_count

    def log(self, msg: str) -> None:
        if self.rank == 0:
            print(f"[language_floors] {msg}", flush=True)

    def all_ok(self, ok: bool) -> bool:
        """True on every rank iff ``ok`` on every rank."""
        return min(bench.all_gather_floats(1.0 if ok else 0.0)) == 1.0


def signal_round_trip(ctx: Ctx) -> list[dict]:
    import torch
    import torch.distributed as dist

    quick = ctx.args.quick
    rounds = 2000 if quick else 10000
    iters = 5 if quick else 20
    pad = tdist.SignalPad(1)
    flags = pad.signals
    state = {"base": 0}  # the last signal value sent; advances identically on every rank
    bench.sync_and_barrier()  # the pad is zeroed everywhere before anyone signals

    ping_pong = load_ping_pong_kernel()
    per_config = {}
    for num_warps in (1, 4):
        # Compile and load on every rank with a launch that does not spin (0 rounds), before any
        # rank spins: module loading waits for the device.
        ping_pong.preload(flags, 0, 0, grid=(1, ), num_warps=num_warps)
        bench.sync_and_barrier()

        def launch(num_warps=num_warps):
            ping_pong[(1, )](flags, rounds, state["base"], num_warps=num_warps)
            state["base"] += rounds

        us = bench.median_us(launch, warmup=1, iters=iters) / rounds
        per_config[num_warps] = us
        ctx.log(f"signal round trip, Triton notify/wait, num_warps={num_warps}: {us:.3f} us "
                f"({rounds} rounds x {iters})")
    final = int(flags.view(torch.int64)[0].item())
    ok = ctx.all_ok(final == state["base"])
    if not ok:
        ctx.log(f"WARNING: a flag ended at the wrong value (rank {ctx.rank}: {final}, expected {state['base']})")
    best_warps = min(per_config, key=per_config.get)

    # NCCL: blocking-order send/recv of 8 bytes, per round trip.
    token = torch.zeros(1, dtype=torch.int64, device=ctx.device)
    nccl_rounds = 200 if quick else 1000

    def nccl_ping_pong():
        for _ in range(nccl_rounds):
            if ctx.rank % 2 == 0:
                dist.send(token, ctx.peer)
                dist.recv(token, ctx.peer)
            else:
                dist.recv(token, ctx.peer)
                dist.send(token, ctx.peer)

    nccl_us = bench.median_us(nccl_ping_pong, warmup=1, iters=iters) / nccl_rounds
    ctx.log(f"signal round trip, NCCL send/recv 8 B: {nccl_us:.3f} us ({nccl_rounds} rounds x {iters})")
    one = torch.zeros(1, dtype=torch.float32, device=ctx.device)
    allreduce_us = bench.median_us(lambda: dist.all_reduce(one), warmup=10, iters=iters, group=100)
    ctx.log(f"NCCL all_reduce of 1 float: {allreduce_us:.3f} us (100 back-to-back calls per sample)")
    return [
        bench.record("signal_round_trip", shape=[1], dtype="uint64", world_size=ctx.world, gpu=ctx.gpu,
                     ours_us=per_config[best_warps],
                     baselines={"torch_nccl_us": nccl_us, "torch_nccl_all_reduce_us": allreduce_us}, bound_us=None,
                     rounds=rounds, config={"num_warps": best_warps},
                     per_config_us={f"num_warps={w}": us for w, us in per_config.items()}, verified=ok,
                     method="R round trips in one launch, elapsed / R; NCCL: send/recv ping-pong, elapsed / rounds")
    ]


def _pattern(n: int, rank: int, device):
    """What ``rank`` sends: distinct per element and per rank (int32, no overflow below 2^28)."""
    import torch

    return torch.arange(n, dtype=torch.int32, device=device) * 7 + rank * 1000003


def puts(ctx: Ctx) -> list[dict]:
    import torch
    import torch.distributed as dist

    quick = ctx.args.quick
    sizes = [16 * MIB, 256 * MIB] if quick else [MIB * 4**k for k in range(6)]  # 1 MiB .. 1 GiB
    seen = bench.all_gather_floats(float(sum(sizes) + len(sizes)))
    if len(set(seen)) != 1:
        raise RuntimeError(f"ranks disagree on the sizes to run: {seen} (run every rank with the same flags)")
    n_max = max(sizes) // 4
    dst = tdist.symm_zeros((n_max, ), torch.int32)
    remote = tdist.peer_tensor(dst, ctx.peer)
    src = _pattern(n_max, ctx.rank, ctx.device)
    expected = _pattern(n_max, ctx.peer, ctx.device)
    recv = torch.zeros(n_max, dtype=torch.int32, device=ctx.device)
    iters_big = 10 if quick else 20

    def sm_store(n, cfg):
        block = cfg["BLOCK"]
        tiles = n // block
        grid = min(tiles, cfg["programs_per_sm"] * ctx.sms)
        return lambda: put_sm_store_kernel[(grid, )](dst, src, ctx.peer, tiles, BLOCK=block, num_warps=cfg["num_warps"])

    def copy_engine(n):
        return lambda: remote[:n].copy_(src[:n])

    def nccl(n):

        def run():
            ops = [dist.P2POp(dist.isend, src[:n], ctx.peer), dist.P2POp(dist.irecv, recv[:n], ctx.peer)]
            for work in dist.batch_isend_irecv(ops):
                work.wait()

        return run

    def verified(fn, n, out) -> bool:
        out.zero_()
        bench.sync_and_barrier()
        fn()
        bench.sync_and_barrier()
        return ctx.all_ok(torch.equal(out[:n], expected[:n]))

    def timed(fn, nbytes, host_us_per_call):
        # Small sizes: several calls per sample, queued behind a GPU delay so that the host's
        # launch latency is not what is measured.
        group = max(1, min(16, (64 * MIB) // nbytes))
        delay = host_us_per_call * group if nbytes < 64 * MIB else 0.0
        return bench.median_us(fn, warmup=3, iters=iters_big if nbytes >= 64 * MIB else 2 * iters_big, group=group,
                               gpu_delay_us=delay)

    records = []
    for nbytes in sizes:
        n = nbytes // 4
        assert all(n % cfg["BLOCK"] == 0 for cfg in SM_STORE_CONFIGS)
        gb = nbytes / 1e9
        ok = True
        sm = {}
        for i, cfg in enumerate(SM_STORE_CONFIGS):
            fn = sm_store(n, cfg)
            ok = verified(fn, n, dst) and ok
            sm[i] = timed(fn, nbytes, 40.0)
            ctx.log(f"put {nbytes // MIB:5d} MiB  SM stores {cfg}: {sm[i]:9.2f} us  {gb / (sm[i] * 1e-6):7.1f} GB/s")
        ce_fn = copy_engine(n)
        ok_ce = verified(ce_fn, n, dst)
        ce = timed(ce_fn, nbytes, 20.0)
        ctx.log(f"put {nbytes // MIB:5d} MiB  copy engine: {ce:9.2f} us  {gb / (ce * 1e-6):7.1f} GB/s")
        nccl_fn = nccl(n)
        ok_nccl = verified(nccl_fn, n, recv)
        nc = timed(nccl_fn, nbytes, 100.0)
        ctx.log(f"put {nbytes // MIB:5d} MiB  NCCL send/recv: {nc:9.2f} us  {gb / (nc * 1e-6):7.1f} GB/s")
        if not (ok and ok_ce and ok_nccl):
            ctx.log(f"WARNING: {nbytes} B: data check failed (SM stores {ok}, copy engine {ok_ce}, NCCL {ok_nccl})")
        best = min(sm, key=sm.get)
        best_cfg = dict(SM_STORE_CONFIGS[best])
        best_cfg["programs"] = min(n // best_cfg["BLOCK"], best_cfg["programs_per_sm"] * ctx.sms)
        common = dict(shape=[n], dtype="int32", world_size=ctx.world, gpu=ctx.gpu, baselines={"torch_nccl_us": nc},
                      bound_us=None, bytes=nbytes, direction="bidirectional", torch_nccl_gbps=gb / (nc * 1e-6),
                      torch_nccl_verified=ok_nccl)
        records.append(
            bench.record("put_sm_store", ours_us=sm[best], gbps=gb / (sm[best] * 1e-6),
                         config=best_cfg,
                         per_config_us=[dict(cfg, us=sm[i]) for i, cfg in enumerate(SM_STORE_CONFIGS)], verified=ok,
                         **common))
        records.append(
            bench.record("put_copy_engine", ours_us=ce, gbps=gb / (ce * 1e-6), verified=ok_ce,
                         method="peer_tensor(dst, peer).copy_(src) on the current stream", **common))
    del remote, dst
    return records


def main() -> int:
    parser = bench.script.argument_parser(__doc__, HERE / "results")
    parser.add_argument("--skip", choices=("signal", "put"), action="append", default=[], help="skip a part")
    args = parser.parse_args()
    bench.script.guard(args)

    tdist.init(heap_size=args.heap_size)
    ctx = Ctx(args)
    if ctx.world < 2 or ctx.world % 2:
        ctx.log(f"needs an even number of ranks (pairs exchange), got {ctx.world}; "
                "run: torchrun --nproc-per-node=2 bench/language_floors.py")
        tdist.finalize()
        return 2
    ctx.log(f"gpu {ctx.gpu} x{ctx.world} ({ctx.sms} SMs), commit {bench.commit()}, versions {bench.versions()}, "
            f"{'quick' if args.quick else 'full'} run")
    records = []
    if "signal" not in args.skip:
        records += signal_round_trip(ctx)
    if "put" not in args.skip:
        records += puts(ctx)
    bench.sync_and_barrier()
    if ctx.rank == 0 and records:
        print()
        bench.print_table(records, extra=("bytes", "gbps", "torch_nccl_gbps"))
        path = bench.write_results(records, "language_floors", root=args.out, rank=0)
        print(f"\n[language_floors] wrote {path}", flush=True)
    tdist.barrier()
    tdist.finalize()
    faulthandler.cancel_dump_traceback_later()
    return 0


if __name__ == "__main__":
    sys.exit(main())
