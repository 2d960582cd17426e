"""Sphinx configuration of triton-dist's documentation (``scripts/docs`` builds it)."""

import os
import sys

_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(_ROOT, "python"))  # the source tree: no build needed, no torch needed

project = "triton-dist"
author = "the triton-dist developers"
extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon", "breathe"]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build"]
html_theme = "furo"
html_title = "triton-dist"
myst_heading_anchors = 3
autodoc_member_order = "bysource"
autodoc_default_options = {"members": True, "undoc-members": False}
# torch is imported inside functions only; _C is the compiled core, absent in a source checkout.
autodoc_mock_imports = ["triton_dist._C"]
breathe_projects = {"libtdist": os.path.join(_ROOT, "docs", "_build", "doxygen", "xml")}
breathe_default_project = "libtdist"
nitpicky = False
# CUDA's function qualifiers, which the C++ domain would otherwise read as return types.
cpp_id_attributes = ["__device__", "__host__", "__global__", "__forceinline__", "__noinline__"]
toc_object_entries = False  # the index lists pages and sections, not every documented function
