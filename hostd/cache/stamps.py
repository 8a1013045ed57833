"""What the disk tier trusts: a file with a stamp written when its bytes were verified. The stamp is the
digest plus the file's inode, size and modification time at that moment; a file changed or replaced since
(any of those differ) is not trusted, never re-used as it is."""

from __future__ import annotations

from pathlib import Path

from ground.hashing import sha256_file

__all__ = ["marker", "sha256_file", "stamp", "verified"]


def stamp(path: Path, sha256: str) -> str:
    st = path.stat()
    return f"{sha256} {st.st_ino} {st.st_size} {st.st_mtime_ns}"


def marker(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def verified(path: Path, sha256: str) -> bool:
    try:
        return marker(path).read_text() == stamp(path, sha256)
    except OSError:
        return False
