"""The timeline's host side without a GPU: stamp records paired into spans, the trace-event JSON a
browser's trace viewer reads, the summary, the recording switch; and the instrumented GEMM's stamps
compiled in only while recording (no %globaltimer in the kernel launched outside one)."""

import json
from pathlib import Path

import pytest

from triton_dist import timeline
from triton_dist.kernels.gemm import dense as gemm_module
from triton_dist.kernels.gemm import ag_gemm as allgather_gemm
from triton_dist.language import timeline as stamps
from triton_dist.tools.compile_check import compile_for_hopper

TILE, WAITED, COMPUTED, DONE = int(stamps.TILE), int(stamps.WAITED), int(stamps.COMPUTED), int(stamps.DONE)


def _records():
    # program 0: a tile that waited, then one that did not; program 1: a tile cut off by the end.
    return [(0, 100, TILE), (0, 150, WAITED), (0, 400, COMPUTED), (0, 450, DONE),
            (0, 460, TILE), (0, 700, COMPUTED), (0, 720, DONE),
            (1, 120, TILE), (1, 130, int(stamps.USER)), (1, 380, COMPUTED)]


def test_records_pair_into_spans():
    got = [(s["program"], s["name"], s["start"], s["end"]) for s in timeline.spans(_records())]
    assert got == [(0, "wait", 100, 150), (0, "compute", 150, 400), (0, "epilogue", 400, 450), (0, "tile", 100, 450),
                   (0, "compute", 460, 700), (0, "epilogue", 700, 720), (0, "tile", 460, 720),
                   (1, "compute", 120, 380)]


