"""Worker processes of the benchmark runners (``benchmarks/regimes``, ``benchmarks/fidelity``)."""

from __future__ import annotations

import ctypes
import signal
import sys

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent() -> None:
    """A pool worker's initializer: on Linux the kernel kills the worker when the process
    that started it dies, so stopping a runner (``kill``, a closed terminal) does not
    leave its runs computing on, unseen, beside the next ones (a process pool's workers
    otherwise finish their current run first, however long). Elsewhere: nothing."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # a libc without prctl: the workers outlive it
        return
