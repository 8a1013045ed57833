"""mmhost's command line: `mmhost upload`, `demo`, `top`, and the subcommands that start hostd and the
router. What every part shares lives in `ground/` (the ground floor), the catalog in `catalog/`."""

from ground import __version__

__all__ = ["__version__"]
