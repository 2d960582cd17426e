"""The prebuilt set without a GPU (issue 21): a library kernel's variant written as a JSON line and
compiled by ``python -m triton_dist.prebuilt_cache`` into a directory is found there, through the
layered cache manager, by a process whose own Triton cache is empty, and loads without compiling;
the manager otherwise is the user's file cache; a recorded variant comes back under the key Triton
gave it; bad lines are named."""

import json
import os
import subprocess
import sys
import types

import pytest
import triton
import triton.language as tl
from triton.backends.nvidia.compiler import CUDABackend
from triton.runtime.cache import FileCacheManager
from triton.runtime.jit import create_function_from_signature

from triton_dist import config, distributed_jit, parallel_compile, prebuilt_cache, variant_list
from triton_dist.kernels.common.rank_barrier import rank_barrier_kernel
from triton_dist.language import support_library
from triton_dist.tools import prebuild
from triton_dist.tools.compile_check import HOPPER



def _settings_in_force(**fields):
    """What init() would install on two ranks of a node (a new object: distributed_jit keys its
    libraries on the installed Config's identity)."""
    return config.Config(local_world_size=2, **fields)


class FakeTensor:
    """What Triton's binder reads of a tensor: a dtype and a 16-byte aligned address."""

    def __init__(self, dtype, address=1 << 20):
        self.dtype, self.address = dtype, address

    def data_ptr(self) -> int:
        return self.address


def _cpu_binder(monkeypatch, kernel):
    """Triton's JIT for ``kernel`` on an sm_90 target without a GPU: device 0, a fresh in-memory
    cache (so the JIT compiles or loads from disk)."""
    fn = kernel.fn
    backend = CUDABackend(HOPPER)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    monkeypatch.setitem(fn.device_caches, 0, ({}, {}, backend.target, backend, binder))
    return backend, binder


def _one_shot_variant(monkeypatch, world):
    """The one-shot AllReduce at ``world`` ranks, fp32, as the C++ prebuild describes it (the whole-GPU
    variant AllReduceContext preloads)."""
    kernel, args, kwargs = prebuild.VARIANTS["all_reduce_one_shot"](world, tl.float32)
    backend, binder = _cpu_binder(monkeypatch, kernel)
    return parallel_compile.bound_variant(kernel, args, kwargs, HOPPER, backend, binder)[0]


def _line(variant) -> str:
    recorded = variant_list.RecordedVariant(variant, ("libnvshmem_device", support_library.NAME),
                                            tuple(support_library.settings().items()), parallel_compile.cache_key(variant))
    return variant_list.to_line(recorded)


def _command(*args, cache_dir, **env):
    """``python -m triton_dist.prebuilt_cache ARGS`` in a process of its own, with its own Triton
    cache (the support library it links is written there: another path, the same content)."""
    env = dict(os.environ, TRITON_CACHE_DIR=str(cache_dir), PYTHONPATH=os.pathsep.join(p for p in sys.path if p),
               **env)
    env.pop("TRITON_CACHE_MANAGER", None)
    return subprocess.run([sys.executable, "-m", "triton_dist.prebuilt_cache", *args], capture_output=True,
                          text=True, env=env, timeout=300)


def _files_under(root) -> list:
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)


@pytest.fixture(autouse=True)
def _settings(monkeypatch, tmp_path, request):
    user_cache = tmp_path / "user-cache"
    user_cache.mkdir()
    monkeypatch.setenv("TRITON_CACHE_DIR", str(user_cache))
    monkeypatch.delenv("TRITON_CACHE_MANAGER", raising=False)
    monkeypatch.setattr(config, "_current", _settings_in_force())
    # The support library's file is written into the Triton cache in force, once per process.
    support_library._write.cache_clear()
    request.addfinalizer(support_library._write.cache_clear)
    request.addfinalizer(prebuilt_cache.uninstall)
    return user_cache


