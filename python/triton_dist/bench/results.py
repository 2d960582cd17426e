"""Benchmark records (docs/design.md §7): building, writing and printing them.

Each results file ``bench/results/<gpu>-x<world>/<name>.json`` is a JSON list of records

    {"op", "shape", "dtype", "world_size", "gpu", "ours_us", "baselines": {"torch_nccl_us": ...,
     "torch_symm_mem_us": ...}, "bound_us", "commit", "versions"}

in median microseconds; a baseline that does not exist for an op is omitted, and a record may
carry extra fields after these (``bytes``, ``gbps``, ``config``, ...). Building, validating and
writing records needs no torch; :func:`gpu_slug` without a name and :func:`versions`' CUDA entry
ask torch.
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import math
import os
import re
import subprocess
from pathlib import Path

from .. import config as _config

FIELDS = ("op", "shape", "dtype", "world_size", "gpu", "ours_us", "baselines", "bound_us", "commit", "versions")
"""The record's fields, in order (docs/design.md §7)."""

RESULTS_ROOT: Path | None = None
"""Where ``<gpu>-x<world>/`` folders go when ``write_results`` is given no root; ``None``: the
``Config.results_dir`` (TRITON_DIST_RESULTS_DIR), else ``bench/results`` of the source tree this
package lives in, else ``bench/results`` under the current directory."""

_SOURCE_TREE = Path(__file__).resolve().parents[3]  # <repo>/python/triton_dist/bench/results.py


def _number(value, what: str, *, optional: bool = False) -> float | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"triton_dist.bench: {what} must be a finite number >= 0, got {value!r}")
    return float(value)


def record(op: str, *, shape, dtype: str, world_size: int, gpu: str, ours_us: float, baselines: dict | None = None,
           bound_us: float | None = None, commit: str | None = None, versions: dict | None = None, **extra) -> dict:
    """One result record with docs/design.md §7's fields in order, then ``extra`` fields.

    ``shape`` is a sequence of ints; baselines whose value is ``None`` are dropped; ``commit`` and
    ``versions`` default to this checkout's (see :func:`commit`, :func:`versions`).
    """
    clash = set(extra) & set(FIELDS)
    if clash:
        raise ValueError(f"triton_dist.bench: extra fields {sorted(clash)} clash with the record's own")
    rec = {
        "op": op,
        "shape": [int(s) for s in ([shape] if isinstance(shape, int) else shape)],
        "dtype": str(dtype),
        "world_size": world_size,
        "gpu": gpu,
        "ours_us": _number(ours_us, f"{op}: ours_us"),
        "baselines": {k: _number(v, f"{op}: baseline {k}") for k, v in (baselines or {}).items() if v is not None},
        "bound_us": _number(bound_us, f"{op}: bound_us", optional=True),
        "commit": commit if commit is not None else globals()["commit"](),
        "versions": dict(versions) if versions is not None else globals()["versions"](),
    }
    rec.update(extra)
    validate_record(rec)
    return rec


