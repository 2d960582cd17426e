"""Shares claimed at run time: work split into ``grid`` shares that whichever programs are running
take, so that a kernel whose programs wait for each other's shares needs no program to be resident
but the ones already running.

A persistent grid sized to the SMs is co-resident only while nothing else holds them: ranks that
share a GPU under MPS each get a cap on SMs, not a reservation (:mod:`triton_dist.residency`), so
another client's spinning programs can keep some of a grid's programs from starting (2026-12-07,
7 clients on one H100: the one-launch AllGather+GEMM waited 60 s on a ready flag whose last share
belonged to a program that never started). With claims the running programs take every share, so
every flag they wait for is set by programs that are running.

Each program calls :func:`claim` until it gets a value of ``grid`` or more. A call makes exactly
``2 * grid`` claims (one success per share, one failure per program), so the program whose failed
claim returns ``2 * grid - 1`` made the counter's last one of the call and resets it
(:func:`end_claims`): the counter is zero between calls without a second counter.
"""

import triton
import triton.language as tl

from ... import language as dl


@triton.jit
def claim(counter):
    """The next unclaimed share (``>= grid``: none left). Relaxed: the claim publishes nothing; the
    share's work is published by its own ticket (:mod:`~triton_dist.kernels.common.tickets`)."""
    return dl.atomic_add(counter, 1, scope="gpu", semantic="relaxed")


@triton.jit
def end_claims(counter, failed, grid):
    """After this program's failed claim ``failed`` (its last): the call's last claimant resets the
    counter for the stream's next call, which starts only after this kernel has ended."""
    if failed == 2 * grid - 1:
        dl.atomic_xchg(counter, 0, scope="gpu", semantic="relaxed")
