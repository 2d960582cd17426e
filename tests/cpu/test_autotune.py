"""The distributed autotuner's decisions, on a CPU: a fake world of ranks as threads (an all-gather
built on a barrier that times out, so a rank that leaves the protocol makes the others fail
instead of hanging), a fake timer that gives each rank its own times, and fake ops."""

import copy
import json
import threading

import pytest

from triton_dist import autotune
from triton_dist.autotune import (AutotuneError, AutotuneMismatchError, DistributedAutotuner, LocalCommunicator,
                                  TuneResult)

ENV = {"gpu": "NVIDIA H200", "torch": "2.11.0", "triton": "3.6.0", "triton_dist": "0.1.0", "cuda": "13.0"}
A, B, C = {"name": "A", "BM": 128}, {"name": "B", "BM": 64}, {"name": "C", "BM": 256}


class FakeWorld:
    """``n`` ranks in threads; ``all_gather`` deep-copies what each rank gives (as pickling would)."""

    def __init__(self, n, timeout=5.0):
        self.n = n
        self._barrier = threading.Barrier(n, timeout=timeout)
        self._slots = [None] * n
        self.gathers = [0] * n

    def comm(self, rank):
        return FakeComm(self, rank)

    def run(self, fn):
        """``fn(rank, comm)`` on every rank; returns each rank's result or exception."""
        results = [None] * self.n

        def body(rank):
            try:
                results[rank] = fn(rank, self.comm(rank))
            except BaseException as e:  # noqa: BLE001 - handed to the test
                results[rank] = e  # a rank left waiting for this one fails at the barrier's timeout

        threads = [threading.Thread(target=body, args=(r, )) for r in range(self.n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
            assert not t.is_alive(), "a rank is stuck"
        return results


class FakeComm:

    def __init__(self, world, rank):
        self.world, self.rank, self.world_size = world, rank, world.n

    def all_gather(self, value):
        w = self.world
        w.gathers[self.rank] += 1
        w._slots[self.rank] = copy.deepcopy(value)
        w._barrier.wait()
        out = list(w._slots)
        w._barrier.wait()
        return out


class OutOfResources(Exception):
    """Stands for triton's OutOfResources (too much shared memory)."""


class FakeOp:
    """One rank's op: ``times[name][rank]`` µs; ``fails``: {(rank, name): exception} at the trial."""

    def __init__(self, rank, comm, times, fails=None, fail_in_timer=None):
        self.rank, self.comm, self.times = rank, comm, times
        self.fails = fails or {}
        self.fail_in_timer = fail_in_timer or {}
        self.calls = []
        self.timed = []
        self._last = None

    def run(self, cfg):
        self.calls.append(cfg["name"])
        self._last = cfg["name"]
        exc = self.fails.get((self.rank, cfg["name"]))
        if exc is not None:
            raise exc

    def timer(self, fn):
        """Fixed counts (like bench.timing), then every rank's 'median', gathered (collective)."""
        for _ in range(3):
            fn()
        name = self._last
        self.timed.append(name)
        exc = self.fail_in_timer.get((self.rank, name))
        if exc is not None:
            raise exc
        return self.comm.all_gather(self.times[name][self.rank])


def tune_on_world(n, times, candidates, tmp_path, *, fails=None, fail_in_timer=None, env=None, cache_dirs=None,
                  key=(1024, 512, "bfloat16"), precheck=None, **kw):
    world = FakeWorld(n)
    ops = [None] * n

    def rank_fn(rank, comm):
        op = ops[rank] = FakeOp(rank, comm, times, fails, fail_in_timer)
        cache_dir = cache_dirs[rank] if cache_dirs else tmp_path
        tuner = DistributedAutotuner(comm=comm, timer=op.timer, cache_dir=cache_dir,
                                     environment=lambda: dict(env or ENV), **kw)
        pc = (lambda cfg: precheck(rank, cfg)) if precheck else None
        return tuner.tune("gemm", key, candidates(rank) if callable(candidates) else candidates, op.run,
                          precheck=pc)

    return world.run(rank_fn), ops, world


def _ok(results):
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results


def test_the_max_over_ranks_decides(tmp_path):
    # A is fastest on rank 0 but slowest on rank 1; the minimum of the MAX is B.
    times = {"A": [1.0, 10.0], "B": [5.0, 5.0], "C": [2.0, 8.0]}
    results, ops, _ = tune_on_world(2, times, [A, B, C], tmp_path)
    r0, r1 = _ok(results)
    assert r0.config == r1.config == B and r0.index == 1 and r0.source == "tuned"
    assert r0.times_us == r1.times_us == (10.0, 5.0, 8.0)
    assert r0.rank_times_us[0] == [1.0, 10.0]
    # Fixed counts: every rank called every config the same number of times.
    assert ops[0].calls == ops[1].calls == ["A"] * 4 + ["B"] * 4 + ["C"] * 4


def test_a_timer_that_knows_only_its_own_rank_still_gets_the_max(tmp_path):
    times = {"A": [1.0, 10.0], "B": [5.0, 5.0]}
    world = FakeWorld(2)

    def rank_fn(rank, comm):
        op = FakeOp(rank, comm, times)
        tuner = DistributedAutotuner(comm=comm, timer=lambda fn: (fn(), times[op._last][rank])[1], cache_dir=tmp_path,
                                     environment=lambda: ENV)
        return tuner.tune("gemm", (1, ), [A, B], op.run)

    r0, r1 = _ok(world.run(rank_fn))
    assert r0.config == r1.config == B and r0.times_us == (10.0, 5.0) and r0.rank_times_us[0] == [1.0, 10.0]


def test_ties_go_to_the_first_candidate(tmp_path):
    times = {"A": [3.0, 5.0], "B": [5.0, 4.0], "C": [5.0, 5.0]}
    results, _, _ = tune_on_world(2, times, [C, A, B], tmp_path)
    assert [r.config for r in _ok(results)] == [C, C]


def test_a_config_failing_on_one_rank_is_skipped_on_all(tmp_path):
    times = {"A": [4.0, 4.0], "B": [5.0, 5.0], "C": [1.0, 1.0]}
    fails = {(1, "C"): OutOfResources("out of resource: shared memory, Required: 262144, Hardware limit: 232448")}
    results, ops, _ = tune_on_world(2, times, [A, B, C], tmp_path, fails=fails)
    r0, r1 = _ok(results)
    assert r0.config == r1.config == A
    assert r0.times_us == (4.0, 5.0, None) and r0.skipped == r1.skipped
    assert list(r0.skipped) == [2] and r0.skipped[2][0].startswith("rank 1: OutOfResources: out of resource")
    # Both ranks tried C once and neither timed it.
    assert ops[0].calls.count("C") == ops[1].calls.count("C") == 1
    assert "C" not in ops[0].timed and "C" not in ops[1].timed


def test_a_config_failing_in_the_timer_on_every_rank_is_skipped(tmp_path):
    times = {"A": [4.0, 4.0], "B": [1.0, 1.0]}
    boom = {(r, "B"): RuntimeError("graph capture failed") for r in range(2)}
    results, _, _ = tune_on_world(2, times, [A, B], tmp_path, fail_in_timer=boom)
    r0, r1 = _ok(results)
    assert r0.config == r1.config == A and sorted(r0.skipped[1]) == ["rank 0: RuntimeError: graph capture failed",
                                                                     "rank 1: RuntimeError: graph capture failed"]


def test_a_precheck_failure_skips_without_running(tmp_path):
    times = {"A": [4.0, 4.0], "B": [1.0, 1.0]}

    def precheck(rank, cfg):
        if rank == 0 and cfg["name"] == "B":
            raise OutOfResources("shared memory")

    results, ops, _ = tune_on_world(2, times, [A, B], tmp_path, precheck=precheck)
    assert [r.config for r in _ok(results)] == [A, A]
    assert "B" not in ops[0].calls + ops[1].calls


def test_an_exception_outside_skip_on_raises_on_every_rank(tmp_path):
    times = {"A": [4.0, 4.0], "B": [1.0, 1.0]}
    fails = {(1, "B"): KeyError("bug")}
    results, _, _ = tune_on_world(2, times, [A, B], tmp_path, fails=fails, skip_on=(OutOfResources, ))
    for r in results:
        assert isinstance(r, AutotuneError) and "rank 1: KeyError" in str(r) and "skip_on" in str(r)


def test_every_candidate_failing_raises_on_every_rank(tmp_path):
    times = {"A": [4.0, 4.0], "B": [1.0, 1.0]}
    fails = {(0, "A"): OutOfResources("smem A"), (1, "B"): OutOfResources("smem B")}
    results, _, _ = tune_on_world(2, times, [A, B], tmp_path, fails=fails)
    for r in results:
        assert isinstance(r, AutotuneError) and "every candidate failed" in str(r)
        assert "rank 0: OutOfResources: smem A" in str(r) and "rank 1: OutOfResources: smem B" in str(r)


def test_mismatched_candidates_raise_on_every_rank_naming_the_ranks(tmp_path):
    times = {"A": [1.0, 1.0], "B": [1.0, 1.0], "C": [1.0, 1.0]}
    results, ops, _ = tune_on_world(2, times, lambda rank: [A, B] if rank == 0 else [A, B, C], tmp_path)
    for r in results:
        assert isinstance(r, AutotuneMismatchError) and isinstance(r, ValueError)
        assert "ranks [0]" in str(r) and "ranks [1]" in str(r) and "2 candidates" in str(r) and "3 candidates" in str(r)
    assert ops[0].calls == ops[1].calls == []


def test_mismatched_keys_raise(tmp_path):
    world = FakeWorld(3)

    def rank_fn(rank, comm):
        op = FakeOp(rank, comm, {"A": [1.0] * 3})
        tuner = DistributedAutotuner(comm=comm, timer=op.timer, cache_dir=tmp_path, environment=lambda: ENV)
        return tuner.tune("gemm", (1024 if rank < 2 else 2048, 512), [A], op.run)

    for r in world.run(rank_fn):
        assert isinstance(r, AutotuneMismatchError)
        assert "ranks [0, 1]: op 'gemm', key [1024,512]" in str(r) and "ranks [2]: op 'gemm', key [2048,512]" in str(r)


def test_the_disk_cache_round_trips_and_its_key_has_gpu_world_size_and_versions(tmp_path):
    times = {"A": [1.0, 10.0], "B": [5.0, 5.0]}
    results, _, _ = tune_on_world(2, times, [A, B], tmp_path)
    first = _ok(results)[0]
    files = list((tmp_path / "gemm").glob("*.json"))
    assert [str(f) for f in files] == [first.cache_file]
    entry = json.loads(files[0].read_text())
    assert entry["index"] == 1 and entry["config"] == B and entry["times_us"] == [10.0, 5.0]
    assert entry["key"]["world_size"] == 2 and entry["key"]["op"] == "gemm" and entry["key"]["key"] == [1024, 512,
                                                                                                        "bfloat16"]
    assert entry["key"]["env"] == ENV

    # Fresh processes (new autotuners), other timings: the decision comes from disk, nothing runs.
    other = {"A": [1.0, 1.0], "B": [9.0, 9.0]}
    results, ops, _ = tune_on_world(2, other, [A, B], tmp_path)
    for r in _ok(results):
        assert r.source == "disk" and r.config == B and r.times_us == (10.0, 5.0) and r.index == 1
    assert ops[0].calls == ops[1].calls == []

    # Another GPU, another version, another world size: other keys, so it tunes again.
    for env in ({**ENV, "gpu": "NVIDIA B200"}, {**ENV, "triton": "3.7.0"}, {**ENV, "torch": "2.12.0"}):
        results, _, _ = tune_on_world(2, other, [A, B], tmp_path, env=env)
        assert [(r.source, r.config) for r in _ok(results)] == [("tuned", A)] * 2
    results, _, _ = tune_on_world(1, {"A": [1.0], "B": [9.0]}, [A, B], tmp_path)
    assert [(r.source, r.config) for r in _ok(results)] == [("tuned", A)]
    assert len(list((tmp_path / "gemm").glob("*.json"))) == 5
    # Changed candidates are another key too.
    results, _, _ = tune_on_world(2, other, [A, {**B, "BM": 32}], tmp_path)
    assert [r.source for r in _ok(results)] == ["tuned"] * 2


def test_rank_zeros_disk_decision_wins_even_if_other_ranks_caches_differ(tmp_path):
    d0, d1 = tmp_path / "r0", tmp_path / "r1"
    times = {"A": [1.0, 10.0], "B": [5.0, 5.0]}
    _ok(tune_on_world(2, times, [A, B], tmp_path, cache_dirs=[d0, d0])[0])  # rank 0's cache says B
    # Rank 1's cache holds the same key with the other decision: it is never read.
    (d1 / "gemm").mkdir(parents=True)
    for f in (d0 / "gemm").glob("*.json"):
        entry = json.loads(f.read_text())
        entry["index"], entry["config"] = 0, A
        (d1 / "gemm" / f.name).write_text(json.dumps(entry))
    results, ops, _ = tune_on_world(2, {"A": [1.0, 1.0], "B": [9.0, 9.0]}, [A, B], tmp_path, cache_dirs=[d0, d1])
    assert [(r.source, r.config) for r in _ok(results)] == [("disk", B)] * 2
    assert ops[1].calls == []


def test_a_rank_with_different_environment_gets_a_key_of_its_own(tmp_path):
    world = FakeWorld(2)

    def rank_fn(rank, comm):
        op = FakeOp(rank, comm, {"A": [1.0, 1.0]})
        env = {**ENV, "gpu": "NVIDIA H200" if rank == 0 else "NVIDIA H100"}
        tuner = DistributedAutotuner(comm=comm, timer=op.timer, cache_dir=tmp_path, environment=lambda: env)
        return tuner.tune("gemm", (1, ), [A], op.run)

    r0, r1 = _ok(world.run(rank_fn))
    entry = json.loads(open(r0.cache_file).read())
    assert entry["key"]["env"]["gpu"] == "NVIDIA H100 | NVIDIA H200" and r1.cache_file == r0.cache_file


def test_a_corrupt_or_stale_cache_file_is_ignored(tmp_path):
    times = {"A": [1.0, 10.0], "B": [5.0, 5.0]}
    first = _ok(tune_on_world(2, times, [A, B], tmp_path)[0])[0]
    with open(first.cache_file, "w") as f:
        f.write("{not json")
    results, _, _ = tune_on_world(2, times, [A, B], tmp_path)
    assert [r.source for r in _ok(results)] == ["tuned"] * 2
    entry = json.loads(open(first.cache_file).read())  # rewritten
    entry["index"] = 7
    with open(first.cache_file, "w") as f:
        json.dump(entry, f)
    results, _, _ = tune_on_world(2, times, [A, B], tmp_path)
    assert [(r.source, r.config) for r in _ok(results)] == [("tuned", B)] * 2


def test_the_memory_cache_answers_without_communicating(tmp_path):
    world = FakeWorld(2)
    counts = {}

    def rank_fn(rank, comm):
        op = FakeOp(rank, comm, {"A": [2.0, 2.0], "B": [1.0, 1.0]})
        tuner = DistributedAutotuner(comm=comm, timer=op.timer, cache_dir=tmp_path, environment=lambda: ENV)
        first = tuner.best_config("gemm", (1, ), [A, B], op.run)
        counts[rank] = (world.gathers[rank], len(op.calls))
        again = [tuner.best_config("gemm", (1, ), [A, B], op.run) for _ in range(3)]
        assert (world.gathers[rank], len(op.calls)) == counts[rank]
        return [first] + again

    assert _ok(world.run(rank_fn)) == [[B] * 4] * 2


def test_cache_dir_comes_from_config(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_DIST_AUTOTUNE_CACHE_DIR", str(tmp_path / "from-env"))
    op = FakeOp(0, LocalCommunicator(), {"A": [3.0], "B": [2.0]})
    tuner = DistributedAutotuner(comm=LocalCommunicator(), timer=op.timer, environment=lambda: ENV)
    result = tuner.tune("my op/v2", ("k", ), [A, B], op.run)
    assert result.config == B and result.cache_file.startswith(str(tmp_path / "from-env" / "my_op_v2") + "/")
    assert json.loads(open(result.cache_file).read())["config"] == B


def test_disk_cache_off_writes_nothing(tmp_path):
    op = FakeOp(0, LocalCommunicator(), {"A": [3.0], "B": [2.0]})
    tuner = DistributedAutotuner(comm=LocalCommunicator(), timer=op.timer, cache_dir=tmp_path, disk_cache=False,
                                 environment=lambda: ENV)
    assert tuner.tune("gemm", (1, ), [A, B], op.run).cache_file is None and not list(tmp_path.iterdir())


def test_an_unwritable_cache_dir_only_warns(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("")
    op = FakeOp(0, LocalCommunicator(), {"A": [3.0], "B": [2.0]})
    tuner = DistributedAutotuner(comm=LocalCommunicator(), timer=op.timer, cache_dir=blocker, environment=lambda: ENV)
    assert tuner.best_config("gemm", (1, ), [A, B], op.run) == B
    assert "could not write cache file" in caplog.text


def test_single_process_without_torch_distributed(tmp_path):
    # No comm given: the default communicator is a world of one (torch is not even installed here).
    assert isinstance(autotune.default_communicator(), LocalCommunicator)
    calls = []
    times = {"x": 2.0, "y": 1.0, "z": 1.0}
    tuner = DistributedAutotuner(timer=lambda fn: (fn(), times[calls[-1]])[1], cache_dir=tmp_path,
                                 environment=lambda: ENV)
    chosen = autotune.best_config("scalar", [3, "float16"], ["x", "y", "z"], calls.append, autotuner=tuner)
    assert chosen == "y" and calls == ["x", "x", "y", "y", "z", "z"]


def test_the_default_timer_is_bench_timing_with_fixed_counts():
    from triton_dist.bench import timing

    tuner = DistributedAutotuner(warmup=2, iters=7, graph=True)
    assert tuner.timer.func is timing.rank_medians_us
    assert tuner.timer.keywords == {"warmup": 2, "iters": 7, "group": 1, "graph": True}
    with pytest.raises(ValueError, match="iters"):
        DistributedAutotuner(iters=0)


def test_bad_requests():
    tuner = DistributedAutotuner(comm=LocalCommunicator(), timer=lambda fn: 1.0, disk_cache=False)
    with pytest.raises(ValueError, match="no candidate"):
        tuner.tune("gemm", (1, ), [], lambda c: None)
    with pytest.raises(ValueError, match="op must be"):
        tuner.tune("", (1, ), ["a"], lambda c: None)


def test_environment_and_result_types():
    env = autotune.default_environment()
    assert env["gpu"] == "none" and env["triton"] and len(env["triton_dist_source"]) == 16
    assert autotune.source_digest() == env["triton_dist_source"]
    assert {f.name for f in __import__("dataclasses").fields(TuneResult)} >= {"config", "times_us", "skipped"}


def test_gemm_candidates_put_the_rule_first():
    from triton_dist.kernels.gemm import dense as gemm
    from triton_dist.kernels.gemm import autotune as gemm_autotune

    cands = gemm_autotune.candidates(8192, 8192, 4096, 132)
    assert [c["name"] for c in cands][0] == gemm.pick_gemm_config(8192, 8192, 4096, 132) == "large"
    assert sorted(c["name"] for c in cands) == sorted(gemm.CONFIGS)
    assert gemm_autotune.candidates(256, 512, 512, 132)[0]["name"] == "small"
    assert [c["name"] for c in gemm_autotune.candidates(128, 512, 512, 132)] == ["split_k_m128_n64", "split_k_m128", "large",
                                                                                      "small"]
    small_m = [c["name"] for c in gemm_autotune.candidates(16, 4096, 4096, 132)]
    assert small_m == ["split_k_m16", "split_k_m32", "split_k_m64", "split_k_m128", "split_k_m128_n64", "skinny_n32",
                       "large", "small"]
    assert all({k: v for k, v in c.items() if k not in ("name", "split_k_rule")} == gemm.config_params(c["name"])
               for m in (16, 8192) for c in gemm_autotune.candidates(m, 4096, 4096, 132))
    assert all(("split_k_rule" in c) == c["name"].startswith("split_k") for c in gemm_autotune.candidates(16, 4096, 4096, 132))
    with pytest.raises(ValueError, match="dtype"):
        gemm_autotune.tuned_gemm_config(128, 128, 128, "float32")
    with pytest.raises(ValueError, match="m must be"):
        gemm_autotune.tuned_gemm_config(0, 128, 128, "bfloat16")
