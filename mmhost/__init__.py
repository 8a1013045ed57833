"""mmhost: multi-model, multi-tenant model hosting. This package holds the CLI and what all parts share."""

__version__ = "0.1.0"
