"""``EPContext``: the buffers, signals and kernels of expert-parallel dispatch and combine
(:mod:`~triton_dist.kernels.moe.alltoall`, low-latency and high-throughput modes), created once
and reused.

    ctx = EPContext(max_tokens=128, hidden=7168, num_experts=256, topk=8, dtype=torch.bfloat16)
    d = ctx.dispatch(x, topk_idx, topk_weights)   # d.x: [local experts, world * 128, 7168]
    y = experts(d.x, d.counts)                     # rows [0, d.counts[j]) of expert j are real
    out = ctx.combine(y, d.handle)                 # [tokens, 7168], the original order

Low-latency: no host synchronisation (but the optional routing check), capturable in a CUDA graph.
High-throughput (``mode="high_throughput"``): a packed ``d.x [rows, 7168]`` with ``d.offsets``,
one host synchronisation per dispatch unless ``max_recv_rows`` is given.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import triton

from ... import runtime as _runtime
from ...eager_launch import EagerLaunches
from ...symmetric import symm_empty
from ..common.context import DTYPES, CollectiveContext
from .alltoall import ep_combine_kernel, ep_dispatch_kernel, ep_received_counts_kernel
from .layout import ep_layout_kernel

PROGRAMS = 32
"""Programs of every dispatch and combine grid (fewer when the SMs are fewer): each handles the
tokens ``pid, pid + 32, ...``; with up to a few hundred tokens per rank, more programs would
mostly add signals to wait for. Not measured yet."""

MAX_TOKENS = 1024
"""The largest ``max_tokens`` (per rank) a low-latency context takes: the protocol is for
decode-sized batches, and its fixed layouts grow with ``world * max_tokens * hidden`` (the dispatch
output with ``local experts`` times that: 470 MB per rank at 128 tokens, hidden 7168, 256 experts
on 8 ranks)."""

MAX_TOKENS_HIGH_THROUGHPUT = 16384
"""The largest ``max_tokens`` of a high-throughput context, whose output is packed (sized by the
received rows) but whose symmetric receive and combine buffers are ``world * max_tokens * hidden``
each (940 MB per rank for both at 4096 tokens, hidden 7168, bf16, 8 ranks)."""

MODES = ("low_latency", "high_throughput")
"""The protocol's two modes (:mod:`~triton_dist.kernels.moe.alltoall`)."""

FP8_BLOCK = 128
"""Values per scale of FP8 dispatch (DeepSeek-V3's and DeepEP's block size)."""

LAYOUT_TOKENS_PER_STEP = 32
"""Tokens each layout program reads per step (``BT`` of :func:`ep_layout_kernel`)."""

_LAYOUT = EagerLaunches(ep_layout_kernel)


@dataclass(eq=False)
class EPHandle:
    """What :meth:`EPContext.combine` needs from a dispatch: the layout (where each token went) and
    the receive side's bookkeeping (the row and weight of each received entry). Device tensors, valid
    until the handle is combined; ``seq`` orders combines after their dispatches."""

    context: "EPContext"
    seq: int
    tokens: int
    epoch: object  # int64 [1]: the dispatch's epoch, written by its kernel
    slots: object  # int32 [tokens, world]
    row_of: object  # int32 [world, max_tokens, KP]
    weight_of: object  # fp32 [world, max_tokens, KP]
    recv_tokens: object  # int32 [world]
    rows: int | None = None  # high-throughput: the packed rows of the dispatch's x (and combine's y)
    received: bool = False
    combined: bool = False
    _receive_args: tuple = field(default=(), repr=False)


