import os

import pytest

from triton_dist import config


@pytest.mark.parametrize("text,expected", [("8G", 8 << 30), ("512M", 512 << 20), ("4096", 4096), ("2GiB", 2 << 30),
                                           ("1k", 1024), (123, 123)])
def test_parse_size(text, expected):
    assert config.parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "abc", "0", "-1G", "1.5G", 0])
def test_parse_size_rejects(text):
    with pytest.raises(ValueError):
        config.parse_size(text)


def test_environment_overrides(monkeypatch):
    monkeypatch.setenv("TRITON_DIST_SYMMETRIC_HEAP_SIZE", "3G")
    monkeypatch.setenv("TRITON_DIST_LOCAL_WORLD_SIZE", "1")
    monkeypatch.setenv("TRITON_DIST_BOOTSTRAP_TIMEOUT_S", "12.5")
    monkeypatch.setenv("TRITON_DIST_WAIT_TIMEOUT_NS", "5000")
    monkeypatch.setenv("TRITON_DIST_DEBUG_BARRIERS", "1")
    monkeypatch.setenv("TRITON_DIST_AUTOTUNE_CACHE_DIR", "/tmp/tuned")
    monkeypatch.setenv("TRITON_DIST_EAGER_REPLAY", "0")
    cfg = config.Config.from_environment()
    assert not cfg.eager_replay and config.Config().eager_replay
    assert cfg.wait_timeout_ns == 5000 and cfg.debug_barriers
    assert cfg.symmetric_heap_size == 3 << 30
    assert cfg.local_world_size == 1
    assert cfg.bootstrap_timeout_s == 12.5
    assert cfg.autotune_cache_dir == "/tmp/tuned"
    assert config.get() == cfg  # nothing initialised: get() reads the environment


def test_defaults(monkeypatch):
    # Every setting's variable (a GPU run may export some, e.g. TRITON_DIST_RECORD_VARIANTS).
    for name in [n for n in os.environ if n.startswith("TRITON_DIST_")] + ["CUDA_LAUNCH_BLOCKING"]:
        monkeypatch.delenv(name, raising=False)
    assert config.Config.from_environment() == config.Config()
    assert config.Config().autotune_cache_dir == "~/.cache/triton_dist/autotune"


@pytest.mark.parametrize("name,value,expected", [("CUDA_LAUNCH_BLOCKING", "1", True), ("CUDA_LAUNCH_BLOCKING", "0", False),
                                                 ("TRITON_DIST_SERIALISED_LAUNCHES", "1", True),
                                                 ("TRITON_DIST_SERIALISED_LAUNCHES", "0", False)])
def test_serialised_launches_follow_cuda_launch_blocking(monkeypatch, name, value, expected):
    monkeypatch.delenv("CUDA_LAUNCH_BLOCKING", raising=False)
    monkeypatch.delenv("TRITON_DIST_SERIALISED_LAUNCHES", raising=False)
    monkeypatch.setenv(name, value)
    assert config.Config.from_environment().serialised_launches is expected


def test_empty_autotune_cache_dir_means_the_default(monkeypatch):
    monkeypatch.setenv("TRITON_DIST_AUTOTUNE_CACHE_DIR", "")
    assert config.Config.from_environment().autotune_cache_dir == config.Config.autotune_cache_dir


@pytest.mark.parametrize("name,value", [("TRITON_DIST_LOCAL_WORLD_SIZE", "two"), ("TRITON_DIST_BOOTSTRAP_TIMEOUT_S", "soon"),
                                        ("TRITON_DIST_SYMMETRIC_HEAP_SIZE", "lots"),
                                        ("TRITON_DIST_WAIT_TIMEOUT_NS", "-1"), ("TRITON_DIST_WAIT_TIMEOUT_NS", "1s")])
def test_bad_environment_values_name_the_variable(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=name if "HEAP" not in name else "lots"):
        config.Config.from_environment()
