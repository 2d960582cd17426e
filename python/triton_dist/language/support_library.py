"""The small LLVM library every ``triton_dist.jit`` kernel links besides NVSHMEM's.

It holds what inline PTX cannot: the report of a timed-out wait, which needs a global variable
(``triton_dist_wait_report``: the device address of the runtime's report record, written into
every module Triton loads by ``initialize_module``; see csrc/include/tdist/wait_timeout_report.h).
The first timed-out thread of the process claims the record, writes rank, signal, expected and
observed values into it (pinned host memory, mapped), publishes it, lingers 100 ms so the host's
watcher prints it, and traps. No function call: ``vprintf`` is one, and ptxas serialises every
wgmma of a kernel that contains a call (C7510), which cost the waiting GEMMs 15-20 % of their time
(measured on H200, AllGather+GEMM consumer: 2872 us against 2426 us for the plain GEMM).

It also carries the language settings that change generated code (the default wait timeout,
debug barriers, and the ranks per node that ``dl.rank(axis)`` divides by) in its file name and
contents. Triton keys its in-memory kernel cache on the
``extern_libs`` paths and its on-disk cache on their contents, so a kernel compiled under one
setting is never reused under another. Written as textual IR, so no LLVM newer than Triton's
ever touches it.
"""

from __future__ import annotations

import functools
import hashlib
import os
import tempfile

from .. import config as _config

NAME = "triton_dist_language"
WAIT_TIMED_OUT = "triton_dist_wait_timed_out"
REPORT_SYMBOL = "triton_dist_wait_report"
"""The global holding the report record's device address (0 in a module nobody initialised)."""

_LINGER_MS = 100  # the host polls every 10 ms (wait_timeout_report.cc)


def _source(wait_timeout_ns: int, debug_barriers: bool, local_world_size: int) -> str:
    # Record layout (WaitTimeoutRecord): u32 claimed @0, u32 published @4, i32 rank @8,
    # i32 signal index @12, u64 signal address @16, expected @24, observed @32, waited ns @40,
    # u32 comparison @48 (0: >=, 1: ==).
    return f"""; triton_dist language support library
; settings: wait_timeout_ns={wait_timeout_ns} debug_barriers={int(debug_barriers)} local_world_size={local_world_size}
; language sources: {_language_fingerprint()}
target datalayout = "e-p3:32:32-p4:32:32-p5:32:32-p6:32:32-p7:32:32-i64:64-i128:128-i256:256-v16:16-v32:32-n16:32:64"
target triple = "nvptx64-nvidia-cuda"

; Externally initialised: the runtime writes it after the module loads, so the 0 here must never
; be folded into the code.
@{REPORT_SYMBOL} = addrspace(1) externally_initialized global i64 0, align 8

declare i32 @llvm.nvvm.read.ptx.sreg.tid.x()
declare i32 @llvm.nvvm.read.ptx.sreg.tid.y()
declare i32 @llvm.nvvm.read.ptx.sreg.tid.z()
declare void @llvm.nvvm.nanosleep(i32)
declare void @llvm.trap()

; Called by every thread whose wait expired. Thread (0,0,0) of the first program to get here
; claims and fills the record; every thread then lingers before trapping, because a trap ends the
; whole grid and the host must read the record first.
define i32 @{WAIT_TIMED_OUT}(i32 %rank, i32 %index, i64 %address, i64 %expected, i64 %observed, i64 %waited_ns, i32 %cmp) {{
entry:
  %x = call i32 @llvm.nvvm.read.ptx.sreg.tid.x()
  %y = call i32 @llvm.nvvm.read.ptx.sreg.tid.y()
  %z = call i32 @llvm.nvvm.read.ptx.sreg.tid.z()
  %xy = or i32 %x, %y
  %xyz = or i32 %xy, %z
  %first = icmp eq i32 %xyz, 0
  %record = load volatile i64, ptr addrspace(1) @{REPORT_SYMBOL}, align 8
  %installed = icmp ne i64 %record, 0
  %reports = and i1 %first, %installed
  br i1 %reports, label %claim, label %linger

claim:
  %won = call i32 asm sideeffect "atom.sys.global.cas.b32 $0, [$1], 0, 1;", "=r,l,~{{memory}}"(i64 %record)
  %mine = icmp eq i32 %won, 0
  br i1 %mine, label %fill, label %linger

fill:
  %p_rank = add i64 %record, 8
  %p_index = add i64 %record, 12
  %p_address = add i64 %record, 16
  %p_expected = add i64 %record, 24
  %p_observed = add i64 %record, 32
  %p_waited = add i64 %record, 40
  %p_cmp = add i64 %record, 48
  %q_rank = inttoptr i64 %p_rank to ptr addrspace(1)
  %q_index = inttoptr i64 %p_index to ptr addrspace(1)
  %q_address = inttoptr i64 %p_address to ptr addrspace(1)
  %q_expected = inttoptr i64 %p_expected to ptr addrspace(1)
  %q_observed = inttoptr i64 %p_observed to ptr addrspace(1)
  %q_waited = inttoptr i64 %p_waited to ptr addrspace(1)
  %q_cmp = inttoptr i64 %p_cmp to ptr addrspace(1)
  store volatile i32 %rank, ptr addrspace(1) %q_rank, align 4
  store volatile i32 %index, ptr addrspace(1) %q_index, align 4
  store volatile i64 %address, ptr addrspace(1) %q_address, align 8
  store volatile i64 %expected, ptr addrspace(1) %q_expected, align 8
  store volatile i64 %observed, ptr addrspace(1) %q_observed, align 8
  store volatile i64 %waited_ns, ptr addrspace(1) %q_waited, align 8
  store volatile i32 %cmp, ptr addrspace(1) %q_cmp, align 4
  ; The fields reach the host before the flag that the host acquires.
  call void asm sideeffect "fence.sc.sys;", "~{{memory}}"()
  %p_published = add i64 %record, 4
  call void asm sideeffect "st.release.sys.global.u32 [$0], 1;", "l,~{{memory}}"(i64 %p_published)
  br label %linger

linger:
  ; Timed by %globaltimer: nanosleep only promises a sleep between 0 and twice its argument.
  %since = call i64 asm sideeffect "mov.u64 $0, %globaltimer;", "=l"()
  br label %sleep

sleep:
  call void @llvm.nvvm.nanosleep(i32 1000000)
  %now = call i64 asm sideeffect "mov.u64 $0, %globaltimer;", "=l"()
  %slept = sub i64 %now, %since
  %done = icmp uge i64 %slept, {_LINGER_MS * 1_000_000}
  br i1 %done, label %trap, label %sleep, !llvm.loop !0

trap:
  call void @llvm.trap()
  unreachable
}}

; A loop of nanosleeps, never unrolled.
!0 = distinct !{{!0, !1}}
!1 = !{{!"llvm.loop.unroll.disable"}}
"""


