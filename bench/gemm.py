"""Our persistent GEMM (:func:`triton_dist.kernels.gemm.dense.gemm`) alone against cuBLAS
(``torch.matmul``), ``C = A @ B.T`` in bf16, on one GPU: issue 22's table.

    python bench/gemm.py [--quick] [--m 1,16] [--shapes 4096x7168,70b.down] [--no-sweep] [--cublas-kernels]
                         [--no-do-bench] [--same-operands] [--budget-s 540] [--merge | --resume] [--list]
                         [--trial-config NAME=BM,BN,BK,GROUP_M,STAGES,WARPS[,FLATTEN]]
                         [--trial-split-k NAME=BM,BN,BK,STAGES,WARPS]

Rows: M in :data:`M_VALUES` x every (N, K) of the QKV, O, gate+up (fused) and down projections of
:data:`MODELS`, unsplit and split over 2, 4 and 8 ranks both ways (column-parallel: N / world;
row-parallel: K / world), pairs deduplicated (a record's ``labels`` name every projection that has
its (N, K), e.g. ``llama3.1-70b.down/row2``). ``--quick``: :data:`QUICK_M` x :data:`QUICK_PAIRS`.
``--m`` replaces the M values; ``--shapes`` keeps the pairs matching any of its items (``NxK``, or a
piece of a label: ``405b``, ``qkv``, ``row8``); ``--list`` prints the rows and exits (no GPU).

Timing (docs/design.md §7). Headline (``ours_us``, ``baselines.torch_cublas_us``): *sustained*.
Each contender (ours, cuBLAS and, unless ``--no-sweep``, every config of
:data:`~triton_dist.kernels.gemm.dense.CONFIGS`, for M <= ``SKINNY_MAX_M``
:data:`~triton_dist.kernels.gemm.dense.SKINNY_CONFIGS`, and every split-K config
(:data:`~triton_dist.kernels.gemm.split_k.CONFIG_NAMES`) whose ``BM`` holds M, and above 128 rows the
wave-tail configs, :data:`~triton_dist.kernels.gemm.wave_tail.CONFIG_NAMES`) is captured in a CUDA graph of up to
:data:`GROUP` calls; the replays of all contenders are issued back to back with no sync between
them, in turn (ours, cuBLAS, configs, then the reverse order), and each contender's time is the
median over its replays. Why: one call per sample after a sync gave ours/cuBLAS 1.14 at
8192x14336x8192 on one H200 and 0.94 minutes later on the same machine; under sustained load the
H200 is power-limited (SM clock ~1440 MHz instead of 1980), idle gaps let it boost, and which
contender got the boost decided the ratio. Sustained graph replay gave 0.99-1.01. Taking turns
makes any remaining clock or power drift hit every contender alike.
Beside it (``do_bench``): ``triton.testing.do_bench`` (L2 flushed before every call, median) of one
eager call each; for the smallest shapes that includes the host's launch cost where the flush
does not hide it.

Operands: unless ``--same-operands``, the calls of a graph rotate over copies of A and B, enough
copies that they span :data:`ROTATE_L2` x the L2 size: a model's step reads each layer's weights
from HBM, while twenty calls on the same small B would run out of L2. ``--same-operands``: the
same A and B in every call, as this script timed before (and, as far as its text says, issue 22).

Per row: ``config`` (what ``gemm`` picks: ``pick_gemm_config``), ``config_us``
(every applicable config, sustained, in the same turns: the data to re-derive the pick rule),
``best_config``, ``split_k_slices`` (the K slices each timed split-K config ran with:
``pick_split_k``'s; with ``--sweep-slices`` also ``slices_us``, each split-K config at the other
counts of :data:`SLICE_COUNTS`: the data to re-derive that rule), ``tail_slices`` (the K slices of
each timed wave-tail config's last-wave tiles, ``pick_tail_split``'s; 1: it ran as its base);
with ``--cublas-kernels``, ``cublas_kernels`` (the kernel names of one profiled cuBLAS call:
its tile shape and split of K for the row); ``verified``: ours within :data:`REL_TOL` of an fp32 reference on up to
:data:`REF_ROWS` rows (random inputs); a config that misses it is left out of ``config_us`` and
listed in ``config_errors``. Bar (issue 22): cuBLAS/ours >= 0.95 on every row, median >= 1.

One GPU only (not under torchrun: the old MAX over ranks added nothing to a one-GPU GEMM). Writes
bench/results/<gpu>-x1/gemm.json every 10 rows and at the end (``--merge`` keeps the file's
records of other rows; ``--resume`` also skips rows the file has), so a run cut by a time limit
keeps its rows; ``--budget-s`` stops starting rows after that many seconds. The full run takes
longer than one 10-minute GPU call: cut it with ``--m`` / ``--shapes`` or ``--budget-s`` +
``--resume``; run whole, pass ``--timeout-s 3600`` (the watchdog's 900 s default is for hangs). At
start it prints the row count and a time estimate from a rough H200 model.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
try:
    import triton_dist._C  # noqa: F401  an installed build
except ImportError:
    sys.path.insert(0, str(HERE.parent / "python"))

from triton_dist import bench  # noqa: E402
from triton_dist.kernels.gemm.dense import (CONFIGS, SKINNY_CONFIGS, SKINNY_MAX_M, gemm, num_sms,  # noqa: E402
                                            pick_gemm_config)
from triton_dist.kernels.gemm.split_k import CONFIG_NAMES as SPLIT_K_CONFIGS  # noqa: E402
from triton_dist.kernels.gemm.split_k import config_params as split_k_params, gemm_split_k, pick_split_k  # noqa: E402
from triton_dist.kernels.gemm.split_k import NARROW_CONFIGS, SPLIT_K_MAX_M  # noqa: E402
from triton_dist.kernels.gemm.wave_tail import CONFIG_NAMES as WAVE_TAIL_CONFIGS, tail_split_for  # noqa: E402

SLICE_COUNTS = (1, 2, 3, 4, 6, 8)
"""``--sweep-slices``: the K slice counts each split-K config is also timed with."""

M_VALUES = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 8192)
WORLDS = (1, 2, 4, 8)
MODELS = {
    # hidden, intermediate, attention heads, KV heads, head dim (the models' config.json)
    "llama3.1-8b": (4096, 14336, 32, 8, 128),
    "llama3.1-70b": (8192, 28672, 64, 8, 128),
    "llama3.1-405b": (16384, 53248, 128, 8, 128),
    "qwen2-72b": (8192, 29568, 64, 8, 128),
}
QUICK_M = (1, 16, 128, 1024, 8192)
QUICK_PAIRS = (
    (4096, 7168),  # llama3.1-8b down over 2 ranks: issue 22's worst decode row
    (8192, 14336),  # llama3.1-70b down over 2 ranks
    (14336, 8192),  # llama3.1-70b gate+up over 4 ranks
    (8192, 8192),  # llama3.1-70b / qwen2-72b O, unsplit
)

REL_TOL = 1e-2
REF_ROWS = 64
"""Rows of C checked against fp32: a full fp32 reference of an 8192 x 106496 x 16384 row would cost
more than timing it."""
GROUP = 20
"""Most calls per graph replay; fewer where a call is long (:func:`sampling`)."""
SAMPLE_US = 2000.0
"""A replay's target length: long enough that event and replay overheads vanish in it."""
CONTENDER_US = 300_000.0
"""GPU time per contender's timed replays, between :data:`MIN_ITERS` and :data:`ITERS` replays."""
ITERS, MIN_ITERS = 30, 10
WARMUP_US = 50_000.0
"""Untimed turns first, at least two, until about this much GPU time (clocks settle under load)."""
ROTATE_L2 = 3
"""Operand copies span this many L2 sizes, so that calls read B from HBM as a model's layers do."""
DO_BENCH_WARMUP_MS, DO_BENCH_REP_MS = 5, 25
"""Below do_bench's defaults (25, 100): its median is steady at a few hundred calls, and the full run
has about a thousand rows."""

