"""The storage interface every backend implements. Keys are '/'-separated paths relative to the store root."""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

# Called with the number of bytes moved since the last call (s3transfer's callback convention).
ProgressFn = Callable[[int], None]


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
