"""The distributed autotuner: every rank times every candidate config the same way, and every rank
chooses the same one (docs/design.md §4, last bullet).

Triton's own autotuner picks repeat counts from local timings and decides locally, so ranks can
make different numbers of calls (a collective kernel then waits for a peer that stopped calling:
deadlock) or choose different configs. Here:

    from triton_dist import autotune

    cfg = autotune.best_config("my_op", (m, n, k, "bfloat16"), candidates, run)

- ``candidates``: a sequence of configs (dicts, names, ... anything JSON-serialisable; other
  objects are written with ``str``). ``run(config)`` launches the op once with ``config``. It is
  *collective*: every rank calls it for the same config at the same time, so the op may itself
  communicate. ``key``: what the choice depends on (shapes, dtype names, ...), JSON-serialisable.
- :func:`best_config` is collective on a miss of the in-memory cache: **every rank must call it
  with the same op, key and candidates at the same point of its program** (as every rank calls a
  collective op). A hit of the in-memory cache communicates nothing and runs nothing.

What a miss does, on every rank, in lock step:

1. All-gathers a digest of (op, key, candidates) and each rank's environment (GPU, versions). Ranks
   that disagree raise :class:`AutotuneMismatchError` on every rank, naming which ranks asked for
   what.
2. Rank 0 looks the decision up in its disk cache (:attr:`Config.autotune_cache_dir
   <triton_dist.config.Config.autotune_cache_dir>`, one JSON file per op, key, candidates, GPU,
   world size and versions of torch/triton/triton_dist/CUDA/NCCL plus a digest of triton_dist's
   Python source) and all-gathers what it found: every rank adopts **rank 0's** decision, so ranks
   agree even when their disk caches differ (or are on different nodes).
3. Otherwise it tunes collectively. For each candidate: an optional ``precheck(config)`` (local,
   not collective: e.g. compile the kernel), then one trial ``run(config)``, then the timer
   (default :func:`triton_dist.bench.timing.rank_medians_us`: fixed warm-up and iteration counts,
   a synchronise + barrier before each sample, every rank's median; the MAX over ranks is the
   op's time). After each of these steps the ranks all-gather whether it raised: a config that
   raised on *any* rank is skipped on *all* ranks (an exception in ``skip_on``, by default any
   ``Exception``; another exception is re-raised on every rank as :class:`AutotuneError`). The
   candidate with the lowest MAX-over-ranks time wins; ties go to the earlier candidate. If every
   candidate failed, :class:`AutotuneError` on every rank lists why.
4. Rank 0 writes the decision to disk (temporary file + atomic rename; a failure to write only
   warns). Every rank keeps it in memory.

Limits: the trial run catches failures on the host (a compile error, ``OutOfResources`` for too
much shared memory, a launch error) before any timing collective. A collective ``run`` that fails
on one rank *after* its peers launched their part can still leave the peers' kernels waiting (the
device wait times out after ``TRITON_DIST_WAIT_TIMEOUT_NS``): give such ops a ``precheck`` that
compiles the config locally, so that resource failures are found before anything is launched.
A failure that is not symmetric inside the timer (after a successful trial) can likewise hang.

Testing: the communication goes through a :class:`Communicator` (``rank``, ``world_size``,
``all_gather(value) -> list``) and the timing through a ``timer(fn)`` callable, both injectable,
so the decision logic runs on a CPU with a fake world (tests/cpu/test_autotune.py). Without
torch.distributed initialised the autotuner is a single-process one (:class:`LocalCommunicator`).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import math
import os
import re
import tempfile
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

from . import config as _config

log = logging.getLogger(__name__)

CACHE_FORMAT = 1
"""Version of the disk-cache entries; part of their key (bump it when the format changes)."""


class AutotuneError(RuntimeError):
    """Autotuning failed; raised on every rank alike."""


class AutotuneMismatchError(AutotuneError, ValueError):
    """Ranks asked for different tunings (op, key or candidates differ); raised on every rank."""


class Communicator(Protocol):
    """What the autotuner needs from the world: its rank, its size, and an all-gather of small
    picklable Python values (the result is indexed by rank and the same on every rank)."""

    rank: int
    world_size: int

    def all_gather(self, value: Any) -> list[Any]:
        """Every rank's ``value``, in rank order (collective)."""
        ...