@pytest.fixture(scope="module")
def prebuilt(tmp_path_factory):
    """A prebuilt directory made by the command from a list holding one variant twice, and the line."""
    root = tmp_path_factory.mktemp("prebuilt")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRITON_CACHE_DIR", str(root / "scratch"))
        mp.setattr(config, "_current", _settings_in_force())
        support_library._write.cache_clear()
        line, line4 = _line(_one_shot_variant(mp, 2)), _line(_one_shot_variant(mp, 4))
        support_library._write.cache_clear()
    listing = root / "variants.jsonl"
    listing.write_text(f"# a comment\n{line}\n\n{line4}\n{line}\n")
    # Launchers link against libcuda.so.1: CUDA's stub stands in for the driver (loading them then
    # fails, after they were written, as it would not on a GPU machine).
    stub = "/usr/local/cuda/lib64/stubs/libcuda.so"
    env = {}
    if os.path.isfile(stub):
        (root / "driver").mkdir()
        os.symlink(stub, root / "driver" / "libcuda.so.1")
        env["TRITON_LIBCUDA_PATH"] = str(root / "driver")
    done = _command("--variants", str(listing), "--out", str(root / "cache"), "--workers", "2",
                    cache_dir=root / "builder-cache", **env)
    assert done.returncode == 0, done.stderr
    assert "2 variants in" in done.stdout and "2 compiled, 0 already there, 0 failed" in done.stdout
    if env:
        assert "with their launchers" in done.stdout
        built = [os.path.basename(f) for f in _files_under(root / "cache") if f.endswith(".so")]
        # One launcher: the two variants differ only in a constexpr, which launchers do not take.
        assert sorted(name.split(".")[0] for name in built) == ["__triton_launcher", "cuda_utils"], built
    return types.SimpleNamespace(dir=root / "cache", line=line, listing=listing, root=root)


def test_a_prebuilt_variant_is_found_and_loaded_without_compiling(prebuilt, monkeypatch, _settings):
    variant = variant_list.from_line(prebuilt.line).resolve(distributed_jit.extern_libs())
    assert not parallel_compile.is_cached(variant)  # the user's cache is empty, and no layer yet
    monkeypatch.setattr(config, "_current", _settings_in_force(prebuilt_cache_dir=str(prebuilt.dir)))
    assert prebuilt_cache.install() == str(prebuilt.dir)
    assert parallel_compile.is_cached(variant)

    def no_compiling(*args, **kwargs):
        raise AssertionError("the variant was compiled, not loaded from the prebuilt directory")

    monkeypatch.setattr(CUDABackend, "add_stages", no_compiling)
    before = _files_under(_settings)
    src, options = parallel_compile._source_and_options(variant)
    compiled = triton.compile(src, target=HOPPER, options=options)
    assert compiled.hash == parallel_compile.cache_key(variant)
    assert b"all_reduce_one_shot_kernel" in compiled.asm["cubin"]
    assert all(str(prebuilt.dir) in path for path in compiled.metadata_group.values())
    assert _files_under(_settings) == before  # a hit writes nothing into the user's cache
    prebuilt_cache.uninstall()
    assert triton.knobs.cache.manager_class is None and not parallel_compile.is_cached(variant)


def test_the_command_counts_what_is_already_there_and_names_what_fails(prebuilt, tmp_path):
    obj = json.loads(prebuilt.line)
    obj["module"] = "triton_dist.kernels.no_such_module"
    listing = tmp_path / "more.jsonl"
    listing.write_text(f"{prebuilt.line}\n{json.dumps(obj)}\n")
    done = _command("--variants", str(listing), "--out", str(prebuilt.dir), cache_dir=tmp_path / "builder")
    assert done.returncode == 1
    assert "2 variants in" in done.stdout and "0 compiled, 1 already there, 1 failed" in done.stdout
    assert "without their launchers (no libcuda.so.1 here" in done.stdout
    assert f"{listing}:2 triton_dist.kernels.no_such_module.all_reduce_one_shot_kernel" in done.stderr
    assert "No module named 'triton_dist.kernels.no_such_module'" in done.stderr


