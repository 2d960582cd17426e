"""The TCP bootstrap from Python: several processes on loopback, and a rank that never comes."""

import time

import pytest

from triton_dist import _C
from triton_dist.selfcheck import check_bootstrap


def test_four_processes_exchange_bytes():
    assert "4 processes" in check_bootstrap(world=4)


def test_missing_rank_times_out_naming_it():
    root = _C.TcpBootstrap.create_root(3, "127.0.0.1", 0, timeout_ms=400)
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=r"rank"):
        root.allgather(b"x")
    assert time.monotonic() - start < 5


def test_bad_unique_id():
    with pytest.raises(RuntimeError):
        _C.TcpBootstrap.connect(1, 2, "not-an-address", timeout_ms=100)