class LocalCommunicator:
    """A world of one process (torch.distributed not initialised)."""

    rank = 0
    world_size = 1

    def all_gather(self, value: Any) -> list[Any]:
        """``[value]``: one process is the whole world."""
        return [value]


class TorchCommunicator:
    """torch.distributed's ``all_gather_object`` over ``group`` (None: the default group)."""

    def __init__(self, group=None):
        import torch.distributed as dist

        self._dist = dist
        self._group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)

    def all_gather(self, value: Any) -> list[Any]:
        """Every rank's ``value``, in rank order (over torch.distributed's objects)."""
        out: list = [None] * self.world_size
        self._dist.all_gather_object(out, value, group=self._group)
        return out


def default_communicator() -> Communicator:
    """triton_dist's process group when the runtime is initialised, else torch.distributed's default
    group when it is initialised, else a :class:`LocalCommunicator` (also without torch)."""
    from . import runtime

    if runtime.is_initialized():
        return TorchCommunicator(runtime._state.get("process_group"))
    try:
        import torch.distributed as dist
    except ImportError:
        return LocalCommunicator()
    if dist.is_available() and dist.is_initialized():
        return TorchCommunicator()
    return LocalCommunicator()


@functools.lru_cache(maxsize=None)
def source_digest() -> str:
    """A digest of triton_dist's Python source (every ``*.py`` under the package): a cached decision
    is not reused once the kernels may have changed, whatever the version number says."""
    root = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode())
        h.update(b"\0")
        h.update(path.read_bytes())
        h.update(b"\0")
    return h.hexdigest()[:16]


def default_environment() -> dict:
    """What a decision depends on besides the op and key: this rank's GPU name and the versions of
    :func:`triton_dist.bench.results.versions` (torch, triton, NVSHMEM, triton_dist, CUDA, NCCL),
    and :func:`source_digest`."""
    from .bench.results import versions

    gpu = "none"
    try:
        import torch

        if torch.cuda.is_available():
            gpu = torch.cuda.get_device_name(torch.cuda.current_device())
    except ImportError:
        pass
    return {"gpu": gpu, **versions(), "triton_dist_source": source_digest()}


def _canonical(value: Any) -> str:
    """Deterministic JSON text of ``value`` (sorted keys; tuples as lists; other objects by str)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _merge_environments(envs: list[dict]) -> dict:
    """One environment for the world: a field that differs between ranks lists every distinct
    value (so a world of mixed GPUs has a key of its own)."""
    merged = {}
    for name in sorted({k for env in envs for k in env}):
        values = [json.loads(v) for v in sorted({_canonical(env.get(name)) for env in envs})]
        merged[name] = values[0] if len(values) == 1 else " | ".join(
            v if isinstance(v, str) else _canonical(v) for v in values)
    return merged


@dataclasses.dataclass(frozen=True)
class TuneResult:
    """A decision. ``times_us[i]``: candidate ``i``'s time, MAX over ranks (None: skipped);
    ``rank_times_us[i]``: its per-rank medians as the timer gave them; ``skipped[i]``: why candidate
    ``i`` was skipped, one ``"rank r: error"`` line per failing rank; ``source``: "tuned" or
    "disk" (how this process got it); ``cache_file``: rank 0's disk-cache file (None: disabled)."""

    op: str
    key: Any
    index: int
    config: Any
    times_us: tuple
    rank_times_us: tuple
    skipped: dict
    source: str
    cache_file: str | None


