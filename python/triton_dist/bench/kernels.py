"""Which GPU kernels a call launches, by name (torch.profiler): what a baseline's library chose for
a row (cuBLAS's ``nvjet_*`` and CUTLASS kernel names carry the tile shape, cluster and split of
K), so that a row where ours is short says which configuration to try."""

from __future__ import annotations

from typing import Callable


def kernels_launched(fn: Callable[[], object]) -> list[str]:
    """The distinct names, in first-launch order, of the GPU kernels one call of ``fn`` launches
    (after a warm-up call: its first call may autotune or load modules). A profiler failure gives
    one line saying so instead: a diagnostic, which no row's times depend on."""
    import torch

    try:
        from torch.profiler import ProfilerActivity, profile

        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    except Exception as e:  # noqa: BLE001  see the docstring
        return [f"profiler failed: {type(e).__name__}: {e}".splitlines()[0]]
    return list(dict.fromkeys(names))
