"""Device-side primitives for Triton kernels (``import triton_dist.language as dl``).

- signalling (``signals``): ``rank``, ``num_ranks``, ``symm_at``, ``wait``, ``notify``, ``consume_token``;
- memory model (``memory``): ``ld``, ``st``, ``fence``, ``atomic_add``/``atomic_xchg``/``atomic_cas``
  with scope and semantic, ``barrier`` (CTA), ``tid``, ``laneid``, ``wait_tma_stores``;
- ``dl.shmem`` (also ``dl.libshmem_device``): the OpenSHMEM device API over NVSHMEM;
- ``dl.simt``: per-thread loads, stores, atomics and waits, and a barrier of every rank in which
  thread ``i`` signals rank ``i``;
- ``dl.timeline``: tagged ``%globaltimer`` stamps into a recording (:mod:`triton_dist.timeline`).

Kernels that use them are decorated with ``triton_dist.jit``. Importing this package needs
neither torch nor a GPU, so kernels compile for sm_90 anywhere.
"""

from . import shmem, simt, timeline
from . import shmem as libshmem_device
from .memory import atomic_add, atomic_cas, atomic_xchg, barrier, fence, laneid, ld, st, tid, wait_tma_stores
from .signals import consume_token, notify, num_ranks, rank, symm_at, wait

__all__ = ["atomic_add", "atomic_cas", "atomic_xchg", "barrier", "consume_token", "fence", "laneid", "ld",
           "libshmem_device", "notify", "num_ranks", "rank", "shmem", "simt", "st", "symm_at", "tid", "timeline", "wait",
           "wait_tma_stores"]
