"""Child processes that must not outlive the process that started them (the fast lane's HAProxy).

The kernel's parent-death signal (prctl PR_SET_PDEATHSIG) has to be set in the child, before it runs the program.
Popen's `preexec_fn` would do that in Python between fork and exec, but a `preexec_fn` makes Popen fork() the
whole process and run Python's at-fork hooks in the child: in a router whose gRPC threads are busy, gRPC's fork
handlers left such children to die of SIGABRT or SIGSEGV before exec (34 of 300 in one try; the fast lane's
HAProxy "exited at start (code -6)" in CI). So the child is a fresh, single-threaded Python that sets the signal
and execs the program: Popen, with no `preexec_fn`, starts it with vfork and runs no at-fork hook. The pid is the
program's (exec keeps it), and so is what it prints and its exit code.
"""

from __future__ import annotations

import os
import signal
import sys

PR_SET_PDEATHSIG = 1

# Run with `python -S -c`: no site packages, nothing imported but ctypes. argv: signal, the parent's pid, program...
# The parent may already have gone before the signal was set: then getppid() is no longer its pid, and the child
# ends at once instead of running on as an orphan.
_EXEC_WITH_PDEATHSIG = (
    "import ctypes, os, sys\n"
    "sig, parent, argv = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]\n"
    f"if ctypes.CDLL(None, use_errno=True).prctl({PR_SET_PDEATHSIG}, sig, 0, 0, 0) != 0:\n"
    "    sys.exit('prctl(PR_SET_PDEATHSIG) failed: ' + os.strerror(ctypes.get_errno()))\n"
    "if os.getppid() != parent:\n"
    "    sys.exit(0)\n"
    "os.execvp(argv[0], argv)\n"
)


def dies_with_parent(argv: list[str], sig: int = signal.SIGTERM) -> list[str]:
    """The command line that runs `argv` so that the kernel sends it `sig` when the thread that starts it exits,
    however it exits (a SIGKILLed router left its HAProxy running, holding the tenants' port). Start it from a
    thread that lives as long as the process (the event loop's). `argv` unchanged where there is no prctl."""
    if not sys.platform.startswith("linux"):
        return list(argv)
    return [sys.executable, "-S", "-c", _EXEC_WITH_PDEATHSIG, str(int(sig)), str(os.getpid()), *argv]
