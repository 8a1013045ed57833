"""The sha256 of a file, read in chunks: the one implementation the publisher (catalog/publish.py), the
hostd's disk tier (hostd/cache/stamps.py), the upload client (mmhost/upload_client.py) and the Triton
importer (mmhost/triton_import.py) share."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

CHUNK = 1 << 20


def sha256_file(path: Path, progress: Callable[[int], None] | None = None) -> str:
    """The file's sha256 (hex); `progress` is called with each chunk's size as it is read."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
            if progress:
                progress(len(chunk))
    return h.hexdigest()