def validate_record(rec: dict) -> None:
    """Raise ValueError unless ``rec`` has docs/design.md §7's fields, in order, with sane types."""
    if not isinstance(rec, dict):
        raise ValueError(f"triton_dist.bench: a record is a dict, got {type(rec).__name__}")
    keys = tuple(rec)[:len(FIELDS)]
    if keys != FIELDS:
        missing = [f for f in FIELDS if f not in rec]
        why = f"missing {missing}" if missing else f"got {keys}"
        raise ValueError(f"triton_dist.bench: record fields must start with {FIELDS}; {why}")
    op = rec["op"]
    if not isinstance(op, str) or not op:
        raise ValueError(f"triton_dist.bench: op must be a non-empty string, got {op!r}")
    if not isinstance(rec["shape"], list) or not all(isinstance(s, int) and s >= 0 for s in rec["shape"]):
        raise ValueError(f"triton_dist.bench: {op}: shape must be a list of ints >= 0, got {rec['shape']!r}")
    if not isinstance(rec["dtype"], str) or not rec["dtype"]:
        raise ValueError(f"triton_dist.bench: {op}: dtype must be a non-empty string")
    ws = rec["world_size"]
    if isinstance(ws, bool) or not isinstance(ws, int) or ws < 1:
        raise ValueError(f"triton_dist.bench: {op}: world_size must be an int >= 1, got {ws!r}")
    if not isinstance(rec["gpu"], str) or not re.fullmatch(r"[a-z0-9][a-z0-9_.-]*", rec["gpu"]):
        raise ValueError(f"triton_dist.bench: {op}: gpu must be a slug such as 'h200', got {rec['gpu']!r}")
    _number(rec["ours_us"], f"{op}: ours_us")
    if not isinstance(rec["baselines"], dict):
        raise ValueError(f"triton_dist.bench: {op}: baselines must be a dict")
    for k, v in rec["baselines"].items():
        if not isinstance(k, str) or not k.endswith("_us"):
            raise ValueError(f"triton_dist.bench: {op}: baseline names end in '_us', got {k!r}")
        _number(v, f"{op}: baseline {k}")
    _number(rec["bound_us"], f"{op}: bound_us", optional=True)
    if not isinstance(rec["commit"], str) or not rec["commit"]:
        raise ValueError(f"triton_dist.bench: {op}: commit must be a non-empty string")
    if not isinstance(rec["versions"], dict):
        raise ValueError(f"triton_dist.bench: {op}: versions must be a dict")


def gpu_slug(name: str | None = None) -> str:
    """A short lowercase name for a GPU model: 'NVIDIA H200' -> 'h200', 'NVIDIA A100-SXM4-80GB' ->
    'a100'. Without ``name``, asks torch for the current device's name."""
    if name is None:
        import torch

        name = torch.cuda.get_device_name(torch.cuda.current_device())
    words = [w for w in re.split(r"[^a-z0-9]+", name.lower()) if w and w not in ("nvidia", "geforce", "tesla")]
    for w in words:
        if re.fullmatch(r"[a-z]+[0-9]+[a-z]*", w):  # h200, a100, b200, l40s, gb200
            return w
    slug = "".join(words)
    return slug or "unknown-gpu"


@functools.lru_cache(maxsize=None)
def commit() -> str:
    """``Config.commit`` when set (the GPU machine gets a copy of the working tree whose ``.git``,
    if any, may be stale), else the checkout's short hash (``-dirty`` when tracked files differ
    from it), else 'unknown'."""
    given = _config.get().commit
    if given:
        return given
    for where in (_SOURCE_TREE, Path.cwd()):
        try:
            head = subprocess.run(["git", "-C", str(where), "rev-parse", "--short", "HEAD"], capture_output=True,
                                  text=True, timeout=10)
            if head.returncode != 0 or not head.stdout.strip():
                continue
            dirty = subprocess.run(["git", "-C", str(where), "diff", "--quiet", "HEAD", "--"], capture_output=True,
                                   timeout=30)
            return head.stdout.strip() + ("-dirty" if dirty.returncode == 1 else "")
        except (OSError, subprocess.SubprocessError):
            continue
    return "unknown"


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.lru_cache(maxsize=None)
def versions() -> dict:
    """Versions of what the numbers depend on; ``None`` for what is not installed. CUDA and NCCL
    come from torch when it can be imported."""
    from .. import __version__ as tdist_version

    out = {
        "torch": _dist_version("torch"),
        "triton": _dist_version("triton"),
        "nvshmem": _dist_version("nvidia-nvshmem-cu13"),
        "triton_dist": tdist_version,
        "cuda": None,
        "nccl": None,
    }
    try:
        import torch

        out["cuda"] = torch.version.cuda
        if torch.cuda.is_available():
            out["nccl"] = ".".join(str(v) for v in torch.cuda.nccl.version())
    except Exception:  # noqa: BLE001 - no torch, or a torch without CUDA/NCCL: leave None
        pass
    return out


