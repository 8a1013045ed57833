"""hostd with a second event loop in its own process: bench/plain_server.py's server for one model, started on
a thread of its own (its own asyncio loop and grpc.aio server, on its own port) before hostd's CLI runs. For
bench/noisy_model.py's `same process` phases: a light model answered by a loop that is not hostd's, yet in
hostd's process, sharing its GIL. It tells a loop of its own apart from a process of its own.

    python -m bench.hostd_twin LISTEN MODEL.onnx MODEL_NAME [hostd's CLI arguments...]

BENCH_SWITCH_INTERVAL_S (environment): the interpreter's switch interval for the whole process (Python's
default: 5 ms), how long a thread that wants the GIL waits for the one holding it."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere


def main() -> None:
    from bench.plain_server import serve

    listen, model, name = sys.argv[1:4]
    if os.environ.get("BENCH_SWITCH_INTERVAL_S"):
        sys.setswitchinterval(float(os.environ["BENCH_SWITCH_INTERVAL_S"]))
    threading.Thread(target=lambda: asyncio.run(serve(listen, model, name)), name="plain-loop", daemon=True).start()
    sys.argv = ["mmhost", *sys.argv[4:]]
    from mmhost.cli import app

    app()


if __name__ == "__main__":
    main()
