"""Rules of the codebase that a reader relies on (issue 25), checked on every file: no source file
over 600 lines; the library's comments and docstrings cite result files, not commit hashes
(which go stale and say nothing without the repository); settings are read only in config.py."""

import pathlib
import re

_ROOT = pathlib.Path(__file__).resolve().parents[2]
_SOURCES = ("python", "csrc", "tests", "bench", "tutorials")
_SUFFIXES = {".py", ".cc", ".h", ".cuh", ".cu"}
# Seven to twelve hex digits with a letter and a digit, not part of a longer hex run or a 0x literal.
_HASH = re.compile(r"(?<![0-9a-fA-Fx])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,12}(?![0-9a-fA-F])")


def _files(roots, suffixes):
    for root in roots:
        yield from (p for p in (_ROOT / root).rglob("*") if p.suffix in suffixes and p.is_file())


def test_no_source_file_is_over_600_lines():
    long = {str(p.relative_to(_ROOT)): n for p in _files(_SOURCES, _SUFFIXES)
            if (n := len(p.read_text(errors="replace").splitlines())) > 600}
    assert not long, f"split these (one concept per file): {long}"


def test_the_library_cites_result_files_not_commits():
    found = []
    for p in _files(["python/triton_dist"], {".py"}):
        for i, line in enumerate(p.read_text().splitlines(), 1):
            for m in _HASH.finditer(line):
                if not re.search(r"bench/results/\S*" + m.group(0), line):  # a result file's own name
                    found.append(f"{p.relative_to(_ROOT)}:{i}: {m.group(0)}")
    assert not found, found


def test_settings_are_read_only_in_config():
    readers = [f"{p.relative_to(_ROOT)}:{i}" for p in _files(["python/triton_dist"], {".py"}) if p.name != "config.py"
               for i, line in enumerate(p.read_text().splitlines(), 1)
               if re.search(r"(environ|getenv)\W.*TRITON_DIST_", line)]
    assert not readers, f"read TRITON_DIST_* settings through triton_dist.config: {readers}"
