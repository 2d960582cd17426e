"""Device-side primitives for Triton kernels (``import triton_dist.language as dl``).

``dl.shmem`` (also ``dl.libshmem_device``) is the OpenSHMEM device API over NVSHMEM; kernels
that use it are decorated with ``triton_dist.jit``. Importing this package needs neither torch
nor a GPU, so kernels compile for sm_90 anywhere.
"""

from . import shmem
from . import shmem as libshmem_device

__all__ = ["shmem", "libshmem_device"]