def test_merging_a_test_runs_recording_keeps_only_the_librarys_kernels(prebuilt, tmp_path):
    obj = json.loads(prebuilt.line)
    obj["module"] = "test_language"  # a GPU test file's own kernel, recorded alongside the library's
    listing = tmp_path / "recorded.jsonl"
    listing.write_text(f"{prebuilt.line}\n{json.dumps(obj)}\n")
    merged = tmp_path / "variants.jsonl"
    done = _command("--variants", str(listing), "--write-list", str(merged), "--library-only",
                    cache_dir=tmp_path / "builder")
    assert done.returncode == 0, done.stderr
    assert "left out 1 variants of kernels outside triton_dist" in done.stdout
    assert [r.variant.module for r in variant_list.read([merged])] == [json.loads(prebuilt.line)["module"]]


def test_a_listed_variant_compiles_with_the_jits_argument_order(monkeypatch):
    """A list's JSON sorts the signature's keys; Triton's launcher lays arguments out in signature
    order and is cached by its source, so a prebuilt launcher matches the JIT's only in its order."""
    variant = _one_shot_variant(monkeypatch, 2)
    listed = variant_list.from_line(_line(variant))
    assert list(listed.variant.signature) != list(variant.signature)  # what the JSON line does
    src, _ = parallel_compile._source_and_options(listed.resolve(distributed_jit.extern_libs()))
    assert list(src.signature) == list(variant.signature)


def test_a_malformed_line_is_named_with_its_file(tmp_path, prebuilt):
    listing = tmp_path / "broken.jsonl"
    listing.write_text(f"# recorded\n{prebuilt.line}\n{{\"module\": \"x\",\n")
    with pytest.raises(ValueError, match=rf"^{listing}:3: not a JSON line"):
        variant_list.read([listing])
    done = _command("--variants", str(listing), "--out", str(tmp_path / "out"), cache_dir=tmp_path / "builder")
    assert done.returncode == 2 and f"{listing}:3: not a JSON line" in done.stderr
    assert not (tmp_path / "out").exists()
    obj = json.loads(prebuilt.line)
    del obj["options"]
    with pytest.raises(ValueError, match=r"^f.jsonl:7: not a kernel variant .*missing field\(s\) options"):
        variant_list.from_line(json.dumps(obj), "f.jsonl:7")


def test_the_manager_falls_back_to_the_users_cache_and_writes_there(tmp_path, _settings):
    prebuilt_dir = tmp_path / "prebuilt"
    (prebuilt_dir / "KEYA").mkdir(parents=True)
    (prebuilt_dir / "KEYA" / "k.cubin").write_bytes(b"prebuilt")
    (prebuilt_dir / "KEYA" / "k.json").write_text("{}")
    # Written elsewhere (absolute paths of the machine that built it): found by name beside it.
    (prebuilt_dir / "KEYA" / "__grp__k.json").write_text(
        json.dumps({"child_paths": {"k.cubin": "/elsewhere/KEYA/k.cubin", "k.json": "/elsewhere/KEYA/k.json"}}))
    monkeypatch_dir = prebuilt_cache.PrebuiltFirstCacheManager.directory
    prebuilt_cache.PrebuiltFirstCacheManager.directory = str(prebuilt_dir)
    try:
        hit = prebuilt_cache.PrebuiltFirstCacheManager("KEYA")
        assert hit.get_file("k.cubin") == str(prebuilt_dir / "KEYA" / "k.cubin")
        assert hit.get_group("k.json") == {"k.cubin": str(prebuilt_dir / "KEYA" / "k.cubin"),
                                           "k.json": str(prebuilt_dir / "KEYA" / "k.json")}
        assert _files_under(_settings) == [] and os.listdir(_settings) == []  # not even the key's folder

        miss = prebuilt_cache.PrebuiltFirstCacheManager("KEYB")
        assert miss.get_file("k.cubin") is None and miss.get_group("k.json") is None
        path = miss.put(b"compiled", "k.cubin")
        assert path == str(_settings / "KEYB" / "k.cubin") and miss.get_file("k.cubin") == path
        miss.put_group("k.json", {"k.cubin": path})
        assert miss.get_group("k.json") == {"k.cubin": path}
        assert miss.cache_dir == str(_settings / "KEYB")  # what a FileCacheManager would say

        # A key present in both: the prebuilt copy; a write still goes to the user's cache.
        both = prebuilt_cache.PrebuiltFirstCacheManager("KEYA")
        assert both.put(b"new", "k.cubin") == str(_settings / "KEYA" / "k.cubin")
        assert both.get_file("k.cubin") == str(prebuilt_dir / "KEYA" / "k.cubin")
        # An incomplete prebuilt group is not used.
        (prebuilt_dir / "KEYA" / "k.json").unlink()
        assert both.get_group("k.json") is None
        # Dump and override managers are the user's alone.
        assert prebuilt_cache.PrebuiltFirstCacheManager("KEYA", override=True).get_file("k.cubin") is None
    finally:
        prebuilt_cache.PrebuiltFirstCacheManager.directory = monkeypatch_dir


