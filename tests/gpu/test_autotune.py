"""The distributed autotuner on GPUs (under torchrun, through triton_dist's process group): the
GEMM tuned on every rank chooses one config everywhere and that config computes the right thing;
rank 0's disk cache decides for a fresh autotuner; a config failing on one rank is skipped on all;
ranks asking for different keys fail everywhere; a collective op is tuned without hanging."""

import pytest
import torch
import torch.distributed as dist

from conftest import all_ranks_agree, raises_everywhere, rank_generator
from triton_dist import autotune, ops
from triton_dist.kernels.gemm import dense as gemm_mod
from triton_dist.kernels.gemm.autotune import tune_gemm, tuned_gemm_config

_REL_TOL = 1e-2


def _same_everywhere(value, what):
    values = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    all_ranks_agree(all(v == values[0] for v in values), f"{what}: ranks differ: {values}")
    return values[0]


def _tuner(cache_dir, **kw):
    return autotune.DistributedAutotuner(warmup=2, iters=5, graph=True, cache_dir=cache_dir, **kw)


@pytest.mark.parametrize("m,n,k", [(2048, 4096, 1024), (256, 512, 768)])
def test_tuned_gemm_agrees_and_is_correct(tmp_path, m, n, k):
    result = tune_gemm(m, n, k, torch.bfloat16, autotuner=_tuner(tmp_path))
    name = _same_everywhere(result.config["name"], "chosen config")
    _same_everywhere(result.times_us, "times (MAX over ranks)")
    timed = [t for t in result.times_us if t is not None]
    all_ranks_agree(name in gemm_mod.CONFIGS and result.source == "tuned" and timed and min(timed) > 0,
                    f"tune_gemm {m}x{n}x{k}: {result}")

    g = rank_generator(5, dist.get_rank())
    a = torch.randn((m, k), device="cuda", generator=g).to(torch.bfloat16)
    b = torch.randn((n, k), device="cuda", generator=g).to(torch.bfloat16)
    out = gemm_mod.gemm(a, b, config=name)
    torch.cuda.synchronize()
    ref = a.float() @ b.float().T
    err = float((out.float() - ref).abs().max() / ref.abs().max())
    all_ranks_agree(err < _REL_TOL, f"gemm with tuned config {name}: rel error {err}")

    # A fresh autotuner (a new process) takes rank 0's disk decision, whatever the other ranks hold.
    fresh = _tuner(tmp_path)
    again = tune_gemm(m, n, k, torch.bfloat16, autotuner=fresh)
    all_ranks_agree(again.config["name"] == name and again.source == "disk" and again.cache_file == result.cache_file,
                    f"second tuning: {again.source} {again.config['name']} (first chose {name})")
    # The memory cache answers without communicating (no rank can hang here).
    all_ranks_agree(tuned_gemm_config(m, n, k, "bfloat16", autotuner=fresh) == name, "memory cache")


def test_gemm_config_auto_uses_the_tuned_config(monkeypatch, tmp_path):
    """``gemm(config="auto")``: every rank runs the autotuner's choice, and the result is right."""
    from triton_dist.kernels.gemm import autotune as gemm_autotune

    tuner = _tuner(tmp_path)
    monkeypatch.setattr(gemm_autotune, "_shared", tuner)
    m, n, k = 512, 1024, 256
    g = rank_generator(6, dist.get_rank())
    a = torch.randn((m, k), device="cuda", generator=g).to(torch.bfloat16)
    b = torch.randn((n, k), device="cuda", generator=g).to(torch.bfloat16)
    out = gemm_mod.gemm(a, b, config="auto")
    torch.cuda.synchronize()
    ref = a.float() @ b.float().T
    err = float((out.float() - ref).abs().max() / ref.abs().max())
    chosen = _same_everywhere(tuned_gemm_config(m, n, k, torch.bfloat16, autotuner=tuner), "config='auto' choice")
    all_ranks_agree(err < _REL_TOL and chosen in gemm_mod.CONFIGS,
                    f"gemm(config='auto') chose {chosen}: rel error {err}")
    raises_everywhere(lambda: gemm_mod.gemm(a, b, config="fastest"), ValueError, "auto")


def test_a_config_failing_on_one_rank_is_skipped_everywhere(tmp_path):
    m, n, k = 1024, 2048, 512
    last = dist.get_world_size() - 1
    a = torch.randn((m, k), device="cuda").to(torch.bfloat16)
    b = torch.randn((n, k), device="cuda").to(torch.bfloat16)
    out = torch.empty((m, n), device="cuda", dtype=torch.bfloat16)

    def run(name):
        if name == "large" and dist.get_rank() == last:
            raise RuntimeError("out of resource: shared memory (simulated)")
        gemm_mod.gemm(a, b, out=out, config=name)

    result = autotune.tune("gemm_skip_test", (m, n, k), ["large", "small"], run, autotuner=_tuner(tmp_path))
    all_ranks_agree(result.config == "small" and list(result.skipped) == [0] and result.times_us[0] is None
                    and f"rank {last}: RuntimeError: out of resource" in result.skipped[0][0],
                    f"skip: {result}")


def test_ranks_asking_for_different_keys_fail_everywhere(tmp_path):
    if dist.get_world_size() == 1:
        pytest.skip("needs two ranks")
    tuner = _tuner(tmp_path)
    raises_everywhere(lambda: tuner.tune("mismatch_test", (dist.get_rank(), ), ["x"], lambda c: None),
                      autotune.AutotuneMismatchError, "ranks disagree")


def test_a_collective_op_is_tuned_in_lock_step(tmp_path):
    x = torch.zeros(1 << 24, device="cuda", dtype=torch.float32)

    def run(elements):  # collective: a rank that ran ahead would wait for the others' signals
        ops.all_reduce(x[:elements])

    result = autotune.tune("all_reduce_test", ("fp32", ), [1 << 24, 1 << 10], run,
                           autotuner=autotune.DistributedAutotuner(warmup=2, iters=5, cache_dir=tmp_path))
    chosen = _same_everywhere(result.config, "all_reduce choice")
    # 64 MiB against 4 KiB: the small one wins (at one rank nothing may move at all).
    all_ranks_agree(chosen == 1 << 10 or dist.get_world_size() == 1, f"all_reduce choice {chosen}: {result.times_us}")
