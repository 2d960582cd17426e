"""The small LLVM library every ``triton_dist.jit`` kernel links besides NVSHMEM's.

It holds what inline PTX cannot: the report a timed-out wait prints before it traps (``vprintf``
needs a format string in global memory, which an asm statement inside a function cannot declare).

It also carries the language settings that change generated code (the default wait timeout and
debug barriers) in its file name and contents. Triton keys its in-memory kernel cache on the
``extern_libs`` paths and its on-disk cache on their contents, so a kernel compiled under one
setting is never reused under another. Written as textual IR, so no LLVM newer than Triton's
ever touches it.
"""

from __future__ import annotations

import functools
import os
import tempfile

from .. import config as _config

NAME = "triton_dist_language"
WAIT_TIMED_OUT = "triton_dist_wait_timed_out"

_MESSAGE = ("triton_dist: rank %d: wait timed out after %llu ns on signal %d at %p: "
            "expected >= %llu, observed %llu\n")


def _c_string(text: str) -> tuple[str, int]:
    data = text.encode() + b"\0"
    return "".join(chr(b) if 32 <= b < 127 and b not in (34, 92) else f"\\{b:02X}" for b in data), len(data)


def _source(wait_timeout_ns: int, debug_barriers: bool) -> str:
    message, length = _c_string(_MESSAGE)
    # vprintf takes a packed argument buffer with each value at its natural alignment, which is
    # exactly an LLVM struct of the argument types in format order.
    return f"""; triton_dist language support library
; settings: wait_timeout_ns={wait_timeout_ns} debug_barriers={int(debug_barriers)}
target datalayout = "e-p3:32:32-p4:32:32-p5:32:32-p6:32:32-p7:32:32-i64:64-i128:128-i256:256-v16:16-v32:32-n16:32:64"
target triple = "nvptx64-nvidia-cuda"

@message = private unnamed_addr addrspace(1) constant [{length} x i8] c"{message}", align 1

declare i32 @vprintf(ptr, ptr)
declare i32 @llvm.nvvm.read.ptx.sreg.tid.x()
declare i32 @llvm.nvvm.read.ptx.sreg.tid.y()
declare i32 @llvm.nvvm.read.ptx.sreg.tid.z()
declare void @llvm.nvvm.nanosleep(i32)
declare void @llvm.trap()

; Called by every thread whose wait expired. Thread (0,0,0) prints; the others give it a moment to
; reach the printf buffer before anyone traps, because a trap ends the whole grid.
define i32 @{WAIT_TIMED_OUT}(i32 %rank, i32 %index, i64 %address, i64 %expected, i64 %observed, i64 %waited_ns) {{
entry:
  %x = call i32 @llvm.nvvm.read.ptx.sreg.tid.x()
  %y = call i32 @llvm.nvvm.read.ptx.sreg.tid.y()
  %z = call i32 @llvm.nvvm.read.ptx.sreg.tid.z()
  %xy = or i32 %x, %y
  %xyz = or i32 %xy, %z
  %first = icmp eq i32 %xyz, 0
  br i1 %first, label %report, label %linger

report:
  %args = alloca {{ i32, i64, i32, i64, i64, i64 }}, align 8
  %a0 = getelementptr inbounds {{ i32, i64, i32, i64, i64, i64 }}, ptr %args, i32 0, i32 0
  store i32 %rank, ptr %a0, align 4
  %a1 = getelementptr inbounds {{ i32, i64, i32, i64, i64, i64 }}, ptr %args, i32 0, i32 1
  store i64 %waited_ns, ptr %a1, align 8
  %a2 = getelementptr inbounds {{ i32, i64, i32, i64, i64, i64 }}, ptr %args, i32 0, i32 2
  store i32 %index, ptr %a2, align 4
  %a3 = getelementptr inbounds {{ i32, i64, i32, i64, i64, i64 }}, ptr %args, i32 0, i32 3
  store i64 %address, ptr %a3, align 8
  %a4 = getelementptr inbounds {{ i32, i64, i32, i64, i64, i64 }}, ptr %args, i32 0, i32 4
  store i64 %expected, ptr %a4, align 8
  %a5 = getelementptr inbounds {{ i32, i64, i32, i64, i64, i64 }}, ptr %args, i32 0, i32 5
  store i64 %observed, ptr %a5, align 8
  %fmt = addrspacecast ptr addrspace(1) @message to ptr
  %printed = call i32 @vprintf(ptr %fmt, ptr %args)
  br label %trap

linger:
  call void @llvm.nvvm.nanosleep(i32 1000000)
  call void @llvm.nvvm.nanosleep(i32 1000000)
  br label %trap

trap:
  call void @llvm.trap()
  unreachable
}}
"""


@functools.lru_cache(maxsize=None)
def _write(wait_timeout_ns: int, debug_barriers: bool) -> str:
    root = os.path.join(os.environ.get("TRITON_CACHE_DIR") or os.path.expanduser("~/.triton/cache"), "triton_dist")
    os.makedirs(root, exist_ok=True)
    path = os.path.join(root, f"{NAME}-t{wait_timeout_ns}-d{int(debug_barriers)}.ll")
    source = _source(wait_timeout_ns, debug_barriers)
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


def path() -> str:
    """The support library for the settings in force (written on first use)."""
    cfg = _config.get()
    return _write(cfg.wait_timeout_ns, cfg.debug_barriers)
