"""Several router processes writing their access logs to one stdout (a router with Python-lane workers and
`--access-log -`: the workers' stdout is the router's, and `kubectl logs` of the pod is the trace). Each
batch goes out in writes of whole lines of at most PIPE_BUF bytes, which a pipe never interleaves, so no
line is torn however the processes' batches meet."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading

from router.accesslog import whole_line_chunks

WRITER = r"""
import sys, time
from router.accesslog import AccessLog
log = AccessLog.open("-")
tag = sys.argv[1]
for batch in range(100):
    for i in range(250):
        log.write(ts=time.time(), tenant="t" + tag, model="m" * 40, version="1", host="127.0.0.1:1", total_ms=1.0,
                  status="OK", bytes_in=10, bytes_out=20, id=f"{tag}-{batch}-{i}")
    log.flush()
"""


def test_two_processes_on_one_stdout_pipe_never_tear_a_line():
    r, w = os.pipe()
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(n)], stdout=w, env=env) for n in range(2)]
    os.close(w)
    chunks: list[bytes] = []
    reader = threading.Thread(target=lambda: chunks.extend(iter(lambda: os.read(r, 1 << 16), b"")))
    reader.start()
    for p in procs:
        assert p.wait(60) == 0
    reader.join(10)
    os.close(r)
    lines = b"".join(chunks).decode().splitlines()
    ids = [json.loads(line)["id"] for line in lines]  # a torn line is not JSON
    assert len(ids) == len(set(ids)) == 2 * 100 * 250


def test_chunks_are_whole_lines_of_at_most_pipe_buf_bytes_in_order():
    lines = [f'{{"n":{i},"pad":"{"x" * (i % 300)}"}}\n' for i in range(500)]
    long = '{"pad":"' + "y" * (select.PIPE_BUF + 10) + '"}\n'  # a line longer than PIPE_BUF goes alone
    chunks = whole_line_chunks([*lines[:10], long, *lines[10:]])
    assert "".join(chunks) == "".join([*lines[:10], long, *lines[10:]])
    assert all(c.endswith("\n") for c in chunks)
    assert [c for c in chunks if len(c) > select.PIPE_BUF] == [long]
    assert len(chunks) < 500 / 4  # batched, not a write per line
