"""Helper servers runner starts as child processes die with it, even when it is SIGKILLed, so
a killed runner never leaves a provider or a llama.cpp server holding a port and a core."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with(parent_pid: int, sig: signal.Signals = signal.SIGKILL) -> Callable[[], None]:
    """A `subprocess.Popen(preexec_fn=...)` that makes the child receive `sig` when the thread
    that started it dies (Linux; a no-op elsewhere), and exit at once if `parent_pid` is
    already gone (the race between fork and prctl).

    Args:
        parent_pid: `os.getpid()` of the process starting the child.
        sig: the signal the child gets (SIGTERM lets it shut down; SIGKILL cannot be caught).
    """

    def arm() -> None:
        if sys.platform.startswith("linux"):
            import ctypes

            ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, sig)
        if os.getppid() != parent_pid:
            os._exit(1)

    return arm