def test_chrome_trace_is_what_a_trace_viewer_reads():
    per_rank = {0: timeline.spans(_records()), 1: timeline.spans([(3, 5, TILE), (3, 9, COMPUTED), (3, 12, DONE)])}
    trace = json.loads(json.dumps(timeline.chrome_trace(per_rank, "ag_gemm")))
    events = trace["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert {e["args"]["name"] for e in events if e["name"] == "process_name"} == {"ag_gemm rank 0", "ag_gemm rank 1"}
    assert names == {(0, 0): "program 0", (0, 1): "program 1", (1, 3): "program 3"}
    for e in spans:
        assert set(e) >= {"name", "ph", "ts", "dur", "pid", "tid"} and e["dur"] >= 0
        assert (e["pid"], e["tid"]) in names
    for rank in (0, 1):
        starts = [e["ts"] for e in spans if e["pid"] == rank]
        assert starts == sorted(starts)
    tile = next(e for e in spans if e["name"] == "tile" and e["pid"] == 0)
    assert (tile["ts"], tile["dur"]) == (0.1, 0.35)  # microseconds
    assert timeline.check_chrome_trace(trace) == []


def test_the_trace_check_names_what_a_viewer_rejects():
    per_rank = {0: timeline.spans(_records())}
    good = timeline.chrome_trace(per_rank, "ag_gemm")
    assert timeline.check_chrome_trace({}) == ["no traceEvents list"]
    assert timeline.check_chrome_trace({"traceEvents": [3]}) == ["traceEvents holds something other than event objects"]
    # Metadata without a pid: a message, not a KeyError.
    nameless = {"traceEvents": [{"ph": "M", "name": "process_name"}, {"ph": "X", "name": "t", "ts": 0, "dur": 1}]}
    assert any("has no name" in p for p in timeline.check_chrome_trace(nameless))
    spans = [e for e in good["traceEvents"] if e["ph"] == "X"]
    unnamed = dict(spans[0], tid=99)
    backwards = dict(spans[-1], ts=-1.0)
    negative = dict(spans[0], dur=-0.5)
    bad = {"traceEvents": good["traceEvents"] + [unnamed, backwards, negative]}
    problems = timeline.check_chrome_trace(bad)
    assert any("has no name" in p for p in problems)
    assert any("before the previous event" in p for p in problems)
    assert any("negative duration" in p for p in problems)


@pytest.mark.parametrize("name", ["ag_gemm_world2", "gemm_rs_fused_world2"])
def test_the_recorded_gpu_traces_read_as_a_viewer_reads_them(name):
    """The traces README shows (tutorial 10 at world 2, docs/traces/): every rank and program
    present, every tile split into its phases."""
    path = Path(__file__).resolve().parents[2] / "docs" / "traces" / f"{name}.json"
    trace = json.loads(path.read_text())
    assert timeline.check_chrome_trace(trace) == []
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert {e["pid"] for e in spans} == {0, 1}
    for rank in (0, 1):
        tiles = [e for e in spans if e["pid"] == rank and e["name"] == "tile"]
        assert len(tiles) == 512
        assert sum(e["name"] == "compute" for e in spans if e["pid"] == rank) == len(tiles)


def test_summary():
    got = timeline.summary({0: timeline.spans(_records())})[0]
    assert got["tiles"] == 2 and got["wait"] == pytest.approx(0.05) and got["tile"] == pytest.approx(0.61)
    assert got["wait_share"] == pytest.approx(0.05 / 0.61)


def test_recording_switches_the_launch_keywords():
    class Buffer:
        buffer = object()

        def clear(self):
            pass

    assert timeline.kernel_args() == {}
    recorded = Buffer()
    with timeline.recording(recorded):
        assert timeline.kernel_args() == {"timeline": recorded.buffer, "TIMELINE": True}
        with pytest.raises(RuntimeError, match="already active"):
            with timeline.recording(Buffer()):
                pass
    assert timeline.kernel_args() == {}


def _consumer(**extra):
    c = gemm_module.config_params("large")
    meta = gemm_module.kernel_meta("large", True)
    options = {"num_warps": meta.pop("num_warps"), "num_stages": meta.pop("num_stages")}
    signature = {"a_desc": f"tensordesc<bf16[{c['BM']}, {c['BK']}]>", "b_desc": f"tensordesc<bf16[{c['BN']}, {c['BK']}]>",
                 "c_desc": f"tensordesc<bf16[{c['BM']}, {c['BN']}]>", "M": "i32", "N": "i32", "K": "i32",
                 "rank": "i32", "m_per_rank": "i32", "signals": "*u64", "calls": "*i64"}
    if extra:
        signature["timeline"] = "*i64"
    meta.update(extra)
    return compile_for_hopper(allgather_gemm.ag_gemm_consumer_kernel, signature, meta, **options).asm["ptx"]


def test_stamps_compile_in_only_while_recording():
    plain, stamped = _consumer(), _consumer(TIMELINE=True)
    # The wait's timeout reads the clock in both; the four stamps of a tile add their own reads.
    assert stamped.count("%globaltimer") == plain.count("%globaltimer") + 4
    assert "st.global.b64" in stamped


def test_the_trace_renders_as_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    from triton_dist.tools import plot_timeline

    per_rank = {0: timeline.spans(_records()), 1: timeline.spans([(3, 5, TILE), (3, 9, COMPUTED), (3, 12, DONE)])}
    path = timeline.write_chrome_trace(per_rank, str(tmp_path / "trace.json"))
    png = plot_timeline.main([path])
    assert png == 0 and (tmp_path / "trace.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_png_legend_names_only_the_phases_present(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    import matplotlib.axes

    from triton_dist.tools import plot_timeline

    labels = []
    real = matplotlib.axes.Axes.legend
    monkeypatch.setattr(matplotlib.axes.Axes, "legend",
                        lambda ax, *a, **k: labels.extend(ax.get_legend_handles_labels()[1]) or real(ax, *a, **k))
    no_wait = [(0, 5, TILE), (0, 9, COMPUTED), (0, 12, DONE)]
    plot_timeline.plot(timeline.chrome_trace({0: timeline.spans(no_wait)}), str(tmp_path / "t.png"))
    assert labels == ["compute", "epilogue"]


def test_clock_offsets_take_the_median_round_and_share_a_gpus_clock():
    # Rank 1 (another GPU) runs 1000 ns ahead; in round 2 it left the barrier 50 us late.
    # Ranks 2 and 3 share GPU "b" with rank 1 (rank 3's stamps skewed by its own barrier exits),
    # rank 4 shares rank 0's GPU.
    rank0 = [100, 200, 300, 400, 500]
    stamps = [rank0] + [[t + ahead for t in rank0] for ahead in (1000, 1000, 1200, 7)]
    stamps[1][2] += 50_000
    assert timeline.clock_offsets(stamps, ["a", "b", "b", "b", "a"]) == [0, 1000, 1000, 1000, 0]
    assert timeline.clock_offsets(stamps, ["a", "b", "c", "d", "e"]) == [0, 1000, 1000, 1200, 7]


def _grouped(**extra):
    from triton_dist.kernels.moe import group_gemm as grouped

    c = gemm_module.config_params("small")
    signature = {"a_desc": f"tensordesc<bf16[{c['BM']}, {c['BK']}]>",
                 "w_desc": f"tensordesc<bf16[{c['BN']}, {c['BK']}]>", "c": "*bf16", "ends": "*i32", "num_experts": "i32", "total_rows": "i32", "capacity": "i32", "N": "i32",
                 "K": "i32"}
    if extra:
        signature["timeline"] = "*i64"
    meta = grouped.kernel_meta("small", **extra)
    options = {"num_warps": meta.pop("num_warps"), "num_stages": meta.pop("num_stages")}
    return compile_for_hopper(grouped.group_gemm_kernel, signature, meta, **options).asm["ptx"]


def test_the_grouped_gemm_stamps_only_while_recording():
    """The MoE grouped GEMM (also ag_group_gemm's consumer and group_gemm_rs's producer): outside a
    recording no clock read at all; inside, a tile's start, K loop end and epilogue end."""
    plain, stamped = _grouped(), _grouped(TIMELINE=True)
    assert "%globaltimer" not in plain
    assert stamped.count("%globaltimer") == 3 and "st.global.b64" in stamped