def results_dir(gpu: str, world_size: int, root: str | os.PathLike | None = None) -> Path:
    """``<root>/<gpu>-x<world_size>`` (not created)."""
    if root is None:
        root = RESULTS_ROOT
    if root is None:
        given = _config.get().results_dir
        if given:
            root = given
        elif (_SOURCE_TREE / "pyproject.toml").is_file() and (_SOURCE_TREE / "bench").is_dir():
            root = _SOURCE_TREE / "bench" / "results"
        else:
            root = Path.cwd() / "bench" / "results"
    return Path(root) / f"{gpu}-x{world_size}"


def _this_rank() -> int:
    import sys

    if "torch" in sys.modules:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank()
    return int(os.environ.get("RANK", "0") or 0)


def write_results(records: list[dict], name: str, *, root: str | os.PathLike | None = None,
                  rank: int | None = None) -> Path | None:
    """Write ``records`` to ``<root>/<gpu>-x<world>/<name>.json`` on rank 0 (replacing that file);
    returns the path there, ``None`` on other ranks. Every record must be valid and share one gpu
    and world size."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name or ""):
        raise ValueError(f"triton_dist.bench: results name must be a plain file name, got {name!r}")
    records = list(records)
    if not records:
        raise ValueError("triton_dist.bench: no records to write")
    for rec in records:
        validate_record(rec)
    machines = {(rec["gpu"], rec["world_size"]) for rec in records}
    if len(machines) != 1:
        raise ValueError(f"triton_dist.bench: records from several gpu/world sizes in one file: {sorted(machines)}")
    if (rank if rank is not None else _this_rank()) != 0:
        return None
    gpu, world_size = machines.pop()
    folder = results_dir(gpu, world_size, root)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(records, indent=1) + "\n")
    os.replace(tmp, path)
    return path


def _fmt(value, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}" if abs(value) < 1e5 else f"{value:.4g}"
    return str(value)


def _short(baseline: str) -> str:
    return baseline[:-3] if baseline.endswith("_us") else baseline


def format_table(records: list[dict], extra: tuple[str, ...] = ("gbps", )) -> str:
    """The table docs/design.md §7 asks for: op, shape, dtype, ours, each baseline, the bound, then
    ``baseline/ours`` (above 1: ours is faster) per baseline and ``bound/ours`` (1: at the bound),
    and the ``extra`` fields any record has."""
    baselines = []
    for rec in records:
        for k in rec["baselines"]:
            if k not in baselines:
                baselines.append(k)
    extra = tuple(e for e in extra if any(e in rec for rec in records))
    header = (["op", "shape", "dtype", "ours_us"] + baselines + ["bound_us"] +
              [f"{_short(b)}/ours" for b in baselines] + ["bound/ours"] + list(extra))
    rows = []
    for rec in records:
        ours = rec["ours_us"]
        base = [rec["baselines"].get(b) for b in baselines]
        ratios = [(v / ours if v is not None and ours else None) for v in base]
        bound = rec["bound_us"]
        rows.append([rec["op"], "x".join(str(s) for s in rec["shape"]), rec["dtype"], _fmt(ours)] +
                    [_fmt(v) for v in base] + [_fmt(bound)] + [_fmt(r) for r in ratios] +
                    [_fmt(bound / ours if bound is not None and ours else None)] +
                    [_fmt(rec.get(e)) for e in extra])
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    lines = ["  ".join(str(c).rjust(w) if i >= 3 else str(c).ljust(w) for i, (c, w) in enumerate(zip(row, widths)))
             for row in [header] + rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def print_table(records: list[dict], extra: tuple[str, ...] = ("gbps", )) -> None:
    """Print :func:`format_table` (call it on one rank)."""
    print(format_table(records, extra), flush=True)