def test_install_respects_a_users_manager_and_finalize_restores(tmp_path, monkeypatch):
    monkeypatch.setattr(config, "_current", config.Config(prebuilt_cache_dir=str(tmp_path / "absent")))
    assert prebuilt_cache.install() == "" and triton.knobs.cache.manager_class is None  # nothing prebuilt
    monkeypatch.setattr(config, "_current", config.Config(prebuilt_cache_dir=str(tmp_path)))
    monkeypatch.setenv("TRITON_CACHE_MANAGER", "triton.runtime.cache:FileCacheManager")
    assert prebuilt_cache.install() == "" and triton.knobs.cache.manager_class is FileCacheManager
    monkeypatch.delenv("TRITON_CACHE_MANAGER")
    assert prebuilt_cache.install() == str(tmp_path)
    assert triton.knobs.cache.manager_class is prebuilt_cache.PrebuiltFirstCacheManager
    prebuilt_cache.uninstall()
    assert triton.knobs.cache.manager_class is None and "TRITON_CACHE_MANAGER" not in os.environ
    # A manager Triton cannot import is the user's to fix at their first compile, as without us:
    # init() (which installs after the runtime is up) must neither import nor fail on it.
    monkeypatch.setenv("TRITON_CACHE_MANAGER", "no_such_module:Manager")
    assert prebuilt_cache.install() == ""
    prebuilt_cache.uninstall()


def test_recording_writes_each_variant_once_and_it_comes_back_under_its_key(monkeypatch, tmp_path, request):
    record = tmp_path / "recorded.jsonl"
    # Triton's JIT for an sm_90 device 0 without a GPU: it binds, compiles and returns the kernel.
    fn = rank_barrier_kernel.fn
    _cpu_binder(monkeypatch, rank_barrier_kernel)
    for name, value in (("ASTSource", triton.compiler.ASTSource), ("compile", triton.compile),
                        ("CompiledKernel", triton.compiler.CompiledKernel)):  # what the binder's maker sets
        monkeypatch.setattr(fn, name, value, raising=False)
    fake_driver = types.SimpleNamespace(get_current_device=lambda: 0, get_current_stream=lambda device: 0)
    monkeypatch.setattr(triton.runtime.driver, "_active", fake_driver)
    args = (FakeTensor(tl.uint64, 4096), FakeTensor(tl.int64, 8192))
    heard = []
    monkeypatch.setattr(triton.knobs.compilation, "listener", lambda **info: heard.append(info["cache_hit"]))
    variant_list.start_recording(str(record))
    request.addfinalizer(variant_list.stop_recording)
    compiled = {}
    for world in (2, 4, 2):  # the JIT compiles two variants; the third call finds the first in memory
        compiled[world] = rank_barrier_kernel.warmup(*args, grid=(1, ), PHASE=0, PHASES=1, WORLD=world, num_warps=1)
    fn.device_caches[0][0].clear()  # a new process: the same variant loaded from Triton's cache
    assert rank_barrier_kernel.warmup(*args, grid=(1, ), PHASE=0, PHASES=1, WORLD=2, num_warps=1).hash == compiled[2].hash
    assert heard == [False, False, True]  # the listener it replaced still hears every compile
    variant_list.stop_recording()
    assert heard and triton.knobs.compilation.listener is not None and not isinstance(
        triton.knobs.compilation.listener, variant_list._Recorder)
    lines = record.read_text().splitlines()
    assert len(lines) == 2
    for line, world in zip(lines, (2, 4)):
        recorded = variant_list.from_line(line, f"{record}:1")
        assert recorded.variant.name == "rank_barrier_kernel" and recorded.key == compiled[world].hash
        assert dict(recorded.settings)["local_world_size"] == 2 and "extern_libs" not in recorded.variant.options
        assert recorded.extern_libs == ("libnvshmem_device", support_library.NAME)
        variant = recorded.resolve(distributed_jit.extern_libs())
        assert parallel_compile.cache_key(variant) == compiled[world].hash
    assert [r.key for r in variant_list.read([record, record])] == [compiled[2].hash, compiled[4].hash]


