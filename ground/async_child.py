"""A child process with its pipes on the running event loop, started without forking this process.

asyncio's `create_subprocess_exec` on uvloop (the router's loop) starts the child with libuv's fork() and runs
Python's at-fork hooks in it before exec (PyOS_AfterFork_Child; checked: a hook registered with
os.register_at_fork runs in the child on uvloop, not on asyncio's loop). In a router whose gRPC threads are
busy, that is the fork that ground/children.py describes: gRPC's fork handlers can kill the child before it
runs the program. The parent then sees uvloop's RuntimeError on the dead child's stdin ("unable to perform
operation on <WriteUnixTransport closed=True ...>; the handler is closed"), and an upload was answered INTERNAL
in CI (tests/router/test_uploads.py, twice in one run).

Here the child is started by Popen with no preexec_fn (vfork: no at-fork hook runs, on either loop), and its
pipes are handed to the loop (connect_read_pipe / connect_write_pipe), which closes them with the transports.
Popen is called on the loop's thread: vfork returns once the child has exec'ed (a millisecond or two), and a
call cancelled meanwhile cannot leave a child nobody holds. The exit is polled (`wait`): the streams' end
comes first, so the poll rarely waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
from collections.abc import Callable, Mapping, Sequence

_POLL_FIRST_S = 0.001
_POLL_MAX_S = 0.05


class AsyncChild:
    """`stdin`, `stdout` and `stderr` as asyncio streams; `kill`, `wait`, `close` (the pipes)."""

    def __init__(self, popen: subprocess.Popen, stdin: asyncio.StreamWriter, stdout: asyncio.StreamReader,
                 stderr: asyncio.StreamReader, transports: list[asyncio.BaseTransport]) -> None:
        self.popen = popen
        self.stdin, self.stdout, self.stderr = stdin, stdout, stderr
        self._transports = transports

    @property
    def returncode(self) -> int | None:
        """None while it runs; minus the signal's number when a signal ended it."""
        return self.popen.poll()

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):  # Popen does nothing once the child has been reaped
            self.popen.kill()

    def close(self) -> None:
        """Close this side of its pipes: a killed child's unread output, or a child of it still holding them,
        would otherwise keep them open."""
        for t in self._transports:
            t.close()

    async def wait(self) -> int:
        delay = _POLL_FIRST_S
        while (rc := self.popen.poll()) is None:
            await asyncio.sleep(delay)
            delay = min(delay * 2, _POLL_MAX_S)
        return rc


def _protocol_for(reader: asyncio.StreamReader) -> Callable[[], asyncio.StreamReaderProtocol]:
    return lambda: asyncio.StreamReaderProtocol(reader)


async def start(argv: Sequence[str], env: Mapping[str, str]) -> AsyncChild:
    """`argv` started with three pipes (OSError when it cannot be: no such program, out of processes)."""
    loop = asyncio.get_running_loop()
    popen = subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             env=dict(env))
    transports: list[asyncio.BaseTransport] = []
    try:
        assert popen.stdin is not None and popen.stdout is not None and popen.stderr is not None
        readers = [asyncio.StreamReader(), asyncio.StreamReader()]
        for pipe, reader in zip((popen.stdout, popen.stderr), readers, strict=True):
            transports.append((await loop.connect_read_pipe(_protocol_for(reader), pipe))[0])
        wt, wp = await loop.connect_write_pipe(_protocol_for(asyncio.StreamReader()), popen.stdin)
        transports.append(wt)
        stdin = asyncio.StreamWriter(wt, wp, None, loop)
    except BaseException:
        popen.kill()
        for t in transports:
            t.close()
        for f in (popen.stdin, popen.stdout, popen.stderr):
            if f is not None:
                f.close()
        popen.wait()
        raise
    return AsyncChild(popen, stdin, readers[0], readers[1], transports)
