"""A PNG of a trace written by :func:`triton_dist.timeline.write_chrome_trace`: one row per rank
and program, tiles as bars coloured by phase (wait, compute, epilogue), time in microseconds.

    python -m triton_dist.tools.plot_timeline trace.json [--out trace.png] [--programs 16]

Needs matplotlib (``pip install matplotlib``). ``--programs``: the first programs of each rank
only (a full H200 has 132 per rank).
"""

from __future__ import annotations

import argparse
import json
import sys

COLOURS = {"wait": "#d62728", "compute": "#1f77b4", "epilogue": "#2ca02c"}


def plot(trace: dict, path: str, programs: int = 16) -> str:
    """Draw ``trace`` (the trace-event JSON) into ``path``; returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    spans = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e["name"] in COLOURS and e["tid"] < programs]
    lanes = sorted({(e["pid"], e["tid"]) for e in spans})
    row = {lane: i for i, lane in enumerate(lanes)}
    # Lanes thin out past 48 so that a whole GPU's programs (132 a rank) fit one readable figure.
    fig, ax = plt.subplots(figsize=(12, max(2.0, min(0.18 * len(lanes), 9.0) + 1)))
    for name, colour in COLOURS.items():
        mine = [e for e in spans if e["name"] == name]
        if not mine:  # an empty bar set still takes a legend entry, in the default colour
            continue
        ax.barh([row[(e["pid"], e["tid"])] for e in mine], [e["dur"] for e in mine], left=[e["ts"] for e in mine],
                height=0.8, color=colour, label=name, linewidth=0)
    step = max(1, len(lanes) // 48)  # a label every few lanes when they are thin
    ax.set_yticks(range(0, len(lanes), step), [f"rank {p} · {t}" for p, t in lanes[::step]], fontsize=6)
    ax.invert_yaxis()
    ax.set_xlabel("µs")
    ax.legend(loc="upper right", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=150)
    plt.close(fig)
    return path


def main(argv=None) -> int:
    """The command line (module notes): draws the trace file into a PNG beside it or ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace")
    parser.add_argument("--out")
    parser.add_argument("--programs", type=int, default=16)
    args = parser.parse_args(argv)
    with open(args.trace) as f:
        trace = json.load(f)
    print(plot(trace, args.out or args.trace.rsplit(".", 1)[0] + ".png", args.programs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
