"""Several ranks per GPU: which GPU a rank uses, when sharing is allowed (MPS on, SM share capped),
and the errors otherwise (triton_dist.placement; init() calls these with what it reads)."""

import pytest

from triton_dist import config, placement


@pytest.mark.parametrize("local_rank,k,expected", [(0, 1, 0), (1, 1, 1), (7, 1, 7), (0, 4, 0), (3, 4, 0), (4, 4, 1),
                                                   (7, 8, 0), (5, 2, 2)])
def test_device_follows_the_local_rank(local_rank, k, expected):
    assert placement.device_of(local_rank, k, 8, rank=local_rank) == expected


def test_more_ranks_than_gpus_says_how_to_share():
    with pytest.raises(RuntimeError, match=r"local rank 2 would use GPU 2.*1 GPU\(s\).*TRITON_DIST_RANKS_PER_GPU"):
        placement.device_of(2, 1, 1, rank=2)
    with pytest.raises(RuntimeError, match="at most 8 ranks per node"):
        placement.device_of(8, 8, 1, rank=8)


def test_host_backend_has_no_nccl_when_ranks_share_gpus():
    assert placement.host_backend(1) == "cpu:gloo,cuda:nccl"
    assert placement.host_backend(2) == placement.host_backend(8) == "gloo"


def test_one_rank_per_gpu_needs_nothing():
    placement.check_gpu_sharing(1, "off", None, rank=0)


def test_sharing_without_mps_is_refused_with_the_reason():
    with pytest.raises(RuntimeError, match=r"\[rank 3\].*needs CUDA MPS.*deadlock.*nvidia-cuda-mps-control -d"):
        placement.check_gpu_sharing(4, "off", "25", rank=3)


@pytest.mark.parametrize("state", ["on", "unknown"])
@pytest.mark.parametrize("k,percent", [(2, "50"), (4, "25"), (8, "12"), (8, "12.5"), (3, "33")])
def test_sharing_under_mps_within_the_share(state, k, percent):
    placement.check_gpu_sharing(k, state, percent, rank=0)


@pytest.mark.parametrize("percent,match", [(None, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE <= 25"),
                                           ("", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE <= 25"),
                                           ("50", "ask for 200 % of one GPU"), ("100", "at most 25"),
                                           ("abc", "not a number"), ("0", "at most 25")])
def test_sm_share_must_leave_room_for_every_rank(percent, match):
    with pytest.raises(RuntimeError, match=match):
        placement.check_gpu_sharing(4, "on", percent, rank=1)


@pytest.mark.parametrize("percent", [None, "", "100"])
def test_a_static_sm_partition_needs_no_share(percent):
    placement.check_gpu_sharing(8, "on", percent, rank=0, sm_partition="GPU-a/0x1")


def test_a_partition_does_not_stand_in_for_mps():
    with pytest.raises(RuntimeError, match="needs CUDA MPS"):
        placement.check_gpu_sharing(2, "off", None, rank=0, sm_partition="GPU-a/0x1")
    with pytest.raises(RuntimeError, match="CUDA_MPS_SM_PARTITION"):
        placement.check_gpu_sharing(2, "on", None, rank=0, sm_partition=" ")


def test_placement_allows_up_to_k_ranks_per_gpu():
    gpus = [("h", "GPU-a")] * 4 + [("h", "GPU-b")] * 4
    placement.check_placement(gpus, 4, rank=0)
    placement.check_placement([("h", "GPU-a"), ("h", "GPU-b")], 1)
    placement.check_placement([("h1", "GPU-a"), ("h2", "GPU-a")], 1)  # same UUID string on two hosts: two GPUs


def test_two_ranks_on_one_gpu_by_accident_names_them():
    with pytest.raises(RuntimeError, match=r"ranks \[0, 2\] all use GPU GPU-a on h.*TRITON_DIST_RANKS_PER_GPU=1"):
        placement.check_placement([("h", "GPU-a"), ("h", "GPU-b"), ("h", "GPU-a")], 1, rank=2)
    with pytest.raises(RuntimeError, match="at most 2 ranks on each GPU"):
        placement.check_placement([("h", "GPU-a")] * 3, 2)


def test_a_given_nccl_group_is_refused_when_ranks_share_gpus():
    placement.check_host_group("cpu:gloo,cuda:nccl", 1)
    placement.check_host_group("gloo", 4)
    with pytest.raises(RuntimeError, match="NCCL refuses two ranks on one GPU"):
        placement.check_host_group("cpu:gloo,cuda:nccl", 2, rank=0)
    with pytest.raises(RuntimeError, match="backend='gloo'"):
        placement.check_host_group("nccl", 8)


@pytest.mark.parametrize("value", [0, -1, 1.5, True, "2"])
def test_ranks_per_gpu_must_be_a_positive_int(value):
    with pytest.raises(ValueError, match="ranks_per_gpu must be an int >= 1"):
        placement.check_ranks_per_gpu(value)


def test_ranks_per_gpu_from_the_environment(monkeypatch):
    monkeypatch.setenv("TRITON_DIST_RANKS_PER_GPU", "4")
    assert config.Config.from_environment().ranks_per_gpu == 4
    monkeypatch.setenv("TRITON_DIST_RANKS_PER_GPU", "0")
    with pytest.raises(ValueError, match="TRITON_DIST_RANKS_PER_GPU=0 must be >= 1"):
        config.Config.from_environment()
    monkeypatch.delenv("TRITON_DIST_RANKS_PER_GPU")
    assert config.Config.from_environment().ranks_per_gpu == 1


def test_benchmarks_refuse_to_time_with_shared_gpus(monkeypatch):
    from triton_dist.bench import script

    monkeypatch.setenv("TRITON_DIST_RANKS_PER_GPU", "2")
    with pytest.raises(SystemExit, match="benchmarks refuse to run with ranks sharing GPUs"):
        script.guard(script.argument_parser("x", "/tmp").parse_args([]))



def test_a_failed_init_destroys_the_group_it_created(monkeypatch):
    """With a stand-in for torch (the CPU suite has none): init() creates the default group from the
    torchrun environment, a later step fails, and the group is gone again."""
    import sys
    import types

    from triton_dist import runtime

    groups = []
    dist = types.ModuleType("torch.distributed")
    dist.is_initialized = lambda: bool(groups)
    dist.init_process_group = lambda backend, timeout: groups.append(backend)
    dist.destroy_process_group = lambda: groups.clear()
    dist.group = types.SimpleNamespace(WORLD="world")
    torch = types.ModuleType("torch")
    torch.distributed = dist
    torch.cuda = types.SimpleNamespace(is_available=lambda: True, device_count=lambda: 1, set_device=lambda d: None)
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "torch.distributed", dist)
    for name, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "TRITON_DIST_RANKS_PER_GPU": "2"}.items():
        monkeypatch.setenv(name, value)

    def refuse(group, cfg, device):
        assert groups == [placement.SHARED_GPU_BACKEND] and group == "world" and device == 0
        raise RuntimeError("triton_dist [rank 0] init: refused for the test")

    monkeypatch.setattr(runtime, "_join", refuse)
    with pytest.raises(RuntimeError, match="refused for the test"):
        runtime.init()
    assert not groups, "init() left behind the process group it created"
    assert not runtime.is_initialized()
