"""The disk tier's graph cache: a model's graph as its runtime optimized it for one device, saved beside the
model's verified files so that a reload skips the optimization and reads weights mapped or in place.

    <version dir>/.graphs/<model sha256>-<runtime key>/graph file, weights file, their stamps, meta.json

An entry belongs to one model file's bytes (its verified sha256) and one runtime key (ONNX Runtime's version
and the provider): another model, another ORT or another device never finds it, since both are in the
folder's name and meta.json must repeat them. Its files are trusted on the disk tier's rule (hostd/cache/
stamps.py): any file changed or replaced since it was written makes the entry invalid; it is removed and the
caller loads the original model.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hostd.cache.stamps import marker, sha256_file, stamp, verified
from hostd.cache.tiers import DiskTier

log = logging.getLogger(__name__)
GRAPHS = ".graphs"
_META = "meta.json"


@dataclass(frozen=True)
class GraphId:
    sha256: str  # the model file's verified digest
    runtime: str  # e.g. "ort1.32.0-cpu"

    @property
    def name(self) -> str:
        return f"{self.sha256}-{self.runtime}"


class GraphCache:
    def __init__(self, disk: DiskTier, graph_file: str) -> None:
        self.disk = disk
        self.graph_file = graph_file  # the file the runtime loads (hostd/runtimes/onnx.py: GRAPH_FILE)
        self.invalid = 0  # entries found changed (or unreadable) and removed

    def _dir(self, key: tuple[str, str, str], gid: GraphId) -> Path:
        return self.disk.path(key) / GRAPHS / gid.name

    def find(self, key: tuple[str, str, str], gid: GraphId) -> Path | None:
        """The saved graph's path when the entry is whole and untouched since it was written."""
        d = self._dir(key, gid)
        if not d.is_dir():
            return None
        try:
            meta = json.loads((d / _META).read_text())
            files = meta["files"]
            ok = (meta.get("model_sha256") == gid.sha256 and meta.get("runtime") == gid.runtime
                  and self.graph_file in files and all(verified(d / n, sha) for n, sha in files.items()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            ok = False
        if not ok:
            log.warning("graph cache: %s for %s was changed or is incomplete; removed (the original model "
                        "is loaded instead)", gid.name, "/".join(key))
            self.discard(key, gid)
            return None
        return d / self.graph_file

    def read(self, graph: Path) -> dict[str, bytes]:
        """Every file of a found entry, by name (for the RAM tier)."""
        meta = json.loads((graph.parent / _META).read_text())
        return {n: (graph.parent / n).read_bytes() for n in meta["files"]}

    def save(self, key: tuple[str, str, str], gid: GraphId, build: Callable[[Path], None]) -> int:
        """Have `build` write the entry's files into a fresh folder, stamp them, and publish the folder
        whole (a rename). Returns the bytes added; 0 when the version is no longer on disk."""
        root = self.disk.path(key) / GRAPHS
        if not self.disk.path(key).is_dir():
            return 0
        root.mkdir(exist_ok=True)
        tmp = root / f".part-{gid.name}-{os.getpid()}-{threading.get_ident()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            build(tmp)
            files = {p.name: sha256_file(p) for p in sorted(tmp.iterdir()) if p.is_file()}
            if self.graph_file not in files:
                raise RuntimeError(f"the runtime wrote no {self.graph_file}")
            for name, sha in files.items():
                marker(tmp / name).write_text(stamp(tmp / name, sha))
            (tmp / _META).write_text(json.dumps({"model_sha256": gid.sha256, "runtime": gid.runtime, "files": files}))
            size = sum(p.stat().st_size for p in tmp.iterdir())
            final = self._dir(key, gid)
            shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self.disk.grow(key, size)
        return size

    def discard(self, key: tuple[str, str, str], gid: GraphId) -> None:
        d = self._dir(key, gid)
        if d.exists():
            self.invalid += 1
            size = sum(p.stat().st_size for p in d.iterdir() if p.is_file())
            shutil.rmtree(d, ignore_errors=True)
            self.disk.grow(key, -size)
