"""Compile kernels for Hopper without a GPU and read what came out.

Triton compiles for a target given explicitly without loading libcuda, so CI (no GPU) proves
that every kernel builds for sm_90 and carries the instructions the memory model needs.
"""

from __future__ import annotations

import re

import triton
from triton.backends.compiler import GPUTarget

from ..distributed_jit import DistributedKernel, extern_libs

HOPPER = GPUTarget("cuda", 90, 32)


def compile_for_hopper(kernel, signature: dict, constexprs: dict | None = None, *, aligned: bool = True,
                       **options):
    """Compile ``kernel`` (triton.jit or triton_dist.jit) for sm_90; returns Triton's CompiledKernel.

    ``signature`` maps each non-constexpr parameter to a Triton type string (``"*fp32"``, ``"i64"``).
    ``aligned`` marks every pointer parameter 16-byte aligned, as a launch with torch tensors does
    (without it Triton can neither vectorise nor software-pipeline loads).
    """
    fn = kernel
    if isinstance(kernel, DistributedKernel):
        fn = kernel.fn
        options.setdefault("extern_libs", extern_libs())
    constexprs = dict(constexprs or {})
    for name in constexprs:
        signature.setdefault(name, "constexpr")
    attrs = {(fn.arg_names.index(name), ): [["tt.divisibility", 16]]
             for name, kind in signature.items() if aligned and kind.startswith("*")}
    source = triton.compiler.ASTSource(fn=fn, signature=signature,
                                       constexprs={(fn.arg_names.index(k), ): v for k, v in constexprs.items()},
                                       attrs=attrs)
    return triton.compile(source, target=HOPPER, options=options)


# The claim, fence and publish of the report a timed-out wait files (language/support_library.py),
# inlined at every wait that can time out.
_WAIT_TIMEOUT_REPORT = re.compile(
    r"^[ \t]*(atom\.sys\.global\.cas\.b32|fence\.sc\.sys;|st\.release\.sys\.global\.u32)[^\n]*\n", re.M)


def without_wait_timeout_report(ptx: str) -> str:
    """``ptx`` without the atomic, fence and release store of the timeout report of its waits, for
    tests that ask which atomics and fences a kernel's own protocol uses."""
    return _WAIT_TIMEOUT_REPORT.sub("", ptx)


# The ticket of call_counter.enter_call: the count of programs that entered a one-kernel call and
# its reset (64-bit, GPU scope), once per program.
_CALL_ENTRY = re.compile(
    r"^[ \t]*(@%p\d+ )?atom\.global\.gpu\.(acq_rel\.add\.u64|relaxed\.exch\.b64)[^\n]*\n", re.M)


def without_call_entry(ptx: str) -> str:
    """``ptx`` without the two atomics of :func:`~triton_dist.kernels.common.call_counter.enter_call`
    (a kernel that is its call advances the call counter), for tests that ask which atomics a
    kernel's own protocol uses; raises if they are not there exactly once each."""
    found = sorted(m.group(2) for m in _CALL_ENTRY.finditer(ptx))
    if found != ["acq_rel.add.u64", "relaxed.exch.b64"]:
        raise AssertionError(f"expected enter_call's two atomics once each, found {found}")
    return _CALL_ENTRY.sub("", ptx)


def _ptxas_report(ptx: str) -> str:
    """What the ptxas that Triton ships prints with ``-v`` for ``ptx`` on sm_90a."""
    import os
    import subprocess
    import tempfile

    from triton.backends.nvidia import compiler as nvidia

    ptxas = nvidia.get_ptxas(HOPPER.arch).path
    with tempfile.TemporaryDirectory() as tmp:
        source = os.path.join(tmp, "kernel.ptx")
        with open(source, "w") as f:
            f.write(ptx)
        run = subprocess.run([ptxas, "-arch=sm_90a", "-v", source, "-o", os.path.join(tmp, "kernel.cubin")],
                             capture_output=True, text=True, check=True)
    return run.stdout + run.stderr


