"""tdist/device.cuh compiles with nvcc (sm_90, and sm_80) into the PTX the signalling model needs:
acquire spins with a clock read only after a failed load, release atomics at sys scope behind a
CTA barrier, and every (scope, semantic) combination of ld/st/fence/atomics."""

import itertools
import os
import re
import shutil
import subprocess

import pytest

_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
_INCLUDE = os.path.join(_ROOT, "csrc", "include")
_KERNELS = os.path.join(_ROOT, "tests", "gpu", "cuda", "device_primitives.cu")

_SCOPES = ("cta", "gpu", "sys")
_LOADS = ("relaxed", "acquire", "volatile_")
_STORES = ("relaxed", "release", "volatile_")
_ATOMICS = ("relaxed", "acquire", "release", "acq_rel")


def _nvcc():
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    candidate = os.path.join(home, "bin", "nvcc")
    return candidate if os.access(candidate, os.X_OK) else shutil.which("nvcc")


@pytest.fixture(scope="module")
def nvcc():
    path = _nvcc()
    if path is None:
        pytest.skip("nvcc not found (set CUDA_HOME or put nvcc on PATH): cannot compile device.cuh")
    return path


def _compile(nvcc, source, out, arch="sm_90", mode="-ptx"):
    cmd = [nvcc, f"-arch={arch}", "-O3", "-std=c++17", mode, "-I", _INCLUDE, source, "-o", out]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stdout}{proc.stderr}"
    with open(out, errors="replace") as f:
        return f.read() if mode == "-ptx" else ""


def _functions(ptx: str) -> dict[str, list[str]]:
    """Kernel name (demangled enough to search) -> its PTX lines."""
    out, name = {}, None
    for line in ptx.splitlines():
        m = re.match(r"\s*(?:\.visible\s+)?\.(?:entry|func)\s+(?:\([^)]*\)\s*)?(\w+)", line)
        if m:
            name = m.group(1)
            out[name] = []
        if name is not None:
            out[name].append(line)
    return out


def _kernel(functions, short: str) -> list[str]:
    hits = [lines for name, lines in functions.items() if short in name and "entry" in lines[0]]
    assert len(hits) == 1, f"kernel {short!r} not found once among {list(functions)}"
    return hits[0]


@pytest.fixture(scope="module")
def kernels_ptx(nvcc, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("ptx") / "device_primitives.ptx")
    return _functions(_compile(nvcc, _KERNELS, out))


def test_wait_spins_with_acquire_and_reads_the_clock_only_after_a_failed_load(kernels_ptx):
    lines = _kernel(kernels_ptx, "wait_forever")
    spins = [i for i, line in enumerate(lines) if "ld.acquire.sys.global.u64" in line]
    clocks = [i for i, line in enumerate(lines) if "%globaltimer" in line]
    assert spins and clocks
    assert spins[0] < clocks[0], "the fast path must be one acquire load, before any clock read"
    assert any("trap" in line for line in lines) or any("call" in line for line in lines)


def test_wait_block_spins_then_barriers(kernels_ptx):
    lines = _kernel(kernels_ptx, "consume_tiles")
    spin = next(i for i, line in enumerate(lines) if "ld.acquire.sys.global.u64" in line)
    assert any("bar.sync" in line for line in lines[spin:]), "wait_block needs a CTA barrier after the spin"
    assert any("%globaltimer" in line for line in lines)


def test_notify_block_barriers_then_releases_at_sys_scope(kernels_ptx):
    lines = _kernel(kernels_ptx, "produce_tiles")
    atoms = [i for i, line in enumerate(lines) if re.search(r"atom\.release\.(sys|gpu)\.global\.exch\.b64", line)]
    assert any("atom.release.sys.global.exch.b64" in lines[i] for i in atoms), "notify to a peer: sys scope"
    assert any("atom.release.gpu.global.exch.b64" in lines[i] for i in atoms), "notify to self: gpu scope"
    barrier = next(i for i, line in enumerate(lines) if "bar.sync" in line)
    assert barrier < min(atoms), "notify_block must barrier before the release atomic"
    assert any("st.relaxed.sys.global.b64" in line for line in lines)


def test_ping_pong_uses_thread_level_wait_and_notify(kernels_ptx):
    lines = _kernel(kernels_ptx, "ping_pong")
    assert any("ld.acquire.sys.global.u64" in line for line in lines)
    assert any("atom.release.sys.global.exch.b64" in line for line in lines)
    assert not any("bar.sync" in line for line in lines), "thread-level wait/notify take no barrier"