@functools.lru_cache(maxsize=1)
def _language_fingerprint() -> str:
    """A hash of the language's sources. Triton's cache key covers a kernel's own source and the
    jit functions it calls, not builtins such as ``dl.simt``'s, so a kernel compiled before the
    language changed would be reused. The contents of every ``extern_libs`` file are part of the
    key, so this library carries the hash, and a change of the language recompiles."""
    here = os.path.dirname(os.path.abspath(__file__))
    digest = hashlib.sha256()
    for name in sorted(f for f in os.listdir(here) if f.endswith(".py")):
        with open(os.path.join(here, name), "rb") as f:
            digest.update(name.encode() + b"\0" + f.read())
    return digest.hexdigest()[:16]


@functools.lru_cache(maxsize=None)
def _write(wait_timeout_ns: int, debug_barriers: bool, local_world_size: int) -> str:
    root = os.path.join(os.environ.get("TRITON_CACHE_DIR") or os.path.expanduser("~/.triton/cache"), "triton_dist")
    os.makedirs(root, exist_ok=True)
    path = os.path.join(root, f"{NAME}-t{wait_timeout_ns}-d{int(debug_barriers)}-l{local_world_size}.ll")
    source = _source(wait_timeout_ns, debug_barriers, local_world_size)
    try:
        with open(path) as f:
            if f.read() == source:
                return path
    except OSError:
        pass
    # Ranks of one host write the same file at once: write aside, then rename atomically.
    fd, tmp = tempfile.mkstemp(dir=root, suffix=".ll.tmp")
    with os.fdopen(fd, "w") as f:
        f.write(source)
    os.replace(tmp, path)
    return path


def local_world_size() -> int:
    """Ranks per node as kernels see them: the runtime's (discovered or declared) once initialised,
    else the declared ``TRITON_DIST_LOCAL_WORLD_SIZE``, else 0 (unknown)."""
    from .. import runtime

    if runtime.is_initialized():
        return runtime.local_world_size()
    return _config.get().local_world_size


def settings() -> dict:
    """The language settings in force that the library carries (and so every kernel's cache key):
    ``wait_timeout_ns``, ``debug_barriers``, ``local_world_size``."""
    cfg = _config.get()
    return dict(wait_timeout_ns=cfg.wait_timeout_ns, debug_barriers=cfg.debug_barriers,
                local_world_size=local_world_size())


def path() -> str:
    """The support library for the settings in force (written on first use)."""
    return _write(**settings())
