"""The persistent GEMM's config chosen by the distributed autotuner (:mod:`triton_dist.autotune`)
instead of :func:`triton_dist.kernels.gemm.dense.pick_gemm_config`'s fixed rule.

    from triton_dist.kernels.gemm.autotune import tuned_gemm_config
    name = tuned_gemm_config(m, n, k, torch.bfloat16)      # collective on the first call per shape
    gemm(a, b, out=out, config=name)

The candidates (:func:`candidates`: name and parameters, so that editing a config invalidates
cached decisions) are the fixed rule's choice (:func:`~triton_dist.kernels.gemm.dense.pick_gemm_config`)
first, so a tie keeps it, then the split-K and skinny configs meant for the rows and every entry of
:data:`gemm.CONFIGS`.
Each is timed on random ``[m, k] @ [n, k]^T`` operands of ``dtype`` on the current device, with
fixed counts in CUDA-graph mode (GPU time, as bench/gemm.py measures it), MAX over ranks.

Collective: on a miss of the in-memory cache every rank must call it with the same shape and dtype
at the same time (as in tensor parallelism, where every rank's GEMM has the same shape). A rank
that runs a GEMM of its own shape must not use it (or must pass an autotuner with a
:class:`triton_dist.autotune.LocalCommunicator`).

:func:`gemm.gemm` takes ``config="auto"`` for this; ``None`` stays the fixed rule,
because ``gemm`` is also called by one rank alone (tests, set-up), where an implicit collective
would hang.
"""

from __future__ import annotations

from typing import Any

from . import dense as _gemm

OP = "gemm"


def _dtype_name(dtype: Any) -> str:
    name = str(dtype).removeprefix("torch.")
    if name not in _gemm.DTYPES:
        raise ValueError(f"triton_dist tuned_gemm_config: dtype must be one of {_gemm.DTYPES}, got {dtype!r}")
    return name


def candidates(m: int, n: int, k: int, sms: int) -> list[dict]:
    """The configs meant for ``m`` rows as ``{"name": ..., **params}``, :func:`gemm.pick_gemm_config`'s
    first (a tie keeps it): up to ``SPLIT_K_MAX_M`` rows each split-K config that holds them, up to
    ``gemm.SKINNY_MAX_M`` the skinny config of :func:`gemm.pick_skinny_config`, then every config
    of :data:`gemm.CONFIGS`."""
    from . import split_k

    names = [_gemm.pick_gemm_config(m, n, k, sms)]
    names += [name for name, bm in split_k.CONFIG_NAMES.items() if m <= bm]
    skinny = _gemm.pick_skinny_config(m, n, sms)
    names += ([skinny] if skinny else []) + list(_gemm.CONFIGS)
    # A split-K config's time also depends on pick_split_k's constants: part of the key, so that
    # changing the rule invalidates decisions cached under the old one.
    rule = dict(split_k_rule=(split_k.MAX_SLICES, split_k.MIN_SLICE_STEPS, split_k.TILE_OVERHEAD_STEPS,
                              tuple(sorted(split_k.STREAMING_SHARE.items())), split_k.SLICE_TIE))
    return [{"name": name, **_gemm.config_params(name), **(rule if name in split_k.CONFIG_NAMES else {})}
            for name in dict.fromkeys(names)]


def tuned_gemm_config(m: int, n: int, k: int, dtype: Any, *, autotuner=None) -> str:
    """The name (one of :func:`gemm.config_names`, a split-K config's included) of the fastest
    config for ``C[m, n] = A[m, k] @ B[n, k]^T`` in ``dtype`` (torch.bfloat16/float16 or their
    names) on the current device, the same on every rank. ``autotuner``: a
    :class:`triton_dist.autotune.DistributedAutotuner` (default: one shared by the GEMM, CUDA-graph
    timing, 5 warm-up calls and 20 samples)."""
    return tune_gemm(m, n, k, dtype, autotuner=autotuner).config["name"]


def tune_gemm(m: int, n: int, k: int, dtype: Any, *, autotuner=None):
    """:func:`tuned_gemm_config` with the timings: a :class:`triton_dist.autotune.TuneResult` whose
    ``config`` is ``{"name": ..., **gemm.config_params(name)}``."""
    for name, value in (("m", m), ("n", n), ("k", k)):
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"triton_dist tuned_gemm_config: {name} must be a positive int, got {value!r}")
    dtype_name = _dtype_name(dtype)
    from ... import autotune

    tuner = autotuner or _default_autotuner()
    sms = _gemm.num_sms()
    key = (m, n, k, dtype_name, sms)
    operands = {}

    def run(cfg: dict) -> None:
        if not operands:  # allocated at the first trial call, before any CUDA graph capture
            import torch

            torch_dtype = getattr(torch, dtype_name)
            g = torch.Generator(device="cuda")
            g.manual_seed(m * 1_000_003 + n * 1009 + k)
            operands["a"] = torch.randn((m, k), device="cuda", dtype=torch.float32, generator=g).to(torch_dtype)
            operands["b"] = torch.randn((n, k), device="cuda", dtype=torch.float32, generator=g).to(torch_dtype)
            operands["out"] = torch.empty((m, n), device="cuda", dtype=torch_dtype)
        _gemm.gemm(operands["a"], operands["b"], out=operands["out"], config=cfg["name"])

    try:
        return autotune.tune(OP, key, candidates(m, n, k, sms), run, autotuner=tuner)
    finally:
        operands.clear()


_shared = None


def _default_autotuner():
    global _shared
    if _shared is None:
        from ...autotune import DistributedAutotuner

        _shared = DistributedAutotuner(warmup=5, iters=20, graph=True)
    return _shared
