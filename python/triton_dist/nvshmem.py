"""Where NVSHMEM's files are: the host library the C++ core loads and the device bitcode that
Triton links into kernels. Both come from the ``nvidia-nvshmem-cu13`` wheel. No torch, no GPU."""

from __future__ import annotations

import functools
import importlib.util
import os

_INSTALL_HINT = "pip install nvidia-nvshmem-cu13 (3.4 or newer)"


@functools.lru_cache(maxsize=None)
def library_dir() -> str:
    """The wheel's ``nvidia/nvshmem/lib`` directory."""
    spec = importlib.util.find_spec("nvidia.nvshmem")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"triton_dist: NVSHMEM is not installed; {_INSTALL_HINT}")
    for root in spec.submodule_search_locations:
        lib = os.path.join(root, "lib")
        if os.path.isfile(os.path.join(lib, "libnvshmem_host.so.3")):
            return lib
    raise RuntimeError(
        f"triton_dist: the nvidia.nvshmem package has no lib/libnvshmem_host.so.3; reinstall it: {_INSTALL_HINT}")


@functools.lru_cache(maxsize=None)
def device_bitcode() -> str:
    """Path of ``libnvshmem_device.bc``, linked into kernels that call the OpenSHMEM device API."""
    path = os.path.join(library_dir(), "libnvshmem_device.bc")
    if not os.path.isfile(path):
        raise RuntimeError(f"triton_dist: {path} is missing; reinstall NVSHMEM: {_INSTALL_HINT}")
    return path


@functools.lru_cache(maxsize=None)
def extern_libs() -> tuple[tuple[str, str], ...]:
    """The ``extern_libs`` launch option that links NVSHMEM's device library."""
    return (("libnvshmem_device", device_bitcode()),)