def wgmma_serialized(ptx: str) -> bool:
    """Whether ptxas serialises the wgmma instructions of ``ptx`` (its warning C7510: a function
    call in the kernel, for one, makes every wgmma wait for the previous one)."""
    return "C7510" in _ptxas_report(ptx)


def spill_bytes(ptx: str) -> tuple[int, int]:
    """``(spill stores, spill loads)`` in bytes per thread that ptxas reports for ``ptx`` (the
    largest over the module's functions)."""
    import re

    report = _ptxas_report(ptx)
    found = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report)
    if not found:
        raise RuntimeError(f"ptxas -v printed no spill line:\n{report}")
    return max(int(a) for a, _ in found), max(int(b) for _, b in found)


def ptx_calls(ptx: str) -> list[str]:
    """Names of the functions a PTX module calls."""
    return re.findall(r"call(?:\.uni)?\s+(?:\([^)]*\),\s*)?([A-Za-z_$][\w$]*)", ptx)


def put_signal_paths(ptx: str) -> int:
    """How many calls of NVSHMEM's put-with-signal transfer path a PTX module makes: one per
    ``putmem_signal`` call site that may cross nodes (the P2P branch inlines its stores)."""
    return sum("nvshmemi_transfer_put_signal" in c for c in ptx_calls(ptx))


_DEFINITION = re.compile(r"^\s*(%[\w.]+)(?::\d+)?\s*=\s*(.*)$")
_REGION_OPS = re.compile(r"^(scf\.if|scf\.for|scf\.while)\b")
_QUOTED = re.compile(r'"(?:[^"\\]|\\.)*"')


def _definitions(ir: str) -> dict[str, tuple[str, int]]:
    """SSA name -> (its op's text after ``=``, the line it is on)."""
    defs = {}
    for i, line in enumerate(ir.splitlines()):
        match = _DEFINITION.match(line)
        if match:
            defs[match.group(1)] = (match.group(2), i)
    return defs


def _refs(text: str) -> list[tuple[str, int | None]]:
    """The SSA operands of an op's text, each with the result index it names (``%5#1``) or None."""
    # Drop the location and the attribute dictionary's strings so asm text is not read as operands.
    text = _QUOTED.sub('""', text.split(" loc(")[0])
    return [(m.group(1), int(m.group(2)) if m.group(2) else None) for m in re.finditer(r"(%[\w.]+)(?:#(\d+))?", text)]


def _operands(text: str) -> list[str]:
    return [name for name, _ in _refs(text)]


def _region_yields(lines: list[str], start: int) -> list[list[tuple[str, int | None]]]:
    """The operands of each ``scf.yield`` (or ``scf.condition``) directly inside the regions of the
    region op on line ``start`` (an ``scf.if``, ``scf.for`` or ``scf.while``)."""
    yields, depth = [], 0
    for line in lines[start:]:
        code = _QUOTED.sub('""', line.split(" loc(")[0])
        if depth == 1 and re.match(r"^\s*(scf\.yield|scf\.condition)\b", code):
            refs = _refs(code.split(":")[0])
            yields.append(refs[1:] if "scf.condition" in code else refs)  # a condition's first is the test
        depth += code.count("{") - code.count("}")
        if depth <= 0 and line is not lines[start]:
            break
    return yields


def ancestors(ir: str, value: str) -> set[str]:
    """Every SSA value that ``value`` is computed from in Triton IR text (TTIR or TTGIR), following
    operands within the function and the results of ``scf.if`` / ``scf.for`` / ``scf.while`` into
    what their regions yield (result ``i`` from each region's ``i``-th yielded value); block
    arguments (a loop's iteration values) end the walk."""
    return _walk(ir, [(value, None)]) - {value}


