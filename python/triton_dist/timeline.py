"""See the overlap: per-tile timelines of the overlapped GEMMs, gathered from every rank and
written as a Chrome / Perfetto trace (``chrome://tracing``, https://ui.perfetto.dev)::

    timeline = tdist.timeline.Timeline()
    with tdist.timeline.recording(timeline):
        ops.ag_gemm(a, b)                      # instrumented kernels stamp into timeline
    spans = tdist.timeline.gather(timeline)    # collective: every rank's spans, on the same clock
    if tdist.rank() == 0:
        tdist.timeline.write_chrome_trace(spans, "ag_gemm.json")
        print(tdist.timeline.summary(spans))

Instrumented kernels (the dense GEMM of ``ag_gemm``, ``gemm_rs`` and ``gemm_ar``, the grouped GEMM
of ``group_gemm``, ``ag_group_gemm`` and ``group_gemm_rs``) take the
recording's buffer while one is active and compile a variant with stamps
(:mod:`triton_dist.language.timeline`); outside a recording they run the code they always ran.
A recording costs a compile per variant on first use and a few global stores per tile. The
clocks are each GPU's ``%globaltimer``; :func:`gather` aligns them with stamps taken right after
barriers (:func:`clock_offsets`: good to the barrier's skew, microseconds; exact for ranks that
share a GPU, which read one clock). Each program's track is one
lane per program and rank: ``tile`` spans, inside them ``wait`` (for the rows or signals the
tile needs), ``compute`` (the K loop) and ``epilogue``.
"""

from __future__ import annotations

import json
from contextlib import contextmanager

import triton.language as tl

from .distributed_jit import jit
from .language import timeline as _stamps

_current = None
"""The active :class:`Timeline` (one recording at a time per process)."""

TAG_NAMES = {int(_stamps.TILE): "tile", int(_stamps.WAIT): "wait", int(_stamps.WAITED): "waited",
             int(_stamps.COMPUTED): "computed", int(_stamps.DONE): "done", int(_stamps.SIGNAL): "signal"}


class Timeline:
    """A device buffer of stamp records for up to ``programs`` programs per kernel launch
    (default: the SMs this process may use, the persistent grids' size). Each launch writes its
    programs' records from the start of their regions, so a recording keeps, per program, the
    records of the last launch that ran it: record one call of one op (read, then record the next)."""

    def __init__(self, programs: int | None = None, device=None):
        import torch

        from . import residency

        self.programs = programs or residency.sm_count(device)
        self.capacity = int(_stamps.CAPACITY)
        self.buffer = torch.zeros((self.programs * self.capacity * 2, ), dtype=torch.int64,
                                  device=device or torch.device("cuda", torch.cuda.current_device()))
        """Per program, ``capacity`` records of ``(nanoseconds, tag)``; tag 0: unused."""

    def clear(self) -> None:
        """Forget every record (on the current stream)."""
        self.buffer.zero_()

    def records(self) -> list[tuple[int, int, int]]:
        """``(program, nanoseconds, tag)`` of every record, in each program's order (a
        synchronisation)."""
        rows = self.buffer.view(self.programs, self.capacity, 2).cpu().tolist()
        return [(p, t, tag) for p, program in enumerate(rows) for t, tag in program if tag]


@contextmanager
def recording(timeline: Timeline):
    """Instrumented kernels launched inside stamp into ``timeline`` (cleared first, on the current
    stream)."""
    global _current
    if _current is not None:
        raise RuntimeError("triton_dist timeline: a recording is already active; end it first")
    timeline.clear()
    _current = timeline
    try:
        yield timeline
    finally:
        _current = None


def kernel_args() -> dict:
    """The launch keywords of an instrumented kernel: none outside a recording."""
    if _current is None:
        return {}
    return dict(timeline=_current.buffer, TIMELINE=True)


