"""streams.wait_for: a waiter waits for a producer through the context's one event, recorded on the
producer just before the wait (so each wait binds to its own record), and the library joins
streams only this way (torch's wait_stream makes and destroys an event per call)."""

import pathlib
import re

from triton_dist.kernels.common.streams import wait_for

_LIBRARY = pathlib.Path(__file__).resolve().parents[2] / "python" / "triton_dist"


class Log:
    def __init__(self):
        self.calls = []


class Stream:
    def __init__(self, name: str, log: Log):
        self.name, self.log = name, log

    def wait_event(self, event):
        self.log.calls.append(("wait", self.name, event.name))


class Event:
    def __init__(self, name: str, log: Log):
        self.name, self.log = name, log

    def record(self, stream):
        self.log.calls.append(("record", self.name, stream.name))


def test_each_wait_follows_its_own_record():
    log = Log()
    main, side, send = Stream("main", log), Stream("side", log), Stream("send", log)
    joined = Event("joined", log)
    wait_for(side, main, joined)
    wait_for(main, side, joined)
    wait_for(main, send, joined)
    assert log.calls == [("record", "joined", "main"), ("wait", "side", "joined"),
                         ("record", "joined", "side"), ("wait", "main", "joined"),
                         ("record", "joined", "send"), ("wait", "main", "joined")]


def test_the_library_joins_streams_through_wait_for():
    found = [f"{p.relative_to(_LIBRARY)}:{i}" for p in _LIBRARY.rglob("*.py")
             for i, line in enumerate(p.read_text().splitlines(), 1)
             if re.search(r"\.wait_stream\(", line) and not line.lstrip().startswith(("#", '"'))]
    assert not found, f"use kernels.common.streams.wait_for (one event per context) instead: {found}"
