"""The GPU scripts' host logic without a GPU: option parsing, and the MPS daemon of
``--ranks-per-gpu`` started with private directories and quit on every way out (a stub stands in
for nvidia-cuda-mps-control)."""

import os
import pathlib
import subprocess
import textwrap

import pytest

_ROOT = pathlib.Path(__file__).resolve().parents[2]

_STUB = textwrap.dedent("""\
    #!/usr/bin/env bash
    # Records each call; -d leaves a daemon (a sleep) and its pid file, as the real one does; quit
    # ends it. -S (static SM partitions) only with STUB_STATIC set, as on a driver that has them;
    # lspart shows STUB_CHUNKS free chunks (16 by default).
    pid_file=$CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid
    if [ "${1:-}" = "-d" ]; then
      if [ "${2:-}" = "-S" ]; then
        [ -n "${STUB_STATIC:-}" ] || { echo "nvidia-cuda-mps-control: unknown option -S" >&2; exit 1; }
        echo "start-static $CUDA_MPS_PIPE_DIRECTORY" >>"$STUB_LOG"
      else
        echo "start $CUDA_MPS_PIPE_DIRECTORY" >>"$STUB_LOG"
      fi
      setsid sleep 300 </dev/null >/dev/null 2>&1 &
      echo $! >"$pid_file"
      exit 0
    fi
    read -r command
    echo "$command $CUDA_MPS_PIPE_DIRECTORY" >>"$STUB_LOG"
    case "$command" in
      quit) kill "$(cat "$pid_file")" ;;
      lspart) echo "GPU-stub free chunks ${STUB_CHUNKS:-16}, used chunks 0, free SM 128, used SM 0" ;;
      "sm_partition add "*) echo "Partition GPU-stub/p$(grep -c '^sm_partition add' "$STUB_LOG") created" ;;
    esac
    exit 0
""")