@dataclass(eq=False)
class EPDispatch:
    """The tokens this rank's experts must process. ``x``: ``[local experts, world * max_tokens,
    hidden]``, expert ``j``'s rows packed at the start of ``x[j]`` (by source rank, then the source's
    token order); ``weights``: fp32 ``[local experts, world * max_tokens]``, each row's routing
    weight; ``counts``: int32 ``[local experts]``, the rows of each expert (on the GPU). Rows past
    ``counts[j]`` are not written. ``handle``: for :meth:`EPContext.combine`. With FP8 dispatch
    (``EPContext(fp8_dispatch=True)``), ``x`` is float8 e4m3 and ``scales`` fp32 ``[local experts,
    world * max_tokens, hidden / 128]``: row ``i``'s values ``x[j, i, b * 128:(b + 1) * 128] *
    scales[j, i, b]``; None otherwise.

    High-throughput mode: ``x`` is packed, ``[rows, hidden]``, expert ``j``'s rows ``[offsets[j -
    1], offsets[j])`` (``offsets``: int32 ``[local experts]`` cumulative ends, the convention of
    :func:`triton_dist.ops.group_gemm`, capped at ``rows`` where ``max_recv_rows`` dropped some, so
    that ``counts`` may then exceed the rows an expert got), ``weights`` ``[rows]``, ``scales``
    ``[rows, hidden / 128]``. ``offsets`` is None in low-latency mode."""

    x: object
    weights: object
    counts: object
    handle: EPHandle
    scales: object = None
    offsets: object = None


