"""Reading v2 request parameters (InferParameter) the way both router and hostd need them."""

from __future__ import annotations


def param_int(params, name: str) -> int | None:
    """An integer parameter (int64, uint64, or a decimal string); None when absent.
    Raises ValueError when present but not an integer."""
    p = params.get(name)
    if p is None:
        return None
    which = p.WhichOneof("parameter_choice")
    if which in ("int64_param", "uint64_param"):
        return int(getattr(p, which))
    if which == "string_param" and p.string_param.lstrip("-").isdigit():
        return int(p.string_param)
    raise ValueError(f"parameter {name!r} must be an integer")