def test_recording_is_off_by_default_and_skips_what_a_prebuild_cannot_import(tmp_path, monkeypatch):
    monkeypatch.delenv("TRITON_DIST_RECORD_VARIANTS", raising=False)
    assert config.Config.from_environment().record_variants == ""
    monkeypatch.setenv("TRITON_DIST_RECORD_VARIANTS", str(tmp_path / "r.jsonl"))
    assert config.Config.from_environment().record_variants == str(tmp_path / "r.jsonl")
    recorder = variant_list._Recorder(str(tmp_path / "r.jsonl"), None)

    def source(module, qualname, libs=()):
        fn = types.SimpleNamespace(fn=types.SimpleNamespace(__module__=module, __qualname__=qualname))
        return types.SimpleNamespace(fn=fn), {"hash": qualname, "extern_libs": list(libs)}

    for module, qualname, libs in (("__main__", "mine", [[support_library.NAME, "/x.ll"]]),
                                   ("triton_dist.kernels.x", "outer.<locals>.k", ()),
                                   ("users_module", "plain_triton_kernel", ())):
        src, md = source(module, qualname, libs)
        recorder(src=src, metadata=md, metadata_group={}, times=None, cache_hit=False)
    recorder(src=types.SimpleNamespace(), metadata={"hash": "ir"}, metadata_group={}, times=None, cache_hit=True)
    assert not (tmp_path / "r.jsonl").exists()


def test_the_first_compile_message_says_how_to_prebuild_once(monkeypatch, capsys):
    asked = []
    monkeypatch.setattr(parallel_compile, "compile_variants", lambda variants, **kw: asked.append(kw))
    monkeypatch.setattr(parallel_compile, "_told_how_to_prebuild", False)
    variant = parallel_compile.Variant("triton_dist.kernels.collectives.allreduce_kernels", "k", {}, {}, {}, {}, None)
    parallel_compile._compile_saying_so([variant])
    parallel_compile._compile_saying_so([variant])
    first, why, _, second, _, _ = capsys.readouterr().err.splitlines()
    assert "k: the list has no variant of this kernel" in why  # each miss explained against the list
    assert "not in the prebuilt set" in first and "TRITON_DIST_RECORD_VARIANTS=FILE" in first
    assert "python -m triton_dist.prebuilt_cache --variants FILE" in first
    assert "not in the prebuilt set" in second and "TRITON_DIST_RECORD_VARIANTS" not in second
    assert asked == [{"launchers": True}] * 2  # the launchers built in the same parallel workers


def test_every_shipped_variant_names_its_kernels_parameters():
    """The shipped list (python/triton_dist/prebuilt/variants.jsonl) keys signatures by parameter
    name: a kernel whose parameter was renamed since it was recorded would no longer compile from
    it, and its op would compile on first use again."""
    import importlib

    stale = []
    for r in variant_list.read([prebuilt_cache.default_variant_list()]):
        kernel = getattr(importlib.import_module(r.variant.module), r.variant.name)
        fn = kernel
        while not isinstance(fn, triton.runtime.JITFunction):  # DistributedKernel -> JITFunction
            fn = fn.fn
        if set(r.variant.signature) != set(fn.arg_names):
            stale.append(f"{r.variant.name}: {sorted(set(r.variant.signature) ^ set(fn.arg_names))}")
    assert not stale, stale


