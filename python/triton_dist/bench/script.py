"""What every benchmark script shares: its common command-line options and the guards it runs
under (NVLink multicast off, a watchdog that dumps stacks instead of hanging)."""

from __future__ import annotations

import argparse
import faulthandler
import os
from pathlib import Path

from .. import config as _config

# NVLink multicast stays off on shared machines (docs/design.md §3); scripts/env.sh sets the same.
_MULTICAST_OFF = (("NCCL_NVLS_ENABLE", "0"), ("NVSHMEM_DISABLE_NVLS", "1"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"))


def argument_parser(description: str, results_root: Path) -> argparse.ArgumentParser:
    """A parser with the options every benchmark takes: --quick, --heap-size, --timeout-s, --out."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer sizes and iterations")
    parser.add_argument("--heap-size", default="4G", help="symmetric heap per rank (default 4G)")
    parser.add_argument("--timeout-s", type=float, default=900.0,
                        help="dump every thread's stack and exit if the run takes longer (default 900)")
    # The environment's root wins over the script's own: gpu-test and the device tool's callers
    # point TRITON_DIST_RESULTS_DIR at a folder that comes back, and a default taken here hid it.
    given = _config.get().results_dir
    parser.add_argument("--out", default=given or str(results_root),
                        help=f"results root (default: TRITON_DIST_RESULTS_DIR, else {results_root})")
    return parser


def start(args: argparse.Namespace, log, note: str = "", allow_shared_gpus: bool = False):
    """:func:`guard`, then initialise the runtime with ``args.heap_size`` and log the run's header
    (GPU, world, commit, versions, quick or full, ``note``); returns ``(world, rank, device, gpu)``.
    ``allow_shared_gpus``: for measurements that ranks sharing a GPU do not falsify (host time)."""
    guard(args, allow_shared_gpus)
    import torch

    from .. import runtime
    from .results import commit, gpu_slug, versions

    runtime.init(heap_size=args.heap_size)
    world, rank = runtime.world_size(), runtime.rank()
    device = torch.device("cuda", torch.cuda.current_device())
    gpu = gpu_slug()
    log(f"gpu {gpu} x{world}, commit {commit()}, versions {versions()}, {'quick' if args.quick else 'full'} run{note}")
    return world, rank, device, gpu


def finish(name: str, records: list[dict], args: argparse.Namespace, extra: tuple[str, ...]) -> int:
    """The end of a benchmark: on rank 0 the table (``extra`` columns) and the JSON
    (``<args.out>/<gpu>-x<world>/<name>.json``); then every cached context released, the runtime
    finalised and the watchdog disarmed. Returns the exit code: 0 when every record verified."""
    from .. import ops, runtime
    from .results import print_table, write_results
    from .timing import sync_and_barrier

    sync_and_barrier()
    if runtime.rank() == 0:
        print()
        print_table(records, extra=extra)
        path = write_results(records, name, root=args.out, rank=0)
        print(f"\n[{name}] wrote {path}", flush=True)
    sync_and_barrier()
    ops.clear_contexts()
    runtime.finalize()
    faulthandler.cancel_dump_traceback_later()
    return 0 if all(r["verified"] for r in records) else 1


def guard(args: argparse.Namespace, allow_shared_gpus: bool = False) -> None:
    """Refuse to time with ranks sharing GPUs (unless ``allow_shared_gpus``); multicast off (unless
    the caller set these variables) and the watchdog armed."""
    from .. import config

    shared = config.get().ranks_per_gpu
    if shared > 1 and not allow_shared_gpus:
        raise SystemExit(f"benchmarks refuse to run with ranks sharing GPUs (TRITON_DIST_RANKS_PER_GPU={shared}): "
                         "ranks on one GPU split its SMs and talk through its own memory, so the times would say "
                         "nothing about the ops over NVLink. Run one rank per GPU.")
    for name, value in _MULTICAST_OFF:
        os.environ.setdefault(name, value)
    faulthandler.dump_traceback_later(args.timeout_s, exit=True)


KIB, MIB = 1 << 10, 1 << 20

COLLECTIVE_SWEEP_BYTES = tuple(8 * KIB * 4**k for k in range(8)) + (256 * MIB, 10**9)
"""The collectives' message sizes: 8 KiB .. 128 MiB in x4 steps, 256 MiB and 1 GB. The top is 10^9
bytes, not 2^30: 2^30 bytes of bf16 are 2^29 elements, one past the contexts' element limit
(:data:`triton_dist.kernels.common.context.MAX_NUMEL`)."""

COLLECTIVE_DTYPES = ("bfloat16", "float32")
"""The collectives' element types, each swept on its own (``--dtypes`` picks some)."""


def add_dtypes_option(parser: argparse.ArgumentParser) -> None:
    """``--dtypes bfloat16,float32``: the element types a collective benchmark sweeps."""
    parser.add_argument("--dtypes", default=",".join(COLLECTIVE_DTYPES),
                        help=f"comma-separated element types (default {','.join(COLLECTIVE_DTYPES)})")


def parse_dtypes(args: argparse.Namespace) -> list:
    """The torch dtypes of ``--dtypes``; a clear error for a name torch lacks or we do not sweep."""
    import torch

    names = [name.strip() for name in args.dtypes.split(",") if name.strip()]
    unknown = [name for name in names if name not in COLLECTIVE_DTYPES + ("float16", )]
    if not names or unknown:
        raise SystemExit(f"--dtypes: {unknown or names} not among bfloat16, float32, float16")
    return [getattr(torch, name) for name in names]

# Floors measured by bench/language_floors.py on 2 x H200 (bench/results/h200-x2/language_floors.json):
LINK_GBPS = 384.0
"""Peer put bandwidth with both GPUs pushing (copy engine, 1 GiB), GB/s."""
ROUND_TRIP_US = 2.9
"""One-signal round trip between the GPUs, microseconds."""


def collective_main(name: str, description: str, results_root: Path, log, sweep, *, quick_sizes, extra,
                    heap_size: str) -> int:
    """The whole ``main`` of a collective benchmark: the common options plus ``--dtypes``, the
    runtime started with ``heap_size`` unless ``--heap-size`` says otherwise, the sizes checked to
    be the same on every rank, then ``sweep(dtype, sizes, iters, world, rank, device, gpu)`` (a
    list of records) for each dtype, and :func:`finish` with the ``extra`` columns."""
    from .timing import all_gather_floats

    parser = argument_parser(description, results_root)
    add_dtypes_option(parser)
    parser.set_defaults(heap_size=heap_size)
    args = parser.parse_args()
    world, rank, device, gpu = start(args, log)
    dtypes = parse_dtypes(args)
    sizes = list(quick_sizes) if args.quick else list(COLLECTIVE_SWEEP_BYTES)
    seen = all_gather_floats(float(sum(sizes) + len(sizes) + 1000 * len(dtypes)))
    if len(set(seen)) != 1:
        raise RuntimeError(f"ranks disagree on the sizes to run: {seen} (run every rank with the same flags)")
    records = []
    for dtype in dtypes:
        records += sweep(dtype, sizes, 20 if args.quick else 50, world, rank, device, gpu)
    return finish(name, records, args, extra)


def logger(tag: str):
    """A ``log(message)`` that prints ``[tag] message`` on rank 0."""

    def log(message: str) -> None:
        from .. import runtime

        if runtime.rank() == 0:
            print(f"[{tag}] {message}", flush=True)

    return log


def all_ranks_ok(ok: bool) -> bool:
    """Whether ``ok`` holds on every rank (collective)."""
    from .timing import all_gather_floats

    return min(all_gather_floats(1.0 if ok else 0.0)) == 1.0


def relative_error(got, ref) -> float:
    """``max |got - ref| / max |ref|`` in fp32; infinite when ``got`` holds a NaN or an Inf."""
    import torch

    got = got.float()
    if not torch.isfinite(got).all():
        return float("inf")
    return float((got - ref).abs().max() / ref.abs().max().clamp_min(1e-6))


def symm_mem_world_group() -> str:
    """The default group's name, with torch symmetric memory enabled on it (older torch needs the
    call; newer torch has no such call or needs none): what torch's fused ops take."""
    import torch.distributed as dist
    import torch.distributed._symmetric_memory  # noqa: F401  registers torch.ops.symm_mem's fused ops

    group_name = dist.group.WORLD.group_name
    try:
        from torch.distributed._symmetric_memory import enable_symm_mem_for_group

        enable_symm_mem_for_group(group_name)
    except Exception:  # noqa: BLE001
        pass
    return group_name


def symm_mem_one_shot_all_reduce(n_max: int, dtype, device):
    """``(buffer, fn(n))``: torch's one-shot symmetric-memory AllReduce of ``buffer[:n]`` (a
    ``n_max``-element symmetric buffer, rendezvoused on the default group) as ``fn(n)()``, which
    returns the result. Raises where this torch lacks it."""
    import torch

    import torch.distributed._symmetric_memory as symm_mem

    group_name = symm_mem_world_group()
    buf = symm_mem.empty(n_max, dtype=dtype, device=device)
    symm_mem.rendezvous(buf, group_name)
    op = torch.ops.symm_mem.one_shot_all_reduce

    def fn(n):
        return lambda: op(buf[:n], "sum", group_name)

    return buf, fn


MODEL_SHAPES = {
    "llama3.1-8b": (14336, 4096),
    "llama3.1-70b": (28672, 8192),
    "llama3.1-405b": (53248, 16384),
    "qwen2-72b": (29568, 8192),
    "gpt3-175b": (49152, 12288),
}
"""(N, K) of each model's MLP GEMM, the overlapped GEMMs' benchmark shapes (with M = 8192)."""

M_SWEEP = (1024, 2048, 4096, 16384)
"""The extra M values benchmarked for llama3.1-70b."""


def overlap_shapes(quick: bool) -> list[tuple[str, int, int, int]]:
    """``(label, M, N, K)`` for the overlapped-GEMM benchmarks: every model at M = 8192, then the M
    sweep for llama3.1-70b (``quick``: llama3.1-8b at M = 4096 only). The caller splits N or K
    across ranks."""
    if quick:
        return [("llama3.1-8b", 4096, *MODEL_SHAPES["llama3.1-8b"])]
    return ([(name, 8192, n, k) for name, (n, k) in MODEL_SHAPES.items()] +
            [("llama3.1-70b", m, *MODEL_SHAPES["llama3.1-70b"]) for m in M_SWEEP])
