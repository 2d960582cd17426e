"""What every benchmark script shares: its common command-line options and the guards it runs
under (NVLink multicast off, a watchdog that dumps stacks instead of hanging)."""

from __future__ import annotations

import argparse
import faulthandler
import os
from pathlib import Path

# NVLink multicast stays off on shared machines (DESIGN.md §3); scripts/env.sh sets the same.
_MULTICAST_OFF = (("NCCL_NVLS_ENABLE", "0"), ("NVSHMEM_DISABLE_NVLS", "1"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"))


def argument_parser(description: str, results_root: Path) -> argparse.ArgumentParser:
    """A parser with the options every benchmark takes: --quick, --heap-size, --timeout-s, --out."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer sizes and iterations")
    parser.add_argument("--heap-size", default="4G", help="symmetric heap per rank (default 4G)")
    parser.add_argument("--timeout-s", type=float, default=900.0,
                        help="dump every thread's stack and exit if the run takes longer (default 900)")
    parser.add_argument("--out", default=str(results_root), help=f"results root (default {results_root})")
    return parser


def guard(args: argparse.Namespace) -> None:
    """Multicast off (unless the caller set these variables) and the watchdog armed."""
    for name, value in _MULTICAST_OFF:
        os.environ.setdefault(name, value)
    faulthandler.dump_traceback_later(args.timeout_s, exit=True)
