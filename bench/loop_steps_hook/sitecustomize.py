"""Loaded by every Python process that bench/loop_steps.py starts (it puts this folder on PYTHONPATH): each
asyncio callback that holds its event loop longer than MMHOST_LOOP_STEPS_MS is written to
MMHOST_LOOP_STEPS_DIR/<pid>.txt with its wall and thread-CPU time and, sampled every 3 ms from a watchdog
thread while it runs, the loop thread's innermost Python frames. Diagnostics only: never imported by mmhost."""

from __future__ import annotations

import asyncio.events
import os
import sys
import threading
import time
import traceback

_DIR = os.environ.get("MMHOST_LOOP_STEPS_DIR")
_MIN_S = float(os.environ.get("MMHOST_LOOP_STEPS_MS", "8")) / 1000
_run = asyncio.events.Handle._run
_state: dict = {"t0": None, "tid": None, "seq": 0}
_samples: dict[int, list[str]] = {}


def _watch() -> None:
    while True:
        time.sleep(0.003)
        t0, tid, seq = _state["t0"], _state["tid"], _state["seq"]
        if t0 is not None and tid is not None and time.perf_counter() - t0 > _MIN_S / 2:
            frame = sys._current_frames().get(tid)
            if frame is not None:
                st = traceback.extract_stack(frame)[-4:]
                _samples.setdefault(seq, []).append(" < ".join(f"{os.path.basename(x.filename)}:{x.lineno}:{x.name}"
                                                               for x in reversed(st)))


def _timed_run(self) -> None:
    if _state["tid"] is None:
        _state["tid"] = threading.get_ident()
        threading.Thread(target=_watch, daemon=True, name="loop-steps").start()
    _state["seq"] += 1
    seq = _state["seq"]
    t0, c0 = time.perf_counter(), time.thread_time()
    _state["t0"] = t0
    try:
        _run(self)
    finally:
        _state["t0"] = None
        wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
        samples = _samples.pop(seq, [])
        if wall >= _MIN_S:
            with open(os.path.join(_DIR, f"{os.getpid()}.txt"), "a") as f:
                f.write(f"step {wall * 1e3:.1f} {cpu * 1e3:.1f} {' '.join(sys.argv[:3])}\n")
                for s in dict.fromkeys(samples):  # distinct samples, in order
                    f.write(f"  at {s}\n")


if _DIR:
    asyncio.events.Handle._run = _timed_run
