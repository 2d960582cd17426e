"""Every setting of triton_dist, in one typed place.

Each field has a default, an environment variable that overrides it, and a docstring. Nothing
else in the package reads ``TRITON_DIST_*`` variables; code asks :func:`get` instead. Values given
to :func:`triton_dist.init` override the environment for that call.
"""

from __future__ import annotations

import dataclasses
import os
import re

_SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str | int) -> int:
    """``"8G"``, ``"512M"``, ``"1073741824"`` or an int -> bytes (binary units)."""
    if isinstance(text, int):
        if text <= 0:
            raise ValueError(f"a size must be positive, got {text}")
        return text
    match = re.fullmatch(r"\s*(\d+)\s*([KMGT]?)(?:i?B)?\s*", str(text), re.IGNORECASE)
    if not match or int(match.group(1)) == 0:
        raise ValueError(f"cannot read {text!r} as a size; write e.g. 8G, 512M or 1073741824")
    return int(match.group(1)) * _SIZE_UNITS[match.group(2).upper()]


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer") from None


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number") from None


@dataclasses.dataclass(frozen=True)
class Config:
    symmetric_heap_size: int = 1 << 30
    """Bytes of symmetric memory each rank reserves at init (TRITON_DIST_SYMMETRIC_HEAP_SIZE, e.g. 8G)."""

    local_world_size: int = 0
    """Ranks per node; 0 discovers it from host names (TRITON_DIST_LOCAL_WORLD_SIZE). Setting 1 makes
    every GPU its own node, which exercises the multi-node paths on one host."""

    ranks_per_gpu: int = 1
    """Ranks that share each GPU (TRITON_DIST_RANKS_PER_GPU). Above 1 needs CUDA MPS, with
    ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` at most ``100 / ranks_per_gpu`` for every rank: only under
    MPS do kernels of different processes run at once, and a kernel that waits for a peer's kernel
    needs both resident. Rank ``r`` of a node then uses GPU ``local_rank // ranks_per_gpu``, host
    exchange goes through gloo (NCCL refuses two ranks on one GPU), and benchmarks refuse to time:
    the mode proves correctness at any world size on few GPUs, not speed over NVLink
    (``scripts/gpu-test --ranks-per-gpu K`` sets all of this up)."""

    bootstrap_timeout_s: float = 300.0
    """How long init and other host collectives wait for every rank (TRITON_DIST_BOOTSTRAP_TIMEOUT_S)."""

    wait_timeout_ns: int = 60_000_000_000
    """How long a device-side ``dl.wait`` spins before it prints what it waited for and traps, unless
    the call gives its own ``timeout_ns`` (TRITON_DIST_WAIT_TIMEOUT_NS; 0 waits forever). Generous by
    default: a peer may still be compiling its first kernel while this rank waits."""

    debug_barriers: bool = False
    """Wrap every ``dl.wait`` in CTA barriers and a system fence, to tell ordering bugs from logic bugs:
    a kernel that passes only with this on is missing a fence or a token (TRITON_DIST_DEBUG_BARRIERS=1)."""

    autotune_cache_dir: str = "~/.cache/triton_dist/autotune"
    """Where :mod:`triton_dist.autotune` keeps its decisions, one JSON file per (op, key, GPU, world size,
    versions); ``~`` is expanded when used. Only rank 0 reads and writes it; the other ranks get rank
    0's decision, so the directory need not be shared between nodes (TRITON_DIST_AUTOTUNE_CACHE_DIR)."""

    serialised_launches: bool = False
    """Kernel launches return only when the kernel has finished (CUDA_LAUNCH_BLOCKING=1, which sets
    it, or a tool that serialises launches: TRITON_DIST_SERIALISED_LAUNCHES=1). Copy-engine ops then
    queue their copy stream's work before the kernel that waits for it, which costs the kernel's
    start that host time; by default they launch the kernel first and queue the copies while it runs."""

    check_collective_calls: bool = False
    """Before every collective op, compare the call's shapes, dtypes and method across ranks through
    the host group and raise on every rank if they differ (:mod:`triton_dist.call_agreement`): a
    debugging aid, a host collective per call (TRITON_DIST_CHECK_COLLECTIVE_CALLS=1)."""

    compile_workers: int = 0
    """Processes that compile a context's kernels at once when it is created (on the node's first
    rank; the others wait and then load them from Triton's cache): 0 picks one per CPU core up to 32
    and the kernels to compile, 1 compiles them one after another in each rank, as Triton alone
    would (TRITON_DIST_COMPILE_WORKERS)."""

    keep_nvshmem: bool = False
    """finalize() keeps NVSHMEM (and its whole heap) up, and a later init() of the same processes
    with a heap no larger reuses it (TRITON_DIST_KEEP_NVSHMEM=1). For programs that init and
    finalize many times: each NVSHMEM bring-up and take-down leaves 1.1 MiB of GPU memory behind
    (NVSHMEM's own, measured on one H200); 100 kept cycles lost none. Only the process's first
    NVSHMEM instance can be kept (a later one left up crashed NVSHMEM 3.4.5 at exit): ask for it
    from the first init(), with the largest heap the process will need. An init() with other
    processes then raises."""

    results_dir: str = ""
    """Where benchmarks write their JSON (``<dir>/<gpu>-x<world>/``); "" means ``bench/results`` of
    the source tree, or of the working directory outside one (TRITON_DIST_RESULTS_DIR)."""

    commit: str = ""
    """The commit benchmark results name; "" asks git (TRITON_DIST_COMMIT: a GPU machine that gets a
    copy of the working tree may have a stale ``.git``, or none)."""

    record_variants: str = ""
    """A file to which, from init() on, every variant of the library's kernels and of
    ``triton_dist.jit`` kernels that Triton compiles or loads in this process is appended, once,
    as a JSON line (:mod:`triton_dist.variant_list`); "" records nothing
    (TRITON_DIST_RECORD_VARIANTS). Run the ops at the shapes that matter with it set, then compile
    what it wrote into the prebuilt set with ``python -m triton_dist.prebuilt_cache --variants
    FILE``. Ranks may share the file."""

    prebuilt_cache_dir: str = ""
    """The prebuilt set: a Triton cache directory of library kernels compiled ahead of time, which
    Triton consults, read-only, before its own cache (:mod:`triton_dist.prebuilt_cache`); ""
    means ``prebuilt/cache`` inside the installed package, where ``python -m
    triton_dist.prebuilt_cache`` writes by default; a directory that does not exist turns the
    layer off (TRITON_DIST_PREBUILT_CACHE_DIR)."""

    eager_tensor_descriptors: bool = True
    """Kernels that take host tensor descriptors (the GEMMs' TMA operands) launch eagerly from C++
    too, the TMA descriptors encoded there (:mod:`triton_dist.eager_launch`), instead of through
    Triton's launcher, whose per-call binding cost an eager ag_gemm or gemm_rs tens of µs
    (TRITON_DIST_EAGER_TENSOR_DESCRIPTORS=0 turns it off). On since the GPU suites passed with it
    (one H100, worlds 1, 2 and 4 under MPS, 2026-12-07)."""

    eager_replay: bool = True
    """A repeated eager call of all_reduce, all_gather, reduce_scatter, gemm_ar's ``"split_k"``,
    ag_gemm's ``"sm_push_inline"`` or gemm_rs's ``"fused"`` launches the earlier call's recorded
    launches after checking only its tensors
    (:mod:`triton_dist.eager_calls`), instead of the op's whole Python path
    (TRITON_DIST_EAGER_REPLAY=0 turns it off, every call then takes the full path)."""

    stream_schedule_graphs: bool = False
    """Copy-engine protocols (:class:`triton_dist.StreamSchedule`) enqueue their fixed operations
    as one CUDA-graph launch per call instead of a driver call each, most of an eager
    GEMM+ReduceScatter's host time (TRITON_DIST_STREAM_SCHEDULE_GRAPHS=1). Off until run on GPUs:
    a captured peer copy must still run on a copy engine (csrc/include/tdist/stream_schedule.h)."""

    @staticmethod
    def from_environment() -> "Config":
        heap = os.environ.get("TRITON_DIST_SYMMETRIC_HEAP_SIZE")
        timeout = _env_int("TRITON_DIST_WAIT_TIMEOUT_NS", Config.wait_timeout_ns)
        if timeout < 0:
            raise ValueError(f"TRITON_DIST_WAIT_TIMEOUT_NS={timeout} must be >= 0 (0 waits forever)")
        ranks_per_gpu = _env_int("TRITON_DIST_RANKS_PER_GPU", 1)
        if ranks_per_gpu < 1:
            raise ValueError(f"TRITON_DIST_RANKS_PER_GPU={ranks_per_gpu} must be >= 1")
        compile_workers = _env_int("TRITON_DIST_COMPILE_WORKERS", 0)
        if compile_workers < 0:
            raise ValueError(f"TRITON_DIST_COMPILE_WORKERS={compile_workers} must be >= 0 (0: one per core)")
        return Config(
            symmetric_heap_size=parse_size(heap) if heap else Config.symmetric_heap_size,
            local_world_size=_env_int("TRITON_DIST_LOCAL_WORLD_SIZE", 0),
            ranks_per_gpu=ranks_per_gpu,
            bootstrap_timeout_s=_env_float("TRITON_DIST_BOOTSTRAP_TIMEOUT_S", 300.0),
            wait_timeout_ns=timeout,
            debug_barriers=_env_int("TRITON_DIST_DEBUG_BARRIERS", 0) != 0,
            autotune_cache_dir=os.environ.get("TRITON_DIST_AUTOTUNE_CACHE_DIR") or Config.autotune_cache_dir,
            serialised_launches=(_env_int("TRITON_DIST_SERIALISED_LAUNCHES", 0) != 0
                                 or os.environ.get("CUDA_LAUNCH_BLOCKING", "0") not in ("", "0")),
            compile_workers=compile_workers,
            check_collective_calls=_env_int("TRITON_DIST_CHECK_COLLECTIVE_CALLS", 0) != 0,
            keep_nvshmem=_env_int("TRITON_DIST_KEEP_NVSHMEM", 0) != 0,
            results_dir=os.environ.get("TRITON_DIST_RESULTS_DIR", ""),
            commit=os.environ.get("TRITON_DIST_COMMIT", ""),
            record_variants=os.environ.get("TRITON_DIST_RECORD_VARIANTS", ""),
            prebuilt_cache_dir=os.environ.get("TRITON_DIST_PREBUILT_CACHE_DIR", ""),
            eager_tensor_descriptors=_env_int("TRITON_DIST_EAGER_TENSOR_DESCRIPTORS", 1) != 0,
            stream_schedule_graphs=_env_int("TRITON_DIST_STREAM_SCHEDULE_GRAPHS", 0) != 0,
            eager_replay=_env_int("TRITON_DIST_EAGER_REPLAY", 1) != 0,
        )


_current: Config | None = None


def get() -> Config:
    """The configuration in force: what init() was given, else the environment's."""
    return _current if _current is not None else Config.from_environment()


def _set(config: Config | None) -> None:
    global _current
    _current = config