@pytest.fixture
def stub(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    control = bin_dir / "nvidia-cuda-mps-control"
    control.write_text(_STUB)
    control.chmod(0o755)
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/usr/bin/env bash\necho GPU-stub\n")
    smi.chmod(0o755)
    log = tmp_path / "calls.log"
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", STUB_LOG=str(log))
    return env, log


def _bash(script, env):
    return subprocess.run(["bash", "-c", f"source scripts/env.sh; {script}"], cwd=_ROOT, env=env,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("ending", ["exit 3", "false", "kill -TERM $$", "kill -INT $$"])
def test_mps_daemon_is_quit_on_every_way_out(stub, ending):
    env, log = stub
    run = _bash(f"set -e; tdist_start_mps 4; echo share=$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE "
                f"k=$TRITON_DIST_RANKS_PER_GPU pipe=$CUDA_MPS_PIPE_DIRECTORY; {ending}; echo not reached", env)
    assert "share=25 k=4 pipe=/tmp/tdist-mps-pipe." in run.stdout, run.stdout + run.stderr
    assert "not reached" not in run.stdout
    calls = log.read_text().split("\n")
    pipe = calls[0].split()[1]
    assert calls[0] == f"start {pipe}" and calls[1] == f"quit {pipe}", calls
    assert not pathlib.Path(pipe).exists(), "the private pipe directory was left behind"
    assert "did not quit" not in run.stdout
    assert "MPS control daemon quit" in run.stdout


@pytest.mark.parametrize("k,share", [(2, 50), (8, 12), (3, 33)])
def test_each_rank_gets_its_share(stub, k, share):
    env, _ = stub
    run = _bash(f"tdist_start_mps {k}; echo share=$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", env)
    assert f"share={share}" in run.stdout, run.stdout + run.stderr


@pytest.mark.parametrize("k", [2, 4, 8])
def test_static_sm_partitions_give_each_rank_its_own(stub, k):
    env, log = stub
    env = dict(env, STUB_STATIC="1")
    run = _bash(f"set -e; tdist_start_mps {k}; echo parts=$TDIST_MPS_SM_PARTITIONS "
                "share=${CUDA_MPS_ACTIVE_THREAD_PERCENTAGE:-none} entry=$(tdist_rank_entry)", env)
    assert "each on a static SM partition of its own" in run.stdout, run.stdout + run.stderr
    parts = run.stdout.split("parts=")[1].split(" share=")[0].split()
    assert parts == [f"GPU-stub/p{i}" for i in range(1, k + 1)], run.stdout
    assert "share=none entry=--no-python scripts/mps-rank" in run.stdout
    assert f"{16 // k} chunks per rank" in run.stdout
    calls = log.read_text()
    assert calls.count(f"sm_partition add GPU-stub {16 // k}") == k and "quit" in calls


@pytest.mark.parametrize("static,chunks", [("", "16"), ("1", "2")])
def test_without_static_partitions_ranks_share_by_percentage(stub, static, chunks):
    """A daemon without -S, or too few chunks for the ranks: the 100/K cap, saying why."""
    env, log = stub
    env = dict(env, STUB_STATIC=static, STUB_CHUNKS=chunks)
    run = _bash("set -e; tdist_start_mps 4; echo share=$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE "
                "parts=${TDIST_MPS_SM_PARTITIONS:-none} entry=$(tdist_rank_entry)", env)
    assert "share=25 parts=none entry=" in run.stdout, run.stdout + run.stderr
    assert "static SM partitions unavailable" in run.stdout
    assert ("unknown option -S" if not static else "2 free chunks for 4 ranks") in run.stdout
    calls = [c.split()[0] for c in log.read_text().strip().split("\n")]
    assert calls == (["start", "quit"] if not static else ["start-static", "lspart", "quit", "start", "quit"]), calls


def test_percent_share_is_asked_for_by_name(stub):
    env, log = stub
    run = _bash("set -e; tdist_start_mps 2 percent; echo share=$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
                dict(env, STUB_STATIC="1"))
    assert "share=50" in run.stdout and "start-static" not in log.read_text(), run.stdout + run.stderr


@pytest.mark.parametrize("local_rank,expected", [("0", "GPU-a/1"), ("2", "GPU-a/3")])
def test_mps_rank_binds_its_partition(local_rank, expected):
    env = dict(os.environ, TDIST_MPS_SM_PARTITIONS="GPU-a/1 GPU-a/2 GPU-a/3", LOCAL_RANK=local_rank)
    run = subprocess.run(["scripts/mps-rank", "-c", "import os; print(os.environ['CUDA_MPS_SM_PARTITION'])"],
                         cwd=_ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stdout.strip() == expected, run.stdout + run.stderr


def test_mps_rank_without_a_partition_for_it_says_so():
    env = dict(os.environ, TDIST_MPS_SM_PARTITIONS="GPU-a/1 GPU-a/2", LOCAL_RANK="2")
    run = subprocess.run(["scripts/mps-rank", "-c", "pass"], cwd=_ROOT, env=env, capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 1 and "local rank 2 has no SM partition (2 were made" in run.stderr


def test_a_stale_daemon_of_ours_is_quit_first(stub):
    env, log = stub
    stale = pathlib.Path("/tmp/tdist-mps-pipe.stale-test")
    stale.mkdir(exist_ok=True)
    daemon = subprocess.Popen(["sleep", "300"])
    (stale / "nvidia-cuda-mps-control.pid").write_text(f"{daemon.pid}\n")
    try:
        run = _bash("tdist_start_mps 2", env)
        assert f"quit {stale}" in log.read_text(), run.stdout + run.stderr
        assert not stale.exists()
        assert daemon.wait(timeout=10) is not None
    finally:
        daemon.kill()
        if stale.exists():
            (stale / "nvidia-cuda-mps-control.pid").unlink(missing_ok=True)
            stale.rmdir()


@pytest.mark.parametrize("script", ["gpu-test", "run"])
@pytest.mark.parametrize("args,message", [(["--ranks-per-gpu", "0"], "positive integer"),
                                          (["--ranks-per-gpu", "two"], "positive integer"),
                                          (["--no-such-option"], "unknown option")])
def test_bad_options_are_refused_before_anything_runs(script, args, message):
    run = subprocess.run(["bash", f"scripts/{script}", *args], cwd=_ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and message in run.stdout, run.stdout + run.stderr


@pytest.mark.parametrize("args,message", [(["--concurrent"], "give --ranks-per-gpu K"),
                                          (["--budget-s", "soon"], "take seconds"),
                                          (["--test-timeout", "10"], "--test-timeout takes seconds, at least 30"),
                                          (["--local-world", "two"], "--local-world takes a positive integer"),
                                          (["--tests", "ag_gemm"], "no tests/gpu/**/test_ag_gemm.py")])
def test_gpu_test_option_rules(args, message):
    run = subprocess.run(["bash", "scripts/gpu-test", *args], cwd=_ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and message in run.stdout, run.stdout + run.stderr


def test_gpu_test_writes_its_summary_with_what_produced_it(tmp_path):
    """$OUT/summary.txt: one line naming the commit and the arguments, then the printed summary's
    lines (a budget of one second: the build, then every step listed as not run)."""
    env = dict(os.environ, OUT=str(tmp_path), TRITON_DIST_COMMIT="abc1234")
    run = subprocess.run(["bash", "scripts/gpu-test", "--parts", "lifecycle", "--budget-s", "1"], cwd=_ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    head, *lines = (tmp_path / "summary.txt").read_text().splitlines()
    assert "commit abc1234" in head and head.endswith("scripts/gpu-test --parts lifecycle --budget-s 1"), head
    printed = run.stdout.split("== summary", 1)[1].splitlines()[1:]
    assert lines and lines == printed[:len(lines)] and "build (pip install .)" in lines[0], run.stdout


_SANITIZER_PROBE = """\
========= Program hit CUDA_ERROR_NOT_FOUND (error 500) due to "named symbol not found" on CUDA API call to cuModuleGetGlobal_v2.
=========     Saved host backtrace up to driver entry point at error
=========         Host Frame: nvshmemx_cumodule_init [0x118932] in libnvshmem_host.so.3
=========         Host Frame: tdist::NvshmemBackend::initialize_module [0xdc064] in _C.so
"""
_SANITIZER_OURS = """\
========= Program hit CUDA_ERROR_NOT_FOUND (error 500) due to "named symbol not found" on CUDA API call to cuModuleGetGlobal_v2.
=========     Saved host backtrace up to driver entry point at error
=========         Host Frame: tdist::WaitTimeoutReport::install [0x6d0e1] in _C.so
"""
_SANITIZER_READ = """\
========= Invalid __global__ read of size 4 bytes
=========     at kernel+0x90
"""


@pytest.mark.parametrize("log, clean", [
    ("========= ERROR SUMMARY: 0 errors\n", True),
    (_SANITIZER_PROBE + "========= ERROR SUMMARY: 1 error\n", True),
    (_SANITIZER_PROBE + _SANITIZER_OURS + "========= ERROR SUMMARY: 2 errors\n", False),
    (_SANITIZER_PROBE + _SANITIZER_READ + "========= ERROR SUMMARY: 2 errors\n", False),
    (_SANITIZER_PROBE * 2 + "========= ERROR SUMMARY: 5 errors\n"
     "========= ERROR SUMMARY: 3 errors were not printed. Use --print-limit option to adjust\n", False),
    ("Traceback (most recent call last):\n", False),
    ("========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)\n", True),
    ("========= RACECHECK SUMMARY: 2 hazards displayed (2 errors, 0 warnings)\n", False),
])
def test_sanitizer_verdict_allows_only_nvshmems_own_lookups(tmp_path, log, clean):
    path = tmp_path / "sanitizer.log"
    path.write_text(log)
    done = subprocess.run([str(_ROOT / "scripts/sanitizer-verdict"), str(path)], capture_output=True, text=True)
    assert (done.returncode == 0) == clean, done.stdout
    assert done.stdout.startswith("clean: " if clean else "NOT clean: ")


def test_sanitizer_verdict_counts_every_process(tmp_path):
    # A compile worker's clean summary first must not stand for the main process's errors.
    path = tmp_path / "sanitizer.log"
    path.write_text("========= ERROR SUMMARY: 0 errors\n" + _SANITIZER_READ + "========= ERROR SUMMARY: 1 error\n")
    done = subprocess.run([str(_ROOT / "scripts/sanitizer-verdict"), str(path)], capture_output=True, text=True)
    assert done.returncode == 1 and "1 errors in 2 process(es)" in done.stdout, done.stdout
    path.write_text("========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)\n")
    done = subprocess.run([str(_ROOT / "scripts/sanitizer-verdict"), str(path)], capture_output=True, text=True)
    assert done.returncode == 1 and "1 hazards" in done.stdout, done.stdout


def _race(first: str, second: str, hazards: int = 128) -> str:
    # As racecheck prints one (tutorial 08 on one H200, 2026-12-04).
    return (f"========= Error: Race reported between Read access at {first}+0xb00\n"
            f"=========     and Write access at {second}+0x2820 [{hazards} hazards]\n=========\n")


_CUBLAS = "nvjet_sm90_tst_64x8_64x16_4x2_h_bz_TNT"


@pytest.mark.parametrize("races, clean", [
    ([(_CUBLAS, _CUBLAS)] * 2, True),                   # only cuBLAS's kernels: listed, allowed
    ([(_CUBLAS, _CUBLAS), ("_moe_dispatch_kernel", "_moe_dispatch_kernel")], False),
    ([(_CUBLAS, "_moe_dispatch_kernel")], False),       # one access is ours
    ([(_CUBLAS, _CUBLAS)], False),                      # the summary counts one more than printed
])
def test_sanitizer_verdict_allows_only_cublas_races(tmp_path, races, clean):
    summary_count = len(races) + (1 if races == [(_CUBLAS, _CUBLAS)] else 0)
    path = tmp_path / "sanitizer.log"
    path.write_text("".join(_race(a, b) for a, b in races) +
                    f"========= RACECHECK SUMMARY: {summary_count} hazards displayed ({summary_count} errors, 0 warnings)\n")
    done = subprocess.run([str(_ROOT / "scripts/sanitizer-verdict"), str(path)], capture_output=True, text=True)
    assert (done.returncode == 0) == clean, done.stdout
    if clean:
        assert "inside cuBLAS's kernels, allowed: nvjet_sm90" in done.stdout, done.stdout
