"""Keywords renamed when every op came to say ``method=`` (2026-12): the old names still work,
with a DeprecationWarning, until callers have moved."""

from __future__ import annotations


def method_or_old_name(op: str, method: str, default: str, old_name: str, old_value: str | None) -> str:
    """``method``, or ``old_value`` given under ``old_name`` (``variant``, ``producer``); both
    given and different (``method`` not left at ``default``) is an error."""
    if old_value is None:
        return method
    import warnings

    warnings.warn(f"triton_dist {op}: {old_name}= is now called method=", DeprecationWarning, stacklevel=3)
    if method not in (default, old_value):
        raise ValueError(f"triton_dist {op}: method={method!r} and {old_name}={old_value!r} disagree; pass method= "
                         f"only")
    return old_value