# The time model of the start-up estimate (one H200, sustained; rough).
_MODEL_TFLOPS, _MODEL_HBM_GBPS, _MODEL_LAUNCH_US, _MODEL_ROW_HOST_S = 700.0, 4000.0, 4.0, 0.3


def shape_pairs() -> dict[tuple[int, int], list[str]]:
    """Every (N, K) of :data:`MODELS`' projections over :data:`WORLDS` ranks both ways, with the
    labels of the projections that have it, in first-seen order. Only splits that divide evenly
    and keep N and K multiples of 8 (TMA's 16-byte rows)."""
    pairs: dict[tuple[int, int], list[str]] = {}
    for model, (hidden, inter, heads, kv_heads, head_dim) in MODELS.items():
        projections = {"qkv": ((heads + 2 * kv_heads) * head_dim, hidden), "o": (hidden, heads * head_dim),
                       "gate_up": (2 * inter, hidden), "down": (hidden, inter)}
        for proj, (n, k) in projections.items():
            for world in WORLDS:
                for way in (("",) if world == 1 else ("col", "row")):
                    nn, kk = (n // world, k) if way == "col" else (n, k // world) if way == "row" else (n, k)
                    split = n if way == "col" else k
                    if split % world or nn % 8 or kk % 8:
                        continue
                    pairs.setdefault((nn, kk), []).append(f"{model}.{proj}" + (f"/{way}{world}" if way else ""))
    return pairs


def parse_ms(text: str | None) -> tuple[int, ...] | None:
    """``--m``: comma-separated row counts >= 1."""
    if not text:
        return None
    try:
        ms = tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise SystemExit(f"--m: {text!r} is not a comma-separated list of integers") from None
    if not ms or min(ms) < 1:
        raise SystemExit(f"--m: {text!r}: give row counts >= 1")
    return ms


def parse_shapes(text: str | None) -> tuple[str, ...] | None:
    """``--shapes``: comma-separated items, each ``NxK`` or a piece of a label."""
    items = tuple(t.strip() for t in (text or "").split(",") if t.strip())
    return items or None


def _exact_pair(item: str) -> tuple[int, int] | None:
    parts = item.lower().split("x")
    if len(parts) == 2 and all(p.isdigit() for p in parts):
        return int(parts[0]), int(parts[1])
    return None


def rows(quick: bool = False, ms=None, shapes=None) -> list[tuple[int, int, int, tuple[str, ...]]]:
    """``(M, N, K, labels)`` to measure, grouped by (N, K): the full set, or ``quick``'s subset;
    ``ms`` replaces the M values; ``shapes`` keeps the pairs matching an item (``NxK`` exactly, else
    a case-insensitive piece of a label). An ``NxK`` of no projection is added, labelled ``custom``
    (N and K must then be multiples of 8)."""
    pairs = shape_pairs()
    if quick:
        pairs = {p: pairs[p] for p in QUICK_PAIRS}
    if shapes:
        kept = {}
        for item in shapes:
            exact = _exact_pair(item)
            if exact is not None:
                if exact[0] % 8 or exact[1] % 8 or min(exact) < 8:
                    raise SystemExit(f"--shapes {item}: N and K must be positive multiples of 8 (TMA)")
                kept[exact] = shape_pairs().get(exact, ["custom"])
            else:
                kept.update({p: labels for p, labels in pairs.items()
                             if any(item.lower() in label.lower() for label in labels)})
        order = list(shape_pairs())  # the projections' order, whatever order the items came in
        pairs = {p: kept[p] for p in sorted(kept, key=lambda p: order.index(p) if p in order else len(order))}
    m_values = ms or (QUICK_M if quick else M_VALUES)
    return [(m, n, k, tuple(labels)) for (n, k), labels in pairs.items() for m in m_values]


def sweep_configs(m: int) -> list[str]:
    """The configs ``gemm`` accepts that are meant for ``m`` rows: CONFIGS always, SKINNY_CONFIGS up to
    ``SKINNY_MAX_M`` rows, each split-K config whose ``BM`` holds ``m`` rows, and above
    ``SPLIT_K_MAX_M`` rows the wave-tail configs (timed beside their bases, which the default rule
    takes where nothing is cut)."""
    return (list(CONFIGS) + (list(SKINNY_CONFIGS) if m <= SKINNY_MAX_M else []) +
            [name for name, bm in SPLIT_K_CONFIGS.items() if m <= bm] +
            (list(WAVE_TAIL_CONFIGS) if m > SPLIT_K_MAX_M else []))


_SMEM_BYTES = 227 << 10
"""Shared memory one program may use on sm_90, against which a trial config's stages are checked."""


def _trial_values(option: str, spec: str, fields: str) -> tuple[str, list[int]]:
    """``NAME=v1,v2,...`` of a ``--trial-*`` option -> ``(NAME, [ints])``, one per comma-separated
    name of ``fields``; SystemExit naming the option and the form otherwise."""
    name, _, values = spec.partition("=")
    try:
        ints = [int(v) for v in values.split(",")]
    except ValueError:
        ints = []
    if len(ints) != len(fields.split(",")):
        raise SystemExit(f"{option} {spec!r}: expected NAME={fields} ({len(fields.split(','))} integers)")
    if not name or name in SPLIT_K_CONFIGS or name in CONFIGS or name in SKINNY_CONFIGS:
        raise SystemExit(f"{option} {spec!r}: the name must be new")
    return name, ints


def add_trial_split_k(spec: str) -> str:
    """``--trial-split-k NAME=BM,BN,BK,STAGES,WARPS``: a split-K tile shape the library does not
    ship, registered for this process only, so the sweep times it beside the shipped configs (a
    candidate is measured before it becomes one). Returns the name."""
    name, (bm, bn, bk, stages, warps) = _trial_values("--trial-split-k", spec, "BM,BN,BK,STAGES,WARPS")
    if not name.startswith("split_k_m"):
        raise SystemExit(f"--trial-split-k {spec!r}: the name must start with split_k_m")
    if bm > SPLIT_K_MAX_M or bn not in (64, 128, 256) or (bn + bm) * bk * 2 * stages > _SMEM_BYTES:
        raise SystemExit(f"--trial-split-k {spec!r}: BM <= {SPLIT_K_MAX_M}, BN in 64/128/256, "
                         "stages x (BN + BM) x BK x 2 bytes within 227 KiB of shared memory")
    NARROW_CONFIGS[name] = dict(BM=bm, BN=bn, BK=bk, NUM_STAGES=stages, num_warps=warps)
    SPLIT_K_CONFIGS[name] = bm
    return name


def add_trial_config(spec: str) -> str:
    """``--trial-config NAME=BM,BN,BK,GROUP_M,STAGES,WARPS[,FLATTEN]``: a tile shape of the persistent
    GEMM (:data:`CONFIGS`, swept at every M; ``FLATTEN`` 1: its tile and K loops fused, see
    :func:`~triton_dist.kernels.gemm.dense.gemm_kernel`) the library does not ship, for this
    process only, as :func:`add_trial_split_k`. Returns the name."""
    fields = "BM,BN,BK,GROUP_M,STAGES,WARPS" + (",FLATTEN" if spec.count(",") == 6 else "")
    name, (bm, bn, bk, group_m, stages, warps, *flatten) = _trial_values("--trial-config", spec, fields)
    if (bm + bn) * bk * 2 * stages + bm * bn * 2 > _SMEM_BYTES or min(bm, bn, bk, group_m, stages, warps) < 1:
        raise SystemExit(f"--trial-config {spec!r}: positive values, and stages x (BM + BN) x BK x 2 bytes plus "
                         "the BM x BN x 2-byte epilogue tile within 227 KiB of shared memory")
    CONFIGS[name] = dict(BM=bm, BN=bn, BK=bk, GROUP_M=group_m, NUM_STAGES=stages, num_warps=warps)
    if flatten and flatten[0]:
        CONFIGS[name]["FLATTEN"] = True
    return name


def model_us(m: int, n: int, k: int) -> float:
    """A rough H200 time of one call: the larger of compute and HBM traffic, plus a launch."""
    flops_us = 2.0 * m * n * k / (_MODEL_TFLOPS * 1e6)
    bytes_us = 2.0 * (m * k + n * k + m * n) / (_MODEL_HBM_GBPS * 1e3)
    return max(flops_us, bytes_us) + _MODEL_LAUNCH_US


def sampling(call_us: float) -> tuple[int, int]:
    """``(calls per replay, timed replays per contender)`` for calls of ``call_us``."""
    group = min(GROUP, max(1, math.ceil(SAMPLE_US / call_us)))
    iters = min(ITERS, max(MIN_ITERS, math.ceil(CONTENDER_US / (group * call_us))))
    return group, iters


def warmup_turns(contenders: int, group: int, call_us: float) -> int:
    return max(2, math.ceil(WARMUP_US / (contenders * group * call_us)))


def _do_bench_ms(call_us: float) -> tuple[float, float]:
    """do_bench's ``(warmup, rep)`` in ms: at least ~5 timed calls of a long GEMM."""
    return float(DO_BENCH_WARMUP_MS), max(float(DO_BENCH_REP_MS), 5 * (call_us / 1000 + 0.1))


def estimate_row_s(m: int, n: int, k: int, sweep: bool = True, do_bench: bool = True) -> float:
    """Seconds one row takes by :func:`model_us`: timed and warm-up turns, do_bench, host set-up."""
    call = model_us(m, n, k)
    group, iters = sampling(call)
    contenders = 2 + (len(sweep_configs(m)) - 1 if sweep else 0)
    turns = iters + warmup_turns(contenders, group, call)
    seconds = contenders * turns * group * call / 1e6 + _MODEL_ROW_HOST_S
    if do_bench:
        warm, rep = _do_bench_ms(call)
        flushed = call + 70.0  # do_bench zeroes 256 MB before each call: ~70 us on an H200
        seconds += 2 * (6 * flushed / 1e3 + max(rep, flushed / 1e3) + max(warm, call / 1e3)) / 1e3
    return seconds


def format_rows(records: list[dict]) -> str:
    """Issue 22's table: M, N, K, ours and cuBLAS (sustained), cuBLAS/ours, the same ratio by
    do_bench, the picked and the fastest config (cuBLAS/it), verified; then a summary line."""
    header = ["M", "N", "K", "ours_us", "cublas_us", "cublas/ours", "do_bench", "config", "best_config", "cublas/best",
              "verified"]
    table, ratios = [], []
    for rec in records:
        m, n, k = rec["shape"]
        ours, cublas = rec["ours_us"], rec["baselines"].get("torch_cublas_us")
        ratio = cublas / ours if cublas and ours else None
        if ratio is not None:
            ratios.append((ratio, rec["shape"]))
        db = rec.get("do_bench") or {}
        db_ratio = db["cublas_us"] / db["ours_us"] if db.get("ours_us") and db.get("cublas_us") else None
        best = rec.get("best_config")
        best_us = (rec.get("config_us") or {}).get(best)
        table.append([str(m), str(n), str(k), f"{ours:.1f}", f"{cublas:.1f}" if cublas else "-",
                      f"{ratio:.3f}" if ratio else "-", f"{db_ratio:.3f}" if db_ratio else "-",
                      str(rec.get("config", "-")), str(best or "-"),
                      f"{cublas / best_us:.3f}" if best_us and cublas else "-", str(rec.get("verified", "-"))])
    widths = [max(len(c) for c in col) for col in zip(header, *table)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(line, widths)) for line in [header] + table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    if ratios:
        worst = min(ratios)
        short = sum(r < 0.95 for r, _ in ratios)
        lines.append(f"{len(ratios)} rows: {short} below 0.95 of cuBLAS; median cuBLAS/ours "
                     f"{statistics.median(r for r, _ in ratios):.3f}; worst {worst[0]:.3f} at "
                     f"{'x'.join(map(str, worst[1]))}")
    return "\n".join(lines)


# ---- on the GPU ----


def _sustained_us(fns: dict, group: int, iters: int, copies: int, call_us: float) -> dict[str, float]:
    """Median µs per call of each ``fns[name](i)`` (``i``: the operand copy), graph replays of
    ``group`` calls issued in turns with no sync between them (see the module docstring)."""
    import torch

    graphs = {}
    for name, fn in fns.items():
        graphs[name] = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graphs[name]):
            for i in range(group):
                fn(i % copies)
    torch.cuda.synchronize()
    names = list(graphs)
    for _ in range(warmup_turns(len(names), group, call_us)):
        for name in names:
            graphs[name].replay()
    events = {name: [] for name in names}
    for turn in range(iters):
        for name in names if turn % 2 == 0 else names[::-1]:
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graphs[name].replay()
            stop.record()
            events[name].append((start, stop))
    torch.cuda.synchronize()
    return {name: statistics.median(s.elapsed_time(e) * 1000.0 / group for s, e in ev) for name, ev in events.items()}