def spans(records) -> list[dict]:
    """``records`` (``(program, ns, tag)``, each program's in order) paired into spans:
    ``{"program", "name", "start", "end"}`` in nanoseconds; an unfinished tile is dropped."""
    out, open_tile = [], {}
    for program, t, tag in records:
        name = TAG_NAMES.get(tag, f"user {tag}")
        state = open_tile.get(program)
        if name == "tile":
            open_tile[program] = {"start": t, "last": t}
        elif state is None:
            continue
        elif name == "waited":
            out.append(dict(program=program, name="wait", start=state["last"], end=t))
            state["last"] = t
        elif name == "computed":
            out.append(dict(program=program, name="compute", start=state["last"], end=t))
            state["last"] = t
        elif name == "done":
            out.append(dict(program=program, name="epilogue", start=state["last"], end=t))
            out.append(dict(program=program, name="tile", start=state["start"], end=t))
            del open_tile[program]
    return out


@jit
def _clock_kernel(out):
    tl.store(out, _stamps.globaltimer().to(tl.int64))


CLOCK_ROUNDS = 5
"""Barrier-and-stamp rounds of :func:`_clock_offset`: the median of their offsets leaves out a
round whose barrier one rank left late (a descheduled process)."""


def clock_offsets(stamps: list[list[int]], gpus: list[str]) -> list[int]:
    """Every rank's clock minus rank 0's, from ``stamps[r]``: rank ``r``'s ``%globaltimer`` right
    after each barrier round, and ``gpus[r]``: the GPU it runs on. Per rank the median over the
    rounds of its stamp minus rank 0's; ranks that share a GPU read one clock, so they all take
    the offset of the first rank on it (exactly 0 on rank 0's GPU, whatever the barrier's skew)."""
    offsets = []
    for r, mine in enumerate(stamps):
        diffs = sorted(a - b for a, b in zip(mine, stamps[0]))
        offsets.append(diffs[len(diffs) // 2])
    first_on = {}
    for r, gpu in enumerate(gpus):
        first_on.setdefault(gpu, r)
    return [0 if gpus[r] == gpus[0] else offsets[first_on[gpus[r]]] for r in range(len(stamps))]


def _clock_offset() -> int:
    """This GPU's clock minus rank 0's (collective): :data:`CLOCK_ROUNDS` stamps, each right after
    a barrier, combined by :func:`clock_offsets`. The stamp kernel runs once first, so that no
    round waits for its compile or load."""
    import torch
    import torch.distributed as dist

    from . import host_collectives, runtime

    # Rows of 16 bytes: every round's pointer has the alignment of the warm-up's, so one variant.
    stamp = torch.zeros((CLOCK_ROUNDS, 2), dtype=torch.int64, device="cuda")
    _clock_kernel[(1, )](stamp[0])
    for i in range(CLOCK_ROUNDS):
        torch.cuda.synchronize()
        runtime.barrier()
        _clock_kernel[(1, )](stamp[i])
    torch.cuda.synchronize()
    every = [row[:, 0].tolist() for row in host_collectives.all_gather_list(stamp)]
    gpus = [None] * runtime.world_size()
    dist.all_gather_object(gpus, str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid))
    return clock_offsets(every, gpus)[runtime.rank()]


def gather(timeline: Timeline) -> dict[int, list[dict]]:
    """Collective: every rank's spans of ``timeline``, on rank 0's clock, as ``{rank: spans}`` on
    every rank (times in nanoseconds from the earliest span of any rank)."""
    import torch.distributed as dist

    from . import runtime

    offset = _clock_offset()
    mine = [dict(s, start=s["start"] - offset, end=s["end"] - offset) for s in spans(timeline.records())]
    every = [None] * runtime.world_size()
    dist.all_gather_object(every, mine)
    first = min((s["start"] for rank_spans in every for s in rank_spans), default=0)
    return {r: [dict(s, start=s["start"] - first, end=s["end"] - first) for s in rank_spans]
            for r, rank_spans in enumerate(every)}


def chrome_trace(per_rank: dict[int, list[dict]], label: str = "triton_dist") -> dict:
    """The trace-event JSON of ``per_rank`` spans: one process per rank, one thread per program,
    complete events (``"ph": "X"``) in microseconds, sorted by start."""
    events = []
    for rank, rank_spans in sorted(per_rank.items()):
        events.append(dict(name="process_name", ph="M", pid=rank, tid=0, args=dict(name=f"{label} rank {rank}")))
        for program in sorted({s["program"] for s in rank_spans}):
            events.append(dict(name="thread_name", ph="M", pid=rank, tid=program, args=dict(name=f"program {program}")))
        for s in sorted(rank_spans, key=lambda s: (s["start"], -s["end"])):
            events.append(dict(name=s["name"], cat="tile", ph="X", pid=rank, tid=s["program"], ts=s["start"] / 1e3,
                               dur=max(0.0, (s["end"] - s["start"]) / 1e3)))
    return {"traceEvents": events, "displayTimeUnit": "ns"}


def check_chrome_trace(trace: dict) -> list[str]:
    """What a trace viewer (chrome://tracing, Perfetto's JSON importer) would reject or misdraw in
    ``trace``, as messages (empty: it reads): a ``traceEvents`` list; complete events (``"ph":
    "X"``) with a name, numeric ``ts`` and ``dur >= 0``, on a process and thread named by metadata
    events; every track's events in start order; every rank (process) named once."""
    problems = []
    events = trace.get("traceEvents") if isinstance(trace, dict) else None
    if not isinstance(events, list):
        return ["no traceEvents list"]
    if not all(isinstance(e, dict) for e in events):
        return ["traceEvents holds something other than event objects"]
    # .get: a malformed event is a message, not a KeyError.
    processes = [e.get("pid") for e in events if e.get("ph") == "M" and e.get("name") == "process_name"]
    threads = {(e.get("pid"), e.get("tid")) for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"}
    if len(processes) != len(set(processes)):
        problems.append(f"a process named twice: {sorted(processes, key=str)}")
    last_start = {}
    for i, e in enumerate(events):
        if e.get("ph") == "M":
            continue
        if e.get("ph") != "X":
            problems.append(f"event {i}: phase {e.get('ph')!r}, expected complete events ('X')")
            continue
        if not isinstance(e.get("name"), str) or not all(isinstance(e.get(k), (int, float)) for k in ("ts", "dur")):
            problems.append(f"event {i}: a name, numeric ts and dur needed: {e}")
            continue
        if e["dur"] < 0:
            problems.append(f"event {i}: negative duration {e['dur']}")
        track = (e.get("pid"), e.get("tid"))
        if e.get("pid") not in processes or track not in threads:
            problems.append(f"event {i}: process/thread {track} has no name")
        if e["ts"] < last_start.get(track, float("-inf")):
            problems.append(f"event {i}: starts at {e['ts']} before the previous event of track {track}")
        last_start[track] = e["ts"]
    return problems


def write_chrome_trace(per_rank: dict[int, list[dict]], path: str, label: str = "triton_dist") -> str:
    """:func:`chrome_trace` into ``path``; returns the path."""
    with open(path, "w") as f:
        json.dump(chrome_trace(per_rank, label), f)
    return path


def summary(per_rank: dict[int, list[dict]]) -> dict[int, dict]:
    """Per rank: tiles, and microseconds in each span kind summed over programs, with the share of
    tile time spent waiting."""
    out = {}
    for rank, rank_spans in per_rank.items():
        total = {name: sum(s["end"] - s["start"] for s in rank_spans if s["name"] == name) / 1e3
                 for name in ("tile", "wait", "compute", "epilogue")}
        total["tiles"] = sum(1 for s in rank_spans if s["name"] == "tile")
        total["wait_share"] = total["wait"] / total["tile"] if total["tile"] else 0.0
        out[rank] = total
    return out

