"""The documentation's generated pages, made from the sources at every build so that they cannot
drift: the configuration table (from :class:`triton_dist.config.Config`, its fields' docstrings
and defaults) and the benchmark tables (from ``bench/results/**/*.json``).

    python -m triton_dist.tools.docs_pages OUT_DIR [RESULTS_ROOT]
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import re
import sys
from pathlib import Path

_ENV = re.compile(r"\b(TRITON_DIST_[A-Z_]+)\b")


def config_fields() -> list[tuple[str, object, str]]:
    """``(name, default, docstring)`` of every :class:`~triton_dist.config.Config` field, in order
    (a dataclass keeps no field docstrings at run time: they are read from the source)."""
    from .. import config

    tree = ast.parse(inspect.getsource(config.Config))
    docs, last = {}, None
    for node in tree.body[0].body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            last = node.target.id
        elif isinstance(node, ast.Expr) and isinstance(getattr(node, "value", None), ast.Constant) and last:
            docs[last] = inspect.cleandoc(node.value.value)
            last = None
    return [(f.name, f.default, docs.get(f.name, "")) for f in dataclasses.fields(config.Config)]


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def configuration_markdown() -> str:
    """The configuration table: variable, default, meaning (the field's docstring)."""
    rows = ["| setting | environment variable | default | meaning |", "|---|---|---|---|"]
    for name, default, doc in config_fields():
        env = _ENV.search(doc)
        rows.append(f"| `{name}` | {f'`{env.group(1)}`' if env else '-'} | `{default!r}` | {_cell(doc)} |")
    return "\n".join(rows) + "\n"


def _markdown_table(records: list[dict]) -> str:
    from ..bench.results import format_table

    text = format_table(records, extra=())
    lines = [line for line in text.splitlines() if not set(line) <= {"-", " "}]
    cells = [re.split(r"\s{2,}", line.strip()) for line in lines]
    width = len(cells[0])
    out = ["| " + " | ".join(cells[0]) + " |", "|" + "---|" * width]
    out += ["| " + " | ".join(row + [""] * (width - len(row))) + " |" for row in cells[1:]]
    return "\n".join(out)


def benchmarks_markdown(root: Path, link_root: str) -> str:
    """Every results file under ``root`` as a section: its records' table (op, shape, ours, the
    baselines, the bound and the ratios), the commits measured, and its plot when there is one
    (``link_root``: ``root`` as the page links it)."""
    parts = ["# Benchmark results\n\nGenerated at every documentation build from `bench/results/**/*.json`: "
             "medians in microseconds; `x/ours` above 1 means ours is faster, `bound/ours` of 1 is at the "
             "bound.\n"]
    for path in sorted(root.glob("*/*.json")):
        records = json.loads(path.read_text())
        if not records:
            continue
        commits = sorted({r.get("commit", "?") for r in records})
        rel = path.relative_to(root)
        parts.append(f"## `{rel}`\n\n{len(records)} records; commit {', '.join(commits)}; "
                     f"{records[0].get('gpu', '?')} x{records[0].get('world_size', '?')}.\n")
        plot = path.parent / "plots" / f"{path.stem}.png"
        if plot.exists():
            parts.append(f"![{path.stem}]({link_root}/{rel.parent}/plots/{path.stem}.png)\n")
        parts.append(_markdown_table(records) + "\n")
    return "\n".join(parts)


def main(argv: list[str]) -> int:
    """Command line: write the generated pages into ``argv[1]`` (results from ``argv[2]``, default ``bench/results``)."""
    out = Path(argv[1])
    root = Path(argv[2]) if len(argv) > 2 else Path(__file__).resolve().parents[3] / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "configuration.md").write_text(configuration_markdown())
    (out / "benchmarks.md").write_text(benchmarks_markdown(root, "../../bench/results"))
    print(f"wrote {out / 'configuration.md'} and {out / 'benchmarks.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