def _do_bench_us(fn, call_us: float) -> float:
    """``triton.testing.do_bench``'s median in µs (it zeroes a 256 MB buffer before each timed call,
    flushing L2); ``quantiles`` where a Triton has no ``return_mode``."""
    from triton.testing import do_bench

    warm, rep = _do_bench_ms(call_us)
    try:
        ms = do_bench(fn, warmup=warm, rep=rep, return_mode="median")
    except TypeError:
        ms = do_bench(fn, warmup=warm, rep=rep, quantiles=[0.5])
    if isinstance(ms, (list, tuple)):
        ms = ms[0]
    return float(ms) * 1000.0


def _call_us(fn) -> float:
    """One warmed call's µs (events around three calls): sizes the sampling, not reported."""
    import torch

    fn()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(3):
        fn()
    stop.record()
    torch.cuda.synchronize()
    return max(start.elapsed_time(stop) * 1000.0 / 3, 1.0)


def measure_row(m: int, n: int, k: int, labels, args, gpu: str, sms: int, l2_bytes: int) -> dict:
    import torch

    dev = torch.device("cuda", torch.cuda.current_device())
    gen = torch.Generator(device=dev).manual_seed(m * 1_000_003 + n * 1009 + k)
    scale = k ** -0.25  # products of unit size: far from bf16's range and from zero
    a = torch.randn(m, k, device=dev, dtype=torch.bfloat16, generator=gen).mul_(scale)
    b = torch.randn(n, k, device=dev, dtype=torch.bfloat16, generator=gen).mul_(scale)
    idx = torch.linspace(0, m - 1, min(m, REF_ROWS), device=dev).round().long().unique()
    ref = torch.matmul(a[idx].float(), b.float().t())
    outs = {name: torch.empty(m, n, device=dev, dtype=torch.bfloat16) for name in ("ours", "cublas", "config")}

    def error(out) -> float:
        return bench.script.relative_error(out[idx], ref)

    picked = pick_gemm_config(m, n, k, sms)  # gemm's own rule
    gemm(a, b, out=outs["ours"])
    torch.matmul(a, b.t(), out=outs["cublas"])
    torch.cuda.synchronize()
    ours_error, cublas_error = error(outs["ours"]), error(outs["cublas"])
    configs, config_errors = [], {}
    for c in sweep_configs(m) if not args.no_sweep else []:
        if c == picked:
            continue  # timed as "ours": the same kernel
        try:
            gemm(a, b, out=outs["config"], config=c)
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001  a config that cannot build for this shape (e.g. out of resources)
            config_errors[c] = f"{type(e).__name__}: {e}".splitlines()[0]
            continue
        err = error(outs["config"])
        if err < REL_TOL:
            configs.append(c)
        else:
            config_errors[c] = err if math.isfinite(err) else None
    call = _call_us(lambda: torch.matmul(a, b.t(), out=outs["cublas"]))
    group, iters = sampling(call)
    pair_bytes = 2 * (m * k + n * k)
    copies = 1 if args.same_operands else min(group, max(1, math.ceil(ROTATE_L2 * l2_bytes / pair_bytes)))
    a_s, b_s = [a] + [a.clone() for _ in range(copies - 1)], [b] + [b.clone() for _ in range(copies - 1)]
    fns = {"ours": lambda i: gemm(a_s[i], b_s[i], out=outs["ours"]),
           "cublas": lambda i: torch.matmul(a_s[i], b_s[i].t(), out=outs["cublas"])}
    fns.update({c: (lambda i, c=c: gemm(a_s[i], b_s[i], out=outs["config"], config=c)) for c in configs})
    forced = {}  # "config/sN": (config, N), split-K configs run with N slices instead of pick_split_k's
    if args.sweep_slices:
        for c in [picked, *configs]:
            if c not in SPLIT_K_CONFIGS:
                continue
            steps = -(-k // split_k_params(c)["BK"])
            for count in SLICE_COUNTS:
                if count != pick_split_k(m, n, k, sms, c) and count <= steps:
                    forced[f"{c}/s{count}"] = (c, count)
        for name, (c, count) in forced.items():
            fns[name] = lambda i, c=c, count=count: gemm_split_k(a_s[i], b_s[i], outs["config"], c, sms, split_k=count)
    us = _sustained_us(fns, group, iters, copies, call)
    ours, cublas = us.pop("ours"), us.pop("cublas")
    extra = {}
    if forced:
        slices_us = {}
        for name, (c, count) in forced.items():
            slices_us.setdefault(c, {})[count] = us.pop(name)
        extra["slices_us"] = slices_us
    if not args.no_sweep:
        config_us = {picked: ours, **us}
        extra.update(config_us=config_us, best_config=min(config_us, key=config_us.get))
        slices = {c: pick_split_k(m, n, k, sms, c) for c in config_us if c in SPLIT_K_CONFIGS}
        if slices:
            extra["split_k_slices"] = slices
        tails = {c: tail_split_for(m, n, k, c, sms) for c in config_us if c in WAVE_TAIL_CONFIGS}
        if tails:
            extra["tail_slices"] = tails
    if config_errors:
        extra["config_errors"] = config_errors
    if args.cublas_kernels:
        extra["cublas_kernels"] = bench.kernels_launched(lambda: torch.matmul(a, b.t(), out=outs["cublas"]))
    if not args.no_do_bench:
        extra["do_bench"] = {"ours_us": _do_bench_us(lambda: gemm(a, b, out=outs["ours"]), call),
                             "cublas_us": _do_bench_us(lambda: torch.matmul(a, b.t(), out=outs["cublas"]), call)}
    warm, rep = _do_bench_ms(call)
    return bench.record(
        "gemm", shape=[m, n, k], dtype="bfloat16", world_size=1, gpu=gpu, ours_us=ours,
        baselines={"torch_cublas_us": cublas}, bound_us=cublas, labels=list(labels), ratio=cublas / ours,
        tflops=2 * m * n * k / ours / 1e6, gbps=2 * (m * k + n * k + m * n) / ours / 1e3,
        max_rel_error=ours_error if math.isfinite(ours_error) else None,
        cublas_rel_error=cublas_error if math.isfinite(cublas_error) else None, verified=ours_error < REL_TOL,
        config=picked, **extra,
        timing={"method": "sustained: CUDA graph replays, contenders in turns, median", "calls_per_replay": group,
                "replays": iters, "operand_copies": copies, "reference_rows": int(idx.numel()),
                "do_bench": None if args.no_do_bench else {"warmup_ms": warm, "rep_ms": rep, "l2_flush": True,
                                                           "return_mode": "median"}})


def _parser():
    parser = bench.script.argument_parser(__doc__, HERE / "results")
    parser.add_argument("--m", help="comma-separated M values, replacing the default ones")
    parser.add_argument("--shapes", help="comma-separated NxK pairs or label pieces (405b, qkv, row8, ...)")
    parser.add_argument("--no-sweep", action="store_true", help="time ours and cuBLAS only, not every config")
    parser.add_argument("--no-do-bench", action="store_true", help="skip triton.testing.do_bench beside it")
    parser.add_argument("--sweep-slices", action="store_true",
                        help=f"also time each split-K config at {SLICE_COUNTS} K slices (slices_us)")
    parser.add_argument("--same-operands", action="store_true", help="no operand copies: L2-resident B for small N*K")
    parser.add_argument("--cublas-kernels", action="store_true",
                        help="record the kernels cuBLAS launches per row (cublas_kernels: its tiles and split)")
    parser.add_argument("--budget-s", type=float, help="start no row after this many seconds (then write)")
    parser.add_argument("--merge", action="store_true", help="keep the results file's records of rows not run")
    parser.add_argument("--resume", action="store_true", help="--merge, and skip rows the results file has")
    parser.add_argument("--trial-split-k", action="append", default=[], metavar="NAME=BM,BN,BK,STAGES,WARPS",
                        help="also sweep a split-K tile shape the library does not ship (repeatable)")
    parser.add_argument("--trial-config", action="append", default=[],
                        metavar="NAME=BM,BN,BK,GROUP_M,STAGES,WARPS[,FLATTEN]",
                        help="also sweep a persistent-GEMM tile shape the library does not ship (repeatable)")
    parser.add_argument("--list", action="store_true", help="print the rows and exit (no GPU)")
    return parser


def main() -> int:
    args = _parser().parse_args()
    for spec in args.trial_split_k:
        add_trial_split_k(spec)
    for spec in args.trial_config:
        add_trial_config(spec)
    if int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:
        raise SystemExit("bench/gemm.py times one GPU: run it with python, not torchrun")
    selected = rows(args.quick, parse_ms(args.m), parse_shapes(args.shapes))
    if not selected:
        raise SystemExit("no rows match --m / --shapes")
    if args.list:
        for m, n, k, labels in selected:
            print(f"{m:>5} {n:>6} {k:>6}  {', '.join(labels)}")
    estimate = sum(estimate_row_s(m, n, k, not args.no_sweep, not args.no_do_bench) for m, n, k, _ in selected)
    print(f"[gemm] {len(selected)} rows ({len({(n, k) for _, n, k, _ in selected})} (N, K) pairs); "
          f"roughly {estimate / 60:.0f} min on one H200 by a rough model, plus compiling", flush=True)
    if args.list:
        return 0
    bench.script.guard(args)
    import torch

    torch.set_float32_matmul_precision("highest")  # an fp32 reference, not TF32
    gpu = bench.gpu_slug()
    dev = torch.cuda.current_device()
    sms = num_sms(torch.device("cuda", dev))
    l2_bytes = getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 0) or 50 << 20
    path = bench.results_dir(gpu, 1, args.out) / "gemm.json"
    kept = []
    if (args.merge or args.resume) and path.is_file():
        kept = json.loads(path.read_text())
        if args.resume:
            done = {tuple(r["shape"]) for r in kept}
            selected = [r for r in selected if r[:3] not in done]
            print(f"[gemm] --resume: {len(done)} rows in {path}, {len(selected)} left to run", flush=True)
        measured = {r[:3] for r in selected}
        kept = [r for r in kept if tuple(r["shape"]) not in measured]
    print(f"[gemm] gpu {gpu}, {sms} SMs, L2 {l2_bytes >> 20} MiB, commit {bench.commit()}, {bench.versions()}",
          flush=True)
    t0, records = time.monotonic(), []

    def write():
        if kept or records:
            bench.write_results(kept + records, "gemm", root=args.out, rank=0)

    try:
        for index, (m, n, k, labels) in enumerate(selected):
            if args.budget_s is not None and time.monotonic() - t0 > args.budget_s:
                print(f"[gemm] --budget-s {args.budget_s:g} spent: {len(selected) - index} rows not run "
                      f"(rerun with --resume)", flush=True)
                break
            rec = measure_row(m, n, k, labels, args, gpu, sms, l2_bytes)
            records.append(rec)
            db = rec.get("do_bench")
            print(f"[gemm] {index + 1}/{len(selected)} {m}x{n}x{k} ({labels[0]}{' ...' if len(labels) > 1 else ''}): "
                  f"ours {rec['ours_us']:.1f} us, cuBLAS {rec['bound_us']:.1f} us, cuBLAS/ours {rec['ratio']:.3f}"
                  + (f" (do_bench {db['cublas_us'] / db['ours_us']:.3f})" if db else "")
                  + f", {rec['config']}" + (f", best {rec['best_config']}" if "best_config" in rec else "")
                  + ("" if rec["verified"] else f", NOT VERIFIED (rel error {rec['max_rel_error']})")
                  + f" [{time.monotonic() - t0:.0f} s]", flush=True)
            if len(records) % 10 == 0:
                write()
            del rec
            torch.cuda.empty_cache()  # rows' operands range from KBs to GBs: no cached blocks piling up
    finally:
        write()  # a row that raised keeps the rows before it
    if kept or records:
        order = {r[:3]: i for i, r in enumerate(rows())}
        every = sorted(kept + records, key=lambda r: (order.get(tuple(r["shape"]), len(order)), r["shape"]))
        print()
        print(format_rows(every))
        print(f"\n[gemm] wrote {path}" + (f" ({len(kept)} earlier records kept)" if kept else ""))
    return 0 if all(r["verified"] for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
