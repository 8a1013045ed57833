"""The storage interface every backend implements. Keys are '/'-separated paths relative to the store root."""

from __future__ import annotations

import abc
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

# Called with the number of bytes moved since the last call (s3transfer's callback convention).
ProgressFn = Callable[[int], None]
# Called with `end` each time buf[:end] is complete, `end` only growing: bytes can be hashed in order as they arrive.
ReadyFn = Callable[[int], None]


class StorageError(Exception):
    """A storage operation failed. The message names the store and the cause."""


class ObjectNotFound(StorageError):
    """The key does not exist."""


class StorageUnavailable(StorageError):
    """The store cannot be reached or refused our credentials; raised fast, never a hang."""


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int


class Storage(abc.ABC):
    """A flat key space with '/'-separated keys."""

    #: Human-readable location, used in every error message (e.g. 's3://bucket/prefix at http://host:9000').
    description: str

    @abc.abstractmethod
    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        """Every object whose key starts with `prefix`, recursively."""

    @abc.abstractmethod
    def list_dirs(self, prefix: str) -> list[str]:
        """The names of the 'folders' directly under `prefix` (which ends with '/')."""

    @abc.abstractmethod
    def stat(self, key: str) -> ObjectInfo:
        """Size of one object; ObjectNotFound if absent."""

    @abc.abstractmethod
    def read_bytes(self, key: str) -> bytes:
        """A small object (manifest, policy) into memory."""

    @abc.abstractmethod
    def download(self, key: str, dest: Path, progress: ProgressFn | None = None, size_hint: int | None = None) -> None:
        """One object to a local file; large objects in parallel ranged parts where the backend can.
        `size_hint` (the size the caller expects, e.g. from a manifest) lets a backend skip asking for it."""

    def read_into(self, key: str, buf: memoryview, progress: ProgressFn | None = None,
                  ready: ReadyFn | None = None) -> int:
        """One object straight into memory the caller sized (from a manifest): `progress` hears of every chunk
        that arrives, `ready` of the filled prefix. Returns the object's real size; where it differs from
        len(buf), only min(size, len(buf)) bytes were filled and the caller decides what that means.
        This default goes through a temporary file; backends that can stream do better."""
        import tempfile

        with tempfile.TemporaryDirectory(prefix="mmhost-read-") as d:
            tmp = Path(d) / "object"
            self.download(key, tmp, progress=progress, size_hint=len(buf))
            with open(tmp, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                n = f.readinto(buf[: min(size, len(buf))])
        if ready is not None and n:
            ready(n)
        return size

    @abc.abstractmethod
    def put_bytes(self, key: str, data: bytes) -> None:
        """Write a small object atomically (readers see the old object or the new one, never a part)."""

    @abc.abstractmethod
    def upload_file(self, src: Path, key: str, progress: ProgressFn | None = None) -> None:
        """One local file to an object; large files multipart where the backend can."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Remove one object; absent keys are not an error."""

    def exists(self, key: str) -> bool:
        try:
            self.stat(key)
            return True
        except ObjectNotFound:
            return False
