"""The C++ launcher's TMA operands given as ``(tensor, block)`` pairs (what a LaunchPlan's descriptor
slot passes, kernels/common/launch_plan.py): taken where ``TensorDescriptor.from_tensor(tensor,
block)`` would make a descriptor of the variant's block and dtype, refused (so that Triton's path
raises its error) where it would not. A zero-sized grid launches nothing, so no driver is needed."""

import threading
import time
import types

import pytest

from triton_dist.runtime import _core

BF16 = types.SimpleNamespace(itemsize=2)  # stands in for torch.bfloat16: matched by identity
FP32 = types.SimpleNamespace(itemsize=4)
BLOCK = [128, 64]


class Tensor:
    """What the launcher reads of a torch tensor: data_ptr(), dtype, shape, stride()."""

    def __init__(self, shape, strides=None, address=0x7F0000000000, dtype=BF16):
        self.shape, self.dtype, self._address = tuple(shape), dtype, address
        self._strides = tuple(strides) if strides else (shape[1], 1)

    def data_ptr(self):
        return self._address

    def stride(self):
        return self._strides


def _launcher():
    """A variant taking one 2-D bf16 descriptor of block [128, 64] and an int."""
    tensor_map = (BLOCK, 10, 2, 3, [64, 128], False)  # CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 128-byte swizzle
    return _core().KernelLauncher("tma_stand_in", 0, 1, ["nvTmaDesc", "i32"], [False, False], [0, 0],
                                  [False, False], [BF16, None], 128, 0, 1, False, False, [tensor_map, None])


def _takes(operand) -> bool:
    return _launcher().launch(0, 1, 1, 0, operand, 7)


def test_a_plain_operand_of_the_variants_block_and_dtype_is_taken():
    assert _takes((Tensor((1024, 4096)), BLOCK))
    assert _takes((Tensor((256, 4096), strides=(8192, 1)), BLOCK))  # rows of a wider tensor


@pytest.mark.parametrize("operand,why", [
    ((Tensor((1024, 4096)), [64, 64]), "another block: another variant"),
    ((Tensor((1024, 4096), dtype=FP32), BLOCK), "another dtype"),
    ((Tensor((1024, 4096), address=0x7F0000000008), BLOCK), "a base TMA cannot take (16-byte alignment)"),
    ((Tensor((1024, 4100), strides=(4100, 1)), BLOCK), "rows not 16-byte aligned"),
    ((Tensor((1024, 4096), strides=(1, 1024)), BLOCK), "a last dimension that is not contiguous"),
    ((Tensor((0, 4096)), BLOCK), "an empty tensor"),
    ((Tensor((4096, ), strides=(1, )), BLOCK), "another rank"),
    (("not a tensor", BLOCK), "no data_ptr"),
])
def test_an_operand_that_from_tensor_would_refuse_is_refused(operand, why):
    assert not _takes(operand), why


# A LaunchPlan's descriptor slot, bound (KernelLauncher.bind): the call passes the tensor alone and
# the launcher knows its block; the same checks apply.

def _bound(block=BLOCK):
    return _launcher().bind(0, 1, 1, [None, 7], [(0, 0, block)], 1)


def test_a_bound_descriptor_slot_takes_the_tensor_itself():
    assert _bound().launch(0, Tensor((1024, 4096)))
    assert _bound().launch(0, Tensor((256, 4096), strides=(8192, 1)))


@pytest.mark.parametrize("operand,why", [
    (Tensor((1024, 4096), dtype=FP32), "another dtype"),
    (Tensor((1024, 4096), address=0x7F0000000008), "a base TMA cannot take (16-byte alignment)"),
    (Tensor((1024, 4100), strides=(4100, 1)), "rows not 16-byte aligned"),
    (Tensor((0, 4096)), "an empty tensor"),
    ((Tensor((1024, 4096)), BLOCK), "a (tensor, block) pair: the bound slot takes the tensor"),
])
def test_a_bound_descriptor_slot_refuses_what_from_tensor_would(operand, why):
    assert not _bound().launch(0, operand), why


def test_a_slot_of_another_block_or_none_for_a_descriptor_is_not_bound():
    assert _bound([64, 64]) is None  # another block: another variant
    assert _bound(None) is None  # a pointer slot where the variant takes a descriptor


# A call's argument block is reused between calls; classifying runs Python (data_ptr()), which may
# hand the GIL to another thread launching the same variant: each call must keep its own arguments.

class SlowTensor(Tensor):
    """A tensor whose data_ptr() sleeps (releasing the GIL) the first time."""

    def __init__(self, *args, sleep=0.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.sleep = sleep

    def data_ptr(self):
        if self.sleep:
            time.sleep(self.sleep)
        return super().data_ptr()


def _pointer_launcher():
    """A variant taking two 16-byte aligned bf16 pointers and an int."""
    return _core().KernelLauncher("pointers", 0, 1, ["*bf16", "*bf16", "i32"], [True, True, False], [0, 0, 0],
                                  [False] * 3, [BF16, BF16, None], 128, 0, 1, False, False)


def _in_threads(first, second):
    """``first()`` and, while its data_ptr() sleeps, ``second()``, in two threads: their results."""
    results = {}
    threads = [threading.Thread(target=lambda: results.update(first=first())),
               threading.Thread(target=lambda: time.sleep(0.05) or results.update(second=second()))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results["first"], results["second"]


def test_a_call_interleaved_with_another_threads_keeps_its_own_arguments():
    launcher = _pointer_launcher()
    aligned = lambda: launcher.launch(0, 1, 1, 0, Tensor((8, 8)), SlowTensor((8, 8), sleep=0.2), 5)
    misaligned = lambda: launcher.launch(0, 1, 1, 0, Tensor((8, 8), address=0x7F0000000008), Tensor((8, 8)), 5)
    assert _in_threads(aligned, misaligned) == (True, False)
    bound = launcher.bind(0, 1, 1, [None, None, 5], [(0, 0, None), (1, 1, None)], 2)
    slow = lambda: bound.launch(0, Tensor((8, 8)), SlowTensor((8, 8), sleep=0.2))
    fast_misaligned = lambda: bound.launch(0, Tensor((8, 8), address=0x7F0000000008), Tensor((8, 8)))
    assert _in_threads(slow, fast_misaligned) == (True, False)
