"""Generated code for the v2 inference protocol; regenerate with `make protos` (python -m protos.generate)."""
