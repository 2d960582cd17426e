"""Torch-facing collective ops: thin wrappers that validate, pick a method and a context, and
launch the kernels of :mod:`triton_dist.kernels`. torch is imported inside the functions.

    import triton_dist as tdist
    from triton_dist import ops
    tdist.init()
    y = ops.all_reduce(x)                    # a new tensor: the sum of x over all ranks
    ops.all_reduce(x, out=x)                 # in place
    g = ops.all_gather(x)                    # (world * x.shape[0], ...) : every rank's x, in rank order
    s = ops.reduce_scatter(x)                # (x.shape[0] // world, ...): this rank's shard of the sum
    c = ops.ag_gemm(a_shard, w)              # allgather(a_shard) @ w.T, the gather overlapped
    y = ops.gemm_rs(a, w)                    # this rank's rows of sum over ranks of a @ w.T
    y = ops.gemm_ar(a, w)                    # sum over ranks of a @ w.T, on every rank (small M)
    d = ops.ep_dispatch(x, idx, w, context=ep)  # MoE: tokens to their experts' ranks (EPContext)
    y = ops.group_gemm(d.x, w_experts, counts=d.counts)  # each local expert's rows @ its weights
    h = ops.ag_group_gemm(x, idx, w1, context=agg)         # MoE TP: gathered tokens @ expert shards
    y = ops.group_gemm_rs(act(h.out), w2, h, topk_w, context=grs)  # weighted, combined, reduce-scattered
    out = ops.ep_combine(y, d.handle)        # and back, weighted and summed

Every op but ``group_gemm`` (one GPU's experts) is collective: every rank makes the same calls, in
the same order, with the same shapes, dtypes and methods. Contexts (symmetric buffers, signals,
loaded kernels) are cached per (op, dtype, size) and created on first use, which is itself
collective (symmetric allocation, kernel load, barrier). Calls run on the current stream and may
be captured in a CUDA graph once their context exists (make one uncaptured call first, or pass
``context=``). Under ``torch.compile`` the dense ops (all_reduce, all_gather, reduce_scatter,
ag_gemm, gemm_rs, gemm_ar) become their ``torch.ops.triton_dist.*`` custom ops
(:mod:`triton_dist.torch_library`), without ``out=`` or ``context=``.
"""

from __future__ import annotations

from . import call_agreement as _call_agreement
from . import eager_calls as _eager_calls
from . import torch_library as _torch_library
from .renamed import method_or_old_name
from .runtime import _require_initialized

MIN_CONTEXT_BYTES = 1 << 20
"""Contexts created on first use hold at least this many bytes (then powers of two)."""

_CONTEXTS: dict = {}
"""(op, dtype, max_bytes) -> context, created on first use."""

_FITTING: dict = {}
"""(op, dtype, nbytes) -> the context :func:`_cached_context` chose: a call's lookup is one dict
access instead of a scan (eager calls count every µs); emptied whenever _CONTEXTS changes."""


def _context_class(op: str):
    from .kernels import AllGatherContext, AllReduceContext, ReduceScatterContext

    return {"all_reduce": AllReduceContext, "all_gather": AllGatherContext, "reduce_scatter": ReduceScatterContext}[op]


def _cached_context(op: str, dtype, nbytes: int):
    """The smallest cached context of ``op`` and ``dtype`` that fits ``nbytes`` input bytes, else a
    new one (collective)."""
    chosen = _FITTING.get((op, dtype, nbytes))
    if chosen is not None:
        return chosen
    fitting = [ctx for (o, dt, size), ctx in _CONTEXTS.items() if o == op and dt == dtype and size >= nbytes]
    if fitting:
        if len(_FITTING) > 4096:  # a caller of ever new sizes: keep the memo bounded
            _FITTING.clear()
        chosen = _FITTING[(op, dtype, nbytes)] = min(fitting, key=lambda c: c.max_bytes)
        return chosen
    from .kernels.common.context import MAX_NUMEL

    size = MIN_CONTEXT_BYTES
    while size < nbytes:
        size *= 2
    if size // dtype.itemsize >= MAX_NUMEL:  # rounded past the largest context: take the size asked
        size = nbytes
    ctx = _context_class(op)(size, dtype)
    _CONTEXTS[(op, dtype, size)] = ctx
    _FITTING.clear()
    return ctx


