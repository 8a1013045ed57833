"""Child processes that must not outlive the process that started them (the fast lane's HAProxy)."""

from __future__ import annotations

import ctypes
import signal
import sys
from collections.abc import Callable

PR_SET_PDEATHSIG = 1


def _prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _prctl()  # looked up here, in the parent: the child between fork and exec only calls it


def die_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A Popen `preexec_fn` that has the kernel send `sig` to the child when its parent exits, however it exits
    (a SIGKILLed router left its HAProxy running, holding the tenants' port). None where prctl is missing."""
    prctl = _PRCTL
    if prctl is None:
        return None

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, sig)

    return preexec
