"""Benchmark harness: how ours and the baselines are timed (``timing``) and how results are
recorded, written and printed (``results``), in the format of docs/design.md §7; which kernels a
baseline launches (``kernels``).

Importing needs neither torch nor a GPU; torch is imported inside the functions that time.

    from triton_dist.bench import median_us, record, write_results, print_table
"""

from . import script
from .kernels import kernels_launched
from .results import (commit, format_table, gpu_slug, print_table, record, results_dir, validate_record,
                      versions, write_results)
from .timing import all_gather_floats, max_over_ranks, median_us, rank_medians_us, sample_us, sync_and_barrier

__all__ = [
    "all_gather_floats", "commit", "format_table", "gpu_slug", "kernels_launched", "max_over_ranks", "median_us",
    "print_table",
    "rank_medians_us", "record", "results_dir", "sample_us", "script", "sync_and_barrier", "validate_record", "versions",
    "write_results"
]