def clear_contexts() -> None:
    """Forget the cached contexts (their symmetric memory is freed once nothing else holds it).
    Collective in effect: call it on every rank (:func:`triton_dist.finalize` does)."""
    _CONTEXTS.clear()
    _FITTING.clear()
    _eager_calls.clear()


def _check_input(op: str, x) -> None:
    import torch

    if not isinstance(x, torch.Tensor):
        raise TypeError(f"triton_dist {op}: x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise TypeError(f"triton_dist {op}: dtype {x.dtype} is not supported; use torch.float32, torch.bfloat16 "
                        f"or torch.float16 (cast x first)")
    if not x.is_cuda:
        raise ValueError(f"triton_dist {op}: x is on {x.device}; move it to the current CUDA device (x.cuda())")
    current = torch.cuda.current_device()
    if x.device.index != current:
        raise ValueError(f"triton_dist {op}: x is on {x.device} but the current device is cuda:{current}; call "
                         f"torch.cuda.set_device() or move x")
    if not x.is_contiguous():
        raise ValueError(f"triton_dist {op}: x must be contiguous; pass x.contiguous()")


def _output(op: str, x, out, shape):
    """``out`` checked against the shape the op produces, or a new tensor of it."""
    import torch

    if out is None:
        return torch.empty(shape, dtype=x.dtype, device=x.device)
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"triton_dist {op}: out must be a torch.Tensor, got {type(out).__name__}")
    if out.dtype != x.dtype or tuple(out.shape) != tuple(shape) or out.device != x.device:
        raise ValueError(f"triton_dist {op}: out must have shape {tuple(shape)}, {x.dtype} on {x.device}; got shape "
                         f"{tuple(out.shape)}, {out.dtype} on {out.device}")
    if not out.is_contiguous():
        raise ValueError(f"triton_dist {op}: out must be contiguous")
    return out


def _check_method(op: str, method: str, methods: tuple[str, ...]) -> None:
    if method not in methods:
        raise ValueError(f"triton_dist {op}: method must be one of {methods}, got {method!r}")


def _resolve_context(op: str, x, context):
    nbytes = x.numel() * x.element_size()
    if context is None:
        return _cached_context(op, x.dtype, nbytes)
    cls = _context_class(op)
    if not isinstance(context, cls):
        raise TypeError(f"triton_dist {op}: context must be a {cls.__name__}, got {type(context).__name__}")
    if context.dtype != x.dtype:
        raise TypeError(f"triton_dist {op}: x is {x.dtype} but the context is for {context.dtype}; create a "
                        f"{cls.__name__} for {x.dtype}")
    if x.numel() > context.max_numel:
        raise ValueError(f"triton_dist {op}: x has {x.numel()} elements ({nbytes} bytes), more than the context's "
                         f"{context.max_numel} ({context.max_bytes} bytes); create a {cls.__name__}(max_bytes>="
                         f"{nbytes}, ...) or pass context=None")
    return context


