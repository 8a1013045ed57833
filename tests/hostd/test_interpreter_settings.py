"""What hostd sets on its own process and threads at start: the interpreter's switch interval
(switch_interval_s) and the model threads' nice value (compute_nice)."""

from __future__ import annotations

import os
import sys
import threading

import pytest

from hostd.server import lower_thread_priority, set_switch_interval


def test_switch_interval_is_set_and_zero_leaves_it():
    before = sys.getswitchinterval()
    try:
        set_switch_interval(0.0005)
        assert sys.getswitchinterval() == pytest.approx(0.0005)
        set_switch_interval(0)  # 0: what the process has stays
        assert sys.getswitchinterval() == pytest.approx(0.0005)
    finally:
        sys.setswitchinterval(before)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice values are Linux's")
def test_model_threads_run_below_the_loop():
    seen: dict[str, int] = {}
    base = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    nice = min(19, base + 7)  # below the caller's, whatever it runs at

    def model_thread() -> None:
        lower_thread_priority(nice)
        seen["model"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    t = threading.Thread(target=model_thread)
    t.start()
    t.join()
    assert seen["model"] == nice
    # only that thread: the calling thread (the event loop's, in hostd) keeps its priority
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == base