class DistributedAutotuner:
    """Chooses, collectively, the fastest of several configs of an op (see the module docstring).

    Args:
        comm: the world; None picks :func:`default_communicator` at each tuning.
        timer: ``timer(fn)`` times ``fn`` collectively and returns every rank's median in µs
            (a list indexed by rank, the same on every rank) or one number (the MAX over ranks);
            default :func:`triton_dist.bench.timing.rank_medians_us` with the counts below.
        warmup, iters, group, graph: the default timer's fixed counts and CUDA-graph mode (see
            :func:`triton_dist.bench.timing.sample_us`). ``graph=True`` times GPU time without the
            host's launch cost; ``run`` must then allocate nothing.
        cache_dir: the disk cache; None reads :attr:`Config.autotune_cache_dir` at each tuning.
        disk_cache: False keeps decisions in memory only.
        skip_on: exception types that skip a config; others are re-raised on every rank.
        environment: ``environment()`` -> this rank's environment dict (default
            :func:`default_environment`); part of the disk-cache key.
    """

    def __init__(self, *, comm: Communicator | None = None, timer: Callable[[Callable[[], Any]], Any] | None = None,
                 warmup: int = 5, iters: int = 20, group: int = 1, graph: bool = False,
                 cache_dir: str | os.PathLike | None = None, disk_cache: bool = True,
                 skip_on: tuple[type[BaseException], ...] = (Exception, ),
                 environment: Callable[[], dict] | None = None):
        from .bench.timing import _check_counts, rank_medians_us

        _check_counts(warmup, iters, group)
        self.comm = comm
        self.timer = timer or functools.partial(rank_medians_us, warmup=warmup, iters=iters, group=group,
                                                graph=graph)
        self.cache_dir = cache_dir
        self.disk_cache = disk_cache
        self.skip_on = tuple(skip_on)
        self.environment = environment or default_environment
        self._memory: dict[tuple, TuneResult] = {}

    # -- public API -------------------------------------------------------------------------

    def best_config(self, op: str, key: Any, candidates: Sequence[Any], run: Callable[[Any], Any], *,
                    precheck: Callable[[Any], Any] | None = None) -> Any:
        """The chosen element of ``candidates`` (the caller's object). Collective on a miss."""
        return self.tune(op, key, candidates, run, precheck=precheck).config

    def tune(self, op: str, key: Any, candidates: Sequence[Any], run: Callable[[Any], Any], *,
             precheck: Callable[[Any], Any] | None = None) -> TuneResult:
        """Like :meth:`best_config`, with the timings and the reasons for skipped candidates."""
        candidates = list(candidates)
        if not isinstance(op, str) or not op:
            raise ValueError(f"triton_dist autotune: op must be a non-empty string, got {op!r}")
        if not candidates:
            raise ValueError(f"triton_dist autotune {op}: no candidate configs")
        comm = self.comm if self.comm is not None else default_communicator()
        key_json = _canonical(key)
        cand_json = [_canonical(c) for c in candidates]
        cand_digest = _digest(_canonical(cand_json))
        memory_key = (op, key_json, cand_digest, comm.world_size)
        hit = self._memory.get(memory_key)
        if hit is not None:
            return hit

        # 1. Same request everywhere; one environment for the world.
        request = _digest(_canonical([op, key_json, cand_digest]))
        envs = comm.all_gather((request, op, key_json, len(candidates), self.environment()))
        if len({g[0] for g in envs}) > 1:
            raise AutotuneMismatchError(_mismatch_message(op, envs))
        disk_key = {"format": CACHE_FORMAT, "op": op, "key": json.loads(key_json), "candidates": cand_digest,
                    "world_size": comm.world_size, "env": _merge_environments([g[4] for g in envs])}
        path = self._cache_path(op, disk_key)

        # 2. Rank 0's disk cache decides for everyone.
        entry = _read_entry(path, disk_key, cand_json) if path is not None and comm.rank == 0 else None
        entry = comm.all_gather(entry)[0]
        if entry is not None and _valid_entry(entry, disk_key, cand_json):
            result = TuneResult(op, key, entry["index"], candidates[entry["index"]], tuple(entry["times_us"]),
                                tuple(entry["rank_times_us"]), {int(i): v for i, v in entry["skipped"].items()},
                                "disk", str(path) if path is not None else None)
        else:
            # 3. Tune, in lock step.
            result = self._tune(comm, op, key, candidates, run, precheck, path)
            # 4. Rank 0 keeps it.
            if path is not None and comm.rank == 0:
                _write_entry(path, {"key": disk_key, "index": result.index,
                                    "config": json.loads(cand_json[result.index]), "times_us": list(result.times_us),
                                    "rank_times_us": list(result.rank_times_us),
                                    "skipped": {str(i): v for i, v in result.skipped.items()}})
        self._memory[memory_key] = result
        return result

    def clear_memory_cache(self) -> None:
        """Forget in-memory decisions. Do it on every rank alike, or the next lookup of a key that
        one rank still holds hangs the others (they tune; it does not)."""
        self._memory.clear()

    # -- internals --------------------------------------------------------------------------

    def _cache_path(self, op: str, disk_key: dict) -> Path | None:
        if not self.disk_cache:
            return None
        root = self.cache_dir if self.cache_dir is not None else _config.get().autotune_cache_dir
        safe_op = re.sub(r"[^A-Za-z0-9_.-]+", "_", op).strip(".") or "op"
        return Path(os.path.expanduser(os.fspath(root))) / safe_op / f"{_digest(_canonical(disk_key))[:32]}.json"

    def _attempt(self, fn: Callable[[], Any]):
        """(value, outcome, exception): outcome None when ``fn`` returned, else (kind, text) with
        kind "skip" (an exception in ``skip_on``) or "fatal"."""
        try:
            return fn(), None, None
        except Exception as e:  # noqa: BLE001 - judged below, and agreed on by every rank
            kind = "skip" if isinstance(e, self.skip_on) else "fatal"
            text = f"{type(e).__name__}: {e}".strip()
            return None, (kind, text[:2000]), e

    @staticmethod
    def _judge(op: str, step: str, config_text: str, outcomes: list, exc: BaseException | None) -> list[str]:
        """Every rank's outcome of one step -> the failure lines (empty: it worked everywhere).
        A fatal failure anywhere raises on every rank."""
        fatal = [f"rank {r}: {o[1]}" for r, o in enumerate(outcomes) if o is not None and o[0] == "fatal"]
        if fatal:
            raise AutotuneError(f"triton_dist autotune {op}: {step} of config {config_text} raised an exception "
                                f"that does not skip a config (skip_on): " + "; ".join(fatal)) from exc
        return [f"rank {r}: {o[1]}" for r, o in enumerate(outcomes) if o is not None]

    def _tune(self, comm: Communicator, op: str, key: Any, candidates: list, run, precheck,
              path: Path | None) -> TuneResult:
        n = len(candidates)
        texts = [_canonical(c)[:200] for c in candidates]
        skipped: dict[int, list[str]] = {}
        if precheck is not None:
            local = [self._attempt(functools.partial(precheck, c)) for c in candidates]
            gathered = comm.all_gather([o for _, o, _ in local])
            for i in range(n):
                lines = self._judge(op, "precheck", texts[i], [g[i] for g in gathered], local[i][2])
                if lines:
                    skipped[i] = lines
        times: list[float | None] = [None] * n
        rank_times: list[list[float] | None] = [None] * n
        for i, cfg in enumerate(candidates):
            if i in skipped:
                continue
            # One trial call: host-side failures (compilation, shared memory, launch) surface here,
            # before any rank enters the timer's barriers.
            _, outcome, exc = self._attempt(functools.partial(run, cfg))
            lines = self._judge(op, "the trial run", texts[i], comm.all_gather(outcome), exc)
            if lines:
                skipped[i] = lines
                continue
            measured, outcome, exc = self._attempt(functools.partial(self.timer, functools.partial(run, cfg)))
            per_rank = None
            if outcome is None:
                per_rank, outcome, exc = self._attempt(functools.partial(_per_rank, measured, comm.world_size))
            # Every rank's MAX, gathered: the world's time is the same number on every rank even
            # if the timer only knew this rank's.
            gathered = comm.all_gather((outcome, None if per_rank is None else max(per_rank)))
            lines = self._judge(op, "timing", texts[i], [g[0] for g in gathered], exc)
            if lines:
                skipped[i] = lines
                continue
            times[i] = max(g[1] for g in gathered)
            rank_times[i] = per_rank if len(per_rank) == comm.world_size else [g[1] for g in gathered]
        timed = [i for i in range(n) if times[i] is not None]
        if not timed:
            why = "; ".join(f"config {texts[i]}: {', '.join(lines)}" for i, lines in sorted(skipped.items()))
            raise AutotuneError(f"triton_dist autotune {op} key {_canonical(key)}: every candidate failed: {why}")
        best = min(timed, key=lambda i: (times[i] if not math.isnan(times[i]) else math.inf, i))
        if comm.rank == 0:
            if skipped:
                log.warning("triton_dist autotune %s %s: skipped %s", op, _canonical(key),
                            {texts[i]: lines for i, lines in skipped.items()})
            log.info("triton_dist autotune %s %s: chose %s (%.2f us, MAX over %d ranks) of %s", op, _canonical(key),
                     texts[best], times[best], comm.world_size, {texts[i]: times[i] for i in timed})
        return TuneResult(op, key, best, candidates[best], tuple(times), tuple(rank_times), skipped, "tuned",
                          str(path) if path is not None else None)


