"""A model store in a local folder: the embedded default, with the same layout as object storage."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from storage_adapters.base import ObjectInfo, ObjectNotFound, ProgressFn, ReadyFn, Storage, StorageError

_CHUNK = 1 << 20
_NAME_MAX = 255  # bytes per path component on every common filesystem


def _usable(key: str) -> bool:
    """A key this filesystem can hold: no NUL byte, no component longer than NAME_MAX bytes. Any other key
    names nothing here (reads: not found), so odd names never reach the OS as errors."""
    return "\0" not in key and all(len(part.encode()) <= _NAME_MAX for part in key.split("/"))


class LocalStorage(Storage):
    def __init__(self, root: Path | str) -> None:
        self.root = Path(root).resolve()
        self.description = f"local store {self.root}"

    def _path(self, key: str) -> Path:
        if not _usable(key):
            raise ObjectNotFound(f"{self.description}: no object {key[:64]!r}: not a usable name here")
        p = (self.root / key).resolve()
        if p != self.root and self.root not in p.parents:
            raise StorageError(f"{self.description}: key {key!r} escapes the store root")
        return p

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        if not _usable(prefix):
            return
        base = self._path(prefix.rstrip("/")) if prefix else self.root
        if base.is_file():
            yield ObjectInfo(prefix, base.stat().st_size)
            return
        if not base.is_dir():
            return
        for dirpath, _dirs, files in os.walk(base):
            for name in sorted(files):
                if name.startswith(".tmp-"):
                    continue
                full = Path(dirpath) / name
                yield ObjectInfo(full.relative_to(self.root).as_posix(), full.stat().st_size)

    def list_dirs(self, prefix: str) -> list[str]:
        if not _usable(prefix):
            return []
        base = self._path(prefix.rstrip("/")) if prefix else self.root
        if not base.is_dir():
            return []
        return sorted(p.name for p in base.iterdir() if p.is_dir())

    def stat(self, key: str) -> ObjectInfo:
        p = self._path(key)
        if not p.is_file():
            raise ObjectNotFound(f"{self.description}: no object {key!r}")
        return ObjectInfo(key, p.stat().st_size)

    def read_bytes(self, key: str) -> bytes:
        p = self._path(key)
        try:
            return p.read_bytes()
        except FileNotFoundError:
            raise ObjectNotFound(f"{self.description}: no object {key!r}") from None
        except OSError as e:
            raise StorageError(f"{self.description}: cannot read {key!r}: {e}") from e

    def download(self, key: str, dest: Path, progress: ProgressFn | None = None, size_hint: int | None = None) -> None:
        src = self._path(key)
        if not src.is_file():
            raise ObjectNotFound(f"{self.description}: no object {key!r}")
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            with open(src, "rb") as fin, open(dest, "wb") as fout:
                while chunk := fin.read(_CHUNK):
                    fout.write(chunk)
                    if progress:
                        progress(len(chunk))
        except OSError as e:
            raise StorageError(f"{self.description}: cannot copy {key!r} to {dest}: {e}") from e

    def read_into(self, key: str, buf: memoryview, progress: ProgressFn | None = None,
                  ready: ReadyFn | None = None) -> int:
        src = self._path(key)
        try:
            with open(src, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                want, pos = min(size, len(buf)), 0
                while pos < want:
                    n = f.readinto(buf[pos : min(want, pos + _CHUNK)])
                    if not n:
                        break  # the file shrank while read: the caller sees a short fill and the size
                    pos += n
                    if progress:
                        progress(n)
                    if ready:
                        ready(pos)
        except (FileNotFoundError, IsADirectoryError):
            raise ObjectNotFound(f"{self.description}: no object {key!r}") from None
        except OSError as e:
            raise StorageError(f"{self.description}: cannot read {key!r}: {e}") from e
        return size

    def _atomic_write(self, key: str, writer) -> None:
        dest = self._path(key)
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=dest.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                writer(f)
            os.replace(tmp, dest)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def put_bytes(self, key: str, data: bytes) -> None:
        self._atomic_write(key, lambda f: f.write(data))

    def upload_file(self, src: Path, key: str, progress: ProgressFn | None = None) -> None:
        def copy(fout) -> None:
            with open(src, "rb") as fin:
                while chunk := fin.read(_CHUNK):
                    fout.write(chunk)
                    if progress:
                        progress(len(chunk))

        self._atomic_write(key, copy)

    def delete(self, key: str) -> None:
        p = self._path(key)
        if p.is_dir():
            shutil.rmtree(p)
        else:
            p.unlink(missing_ok=True)
