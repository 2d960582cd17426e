"""Plots of the benchmark JSON under ``bench/results/<gpu>-x<world>/``.

    python -m triton_dist.tools.plot_results bench/results/h200-x2 [--out DIR]

Writes, next to the JSON (or into ``--out``), one PNG per benchmark found:

- collectives (``allreduce``, ``allgather``, ``reduce_scatter``): latency and bus bandwidth
  against message size, ours (each method) against NCCL and torch symmetric memory, one row of
  plots per element type;
- overlapped GEMMs (``ag_gemm``, ``gemm_rs``, ``gemm_ar``): per shape, the speedup over torch + NCCL of ours and
  of torch's fused symm_mem op, and ours as a fraction of the bound (max(GEMM alone, transfer
  alone)).

Needs matplotlib (not a dependency of the library: ``pip install matplotlib``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

COLLECTIVES = {
    # bench name -> (busbw factor from (world, bytes of the record), what "bytes" is)
    "allreduce": (lambda w: 2 * (w - 1) / w, "message bytes"),
    "allgather": (lambda w: w - 1, "bytes per rank"),
    "reduce_scatter": (lambda w: (w - 1) / w, "input bytes"),
}
"""Bus bandwidth = factor * bytes / time, the nccl-tests convention for each collective."""

OVERLAPPED = ("ag_gemm", "gemm_rs", "gemm_ar")


def _series(records: list[dict]) -> dict[str, list[float | None]]:
    """Every timed contender of a collective sweep: each method's ``<method>_us`` and the baselines."""
    names: dict[str, list[float | None]] = {}
    skip = {"ours_us", "bound_us", "zero_copy_us"}
    keys = dict.fromkeys(key for r in records for key in r)  # some methods run only at some sizes
    for key in keys:
        if key.endswith("_us") and key not in skip:
            names[key[:-3]] = [r.get(key) for r in records]
    for key in dict.fromkeys(key for r in records for key in r.get("baselines", {})):
        names[key[:-3]] = [r["baselines"].get(key) for r in records]
    names["bound"] = [r["bound_us"] for r in records]
    return names


def plot_collective(name: str, records: list[dict], out: Path) -> Path:
    """One row per element type: latency (left) and bus bandwidth (right) against size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    factor, what = COLLECTIVES[name]
    world = records[0]["world_size"]
    by_dtype: dict[str, list[dict]] = {}
    for r in records:
        by_dtype.setdefault(r["dtype"], []).append(r)
    fig, axes = plt.subplots(len(by_dtype), 2, figsize=(13, 5 * len(by_dtype)), squeeze=False)
    for (dtype, rows), (lat, bw) in zip(by_dtype.items(), axes):
        sizes = [r["bytes"] for r in rows]
        for label, times in _series(rows).items():
            points = [(s, t) for s, t in zip(sizes, times) if t]
            if not points:
                continue
            style = dict(linestyle="--", color="grey") if label == "bound" else dict(marker="o", markersize=3)
            xs, ts = zip(*points)
            lat.plot(xs, ts, label=label, **style)
            bw.plot(xs, [factor(world) * s / (t * 1e3) for s, t in points], label=label, **style)
        for ax, ylabel in ((lat, "latency (us)"), (bw, "bus bandwidth (GB/s)")):
            ax.set_xscale("log", base=2)
            ax.set_xlabel(f"{what} ({dtype})")
            ax.set_ylabel(ylabel)
            ax.grid(True, which="both", alpha=0.3)
        lat.set_yscale("log")
        lat.legend(fontsize=8)
    fig.suptitle(f"{name} on {world} x {records[0]['gpu']} (commit {records[0].get('commit')}, CUDA-graph timing, "
                 f"median, max over ranks)")
    fig.tight_layout()
    path = out / f"{name}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_overlapped(name: str, records: list[dict], out: Path) -> Path:
    """The overlapped-GEMM plot of ``records`` (ours, the baselines and the bound per shape) into
    ``out``; returns its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r.get('model', '')}\n{'x'.join(map(str, r['shape']))}" for r in records]
    nccl = [r["baselines"]["torch_nccl_us"] for r in records]
    series = {"ours": [n / r["ours_us"] for n, r in zip(nccl, records)]}
    symm = [r["baselines"].get("torch_symm_mem_us") for r in records]
    if any(symm):
        series["torch symm_mem"] = [n / s if s else 0.0 for n, s in zip(nccl, symm)]
    series["bound (max(GEMM, transfer))"] = [n / r["bound_us"] for n, r in zip(nccl, records)]
    fig, ax = plt.subplots(figsize=(max(8, 1.3 * len(records)), 5))
    width = 0.8 / len(series)
    for i, (label, values) in enumerate(series.items()):
        ax.bar([x + i * width for x in range(len(records))], values, width, label=label)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([x + width * (len(series) - 1) / 2 for x in range(len(records))])
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_ylabel("speedup over torch + NCCL")
    ax.legend(fontsize=8)
    ax.set_title(f"{name} on {records[0]['world_size']} x {records[0]['gpu']} (commit {records[0].get('commit')}; "
                 f"shape: {records[0].get('shape_meaning', '')})", fontsize=9)
    fig.tight_layout()
    path = out / f"{name}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_dir(results: Path, out: Path | None = None) -> list[Path]:
    """Plot every known benchmark JSON in ``results``; returns the PNGs written."""
    out = out or results
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for path in sorted(results.glob("*.json")):
        name = path.stem
        records = json.loads(path.read_text())
        if not records:
            continue
        if name in COLLECTIVES:
            written.append(plot_collective(name, records, out))
        elif name in OVERLAPPED:
            written.append(plot_overlapped(name, records, out))
    return written


def main(argv: list[str] | None = None) -> int:
    """Command line: plot every results file of a directory (see the module notes)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", type=Path, help="a bench/results/<gpu>-x<world> directory")
    parser.add_argument("--out", type=Path, default=None, help="where the PNGs go (default: the results directory)")
    args = parser.parse_args(argv)
    for path in plot_dir(args.results, args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
