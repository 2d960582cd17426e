"""The mixture-of-experts ops of :mod:`triton_dist.ops` (imported there; call them as
``triton_dist.ops.<name>``): expert-parallel dispatch and combine, the grouped GEMM, and the
tensor-parallel AllGather + grouped GEMM and grouped GEMM + ReduceScatter. Thin wrappers that
check their arguments and call the contexts of :mod:`triton_dist.kernels.moe`."""

from __future__ import annotations

from . import call_agreement as _call_agreement
from .runtime import _require_initialized


def ep_dispatch(x, topk_idx, topk_weights, *, context, send_only: bool = False, check_routing: bool | None = None,
                out_x=None, out_weight=None, max_recv_rows: int | None = None):
    """Expert-parallel dispatch: every token of ``x`` (``[tokens, hidden]``) to the ranks of its
    ``topk`` experts (``topk_idx`` ``[tokens, topk]`` int32/int64, ``-1`` for none; ``topk_weights``
    float32), laid out expert-major there; returns an :class:`~triton_dist.kernels.EPDispatch`
    (``x``, ``weights``, ``counts``, ``handle``). ``context``: the
    :class:`~triton_dist.kernels.EPContext` that fixes the sizes and the expert split. Collective;
    see :meth:`EPContext.dispatch <triton_dist.kernels.EPContext.dispatch>` for ``send_only``,
    ``check_routing``, the optional outputs ``out_x`` and ``out_weight`` (low-latency mode) and
    ``max_recv_rows`` (high-throughput mode: the packed output's rows, ``x [rows, hidden]`` with
    per-expert ``offsets``)."""
    _require_initialized("ep_dispatch")
    # Token counts may differ between ranks; the rows' width, the dtype and the mode may not.
    _call_agreement.check("ep_dispatch", rows_may_differ=("x", ), x=x, send_only=send_only,
                          max_recv_rows=max_recv_rows is not None)
    _ep_context("ep_dispatch", context)
    return context.dispatch(x, topk_idx, topk_weights, send_only=send_only, check_routing=check_routing,
                            out_x=out_x, out_weight=out_weight, max_recv_rows=max_recv_rows)


def ep_combine(y, handle, *, out=None):
    """Expert-parallel combine: the experts' outputs ``y`` (``[local experts, world * max_tokens,
    hidden]``, or the packed ``[rows, hidden]`` of a high-throughput dispatch: rows as the dispatch
    laid them out) back to the ranks that sent the tokens, each
    token's weighted sum of its experts' rows, in the original order (``[tokens, hidden]``).
    ``handle``: the dispatch's. Collective, in dispatch order."""
    _require_initialized("ep_combine")
    from .kernels import EPHandle

    if not isinstance(handle, EPHandle):
        raise TypeError(f"triton_dist ep_combine: handle must be an EPHandle (the .handle of ep_dispatch's result), "
                        f"got {type(handle).__name__}")
    return handle.context.combine(y, handle, out=out)


def group_gemm(x, w, *, offsets=None, counts=None, out=None, config: str | None = None,
               check_rows: bool | None = None):
    """MoE grouped GEMM, local to this GPU: ``out[rows of e] = x[rows of e] @ w[e].T`` for every
    expert ``e`` of ``w [experts, N, K]``, with ``x [tokens, K]`` sorted by expert and ``offsets``
    (int32 cumulative row ends, as ``torch._grouped_mm``) or ``x [experts, capacity, K]`` and
    ``counts`` (int32, as :meth:`ep_dispatch`'s result). See
    :func:`triton_dist.kernels.moe.group_gemm.group_gemm` for ``config`` and ``check_rows``."""
    from .kernels.moe.group_gemm import group_gemm as _group_gemm

    return _group_gemm(x, w, offsets=offsets, counts=counts, out=out, config=config, check_rows=check_rows)


