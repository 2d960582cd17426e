"""The contexts' side streams: where the work that a spinning grid waits for runs (copy-engine
producers, signal kernels, acknowledgements).

They run at the device's highest stream priority. A consumer that spins (a persistent GEMM waiting
for rows, a reduction waiting for chunks) and the small kernels it waits for often become ready at
the same moment, after the same copy; the block scheduler then starts the high-priority kernel's
blocks first, so those kernels never queue behind the consumer's grid for the SMs it leaves free
(on one H200 under MPS, a rank's phase-0 signal kernel of ``ag_gemm`` once never started while its
GEMM spun, and the call hung). Priority does not preempt blocks already running: the residency
rule (:mod:`triton_dist.residency`) still leaves the SMs.
"""


HIGHEST_PRIORITY = -(1 << 20)
"""Lower numbers run first; torch maps a priority past the device's range to the nearest one it
has, so this is the highest on every device."""


def side_stream(device):
    """A new stream on ``device`` at the highest priority the device offers."""
    import torch

    return torch.cuda.Stream(device=device, priority=HIGHEST_PRIORITY)


def wait_for(waiter, producer, event) -> None:
    """``waiter.wait_stream(producer)`` through ``event``, one event a context keeps and records
    again for every such wait. torch's ``wait_stream`` makes a new event per call (created,
    recorded, destroyed: a Python object and two more driver calls, in every eager call of the ops
    with side streams). Reusing one is safe: a wait binds to the record made just before it, and
    later records do not move it; under CUDA graph capture the pair becomes the same dependency."""
    event.record(producer)
    waiter.wait_event(event)
