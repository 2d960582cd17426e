"""Global scratch memory for kernels that build TMA descriptors on the device.

``tl.make_tensor_descriptor`` writes each descriptor into global scratch memory that Triton's
launcher asks for at every launch, through the allocator installed with ``triton.set_allocator``
(none by default: the launch fails). A context whose kernels need it owns one
:class:`GlobalScratch`: sized when the kernels are preloaded, for the largest grid, and handed to
the launcher only while the context launches, so the user's own allocator setting is untouched
and nothing is allocated per call (a call inside CUDA graph capture allocates nothing either).
The context's launches are ordered on its stream, so they can share the buffer.
"""

from __future__ import annotations

import contextlib

from triton.runtime import _allocation  # the launcher reads its allocator from this ContextVar


class GlobalScratch:
    """One context's global scratch buffer for device-built TMA descriptors."""

    def __init__(self, device):
        self.device = device
        self._buffer = None

    def reserve(self, compiled, max_programs: int) -> None:
        """Make room for ``max_programs`` programs of the compiled kernel (a no-op for kernels that
        build no descriptor)."""
        need = compiled.metadata.global_scratch_size * getattr(compiled.metadata, "num_ctas", 1) * max_programs
        if need and (self._buffer is None or self._buffer.numel() < need):
            import torch

            self._buffer = torch.empty(need, dtype=torch.uint8, device=self.device)

    def __call__(self, size: int, alignment: int, stream):
        if self._buffer is None or self._buffer.numel() < size or self._buffer.data_ptr() % alignment:
            have = 0 if self._buffer is None else self._buffer.numel()
            raise RuntimeError(f"triton_dist GlobalScratch: a launch asked for {size} bytes of global scratch "
                               f"(alignment {alignment}) but {have} were reserved: reserve() the kernel at preload "
                               f"for its largest grid")
        return self._buffer

    @contextlib.contextmanager
    def installed(self):
        """Within the block, Triton's launcher takes its global scratch from this buffer."""
        token = _allocation._allocator.set(self)
        try:
            yield self
        finally:
            _allocation._allocator.reset(token)