def ag_group_gemm(x, topk_idx, w, *, context, out=None, check_routing: bool | None = None):
    """MoE tensor parallelism, first GEMM: every rank's tokens ``x [m, K]`` (a sequence shard, the
    same ``m`` everywhere) gathered and multiplied by the experts' weight shards ``w [E, N, K]``,
    one row per routed (token, k) pair (``topk_idx [m, topk]``, ``-1`` for none), expert-major,
    the gather overlapped tile by tile; returns an
    :class:`~triton_dist.kernels.moe.ag_group_gemm.AGGroupGemmOutput` (``out``, ``offsets``,
    ``token_index``, ``topk_slot``). ``context``: an
    :class:`~triton_dist.kernels.moe.ag_group_gemm.AllGatherGroupGemmContext` (sizes, experts,
    topk). ``check_routing``: check on the host that every id is in ``[-1, E)`` (one
    synchronisation); default: when not capturing a CUDA graph. Collective."""
    _require_initialized("ag_group_gemm")
    _call_agreement.check("ag_group_gemm", x=x, topk_idx=topk_idx, w=w)
    import torch

    from .kernels.moe.ag_group_gemm import AllGatherGroupGemmContext

    if not isinstance(context, AllGatherGroupGemmContext):
        raise TypeError(f"triton_dist ag_group_gemm: context must be an AllGatherGroupGemmContext, got "
                        f"{type(context).__name__}")
    m, n = context.check_call(x, topk_idx, w, out)
    if check_routing is None:
        check_routing = not torch.cuda.is_current_stream_capturing()
    if check_routing and m:
        low, high = int(topk_idx.min()), int(topk_idx.max())
        if low < -1 or high >= context.num_experts:
            raise ValueError(f"triton_dist ag_group_gemm: expert ids must be in [-1, {context.num_experts}), got ids "
                             f"from {low} to {high}")
    if out is None:
        out = torch.empty((context.world * m * context.topk, n), dtype=x.dtype, device=x.device)
    # The routing's int32 bits travel as float32 words: the gather moves bits, it never computes on them.
    ids = topk_idx.to(torch.int32).contiguous()
    gathered = _all_gather(ids.view(torch.float32)).view(torch.int32) if m else ids
    return context.run(x, gathered.view(context.world * m, context.topk), w, out)


def group_gemm_rs(act, w, layout, topk_weights, *, context, out=None):
    """MoE tensor parallelism, second GEMM: the routed rows ``act`` (``[world * m * topk, K]``,
    expert-major as :func:`ag_group_gemm` returned them; ``layout``: that call's
    :class:`~triton_dist.kernels.moe.ag_group_gemm.AGGroupGemmOutput`) times the experts' weight
    shards ``w [E, N, K]``, each row weighted by its router weight (``topk_weights [m, topk]``
    float32, this rank's tokens) and summed into its token, over every rank's shard: returns this
    rank's ``[m, N]``. The combine and the reduction across ranks run in the GEMM's epilogue.
    ``context``: a :class:`~triton_dist.kernels.moe.group_gemm_rs.GroupGemmReduceScatterContext`.
    Collective."""
    _require_initialized("group_gemm_rs")
    _call_agreement.check("group_gemm_rs", act=act, w=w, topk_weights=topk_weights)
    import torch

    from .kernels.moe.ag_group_gemm import AGGroupGemmOutput
    from .kernels.moe.group_gemm_rs import GroupGemmReduceScatterContext

    if not isinstance(context, GroupGemmReduceScatterContext):
        raise TypeError(f"triton_dist group_gemm_rs: context must be a GroupGemmReduceScatterContext, got "
                        f"{type(context).__name__}")
    if not isinstance(layout, AGGroupGemmOutput):
        raise TypeError(f"triton_dist group_gemm_rs: layout must be the AGGroupGemmOutput of ops.ag_group_gemm, got "
                        f"{type(layout).__name__}")
    m = context.check_call(act, w, layout.offsets, layout.token_index, layout.topk_slot, topk_weights, out)
    if out is None:
        out = torch.empty((m, context.n), dtype=context.dtype, device=act.device)
    if m == 0:
        return out
    weights_all = _all_gather(topk_weights.contiguous())
    context.run(act, w, layout.offsets, layout.token_index, layout.topk_slot, weights_all, out, m)
    return out


def _ep_context(op: str, context):
    from .kernels import EPContext

    if not isinstance(context, EPContext):
        raise TypeError(f"triton_dist {op}: context must be an EPContext (its sizes and expert split are the "
                        f"layer's), got {type(context).__name__}")
    return context


def _all_gather(x):
    # ops imports this module at its end (its MoE half); imported here at call time, either
    # module can be imported first.
    from .ops import all_gather

    return all_gather(x)
