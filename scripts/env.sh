# Sourced by the other scripts: the environment every triton_dist command runs in.
# NVLink multicast must stay off on shared machines (docs/design.md §3).
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
export PYTHONUNBUFFERED=1
# CMake finds the CUDA headers through nvcc, or here when nvcc is not on PATH.
if ! command -v nvcc >/dev/null 2>&1 && [ -d /usr/local/cuda ]; then export CUDAToolkit_ROOT=/usr/local/cuda; fi

tdist_install_python_deps() {
  # Offline machines (the GPU machine) already have everything; elsewhere fetch from PyPI.
  if python3 -c "import triton, nanobind, scikit_build_core, nvidia.nvshmem, pytest" 2>/dev/null; then return; fi
  python3 -m pip install -q -r requirements-ci.txt
}

tdist_build() {
  python3 -m pip install --no-build-isolation --no-deps -q .
}

# Several ranks per GPU (--ranks-per-gpu K of scripts/gpu-test and scripts/run): our own CUDA MPS
# control daemon, with private pipe and log directories so that it meets no other daemon, quit on
# every way out of the calling script (exit, failure, SIGINT/SIGTERM, the script's own timeouts).
# It changes no GPU setting (compute mode, clocks, MIG). Each rank gets 100/K percent of the SMs:
# ranks whose kernels wait on each other must all be resident at once (triton_dist.residency).
tdist_start_mps() {  # K
  local k=$1
  command -v nvidia-cuda-mps-control >/dev/null || { echo "nvidia-cuda-mps-control is not installed: cannot share GPUs"; return 1; }
  tdist_quit_stale_mps
  CUDA_MPS_PIPE_DIRECTORY=$(mktemp -d /tmp/tdist-mps-pipe.XXXXXX)
  CUDA_MPS_LOG_DIRECTORY=$(mktemp -d /tmp/tdist-mps-log.XXXXXX)
  export CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
  trap tdist_stop_mps EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  nvidia-cuda-mps-control -d || { echo "the MPS control daemon did not start (log: $CUDA_MPS_LOG_DIRECTORY)"; return 1; }
  export CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$((100 / k)) TRITON_DIST_RANKS_PER_GPU=$k
  echo "== MPS control daemon started (pipe $CUDA_MPS_PIPE_DIRECTORY): $k ranks per GPU, ${CUDA_MPS_ACTIVE_THREAD_PERCENTAGE} % of the SMs each"
}

tdist_kill_tree() {  # PID: the process and all its descendants (children first)
  local child
  for child in $(pgrep -P "$1" 2>/dev/null || true); do tdist_kill_tree "$child"; done
  kill -TERM "$1" 2>/dev/null || true
}

tdist_stop_mps() {
  # Runs as an EXIT trap, maybe under set -e: no command here may fail.
  [ -n "${CUDA_MPS_PIPE_DIRECTORY:-}" ] || return 0
  # Ranks still running (a TERM during gpu-test --concurrent) are MPS clients: the daemon waits
  # for them before it quits, so end them first.
  local job
  for job in $(pgrep -P $$ 2>/dev/null | grep -vx "$BASHPID" || true); do tdist_kill_tree "$job"; done
  # The daemon leaves its sockets behind when it quits: its pid file says whether it still runs.
  local pid i
  pid=$(cat "$CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid" 2>/dev/null || true)
  echo quit | nvidia-cuda-mps-control >/dev/null 2>&1 || true
  for i in $(seq 100); do [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  tail -3 "$CUDA_MPS_LOG_DIRECTORY/control.log" 2>/dev/null || true
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    # Its pipe directory stays, so that the next tdist_start_mps (tdist_quit_stale_mps) finds it.
    echo "warning: the MPS control daemon (pid $pid) did not quit in 10 s; left $CUDA_MPS_PIPE_DIRECTORY for the next run to quit it"
    rm -rf "$CUDA_MPS_LOG_DIRECTORY" || true
  else
    echo "== MPS control daemon quit"
    rm -rf "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY" || true
  fi
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY CUDA_MPS_ACTIVE_THREAD_PERCENTAGE TRITON_DIST_RANKS_PER_GPU
}

tdist_quit_stale_mps() {
  # A run killed from outside (SIGKILL) could not quit its daemon: quit ours that still answer.
  local dir pid
  for dir in /tmp/tdist-mps-pipe.*; do
    [ -d "$dir" ] || continue
    pid=$(cat "$dir/nvidia-cuda-mps-control.pid" 2>/dev/null || true)
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
      echo "== quitting a stale MPS control daemon ($dir, pid $pid)"
      echo quit | CUDA_MPS_PIPE_DIRECTORY=$dir nvidia-cuda-mps-control >/dev/null 2>&1 || true
      sleep 1
    fi
    rm -rf "$dir"
  done
}
