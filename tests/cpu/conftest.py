import os
import sys

# Tests run against the source tree when the package is not installed (pip install -e is not
# required); an installed build of the same tree provides triton_dist._C either way.
_SRC = os.path.join(os.path.dirname(__file__), "..", "..", "python")
try:
    import triton_dist._C  # noqa: F401
except ImportError:
    sys.path.insert(0, os.path.abspath(_SRC))
