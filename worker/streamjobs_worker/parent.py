"""A worker started by a local parent (the local runtime, the tests' kubelet) dies with it.

The worker asks for it itself (PR_SET_PDEATHSIG), first thing: a parent's
`preexec_fn` would run Python between fork and exec in a threaded process,
where a lock another thread held at the fork (malloc's, the GIL's handoff) can
hang the child before it ever runs, as it did in CI.
"""

from __future__ import annotations

import ctypes
import os
import signal

PARENT_PID = "STREAMJOBS_PARENT_PID"  # set by a parent whose workers must not outlive it
_PR_SET_PDEATHSIG = 1


def parent_env() -> dict[str, str]:
    """What a parent adds to a worker's environment so that the worker dies with it."""
    return {PARENT_PID: str(os.getpid())}


def die_with_parent() -> None:
    parent = os.environ.get(PARENT_PID)
    if not parent:
        return  # a pod: Kubernetes ends it
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != int(parent):  # the parent died before the request: nothing would signal this process
        os._exit(1)