def _per_rank(measured: Any, world_size: int) -> list[float]:
    """The timer's answer as a list of floats: per rank, or one number (already the MAX)."""
    if isinstance(measured, (int, float)) and not isinstance(measured, bool):
        return [float(measured)]
    values = [float(v) for v in measured]
    if len(values) not in (1, world_size):
        raise AutotuneError(f"the timer returned {len(values)} times for a world of {world_size} ranks (the "
                            f"timer's process group and the autotuner's differ?)")
    return values


def _mismatch_message(op: str, gathered: list) -> str:
    groups: dict[str, list[int]] = {}
    for r, g in enumerate(gathered):
        groups.setdefault(g[0], []).append(r)
    parts = []
    for digest, ranks in groups.items():
        _, op_r, key_r, count, _ = gathered[ranks[0]]
        parts.append(f"ranks {ranks}: op {op_r!r}, key {key_r[:300]}, {count} candidates "
                     f"(digest {digest[:12]})")
    return (f"triton_dist autotune {op}: ranks disagree on what to tune (every rank must call it with the same "
            f"op, key and candidates, in the same order): " + "; ".join(parts))


def _valid_entry(entry: Any, disk_key: dict, cand_json: list[str]) -> bool:
    try:
        index = entry["index"]
        return (_canonical(entry["key"]) == _canonical(disk_key) and isinstance(index, int)
                and not isinstance(index, bool) and 0 <= index < len(cand_json)
                and _canonical(entry["config"]) == cand_json[index] and len(entry["times_us"]) == len(cand_json)
                and len(entry["rank_times_us"]) == len(cand_json) and isinstance(entry["skipped"], dict))
    except (KeyError, TypeError):
        return False


