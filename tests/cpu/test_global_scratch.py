"""GlobalScratch (device-built TMA descriptors' memory) is handed to Triton's launcher only inside
``installed()``, restores whatever allocator was there before, and refuses a launch it was not
sized for, naming the fix. No GPU or torch needed."""

import pytest
from triton.runtime import _allocation

from triton_dist.kernels.common.scratch import GlobalScratch


class _Buffer:
    def __init__(self, nbytes, ptr=4096):
        self._n, self._ptr = nbytes, ptr

    def numel(self):
        return self._n

    def data_ptr(self):
        return self._ptr


def test_installed_only_inside_the_block_and_restores_the_previous_allocator():
    before = _allocation._allocator.get()
    scratch = GlobalScratch("cuda:0")
    scratch._buffer = _Buffer(1024)
    with scratch.installed():
        assert _allocation._allocator.get() is scratch
        assert _allocation._allocator.get()(512, 128, None) is scratch._buffer
    assert _allocation._allocator.get() is before


def test_refuses_what_was_not_reserved():
    scratch = GlobalScratch("cuda:0")
    with pytest.raises(RuntimeError, match="reserve"):
        scratch(256, 128, None)
    scratch._buffer = _Buffer(256)
    with pytest.raises(RuntimeError, match="512 bytes"):
        scratch(512, 128, None)
    scratch._buffer = _Buffer(1024, ptr=4096 + 64)
    with pytest.raises(RuntimeError, match="alignment 128"):
        scratch(256, 128, None)


def test_reserve_ignores_kernels_without_scratch():
    class _Meta:
        global_scratch_size = 0
        num_ctas = 1

    class _Compiled:
        metadata = _Meta()

    scratch = GlobalScratch("cuda:0")
    scratch.reserve(_Compiled(), 132)  # would need torch to allocate; nothing to allocate here
    assert scratch._buffer is None
