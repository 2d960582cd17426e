# Sourced by the other scripts: the environment every triton_dist command runs in.
# NVLink multicast must stay off on shared machines (DESIGN.md §3).
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
