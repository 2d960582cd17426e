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
    # Records each call; -d leaves a daemon (a sleep) and its pid file, as the real one does; quit ends it.
    pid_file=$CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid
    if [ "${1:-}" = "-d" ]; then
      echo "start $CUDA_MPS_PIPE_DIRECTORY" >>"$STUB_LOG"
      setsid sleep 300 </dev/null >/dev/null 2>&1 &
      echo $! >"$pid_file"
      exit 0
    fi
    read -r command
    echo "$command $CUDA_MPS_PIPE_DIRECTORY" >>"$STUB_LOG"
    [ "$command" = quit ] && kill "$(cat "$pid_file")"
    exit 0
""")


@pytest.fixture
def stub(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    control = bin_dir / "nvidia-cuda-mps-control"
    control.write_text(_STUB)
    control.chmod(0o755)
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
                                          (["--budget-s", "soon"], "take seconds")])
def test_gpu_test_option_rules(args, message):
    run = subprocess.run(["bash", "scripts/gpu-test", *args], cwd=_ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and message in run.stdout, run.stdout + run.stderr