def _read_entry(path: Path, disk_key: dict, cand_json: list[str]) -> dict | None:
    try:
        entry = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        log.warning("triton_dist autotune: ignoring unreadable cache file %s (%s)", path, e)
        return None
    if not _valid_entry(entry, disk_key, cand_json):
        log.warning("triton_dist autotune: ignoring cache file %s: it does not match this request", path)
        return None
    return entry


def _write_entry(path: Path, entry: dict) -> None:
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(entry, f, indent=1, sort_keys=True)
            f.write("\n")
        os.replace(tmp, path)
        tmp = None
    except OSError as e:
        log.warning("triton_dist autotune: could not write cache file %s (%s); the decision stays in memory", path, e)
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


_default: DistributedAutotuner | None = None


def default_autotuner() -> DistributedAutotuner:
    """The process's shared autotuner (default communicator, timer, counts and cache directory)."""
    global _default
    if _default is None:
        _default = DistributedAutotuner()
    return _default


def best_config(op: str, key: Any, candidates: Sequence[Any], run: Callable[[Any], Any], *,
                precheck: Callable[[Any], Any] | None = None, autotuner: DistributedAutotuner | None = None) -> Any:
    """The fastest of ``candidates`` for ``op`` at ``key``, the same on every rank (collective on a
    miss; see the module docstring). ``autotuner``: default :func:`default_autotuner`."""
    return (autotuner or default_autotuner()).best_config(op, key, candidates, run, precheck=precheck)


def tune(op: str, key: Any, candidates: Sequence[Any], run: Callable[[Any], Any], *,
         precheck: Callable[[Any], Any] | None = None, autotuner: DistributedAutotuner | None = None) -> TuneResult:
    """:func:`best_config` with the timings and skipped candidates (:class:`TuneResult`)."""
    return (autotuner or default_autotuner()).tune(op, key, candidates, run, precheck=precheck)
