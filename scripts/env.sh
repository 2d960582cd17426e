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
# It changes no GPU setting (compute mode, clocks, MIG). Ranks whose kernels wait on each other
# must all be resident at once (triton_dist.residency), so each rank gets SMs of its own: a static
# SM partition of 1/K of the GPU's chunks (the daemon started with -S; scripts/mps-rank binds each
# rank to its partition) where the driver offers them, else a cap of 100/K percent of the SMs
# (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE). A cap is not a reservation: other clients' spinning grids
# may hold the SMs a rank's next kernel needs (our reading of overlapped-GEMM hangs at world 4,
# residency.py's notes); partitions cannot. share="percent" asks for the cap (several
# worlds at once, gpu-test --concurrent: their local ranks would meet in one list of partitions).
tdist_start_mps() {  # K [share: partition (default) | percent]
  local k=$1 share=${2:-partition} why
  command -v nvidia-cuda-mps-control >/dev/null || { echo "nvidia-cuda-mps-control is not installed: cannot share GPUs"; return 1; }
  tdist_quit_stale_mps
  CUDA_MPS_PIPE_DIRECTORY=$(mktemp -d /tmp/tdist-mps-pipe.XXXXXX)
  CUDA_MPS_LOG_DIRECTORY=$(mktemp -d /tmp/tdist-mps-log.XXXXXX)
  export CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
  trap tdist_stop_mps EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  export TRITON_DIST_RANKS_PER_GPU=$k
  if [ "$share" = partition ]; then
    # Output to files, not $(...): a subshell would keep the partitions' export, and a daemon
    # started inside one might hold its pipe open.
    local notes=$CUDA_MPS_LOG_DIRECTORY/partitions.txt
    if ! nvidia-cuda-mps-control -d -S >"$notes" 2>&1; then
      why="the daemon refused -S: $(tr '\n' ' ' <"$notes")"
    elif tdist_mps_partitions "$k" >"$notes" 2>&1; then
      echo "== MPS control daemon started (pipe $CUDA_MPS_PIPE_DIRECTORY): $k ranks per GPU, each on a static SM partition of its own"
      cat "$notes"
      return 0
    else
      # The daemon forks before it checks its options: its log says why it is gone.
      why="$(tr '\n' ' ' <"$notes")control.log: $(tail -n 2 "$CUDA_MPS_LOG_DIRECTORY/control.log" 2>/dev/null | tr '\n' ' ')"
      tdist_quit_mps_daemon
    fi
    echo "== MPS static SM partitions unavailable ($why); sharing by percentage instead"
  fi
  nvidia-cuda-mps-control -d || { echo "the MPS control daemon did not start (log: $CUDA_MPS_LOG_DIRECTORY)"; return 1; }
  export CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$((100 / k))
  echo "== MPS control daemon started (pipe $CUDA_MPS_PIPE_DIRECTORY): $k ranks per GPU, ${CUDA_MPS_ACTIVE_THREAD_PERCENTAGE} % of the SMs each"
}

tdist_mps_partitions() {  # K: K static SM partitions on every GPU, exported in local-rank order as
  # TDIST_MPS_SM_PARTITIONS (ranks K*g .. K*g+K-1 use GPU g, as triton_dist.placement places
  # them). Prints the partition table; on failure prints why and returns 1.
  local k=$1 listing free per uuid out id i ids=()
  listing=$(echo lspart | nvidia-cuda-mps-control 2>&1) || { echo "lspart failed: $listing"; return 1; }
  free=$(grep -o 'free chunks [0-9]*' <<<"$listing" | head -1 | grep -o '[0-9]*$' || true)
  if [ -z "$free" ] || [ "$free" -lt "$k" ]; then echo "lspart shows ${free:-no} free chunks for $k ranks: $listing"; return 1; fi
  per=$(( free / k ))
  for uuid in $(nvidia-smi --query-gpu=uuid --format=csv,noheader 2>/dev/null); do
    for i in $(seq "$k"); do
      out=$(echo "sm_partition add $uuid $per" | nvidia-cuda-mps-control 2>&1)
      id=$(grep -o 'GPU-[^[:space:]]*/[^[:space:]]*' <<<"$out" | tail -1 || true)
      [ -n "$id" ] || { echo "sm_partition add $uuid $per answered: $out"; return 1; }
      ids+=("$id")
    done
  done
  [ "${#ids[@]}" -gt 0 ] || { echo "nvidia-smi listed no GPU"; return 1; }
  export TDIST_MPS_SM_PARTITIONS="${ids[*]}"
  echo "$per chunks per rank; lspart: $(echo lspart | nvidia-cuda-mps-control 2>&1 | tr '\n' ' ')"
}

tdist_rank_entry() {
  # What torchrun runs for each rank: python, or with static SM partitions scripts/mps-rank, which
  # binds the rank to its partition before CUDA starts (torchrun ... $(tdist_rank_entry) script.py).
  if [ -n "${TDIST_MPS_SM_PARTITIONS:-}" ]; then echo "--no-python scripts/mps-rank"; fi
}

tdist_kill_tree() {  # PID: the process and all its descendants (children first)
  local child
  for child in $(pgrep -P "$1" 2>/dev/null || true); do tdist_kill_tree "$child"; done
  kill -TERM "$1" 2>/dev/null || true
}

tdist_quit_mps_daemon() {  # quit the daemon of CUDA_MPS_PIPE_DIRECTORY; 1 if it still runs 10 s later
  # The daemon leaves its sockets behind when it quits: its pid file says whether it still runs.
  local pid i
  pid=$(cat "$CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid" 2>/dev/null || true)
  echo quit | nvidia-cuda-mps-control >/dev/null 2>&1 || true
  for i in $(seq 100); do [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  ! { [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; }
}

tdist_stop_mps() {
  # Runs as an EXIT trap, maybe under set -e: no command here may fail.
  [ -n "${CUDA_MPS_PIPE_DIRECTORY:-}" ] || return 0
  # Ranks still running (a TERM during gpu-test --concurrent) are MPS clients: the daemon waits
  # for them before it quits, so end them first.
  local job
  for job in $(pgrep -P $$ 2>/dev/null | grep -vx "$BASHPID" || true); do tdist_kill_tree "$job"; done
  local quit=0
  tdist_quit_mps_daemon || quit=1
  tail -3 "$CUDA_MPS_LOG_DIRECTORY/control.log" 2>/dev/null || true
  if [ "$quit" -eq 0 ]; then
    echo "== MPS control daemon quit"
    rm -rf "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY" || true
  else
    # Its pipe directory stays, so that the next tdist_start_mps (tdist_quit_stale_mps) finds it.
    echo "warning: the MPS control daemon did not quit in 10 s; left $CUDA_MPS_PIPE_DIRECTORY for the next run to quit it"
    rm -rf "$CUDA_MPS_LOG_DIRECTORY" || true
  fi
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY CUDA_MPS_ACTIVE_THREAD_PERCENTAGE TRITON_DIST_RANKS_PER_GPU \
    TDIST_MPS_SM_PARTITIONS
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