def all_reduce(x, *, out=None, method: str = "auto", context=None):
    """Sum ``x`` over all ranks; returns ``out`` (a new tensor like ``x`` when ``out`` is None;
    ``out=x`` reduces in place). Runs on the current stream.

    ``x``: a contiguous CUDA tensor on the current device, float32, bfloat16 or float16, of the
    same shape on every rank (bf16/fp16 are summed in fp32, rounded once). ``method``:
    ``"ll"`` (low-latency protocol: every rank pushes its data, flags inside the words, to every
    rank; at most :attr:`AllReduceContext.LL_MAX_BYTES <triton_dist.kernels.AllReduceContext>`),
    ``"one_shot"`` (every rank reads every rank's data), ``"two_shot"`` (reduce-scatter then
    all-gather; moves ``2 (w-1)/w`` of the bytes per rank), ``"ce_two_shot"`` (two-shot with both
    transfers on copy engines, in chunks that overlap the SMs' sums; for large tensors),
    ``"ring"`` (reduce-scatter then all-gather around the ring ``r -> r + 1``, fp32 partials; for
    machines whose GPUs are not all linked to each other; its first call allocates an fp32 inbox,
    so make it outside CUDA graph capture) or ``"auto"`` (:func:`triton_dist.kernels.collectives.policy.all_reduce_method`: ``"ll"``
    for small inputs, one-shot, then two-shot, ``"ce_two_shot"`` for the largest on two ranks).
    Every rank gets bit-identical results (``"ll"`` and ``"one_shot"`` the same bits).
    ``context``: an :class:`~triton_dist.kernels.AllReduceContext` of ``x``'s dtype to use instead
    of a cached one.
    """
    if _torch_library.compiling():
        _torch_library.eager_only("all_reduce", out=out, context=context)
        return _torch_library.call("all_reduce", x, method)
    replayed = _eager_calls.replay("all_reduce", x, out, method, context)
    if replayed is not None:
        return replayed
    _require_initialized("all_reduce")
    _call_agreement.check("all_reduce", x=x, method=method)
    _check_input("all_reduce", x)
    from .kernels import AllReduceContext

    _check_method("all_reduce", method, AllReduceContext.METHODS)
    out_given, asked = out is not None, method
    out = _output("all_reduce", x, out, x.shape)
    given_context, context = context, _resolve_context("all_reduce", x, context)
    if x.numel() == 0:
        return out
    if method == "auto":
        method = context.method_for(x.numel() * x.element_size())
    launched = context.run(x.view(-1), out.view(-1), method)
    _eager_calls.record("all_reduce", x, out, out_given, asked, launched, given_context)
    return out


def all_gather(x, *, out=None, method: str = "auto", context=None):
    """Concatenate every rank's ``x`` along dim 0, in rank order; returns ``out`` (shape
    ``(world * x.shape[0], *x.shape[1:])``; a new tensor when None). Runs on the current stream.

    ``method``: see :class:`~triton_dist.kernels.AllGatherContext` (``"auto"`` picks by size and,
    for large inputs, by ``out`` being symmetric). With ``out`` from :func:`triton_dist.symm_empty`
    (collective: every rank passes a symmetric ``out`` at the same offset of the same allocation)
    the ``"ce_zero_copy"``/``"sm_zero_copy"`` methods write peers' data straight into it.
    """
    if _torch_library.compiling():
        _torch_library.eager_only("all_gather", out=out, context=context)
        return _torch_library.call("all_gather", x, method)
    replayed = _eager_calls.replay("all_gather", x, out, method, context)
    if replayed is not None:
        return replayed
    _require_initialized("all_gather")
    _call_agreement.check("all_gather", x=x, method=method)
    _check_input("all_gather", x)
    from .kernels import AllGatherContext

    _check_method("all_gather", method, AllGatherContext.METHODS)
    if x.dim() == 0:
        raise ValueError("triton_dist all_gather: x must have at least one dimension")
    from .runtime import world_size

    out_given = out is not None
    out = _output("all_gather", x, out, (world_size() * x.shape[0], *x.shape[1:]))
    given_context, context = context, _resolve_context("all_gather", x, context)
    if x.numel() == 0:
        return out
    launched = context.run(x.view(-1), out.view(-1), method)
    _eager_calls.record("all_gather", x, out, out_given, method, launched, given_context)
    return out


