"""The contexts' device-side call counters (int64, one element): bumped on the caller's stream
by a one-thread kernel launched from C++ (:mod:`triton_dist.eager_launch`).

Why a kernel of our own: ``counter.add_(1)`` is a torch op, whose dispatch costs several µs of host
time on every call of every op, more than the collective's own launch through the C++ path. A
plain ``triton.jit`` kernel (no NVSHMEM linked): its first load needs no module initialisation,
so it cannot wait for a device on which a peer's kernel spins (triton_dist.distributed_jit).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ...eager_launch import EagerLaunches


@triton.jit
def call_counter_bump_kernel(counter):
    """``counter[0] += 1``, one program of one warp (the scalar store runs in one thread)."""
    tl.store(counter, tl.load(counter) + 1)


_BUMP = EagerLaunches(call_counter_bump_kernel)
_META = dict(num_warps=1)


def bump(counter):
    """``counter += 1`` on the current stream; returns ``counter`` (a one-element int64 CUDA tensor)."""
    _BUMP.run((1, ), (counter, ), _META)
    return counter


def preload(counter) -> None:
    """Compile and load the bump for ``counter``'s device (contexts call it at creation)."""
    _BUMP.preload((1, ), (counter, ), _META)
