"""Every public Python name of the package has a docstring (a list of the undocumented ones
otherwise), and the documentation's generated pages come from the sources. The C++ side is
checked by scripts/docs: Doxygen's undocumented-declaration warnings fail the build."""

import importlib
import inspect
import pkgutil

import triton_dist
from triton_dist.tools import docs_pages


def _public_objects():
    from triton.runtime.jit import JITFunction

    from triton_dist.distributed_jit import DistributedKernel

    for info in pkgutil.walk_packages(triton_dist.__path__, "triton_dist."):
        if info.name.endswith("._C"):
            continue
        module = importlib.import_module(info.name)
        yield info.name, module
        for name, obj in vars(module).items():
            if name.startswith("_"):
                continue
            fn = obj.fn.fn if isinstance(obj, DistributedKernel) else obj.fn if isinstance(obj, JITFunction) else obj
            if not (inspect.isfunction(fn) or inspect.isclass(fn)) or getattr(fn, "__module__", None) != info.name:
                continue
            yield f"{info.name}.{name}", fn
            if inspect.isclass(fn):
                for member, value in vars(fn).items():
                    if not member.startswith("_") and (inspect.isfunction(value) or isinstance(value, property)):
                        yield f"{info.name}.{name}.{member}", value


def test_every_public_name_has_a_docstring():
    undocumented = [name for name, obj in _public_objects() if not (obj.__doc__ or "").strip()]
    assert not undocumented, f"document these public names: {undocumented}"


def test_the_configuration_page_lists_every_setting_with_its_variable():
    page = docs_pages.configuration_markdown()
    from triton_dist.config import Config
    import dataclasses

    for field in dataclasses.fields(Config):
        assert f"| `{field.name}` |" in page, field.name
    assert "`TRITON_DIST_RANKS_PER_GPU`" in page and "`TRITON_DIST_WAIT_TIMEOUT_NS`" in page


def test_the_benchmark_page_has_a_table_per_results_file(tmp_path):
    import json
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[2] / "bench" / "results"
    page = docs_pages.benchmarks_markdown(root, "../results")
    files = [p for p in root.glob("*/*.json") if json.loads(p.read_text())]
    assert files and all(f"## `{p.relative_to(root)}`" in page for p in files)
    assert page.count("| op |") == len(files)
