"""Stand-ins for the plan tests of the overlapped GEMM contexts (test_*_plan.py): a context made
without a GPU (its constructor skipped), its buffers named objects, so that a test can check which
buffer a launch plan passes where."""

import types


class Buffer:
    """A named stand-in for a context's buffer: slicing and ``view`` give views that keep the name."""

    def __init__(self, name: str, shape=None):
        self.name, self.shape = name, shape

    def __getitem__(self, item):
        return Buffer(self.name)

    def view(self, *shape):
        return Buffer(self.name, shape)


def bare_context(cls, buffers: tuple, **attributes):
    """An instance of ``cls`` with ``attributes`` set, a :class:`Buffer` for each name in
    ``buffers`` and a signal pad whose ``signals`` is one, as ``__init__`` would leave them."""
    ctx = cls.__new__(cls)
    for name, value in attributes.items():
        setattr(ctx, name, value)
    for name in buffers:
        setattr(ctx, name, Buffer(name))
    ctx.pad = types.SimpleNamespace(signals=Buffer("signals"))
    return ctx