class EPContext(CollectiveContext):
    """Expert-parallel dispatch and combine for up to ``max_tokens`` tokens per rank of ``hidden``
    values (``dtype``: float32, bfloat16 or float16), ``num_experts`` experts split evenly over the
    ranks (``num_experts % world == 0``), ``topk`` experts per token.

    Collective to create (every rank, same arguments, same order as its other symmetric
    allocations); creating it compiles and loads its kernels. Every dispatch and combine is
    collective too (every rank, same order; token counts may differ). Memory on the symmetric heap:
    ``4 * world * max_tokens * hidden`` elements of ``dtype`` (receive and combine buffers, two
    halves each; half of it in high-throughput mode) plus ``2 * world * max_tokens * KP * 12``
    bytes of routing (``KP``: ``topk`` rounded up to a power of two; halved likewise).

    ``fp8_dispatch``: rows travel and arrive as float8 e4m3 with one fp32 scale per
    :data:`FP8_BLOCK` values (``hidden`` a multiple of it), quantised by the sender: half the
    dispatch's bytes for bf16 input (the receive buffer is float8 and a scale buffer is added);
    :class:`EPDispatch` then carries ``scales``. Combine stays in ``dtype``.

    ``mode``: ``"low_latency"`` (default: up to :data:`MAX_TOKENS` tokens, fixed-size output, two
    dispatches may be in flight, no host synchronisation) or ``"high_throughput"`` (up to
    :data:`MAX_TOKENS_HIGH_THROUGHPUT` tokens, packed output sized by the rows received, one host
    synchronisation per dispatch unless :meth:`dispatch` gets ``max_recv_rows``; each dispatch
    must be combined before the next; the symmetric buffers hold one call, half the low-latency
    ones).
    """

    def __init__(self, max_tokens: int, hidden: int, num_experts: int, topk: int, dtype, *,
                 max_programs: int | None = None, fp8_dispatch: bool = False, mode: str = "low_latency"):
        op = "EPContext"
        _runtime._require_initialized(op)
        import torch

        for name, v in (("max_tokens", max_tokens), ("hidden", hidden), ("num_experts", num_experts),
                        ("topk", topk)):
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"triton_dist {op}: {name} must be a positive int, got {v!r}")
        world = _runtime.world_size()
        if num_experts % world:
            raise ValueError(f"triton_dist {op}: {num_experts} experts do not split evenly over {world} ranks; use a "
                             f"multiple of {world}")
        if topk > num_experts:
            raise ValueError(f"triton_dist {op}: topk {topk} is more than the {num_experts} experts")
        if mode not in MODES:
            raise ValueError(f"triton_dist {op}: mode must be one of {MODES}, got {mode!r}")
        self.high_throughput = mode == "high_throughput"
        limit = MAX_TOKENS_HIGH_THROUGHPUT if self.high_throughput else MAX_TOKENS
        if max_tokens > limit:
            hint = "split the batch" if self.high_throughput else "use mode='high_throughput' or split the batch"
            raise ValueError(f"triton_dist {op}: max_tokens {max_tokens} is above the {mode} protocol's {limit}; "
                             f"{hint}")
        if not isinstance(dtype, torch.dtype) or str(dtype).replace("torch.", "") not in DTYPES:
            raise TypeError(f"triton_dist {op}: dtype must be one of torch.float32, torch.bfloat16, torch.float16, "
                            f"got {dtype!r}")
        if fp8_dispatch and hidden % FP8_BLOCK:
            raise ValueError(f"triton_dist {op}: FP8 dispatch quantises blocks of {FP8_BLOCK} values; hidden "
                             f"{hidden} is not a multiple of {FP8_BLOCK}")
        self.max_tokens, self.hidden, self.num_experts, self.topk = max_tokens, hidden, num_experts, topk
        self.fp8 = bool(fp8_dispatch)
        self.x_dtype = torch.float8_e4m3fn if self.fp8 else dtype
        """What dispatched rows arrive as: float8 e4m3 with FP8 dispatch, else the context's dtype."""
        self.local_experts = num_experts // world
        """Experts per rank: rank ``d`` holds experts ``[d * local_experts, (d + 1) * local_experts)``."""
        self.kp = triton.next_power_of_2(topk)
        self.lp = triton.next_power_of_2(self.local_experts)
        rows = world * max_tokens
        programs = min(PROGRAMS, max_programs) if max_programs is not None else PROGRAMS
        # Three regions of world * MAX_PROGRAMS signals: dispatched, freed, combined. The largest
        # input is one rank's tokens (the kernels' offsets into the buffers are 64-bit).
        super().__init__(op, dtype, max_tokens * hidden, {}, 3 * world, max_programs=programs)
        self.mode = mode
        self.num_halves = 1 if self.high_throughput else 2
        """Calls the symmetric buffers hold (``HALVES`` of :mod:`~triton_dist.kernels.moe.alltoall`)."""
        self.max_recv_rows = world * max_tokens * min(topk, self.local_experts)
        """The most entries a rank can receive in one dispatch (every source's tokens, each with as
        many of its experts here as it can have)."""
        h = self.num_halves
        self.recv_x = symm_empty((h * rows * hidden, ), self.x_dtype)
        self.recv_scale = symm_empty((h * rows * (hidden // FP8_BLOCK), ), torch.float32) if self.fp8 else None
        self.comb_x = symm_empty((h * rows * hidden, ), dtype)
        self.recv_route = symm_empty((h * rows * self.kp * 2, ), torch.int32)
        self.recv_weight = symm_empty((h * rows * self.kp, ), torch.float32)
        self.recv_counts = symm_empty((h * world * (1 + self.lp), ), torch.int32)
        self._dispatches = 0
        self._next_receive = 0
        self._next_combine = 0
        self.ready()

    # -- kernel arguments ------------------------------------------------------------------------

    def _meta(self, send: bool, recv: bool) -> dict:
        return dict(H=self.hidden, T=self.max_tokens, K=self.topk, KP=self.kp, E=self.num_experts,
                    L=self.local_experts, LP=self.lp, WORLD=self.world, MAX_PROGRAMS=self.max_programs,
                    BH=self._bh(), SEND=send, RECV=recv, FP8=self.fp8, QB=FP8_BLOCK, QG=self._quant_group(),
                    PACKED=self.high_throughput, HALVES=self.num_halves, num_warps=4)

    def _combine_meta(self) -> dict:
        return dict(H=self.hidden, T=self.max_tokens, K=self.topk, KP=self.kp, WORLD=self.world,
                    MAX_PROGRAMS=self.max_programs, BH=self._bh(), HALVES=self.num_halves, num_warps=4)

    def _counts_meta(self) -> dict:
        return dict(L=self.local_experts, LP=self.lp, WORLD=self.world, MAX_PROGRAMS=self.max_programs,
                    HALVES=self.num_halves, num_warps=1)

    def _layout_meta(self) -> dict:
        return dict(K=self.topk, KP=self.kp, E=self.num_experts, L=self.local_experts, WORLD=self.world,
                    BT=LAYOUT_TOKENS_PER_STEP, num_warps=4)

    def _quant_group(self) -> int:
        """Blocks FP8 dispatch quantises at a time: the largest power of two (at most 8, 1024
        values) that divides ``hidden / FP8_BLOCK``."""
        blocks = self.hidden // FP8_BLOCK
        return min(8, blocks & -blocks) if self.fp8 else 1

    def _bh(self) -> int:
        return min(1024, triton.next_power_of_2(self.hidden))

    def _signals(self, region: int):
        return self.pad.signals[region * self.world * self.max_programs:]

    def _buffers(self, tokens: int, out_x=None, out_weight=None, packed_rows: int | None = None):
        """A dispatch's local tensors: layout, handle and outputs (``out_x``/``out_weight`` when given;
        ``packed_rows``: high-throughput, the packed output's rows)."""
        import torch

        dev, w, t, kp, i32 = self.calls.device, self.world, self.max_tokens, self.kp, torch.int32
        rows = max(tokens, 1)
        if packed_rows is not None:
            packed = self._packed_outputs(packed_rows)
            out_x, out_weight = packed["out_x"], packed["out_weight"]
        return dict(
            slots=torch.empty((rows, w), dtype=i32, device=dev),
            positions=torch.empty((rows, self.topk), dtype=i32, device=dev),
            layout_counts=torch.empty((self.num_experts + w, ), dtype=i32, device=dev),
            out_x=out_x if out_x is not None else
            torch.empty((self.local_experts, w * t, self.hidden), dtype=self.x_dtype, device=dev),
            out_scale=packed["out_scale"] if packed_rows is not None else
            torch.empty((self.local_experts, w * t, self.hidden // FP8_BLOCK), dtype=torch.float32, device=dev)
            if self.fp8 else None,
            out_weight=out_weight if out_weight is not None else
            torch.empty((self.local_experts, w * t), dtype=torch.float32, device=dev),
            out_counts=torch.empty((self.local_experts, ), dtype=i32, device=dev),
            row_of=torch.empty((w, t, kp), dtype=i32, device=dev),
            weight_of=torch.empty((w, t, kp), dtype=torch.float32, device=dev),
            recv_tokens=torch.empty((w, ), dtype=i32, device=dev),
            epoch=torch.zeros((1, ), dtype=torch.int64, device=dev))

    def _packed_outputs(self, rows: int) -> dict:
        """A high-throughput dispatch's outputs of ``rows`` packed rows (views of at least one row,
        so that an empty output still has an address to pass)."""
        import torch

        dev, n = self.calls.device, max(rows, 1)
        scale = torch.empty((n, self.hidden // FP8_BLOCK), dtype=torch.float32, device=dev)[:rows] if self.fp8 else None
        return dict(out_x=torch.empty((n, self.hidden), dtype=self.x_dtype, device=dev)[:rows],
                    out_weight=torch.empty((n, ), dtype=torch.float32, device=dev)[:rows], out_scale=scale)

    def _dispatch_args(self, x, idx, weights, b, epoch_ptr, tokens) -> tuple:
        capacity = b["out_x"].shape[0] if self.high_throughput else 0
        return (x, idx, weights, b["slots"], b["positions"], b["layout_counts"], self.recv_x, self.recv_route,
                self.recv_weight, self.recv_counts, self.pad.signals, b["out_x"], b["out_weight"], b["out_counts"],
                b["row_of"], b["weight_of"], b["recv_tokens"], epoch_ptr, b["epoch"], tokens, self.recv_scale,
                b["out_scale"], capacity)

    def preload(self) -> None:
        """Compile and load the layout, the dispatch variants of the mode (low-latency: both halves,
        send, receive; high-throughput: send, the count kernel, receive) and combine for this
        context's shapes, before any rank can spin in them."""
        import torch

        b = self._buffers(2, packed_rows=2 if self.high_throughput else None)
        x = torch.empty((2, self.hidden), dtype=self.dtype, device=self.calls.device)
        idx = torch.empty((2, self.topk), dtype=torch.int32, device=x.device)
        weights = torch.empty((2, self.topk), dtype=torch.float32, device=x.device)
        _LAYOUT.preload((1, ), (idx, b["slots"], b["positions"], b["layout_counts"], 2), self._layout_meta())
        # High-throughput dispatches are always split (send, count, receive).
        phases = ((True, False), (False, True)) if self.high_throughput else \
            ((True, True), (True, False), (False, True))
        for send, recv in phases:
            ep_dispatch_kernel.preload(*self._dispatch_args(x, idx, weights, b, self.calls, 2), grid=(1, ),
                                       **self._meta(send, recv))
        if self.high_throughput:
            ep_received_counts_kernel.preload(self.recv_counts, self.pad.signals, b["epoch"], b["out_counts"],
                                              grid=(1, ), **self._counts_meta())
        ep_combine_kernel.preload(b["out_x"], b["row_of"], b["weight_of"], b["recv_tokens"], b["slots"], self.comb_x,
                                  self._signals(2), x, b["epoch"], 2, grid=(1, ), **self._combine_meta())

    # -- dispatch and combine --------------------------------------------------------------------

    def dispatch(self, x, topk_idx, topk_weights, *, send_only: bool = False, check_routing: bool | None = None,
                 out_x=None, out_weight=None, max_recv_rows: int | None = None) -> EPDispatch:
        """Send every token of ``x`` (``[tokens, hidden]``, ``tokens <= max_tokens``) to the ranks of
        its experts and lay them out expert-major there (module notes of
        :mod:`~triton_dist.kernels.moe.alltoall`). ``topk_idx``: ``[tokens, topk]`` int32 or int64
        expert ids, ``-1`` for none; ``topk_weights``: ``[tokens, topk]`` float32.

        ``send_only``: issue the sends and return; the result's tensors are filled once
        :meth:`receive` runs (overlap attention or another micro-batch in between; at most two
        dispatches outstanding). ``check_routing``: check on the host that every id is in
        ``[-1, num_experts)`` (one synchronisation); default: when not capturing a CUDA graph. Out of
        range ids are dropped on the GPU either way (never written out of bounds). ``out_x``,
        ``out_weight``: tensors to receive into (the shapes of :class:`EPDispatch`'s), instead of new
        ones (low-latency mode).

        High-throughput mode: no ``send_only``, ``out_x`` or ``out_weight``; the previous dispatch
        must have been combined. ``max_recv_rows``: the packed output's rows; without it the
        output has exactly the rows received, which costs one host synchronisation (so it cannot
        be captured in a CUDA graph). Entries past ``max_recv_rows`` are dropped (combine counts
        them as zeros); ``counts`` still says how many each expert was sent."""
        import torch

        op = "ep_dispatch"
        tokens = self._check_dispatch(op, x, topk_idx, topk_weights)
        if self.high_throughput:
            self._check_high_throughput_dispatch(op, send_only, out_x, out_weight, max_recv_rows)
        elif max_recv_rows is not None:
            raise ValueError(f"triton_dist {op}: max_recv_rows is for mode='high_throughput'; a low-latency output is "
                             f"[local experts, world * max_tokens, hidden]")
        if self._dispatches - self._next_receive >= 2:
            raise ValueError(f"triton_dist {op}: two dispatches are already waiting for receive(); receive dispatch "
                             f"{self._next_receive} first (its buffers are the ones this dispatch would use)")
        if topk_idx.dtype != torch.int32:
            topk_idx = topk_idx.to(torch.int32)
        # The loaded variants assume 16-byte aligned tensors; another would compile and load while
        # peers spin (triton_dist.distributed_jit).
        x, topk_idx, topk_weights = (_aligned(t) for t in (x, topk_idx, topk_weights))
        capturing = torch.cuda.is_current_stream_capturing()
        if check_routing is None:
            check_routing = not capturing
        if check_routing and tokens:
            low, high = int(topk_idx.min()), int(topk_idx.max())
            if low < -1 or high >= self.num_experts:
                raise ValueError(f"triton_dist {op}: expert ids must be in [-1, {self.num_experts}), got ids from "
                                 f"{low} to {high}")
        rows = self.world * self.max_tokens
        for name, given, shape, dtype in (("out_x", out_x, (self.local_experts, rows, self.hidden), self.x_dtype),
                                          ("out_weight", out_weight, (self.local_experts, rows), torch.float32)):
            if given is not None and (not isinstance(given, torch.Tensor) or tuple(given.shape) != shape or
                                      given.dtype != dtype or not given.is_contiguous() or
                                      given.device != self.calls.device or given.data_ptr() % 16):
                raise ValueError(f"triton_dist {op}: {name} must be a contiguous, 16-byte aligned {list(shape)} {dtype} "
                                 f"tensor on {self.calls.device}, got {_describe(given)}")
        packed_rows = (max_recv_rows or 0) if self.high_throughput else None  # 0: sized after the counts
        b = self._buffers(tokens, out_x, out_weight, packed_rows)
        epoch_ptr = self.next_call()
        _LAYOUT.run((self.num_experts + self.world, ), (topk_idx, b["slots"], b["positions"], b["layout_counts"],
                                                        tokens), self._layout_meta())
        if self.high_throughput:
            return self._send_count_receive(x, topk_idx, topk_weights, b, epoch_ptr, tokens, max_recv_rows)
        args = self._dispatch_args(x, topk_idx, topk_weights, b, epoch_ptr, tokens)
        ep_dispatch_kernel[(self.max_programs, )](*args, **self._meta(True, not send_only))
        # The receive half reads the epoch its send half wrote: the counter itself may have moved on
        # by then (a second micro-batch's dispatch).
        receive_args = self._dispatch_args(x, topk_idx, topk_weights, b, b["epoch"], tokens) if send_only else ()
        handle = EPHandle(self, self._dispatches, tokens, b["epoch"], b["slots"], b["row_of"], b["weight_of"],
                          b["recv_tokens"], received=not send_only, _receive_args=receive_args)
        self._dispatches += 1
        if not send_only:
            self._next_receive += 1
        return EPDispatch(b["out_x"], b["out_weight"], b["out_counts"], handle, b["out_scale"])

    def _check_high_throughput_dispatch(self, op: str, send_only, out_x, out_weight, max_recv_rows) -> None:
        import torch

        if send_only or out_x is not None or out_weight is not None:
            raise ValueError(f"triton_dist {op}: send_only, out_x and out_weight are for mode='low_latency'; a "
                             f"high-throughput dispatch is received at once into a packed output")
        if self._next_combine != self._dispatches:
            raise ValueError(f"triton_dist {op}: combine dispatch {self._next_combine} first: in high-throughput mode "
                             f"the buffers hold one call, so each dispatch is combined before the next")
        if max_recv_rows is None:
            if torch.cuda.is_current_stream_capturing():
                raise ValueError(f"triton_dist {op}: sizing the packed output reads the received counts on the host, "
                                 f"which a CUDA graph capture cannot; pass max_recv_rows")
        elif isinstance(max_recv_rows, bool) or not isinstance(max_recv_rows, int) or \
                not 0 <= max_recv_rows <= self.max_recv_rows:
            raise ValueError(f"triton_dist {op}: max_recv_rows must be an int in [0, {self.max_recv_rows}] (the most "
                             f"entries a rank can receive: world * max_tokens * min(topk, local experts)), got "
                             f"{max_recv_rows!r}")

    def _send_count_receive(self, x, topk_idx, topk_weights, b, epoch_ptr, tokens: int, max_recv_rows):
        """The high-throughput dispatch after the layout: send, size the packed output (the
        received counts, one host synchronisation, unless ``max_recv_rows``), receive."""
        import torch

        grid = (self.max_programs, )
        ep_dispatch_kernel[grid](*self._dispatch_args(x, topk_idx, topk_weights, b, epoch_ptr, tokens),
                                 **self._meta(True, False))
        failure = None
        if max_recv_rows is None:
            ep_received_counts_kernel[(1, )](self.recv_counts, self.pad.signals, b["epoch"], b["out_counts"],
                                             **self._counts_meta())
            max_recv_rows = int(b["out_counts"].sum())
            try:
                b.update(self._packed_outputs(max_recv_rows))
            except RuntimeError as e:  # out of memory: receive into the empty output all the same
                failure = e
        # The receive runs whatever happened since the send: its freed signals let every peer's
        # next send go on (a dispatch sent and never received would hang them).
        ep_dispatch_kernel[grid](*self._dispatch_args(x, topk_idx, topk_weights, b, b["epoch"], tokens),
                                 **self._meta(False, True))
        handle = EPHandle(self, self._dispatches, tokens, b["epoch"], b["slots"], b["row_of"], b["weight_of"],
                          b["recv_tokens"], rows=0 if failure is not None else max_recv_rows, received=True)
        self._dispatches += 1
        self._next_receive += 1
        if failure is not None:
            # Peers' combines wait for this rank's: combine nothing (every row dropped) so that
            # they end, then say so.
            self.combine(b["out_x"][:0].to(self.dtype), handle)
            raise RuntimeError(f"triton_dist ep_dispatch: rank {self.rank} could not allocate the {max_recv_rows} "
                               f"rows it received ({failure}); it dropped them and combined nothing, so every "
                               f"rank's output of this dispatch lacks its experts. Treat the dispatch as failed "
                               f"everywhere; pass max_recv_rows or free memory") from failure
        # Offsets within the output even when rows were dropped (group_gemm's convention); the
        # counts still say what each expert was sent.
        offsets = torch.cumsum(b["out_counts"], 0, dtype=torch.int32).clamp_(max=max_recv_rows)
        return EPDispatch(b["out_x"], b["out_weight"], b["out_counts"], handle, b["out_scale"], offsets)

    def receive(self, handle: EPHandle) -> None:
        """The receive half of a ``send_only`` dispatch (collective, in dispatch order)."""
        self._check_handle("ep_receive", handle)
        if handle.received:
            raise ValueError("triton_dist ep_receive: this dispatch was already received")
        if handle.seq != self._next_receive:
            raise ValueError(f"triton_dist ep_receive: receive dispatches in their order: dispatch "
                             f"{self._next_receive} is next, this handle is dispatch {handle.seq}")
        ep_dispatch_kernel[(self.max_programs, )](*handle._receive_args, **self._meta(False, True))
        handle.received = True
        handle._receive_args = ()
        self._next_receive += 1

    def combine(self, y, handle: EPHandle, *, out=None):
        """``out[t] = sum over t's experts e of weight(t, e) * y_e(t)`` on the rank that sent ``t``,
        in the original token order (``[tokens, hidden]``, a new tensor unless ``out`` is given). ``y``:
        the experts' outputs, ``[local experts, world * max_tokens, hidden]`` of the context's dtype,
        rows as :meth:`dispatch` laid them out. Combine handles in the order of their dispatches."""
        import torch

        op = "ep_combine"
        self._check_handle(op, handle)
        if not handle.received:
            raise ValueError(f"triton_dist {op}: the dispatch was sent but not received; call receive(handle) first")
        if handle.combined:
            raise ValueError(f"triton_dist {op}: this dispatch was already combined")
        if handle.seq != self._next_combine:
            raise ValueError(f"triton_dist {op}: combine dispatches in their order: dispatch {self._next_combine} is "
                             f"next, this handle is dispatch {handle.seq}")
        shape = (handle.rows, self.hidden) if self.high_throughput else \
            (self.local_experts, self.world * self.max_tokens, self.hidden)
        if not isinstance(y, torch.Tensor) or tuple(y.shape) != shape or y.dtype != self.dtype or \
                not y.is_contiguous() or y.device != self.calls.device:
            raise ValueError(f"triton_dist {op}: y must be a contiguous {list(shape)} {self.dtype} tensor on "
                             f"{self.calls.device}, got {_describe(y)}")
        if out is None:
            out = torch.empty((handle.tokens, self.hidden), dtype=self.dtype, device=y.device)
        elif tuple(out.shape) != (handle.tokens, self.hidden) or out.dtype != self.dtype or not out.is_contiguous():
            raise ValueError(f"triton_dist {op}: out must be a contiguous [{handle.tokens}, {self.hidden}] "
                             f"{self.dtype} tensor, got {_describe(out)}")
        # An empty y (no rows received) has no address; the kernel reads none of its rows.
        y = _aligned(y) if y.numel() else torch.empty((1, self.hidden), dtype=self.dtype, device=y.device)
        target = out if out.data_ptr() % 16 == 0 else torch.empty_like(out)
        ep_combine_kernel[(self.max_programs, )](y, handle.row_of, handle.weight_of, handle.recv_tokens, handle.slots,
                                                 self.comb_x, self._signals(2), target, handle.epoch,
                                                 handle.tokens, **self._combine_meta())
        if target is not out:
            out.copy_(target)
        handle.combined = True
        self._next_combine += 1
        return out

    # -- checks ----------------------------------------------------------------------------------

    def _check_dispatch(self, op: str, x, topk_idx, topk_weights) -> int:
        import torch

        device = self.calls.device
        if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.shape[1] != self.hidden or x.dtype != self.dtype:
            raise ValueError(f"triton_dist {op}: x must be [tokens, {self.hidden}] {self.dtype}, got {_describe(x)}")
        tokens = x.shape[0]
        if tokens > self.max_tokens:
            raise ValueError(f"triton_dist {op}: {tokens} tokens, the context takes at most {self.max_tokens}; create "
                             "an EPContext with a larger max_tokens")
        if not isinstance(topk_idx, torch.Tensor) or tuple(topk_idx.shape) != (tokens, self.topk) or \
                topk_idx.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"triton_dist {op}: topk_idx must be [{tokens}, {self.topk}] int32 or int64, got "
                             f"{_describe(topk_idx)}")
        if not isinstance(topk_weights, torch.Tensor) or tuple(topk_weights.shape) != (tokens, self.topk) or \
                topk_weights.dtype != torch.float32:
            raise ValueError(f"triton_dist {op}: topk_weights must be [{tokens}, {self.topk}] float32, got "
                             f"{_describe(topk_weights)}")
        for name, t in (("x", x), ("topk_idx", topk_idx), ("topk_weights", topk_weights)):
            if t.device != device:
                raise ValueError(f"triton_dist {op}: {name} is on {t.device}, the context on {device}")
            if not t.is_contiguous():
                raise ValueError(f"triton_dist {op}: {name} must be contiguous; pass {name}.contiguous()")
        return tokens

    def _check_handle(self, op: str, handle) -> None:
        if not isinstance(handle, EPHandle):
            raise TypeError(f"triton_dist {op}: handle must be the EPHandle of a dispatch, got {type(handle).__name__}")
        if handle.context is not self:
            raise ValueError(f"triton_dist {op}: the handle comes from another EPContext")


def _aligned(t):
    """``t``, or a 16-byte aligned copy of it."""
    return t if t.data_ptr() % 16 == 0 else t.clone()


def _describe(t) -> str:
    import torch

    if not isinstance(t, torch.Tensor):
        return type(t).__name__
    return f"{list(t.shape)} {t.dtype} on {t.device}{'' if t.is_contiguous() else ' (not contiguous)'}"