def reduce_scatter(x, *, out=None, method: str = "auto", context=None):
    """Sum ``x`` over all ranks and keep this rank's shard: rows ``[rank * m, (rank + 1) * m)`` of
    the sum, ``m = x.shape[0] // world``; returns ``out`` (shape ``(m, *x.shape[1:])``; a new tensor
    when None). ``x.shape[0]`` must be divisible by the world size. bf16/fp16 sum in fp32.

    ``method``: see :class:`~triton_dist.kernels.ReduceScatterContext` (``"auto"`` picks by size).
    """
    if _torch_library.compiling():
        _torch_library.eager_only("reduce_scatter", out=out, context=context)
        return _torch_library.call("reduce_scatter", x, method)
    replayed = _eager_calls.replay("reduce_scatter", x, out, method, context)
    if replayed is not None:
        return replayed
    _require_initialized("reduce_scatter")
    _call_agreement.check("reduce_scatter", x=x, method=method)
    _check_input("reduce_scatter", x)
    from .kernels import ReduceScatterContext
    from .runtime import world_size

    _check_method("reduce_scatter", method, ReduceScatterContext.METHODS)
    world = world_size()
    if x.dim() == 0 or x.shape[0] % world:
        raise ValueError(f"triton_dist reduce_scatter: x.shape[0] must be divisible by the world size {world}, got "
                         f"shape {tuple(x.shape)}; pad the first dimension")
    out_given = out is not None
    out = _output("reduce_scatter", x, out, (x.shape[0] // world, *x.shape[1:]))
    given_context, context = context, _resolve_context("reduce_scatter", x, context)
    if x.numel() == 0:
        return out
    launched = context.run(x.view(-1), out.view(-1), method)
    _eager_calls.record("reduce_scatter", x, out, out_given, method, launched, given_context)
    return out


def _ag_gemm_context(a_shard, n: int, context, method: str):
    """A cached :class:`~triton_dist.kernels.AllGatherGemmContext` of ``method`` (``"auto"``:
    :func:`~triton_dist.kernels.gemm.policy.ag_gemm_method` for a GEMM of ``N = n``) that fits
    ``a_shard``, else a new one (collective; ``max_m_per_rank`` rounded up to a power of two, at
    least 128); ``context``, when given, checked instead. Under CUDA graph capture, where no
    context can be made, ``"auto"`` within one node takes a fitting context of another producer
    when there is none of its own (an eager call's, made before the capture; every producer may be
    captured)."""
    import torch

    from .kernels import AllGatherGemmContext

    m, k = a_shard.shape
    if context is not None:
        if type(context) is not AllGatherGemmContext:  # a subclass (the grouped one) runs another consumer
            raise TypeError(f"triton_dist ag_gemm: context must be an AllGatherGemmContext, got "
                            f"{type(context).__name__}")
        if context.dtype != a_shard.dtype or context.k != k or m > context.max_m:
            raise ValueError(f"triton_dist ag_gemm: the context is for up to {context.max_m} rows of K={context.k} "
                             f"{context.dtype}; a_shard is [{m}, {k}] {a_shard.dtype}: create an "
                             f"AllGatherGemmContext(max_m_per_rank>={m}, k={k}, dtype={a_shard.dtype}) or pass "
                             f"context=None")
        if method not in ("auto", context.method):
            raise ValueError(f"triton_dist ag_gemm: method={method!r}, but the context's producer is "
                             f"{context.method!r} (chosen when it was made); pass method='auto' or another context")
        return context
    fitting = [(key[2], ctx) for (o, dt, key), ctx in _CONTEXTS.items() if o == "ag_gemm" and dt == a_shard.dtype
               and key[0] == k and key[1] >= m]
    if method == "auto":
        from .kernels.gemm.policy import ag_gemm_method
        from .runtime import num_nodes, world_size

        nodes, capturing = num_nodes(), torch.cuda.is_current_stream_capturing()
        method = ag_gemm_method(nodes, flops=2.0 * world_size() * m * n * k, eager=not capturing)
        if capturing and nodes == 1 and fitting and method not in {producer for producer, _ in fitting}:
            method = min(fitting, key=lambda f: f[1].max_m)[0]  # within a node every producer stands in
    own = [ctx for producer, ctx in fitting if producer == method]
    if own:
        return min(own, key=lambda c: c.max_m)
    max_m = 128
    while max_m < m:
        max_m *= 2
    ctx = AllGatherGemmContext(max_m, k, a_shard.dtype, method=method)
    _CONTEXTS[("ag_gemm", a_shard.dtype, (k, max_m, method))] = ctx
    return ctx


def _matmul_operands(op: str, a_name: str, a, b, result: str) -> tuple[int, int, int]:
    """Check ``a [M, K]`` and ``b [N, K]`` of a GEMM op (bf16/fp16, the same dtype, 2-D, on the
    current device, contiguous; ``K`` and ``N`` multiples of 8, as TMA needs 16-byte aligned rows);
    returns ``(M, K, N)``. ``result``: what the op computes, for the messages."""
    import torch

    for name, t in ((a_name, a), ("b", b)):
        _check_input(f"{op} ({name})", t)
        if t.dtype not in (torch.bfloat16, torch.float16):
            raise TypeError(f"triton_dist {op}: {name} is {t.dtype}; only torch.bfloat16 and torch.float16 are "
                            f"supported")
        if t.dim() != 2:
            raise ValueError(f"triton_dist {op}: {name} must be 2-D, got shape {tuple(t.shape)}")
    if a.dtype != b.dtype:
        raise TypeError(f"triton_dist {op}: {a_name} is {a.dtype} but b is {b.dtype}")
    m, k = a.shape
    n = b.shape[0]
    if b.shape[1] != k:
        raise ValueError(f"triton_dist {op}: {a_name} is [M, K] = {list(a.shape)} and b is [N, K] = {list(b.shape)}: "
                         f"K differs (the result is {result})")
    if k == 0 or k % 8 or n % 8:
        raise ValueError(f"triton_dist {op}: K ({k}) must be a positive multiple of 8 and N ({n}) a multiple of 8 "
                         f"(TMA needs 16-byte aligned rows)")
    return m, k, n


def _check_aligned(op: str, name: str, t) -> None:
    if t.data_ptr() % 16:
        raise ValueError(f"triton_dist {op}: {name} must start 16-byte aligned (TMA); pass a fresh tensor "
                         f"({name}.clone() for an input)")


def ag_gemm(a_shard, b, *, out=None, method: str = "auto", context=None):
    """AllGather+GEMM: ``allgather(a_shard) @ b.T``, every rank's ``a_shard`` concatenated along dim
    0 in rank order, times ``b`` transposed; returns ``out`` (``[world * m, N]``; a new tensor when
    None). The gather (the producer, on a side stream; ``"sm_push_inline"``: in the GEMM's own
    programs, before their tiles) overlaps the GEMM (persistent Triton kernel, the current stream)
    tile by tile; see :mod:`triton_dist.kernels.gemm.ag_gemm`.

    ``method``: the producer, one of :data:`~triton_dist.kernels.gemm.ag_gemm.METHODS`:
    ``"ce_push"`` (copy engines push each shard to every peer), ``"ce_pull"`` (copy engines pull
    the peers' shards into ordinary memory), ``"sm_push"`` (a kernel of a few SMs pushes),
    ``"sm_2d"`` (that kernel across nodes: NVSHMEM puts between nodes, forwarding within),
    ``"sm_push_inline"`` (the GEMM's own programs push first: one launch a call on the caller's
    stream, no side stream, for eager calls whose host time exceeds their GPU time), or
    ``"auto"`` (``context``'s producer, else within a node ``"sm_push_inline"`` for an eager call
    of a GEMM too short to hide ``"ce_push"``'s host time and ``"ce_push"`` otherwise, and
    ``"sm_2d"`` across nodes: :func:`~triton_dist.kernels.gemm.policy.ag_gemm_method`). A context
    is made for one producer.

    ``a_shard``: ``[m, K]``, the same ``m`` on every rank; ``b``: ``[N, K]`` (the weight of a
    linear layer: ``y = x @ W.T``); both contiguous, bfloat16 or float16 (the same), on the current
    CUDA device; ``K`` and ``N`` multiples of 8. ``context``: an
    :class:`~triton_dist.kernels.AllGatherGemmContext` to use instead of a cached one (needed to
    capture the first call in a CUDA graph). Collective: every rank, same calls, same shapes.
    """
    if _torch_library.compiling():
        _torch_library.eager_only("ag_gemm", out=out, context=context)
        return _torch_library.call("ag_gemm", a_shard, b, method)
    replayed = _eager_calls.replay_gemm("ag_gemm", a_shard, b, out, method, context)
    if replayed is not None:
        return replayed
    _require_initialized("ag_gemm")
    _call_agreement.check("ag_gemm", a_shard=a_shard, b=b, method=method)
    from .kernels.gemm.ag_gemm import METHODS

    _check_method("ag_gemm", method, ("auto", *METHODS))
    m, k, n = _matmul_operands("ag_gemm", "a_shard", a_shard, b, "allgather(a_shard) @ b.T")
    from .runtime import world_size

    out_given = out is not None
    out = _output("ag_gemm", a_shard, out, (world_size() * m, n))
    _check_aligned("ag_gemm", "b", b)
    _check_aligned("ag_gemm", "out", out)
    given_context = context
    context = _ag_gemm_context(a_shard, n, context, method)
    if m == 0 or n == 0:
        return out
    launched = context.run(a_shard, b, out)
    _eager_calls.record_gemm("ag_gemm", a_shard, b, out, out_given, method, launched, given_context)
    return out


def _run_n_keyed_gemm(op: str, context_class, a, b, out_shape, out, context, method: str, *, min_m: int):
    """The common end of gemm_rs and gemm_ar, whose contexts are keyed by N: check (or make) ``out``,
    skip empty calls, find the context and run; returns ``out`` and what ``run`` returned."""
    out = _output(op, a, out, out_shape)
    _check_aligned(op, "out", out)
    if a.shape[0] == 0 or b.shape[0] == 0:
        return out, None
    context = _n_keyed_gemm_context(op, context_class, a, b.shape[0], context, min_m=min_m)
    return out, context.run(a, b, out, method)


def _n_keyed_gemm_context(op: str, context_class, a, n, context, min_m: int):
    """A cached ``context_class(max_m, n, dtype)`` (GEMM+RS or GEMM+AR) that fits ``a``'s rows and
    ``n``, else a new one (collective; ``max_m`` rounded up to a power of two, at least ``min_m``);
    ``context``, when given, checked instead."""
    name = context_class.__name__
    big_m = a.shape[0]
    if context is not None:
        if not isinstance(context, context_class):
            raise TypeError(f"triton_dist {op}: context must be a {name}, got {type(context).__name__}")
        if context.dtype != a.dtype or context.n != n or big_m > context.max_m:
            raise ValueError(f"triton_dist {op}: the context is for up to {context.max_m} rows and N={context.n} "
                             f"{context.dtype}; a is {list(a.shape)} {a.dtype} with N={n}: create a "
                             f"{name}(max_m>={big_m}, n={n}, dtype={a.dtype}) or pass context=None")
        return context
    fitting = [ctx for (o, dt, key), ctx in _CONTEXTS.items() if o == op and dt == a.dtype and key[0] == n and
               key[1] >= big_m]
    if fitting:
        return min(fitting, key=lambda c: c.max_m)
    max_m = min_m
    while max_m < big_m:
        max_m *= 2
    ctx = context_class(max_m, n, a.dtype)
    _CONTEXTS[(op, a.dtype, (n, max_m))] = ctx
    return ctx


def gemm_rs(a, b, *, out=None, method: str = "auto", context=None, variant: str | None = None):
    """GEMM+ReduceScatter: this rank's rows ``[rank * M / world, (rank + 1) * M / world)`` of the sum
    over ranks of ``a @ b.T``; returns ``out`` (``[M / world, N]``; a new tensor when None). The
    reduction overlaps the GEMM (a persistent Triton kernel on the current stream) tile by tile;
    see :mod:`triton_dist.kernels.gemm.gemm_rs`.

    ``a``: ``[M, K]`` (this rank's K-shard of the activations, the same ``M`` on every rank, a
    multiple of the world size); ``b``: ``[N, K]`` (this rank's K-shard of a linear layer's
    weight: ``y = x @ W.T``); both contiguous, bfloat16 or float16 (the same), on the current CUDA
    device, 16-byte aligned; ``K`` and ``N`` multiples of 8. The peers' partials travel in the
    input dtype; the sum is taken in fp32 and rounded once.

    ``method``: ``"fused"`` (one kernel: the peers' tiles go to their buffers first, then each own
    tile is summed with the peers' partials in the GEMM's epilogue), ``"fused_tma"`` (the same
    with the peers' tiles sent by TMA stores), ``"fused_ce"`` (the same with the peers' tiles
    staged locally and sent by the copy engine in chunks, no SM stalled on NVLink), ``"push"`` or ``"pull"`` (a
    separate reduce kernel on a side stream reads the partials that the GEMM stored into the
    destination's buffer, or into its own), ``"2d"`` (across nodes: the GEMM, then the hierarchical
    ReduceScatter), ``"push_2d"`` (across nodes, overlapped: ``"push"`` within each node, then each
    node's fp32 partial sent across by the reduce kernel), or ``"auto"`` (within a node
    ``"fused"`` for an eager call of a GEMM too short to hide ``"fused_ce"``'s host time and
    ``"fused_ce"`` otherwise, ``"2d"`` across nodes:
    :func:`~triton_dist.kernels.gemm.policy.gemm_rs_method`).
    ``context``: a :class:`~triton_dist.kernels.GemmReduceScatterContext` to use instead of a
    cached one (needed to capture the first call in a CUDA graph). Collective: every rank, same calls, same shapes,
    same method. ``variant``: the name ``method`` had before (deprecated).
    """
    method = method_or_old_name("gemm_rs", method, "auto", "variant", variant)
    if _torch_library.compiling():
        _torch_library.eager_only("gemm_rs", out=out, context=context)
        return _torch_library.call("gemm_rs", a, b, method)
    replayed = _eager_calls.replay_gemm("gemm_rs", a, b, out, method, context)
    if replayed is not None:
        return replayed
    _require_initialized("gemm_rs")
    _call_agreement.check("gemm_rs", a=a, b=b, method=method)
    from .kernels.gemm.gemm_rs import METHODS
    from .runtime import world_size

    _check_method("gemm_rs", method, METHODS)
    big_m, k, n = _matmul_operands("gemm_rs", "a", a, b, "reduce_scatter(a @ b.T)")
    _check_aligned("gemm_rs", "a", a)
    _check_aligned("gemm_rs", "b", b)
    world = world_size()
    if big_m % world:
        raise ValueError(f"triton_dist gemm_rs: M = a.shape[0] = {big_m} must be divisible by the world size {world}; "
                         f"pad the rows")
    from .kernels import GemmReduceScatterContext

    out_given = out is not None
    out, launched = _run_n_keyed_gemm("gemm_rs", GemmReduceScatterContext, a, b, (big_m // world, n), out, context,
                                      method, min_m=256)
    _eager_calls.record_gemm("gemm_rs", a, b, out, out_given, method, launched, context)
    return out


def gemm_ar(a, b, *, out=None, method: str = "auto", context=None, variant: str | None = None):
    """GEMM+AllReduce: the sum over ranks of ``a @ b.T`` on every rank, bit-identical across ranks;
    returns ``out`` (``[M, N]``; a new tensor when None). One kernel: each tile's fp32 partial goes
    to every peer as soon as it is computed, and every rank sums the partials in a fixed order; see
    :mod:`triton_dist.kernels.gemm.gemm_ar`. Meant for small ``M`` (decoding): its symmetric
    buffer holds ``2 * world * N * max(max_m, 4 * min(max_m, 128))`` fp32 elements (``max_m``: ``M``
    rounded up to a power of two, at least 128).

    ``method``: ``"auto"`` (measured rule: ``"output_tiles"`` at 33-64 rows and past 128,
    else ``"split_k"``; :func:`~triton_dist.kernels.gemm.policy.gemm_ar_method`),
    ``"split_k"`` (B's rows as the MMA's long side, the contraction split across programs and
    summed with the all-reduce) or ``"output_tiles"`` (one tile of the output per program); the
    same on every rank.

    ``a``: ``[M, K]`` (this rank's K-shard of the activations, the same ``M`` on every rank);
    ``b``: ``[N, K]`` (this rank's K-shard of a row-parallel linear layer's weight: ``y = x @
    W.T``); both contiguous, bfloat16 or float16 (the same), on the current CUDA device, 16-byte
    aligned; ``K`` and ``N`` multiples of 8. ``context``: a
    :class:`~triton_dist.kernels.GemmAllReduceContext` to use instead of a cached one (needed to
    capture the first call in a CUDA graph). Collective: every rank, same calls, same shapes.
    ``variant``: the name ``method`` had before (deprecated).
    """
    method = method_or_old_name("gemm_ar", method, "auto", "variant", variant)
    if _torch_library.compiling():
        _torch_library.eager_only("gemm_ar", out=out, context=context)
        return _torch_library.call("gemm_ar", a, b, method)
    replayed = _eager_calls.replay_gemm("gemm_ar", a, b, out, method, context)
    if replayed is not None:
        return replayed
    _require_initialized("gemm_ar")
    _call_agreement.check("gemm_ar", a=a, b=b, method=method)
    from .kernels.gemm import gemm_ar as _gemm_ar

    _check_method("gemm_ar", method, _gemm_ar.METHODS)
    m, k, n = _matmul_operands("gemm_ar", "a", a, b, "all_reduce(a @ b.T)")
    _check_aligned("gemm_ar", "a", a)
    _check_aligned("gemm_ar", "b", b)
    from .kernels import GemmAllReduceContext

    out_given = out is not None
    out, launched = _run_n_keyed_gemm("gemm_ar", GemmAllReduceContext, a, b, (m, n), out, context, method,
                                      min_m=128)
    _eager_calls.record_gemm("gemm_ar", a, b, out, out_given, method, launched, context)
    return out


def _flash_decode_context(q, context):
    from .kernels.attention.decode import MAX_Q_TOKENS
    from .kernels.attention.flash_decode import FlashDecodeContext

    if context is not None:
        if not isinstance(context, FlashDecodeContext):
            raise TypeError(f"triton_dist flash_decode: context must be a FlashDecodeContext, got "
                            f"{type(context).__name__}")
        return context
    if not (hasattr(q, "dim") and q.dim() == 4):
        raise ValueError(f"triton_dist flash_decode: q must be [batch, q_tokens, q_heads, head_dim], got "
                         f"{list(getattr(q, 'shape', []))}")
    batch, _, q_heads, head_dim = q.shape
    fitting = [ctx for (o, _, key), ctx in _CONTEXTS.items() if o == "flash_decode" and key == (q_heads, head_dim)
               and ctx.max_batch >= batch]
    if fitting:
        return min(fitting, key=lambda c: c.max_batch)
    max_batch = 8
    while max_batch < batch:
        max_batch *= 2
    ctx = FlashDecodeContext(max_batch, MAX_Q_TOKENS, q_heads, head_dim)
    _CONTEXTS[("flash_decode", max_batch, (q_heads, head_dim))] = ctx
    return ctx


def flash_decode(q, k_cache, v_cache, block_table, seq_lens, *, scale: float | None = None,
                 soft_cap: float | None = None, out=None, lse=None, context=None):
    """Distributed flash decoding: attention of ``q`` over a KV cache split along the sequence over
    the ranks; returns ``(out, lse)`` on every rank (see
    :mod:`triton_dist.kernels.attention.flash_decode`).

    ``q``: ``[batch, q_tokens, q_heads, head_dim]`` (the same on every rank; ``q_tokens`` 1..8,
    ``head_dim`` 64 or 128, bfloat16 or float16); ``k_cache``/``v_cache``: this rank's paged part,
    ``[blocks, block_size, kv_heads, head_dim]``; ``block_table`` ``[batch, max_blocks]`` and
    ``seq_lens`` ``[batch]`` (int32): this rank's pages and token counts. Ranks hold consecutive
    parts of every sequence in rank order, and the last rank (``world_size - 1``) holds the newest
    tokens of every sequence, the ``q_tokens`` new ones included (its ``seq_lens >= q_tokens``;
    only there are the new tokens causal among themselves); other ranks may hold 0 tokens of a
    sequence. ``scale``
    defaults to ``head_dim ** -0.5``; ``soft_cap``: ``soft_cap * tanh(score / soft_cap)``. ``out``
    like ``q``, ``lse`` fp32 ``[batch, q_tokens, q_heads]`` (natural log). Collective; the context
    (symmetric partial buffers) is created on first use for ``q``'s heads and head dim."""
    _require_initialized("flash_decode")
    ctx = _flash_decode_context(q, context)
    return ctx(q, k_cache, v_cache, block_table, seq_lens, scale=scale, soft_cap=soft_cap, out=out, lse=lse)


from .moe_ops import ag_group_gemm, ep_combine, ep_dispatch, group_gemm, group_gemm_rs  # noqa: E402,F401