def _walk(ir: str, start: list[tuple[str, int | None]]) -> set[str]:
    """The names reached from ``start`` (``(name, result index)`` pairs) by :func:`ancestors`' rules,
    the start included."""
    lines = ir.splitlines()
    defs, seen, todo = _definitions(ir), set(), list(start)
    while todo:
        name, index = todo.pop()
        if (name, index) in seen:
            continue
        seen.add((name, index))
        text, line = defs.get(name, ("", -1))
        todo.extend(_refs(text.split("{")[0] if _REGION_OPS.match(text) else text))
        if line >= 0 and _REGION_OPS.match(text):
            for yielded in _region_yields(lines, line):
                picked = yielded if index is None else yielded[index:index + 1]
                todo.extend(picked)
    return {name for name, _ in seen}


def ops_matching(ir: str, pattern: str) -> list[str]:
    """The text of every op (with or without results) that matches the regex ``pattern``."""
    return [line.strip() for line in ir.splitlines() if re.search(pattern, line)]


def depends_on(ir: str, op: str, values: set[str]) -> bool:
    """Whether the op whose text is ``op`` is computed from any of ``values`` (SSA names)."""
    text = _DEFINITION.match(op).group(2) if _DEFINITION.match(op) else op
    return bool(_walk(ir, _refs(text)) & values)


def results(ops: list[str]) -> set[str]:
    """The SSA names the given ops define."""
    return {m.group(1) for m in map(_DEFINITION.match, ops) if m}


def ticket_order_problems(compiled) -> list[str]:
    """What breaks the order a ticket-reduced kernel needs (the split-K and wave-tail GEMMs): its one
    fp32 partial store, then a CTA barrier and one acq_rel add at GPU scope (the ticket,
    :func:`~triton_dist.kernels.common.tickets.last_to_finish`); the relaxed reset and every fp32
    partial load only after it; in the PTX, those loads after the barrier that hands the add's
    result to the CTA, and none through the read-only (``.nc``) path, since they were just
    written. Empty when the order holds."""
    problems = []
    ttir = compiled.asm["ttir"].splitlines()
    ticket = [i for i, line in enumerate(ttir) if "tt.atomic_rmw add" in line]
    if len(ticket) != 1 or "acq_rel, gpu" not in ttir[ticket[0]]:
        return [f"expected one acq_rel GPU-scope ticket add, found {[ttir[i].strip() for i in ticket]}"]
    partial = [i for i, line in enumerate(ttir) if "tt.store" in line and "f32>>" in line]
    if len(partial) != 1 or partial[0] > ticket[0]:
        problems.append(f"expected one fp32 partial store before the ticket, at TTIR lines {partial}")
    else:
        between = [line for line in ttir[partial[0]:ticket[0]] if re.search(r"gpu\.barrier|tt\.store|tt\.atomic", line)]
        if "gpu.barrier" not in between[-1]:
            problems.append(f"no CTA barrier between the partial store and the ticket: {between[-1].strip()}")
    loads = [i for i, line in enumerate(ttir) if "tt.load" in line and "f32>>" in line]
    if not loads or min(loads) < ticket[0]:
        problems.append(f"fp32 partial loads {loads} not all after the ticket (line {ticket[0]})")
    elif not any("tt.atomic_rmw exch, relaxed, gpu" in line for line in ttir[ticket[0]:min(loads)]):
        problems.append("no relaxed reset of the ticket between the add and the partial loads")
    ptx = compiled.asm["ptx"].splitlines()
    add = [i for i, line in enumerate(ptx) if "atom.global.gpu.acq_rel.add" in line]
    if len(add) != 1:
        return problems + [f"expected one atom.global.gpu.acq_rel.add in the PTX, found {len(add)}"]
    after = next(i for i in range(add[0], len(ptx)) if "bar.sync" in ptx[i])
    partial_loads = [i for i, line in enumerate(ptx) if re.search(r"ld\.global(\.v4)?\.b32", line)]
    if not partial_loads or min(partial_loads) < after:
        problems.append(f"PTX partial loads {partial_loads} not all after the barrier at line {after}")
    if any(".nc" in ptx[i] for i in partial_loads):
        problems.append("a partial load goes through the read-only path (.nc)")
    return problems