def _all_combinations_source() -> str:
    body = []
    for scope, sem in itertools.product(_SCOPES, _LOADS):
        for t in ("uint32_t", "uint64_t"):
            body.append(f"acc += (uint64_t)ld<Scope::{scope}, Semantic::{sem}>(({t}*)p);")
    for scope, sem in itertools.product(_SCOPES, _STORES):
        for t in ("uint32_t", "uint64_t"):
            body.append(f"st<Scope::{scope}, Semantic::{sem}>(({t}*)p, ({t})acc);")
    for scope, sem in itertools.product(_SCOPES, _ATOMICS):
        for t in ("uint32_t", "uint64_t"):
            body.append(f"acc += (uint64_t)atomic_add<Scope::{scope}, Semantic::{sem}>(({t}*)p, ({t})acc);")
            body.append(f"acc += (uint64_t)atomic_xchg<Scope::{scope}, Semantic::{sem}>(({t}*)p, ({t})acc);")
            body.append(f"acc += (uint64_t)atomic_cas<Scope::{scope}, Semantic::{sem}>(({t}*)p, ({t})1, ({t})acc);")
    for scope in _SCOPES:
        body.append(f"fence<Scope::{scope}>();")
    body.append("acc += (uint64_t)ld<Scope::sys, Semantic::relaxed>((float*)p);")
    body.append("st<Scope::gpu, Semantic::release>((double*)p, (double)acc);")
    body.append("acc += tid() + laneid(); cta_barrier();")
    body.append("acc += rank(map) + num_ranks(map) + *symm_at(p, 1, map);")
    body.append("wait_block(p, 2, acc, Scope::gpu, 0, map); notify_block(p, 1, acc, SignalOp::add, map);")
    return ("#include <cstdint>\n#include \"tdist/device.cuh\"\nusing namespace tdist::device;\n"
            "__global__ void all_combinations(uint64_t* p, uint64_t* out, SymmetricMap map) {\n"
            "  uint64_t acc = 0;\n  " + "\n  ".join(body) + "\n  *out = acc;\n}\n")


@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
def test_every_scope_and_semantic_compiles_to_its_instruction(nvcc, tmp_path, arch):
    source = tmp_path / "all_combinations.cu"
    source.write_text(_all_combinations_source())
    ptx = _compile(nvcc, str(source), str(tmp_path / "all.ptx"), arch)
    # ptxas must accept every instruction, not only the front end.
    _compile(nvcc, str(source), str(tmp_path / "all.cubin"), arch, mode="-cubin")
    missing = []
    for scope in _SCOPES:
        for sem in _LOADS:
            qual = "volatile" if sem == "volatile_" else f"{sem}.{scope}"
            missing += [f"ld.{qual}.global.b{b}" for b in (32, 64) if f"ld.{qual}.global.b{b}" not in ptx]
        for sem in _STORES:
            qual = "volatile" if sem == "volatile_" else f"{sem}.{scope}"
            missing += [f"st.{qual}.global.b{b}" for b in (32, 64) if f"st.{qual}.global.b{b}" not in ptx]
        for sem in _ATOMICS:
            for op in ("add.u32", "add.u64", "exch.b32", "exch.b64", "cas.b32", "cas.b64"):
                instr = f"atom.{sem}.{scope}.global.{op}"
                if instr not in ptx:
                    missing.append(instr)
        if f"fence.acq_rel.{scope}" not in ptx:
            missing.append(f"fence.acq_rel.{scope}")
    assert not missing, f"not in the PTX: {missing}"
    assert "ld.acquire.gpu.global.u64" in ptx  # wait_block's spin at the requested scope
    assert "atom.release.sys.global.add.u64" in ptx  # notify_block with SignalOp::add to a peer


def test_misused_semantics_are_compile_errors(nvcc, tmp_path):
    source = tmp_path / "bad.cu"
    source.write_text("#include <cstdint>\n#include \"tdist/device.cuh\"\nusing namespace tdist::device;\n"
                      "__global__ void bad(uint64_t* p) { st<Scope::sys, Semantic::acquire>(p, (uint64_t)1); }\n")
    cmd = [nvcc, "-arch=sm_90", "-std=c++17", "-ptx", "-I", _INCLUDE, str(source), "-o", str(tmp_path / "bad.ptx")]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode != 0 and "st: semantic must be relaxed, release or volatile_" in proc.stderr


def test_host_map_matches_the_device_layout():
    import ctypes

    from triton_dist.device_map import MAX_RANKS, SymmetricMap, symmetric_map_bytes

    assert MAX_RANKS == 64 and ctypes.sizeof(SymmetricMap) == 520
    assert SymmetricMap.rank.offset == 512 and SymmetricMap.world_size.offset == 516
    with pytest.raises(RuntimeError, match="not initialised"):
        symmetric_map_bytes()
