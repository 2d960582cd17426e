"""The contexts' device-side call counters (int64): the epoch of the latest call on the stream.

Two ways a call advances its context's counter, both stream operations (so a CUDA graph that
captured a call replays with a fresh epoch every time):

- An op of several kernels (producer and consumer on two streams, a barrier then copies) first
  :func:`bump` s it with a one-thread kernel launched from C++ (:mod:`triton_dist.eager_launch`),
  and every kernel of the call reads the bumped value as its epoch. Why a kernel of our own:
  ``counter.add_(1)`` is a torch op, whose dispatch costs several µs of host time per call. A plain
  ``triton.jit`` kernel (no NVSHMEM linked): its first load needs no module initialisation, so it
  cannot wait for a device on which a peer's kernel spins (triton_dist.distributed_jit).
- An op of one kernel (the collectives' one-kernel methods) launches nothing else: each program
  of the kernel takes its epoch from :func:`enter_call` (one past the counter), and the last
  program of the grid to do so advances the counter for the stream's next call (a ticket). That
  saves a launch per call, the bump's host time (9 µs under MPS on an H100 host,
  ``bench/host_overhead.py --breakdown``, 2026-12-07) and its GPU time. Such a counter has two
  elements: the epoch and the count of the running call's programs that have entered. Nothing
  else of the call may read the counter while the kernel runs.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ...eager_launch import EagerLaunches
from .launch_plan import LaunchPlan
from .tickets import last_to_finish


@triton.jit
def call_counter_bump_kernel(counter):
    """``counter[0] += 1``, one program of one warp (the scalar store runs in one thread)."""
    tl.store(counter, tl.load(counter) + 1)


@triton.jit
def enter_call(calls):
    """This call's epoch, for a kernel that is its call's only one: one past the counter
    ``calls[0]``. The last program of the grid to enter sets ``calls[0]`` to it and zeroes the
    count ``calls[1]``, so the stream's next call runs one later. Safe at the kernel's start: every
    program read ``calls[0]`` before it counted itself (the count is an acq_rel add), so the last
    one's store reaches none of them, and the next call starts only when this kernel has ended.
    That needs a kernel that starts only after the stream's previous one has ended (no
    programmatic dependent launch, which no library kernel uses) and a context whose calls run on
    one stream at a time: were ``calls[1]`` ever left non-zero, no program would be last again.
    Early rather than last, so that no value stays live across the kernel for it. (gemm_ar's
    split-K kernel enters its call up to 64 rows; at 128 it still takes a bump: with this entry its
    spills at 128 rows and 8 ranks grew from 96 to 144 bytes, first or last in the kernel alike.)"""
    epoch = tl.load(calls) + 1
    programs = tl.num_programs(0) * tl.num_programs(1) * tl.num_programs(2)
    if last_to_finish(calls + 1, 0, programs):
        tl.store(calls, epoch)
    return epoch


@triton.jit
def call_epoch(calls, ENTER: tl.constexpr):
    """The running call's epoch: :func:`enter_call`'s for a kernel that is its call's only one
    (``ENTER``), else the counter ``calls[0]`` as a :func:`bump` before the kernel left it."""
    if ENTER:
        epoch = enter_call(calls)
    else:
        epoch = tl.load(calls)
    return epoch


_BUMP = EagerLaunches(call_counter_bump_kernel)
_META = dict(num_warps=1)


def bump(counter):
    """``counter[0] += 1`` on the current stream; returns ``counter`` (an int64 CUDA tensor; a
    context's has a second element, which only :func:`enter_call` uses)."""
    _BUMP.run((1, ), (counter, ), _META)
    return counter


class _BumpKernel:
    """The bump as a :class:`~triton_dist.kernels.common.launch_plan.LaunchPlan` takes a kernel."""

    def run(self, *args, grid, **meta):
        return _BUMP.run(grid, args, meta)

    def prepare(self, grid, meta: dict):
        return _BUMP.prepare(grid, meta)

    def __repr__(self) -> str:
        return "call_counter_bump_kernel"


def bump_plan(counter) -> LaunchPlan:
    """:func:`bump` of ``counter`` as a launch plan (a call of several kernels launches it first)."""
    return LaunchPlan(_BumpKernel(), (1, ), (counter, ), _META)


def preload(counter) -> None:
    """Compile and load the bump for ``counter``'s device (contexts call it at creation)."""
    _BUMP.preload((1, ), (counter, ), _META)