DENSE_OP_MODULES = (
    "triton_dist.kernels.collectives.allreduce_kernels", "triton_dist.kernels.collectives.allgather_kernels",
    "triton_dist.kernels.collectives.allgather_2d", "triton_dist.kernels.collectives.reduce_scatter",
    "triton_dist.kernels.collectives.reduce_scatter_2d", "triton_dist.kernels.common.ring",
    "triton_dist.kernels.common.call_counter", "triton_dist.kernels.common.rank_barrier",
    "triton_dist.kernels.gemm.dense", "triton_dist.kernels.gemm.split_k", "triton_dist.kernels.gemm.ag_gemm",
    "triton_dist.kernels.gemm.ag_gemm_2d", "triton_dist.kernels.gemm.gemm_rs", "triton_dist.kernels.gemm.gemm_rs_2d",
    "triton_dist.kernels.gemm.gemm_ar",
)
"""The modules of the dense ops' kernels (issue 21's ops: the collectives and the overlapped GEMMs;
not the wave-tail GEMM, a config gemm() takes by name only, nor the MoE and decode ops)."""


def test_every_kernel_of_the_dense_ops_has_a_listed_variant():
    """Each kernel the dense ops launch has at least one variant in the shipped list, so a new
    kernel (or a renamed one) cannot leave its op compiling on first use unnoticed: record it on a
    GPU (TRITON_DIST_RECORD_VARIANTS) and merge it. One variant per kernel, not every one of every
    dtype and world size: those are what recorded runs met."""
    import importlib

    listed = {(r.variant.module, r.variant.name) for r in variant_list.read([prebuilt_cache.default_variant_list()])}
    missing = []
    for module_name in DENSE_OP_MODULES:
        module = importlib.import_module(module_name)
        for name, obj in vars(module).items():
            fn = obj
            while not isinstance(fn, triton.runtime.JITFunction) and hasattr(fn, "fn"):
                fn = fn.fn  # DistributedKernel -> JITFunction
            if (name.endswith("_kernel") and isinstance(fn, triton.runtime.JITFunction) and fn.__module__ == module_name
                    and (module_name, fn.__name__) not in listed):
                missing.append(f"{module_name}.{fn.__name__}")
    assert not missing, missing


def test_a_miss_is_explained_by_the_closest_listed_variant():
    """What a first-use compile prints per missing variant (issue 21's first calls): the fields in
    which the package's closest listed variant of that kernel differs, by parameter name."""
    import dataclasses

    listed = variant_list.read([prebuilt_cache.default_variant_list()])
    ll = next(r for r in listed if r.variant.name == "ll_reduce_kernel")
    names = parallel_compile._source_and_options(ll.variant)[0].fn.arg_names
    elems = (names.index("ELEMS"), )
    changed = {**ll.variant.constexprs, elems: 3}
    wanted = dataclasses.replace(ll, variant=dataclasses.replace(ll.variant, constexprs=changed))
    why = variant_list.explain_missing(wanted, listed)
    assert why.startswith("ll_reduce_kernel: the closest of ") and "ELEMS 3, listed " in why
    assert "listed, but not found built" in variant_list.explain_missing(ll, listed)
    other = dataclasses.replace(ll, settings=tuple((k, 1 if k == "wait_timeout_ns" else v) for k, v in ll.settings))
    assert "setting wait_timeout_ns 1, listed " in variant_list.explain_missing(other, listed)
    alien = dataclasses.replace(ll, variant=dataclasses.replace(ll.variant, name="no_such_kernel"))
    assert variant_list.explain_missing(alien, listed) == "no_such_kernel: the list has no variant of this kernel"


def test_no_listed_variant_is_keyed_by_the_machine():
    """The prebuilt set must serve any GPU and any MPS share: no listed variant may fold in a value
    that depends on the SM count or a context's size (a signal layout's stride or offsets, an LL
    slot). Those are kernel arguments; a recorded constexpr of such a name fails here."""
    machine_dependent = {"MAX_PROGRAMS", "max_programs", "LL_SLOT", "ll_slot", "READY", "ready", "ACK", "ack",
                         "DONE", "done", "CHUNK_READY", "chunk_ready", "NUM_SMS", "GRID"}
    found = set()
    for r in variant_list.read([prebuilt_cache.default_variant_list()]):
        names = variant_list._parameter_names(r.variant)
        for (position, *_), _value in r.variant.constexprs.items():
            if names[position] in machine_dependent:
                found.add(f"{r.variant.name}.{names[position]}")
    assert not found, sorted(found)
