"""Named regions of a signal pad, laid out one after the other: a context declares its regions and
their sizes once, and every offset (a kernel's region base, passed as an argument; a host view) and
the pad's size are computed from that, not written by hand."""

from __future__ import annotations


class SignalLayout:
    """``SignalLayout(("ready", world), ("ack", world), ...)``: region ``name`` starts at
    ``layout[name]`` and holds the given number of signals; ``layout.size`` is their total."""

    def __init__(self, *regions: tuple[str, int]):
        self._offsets: dict[str, int] = {}
        self.size = 0
        for name, count in regions:
            if name in self._offsets or count < 0:
                raise ValueError(f"triton_dist SignalLayout: region {name!r} repeated or of negative size {count}")
            self._offsets[name] = self.size
            self.size += count

    def __getitem__(self, name: str) -> int:
        return self._offsets[name]

    def regions(self) -> list[tuple[str, int, int]]:
        """``(name, first signal, count)`` of every region, in order (what
        :class:`~triton_dist.signals.SignalPad` takes to name them in timeout reports)."""
        ends = list(self._offsets.values())[1:] + [self.size]
        return [(name, first, end - first) for (name, first), end in zip(self._offsets.items(), ends)]

    def __repr__(self) -> str:
        return f"SignalLayout({self._offsets}, size={self.size})"
