"""A worker started by a local parent dies with it, whether the parent dies before or after it asked."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from streamjobs_worker.parent import PARENT_PID

pytestmark = pytest.mark.unit

CHILD = "from streamjobs_worker.parent import die_with_parent; die_with_parent(); print('up', flush=True); " \
        "import time; time.sleep(60)"
# A parent that starts a child the way the local runtime does and tells us its pid.
PARENT = ("import os, subprocess, sys, time\n"
          "from streamjobs_worker.parent import parent_env\n"
          f"child = subprocess.Popen([sys.executable, '-c', {CHILD!r}], env={{**os.environ, **parent_env()}},\n"
          "                         start_new_session=True, stdout=subprocess.PIPE, text=True)\n"
          "print(child.pid, child.stdout.readline().strip(), flush=True)\n"
          "time.sleep(60)\n")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split(")")[-1].split()[0] != "Z"


def test_a_worker_dies_when_its_parent_is_killed():
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    pid, state = parent.stdout.readline().split()
    assert state == "up" and alive(int(pid))
    parent.send_signal(signal.SIGKILL)
    parent.wait(10)
    deadline = time.monotonic() + 10
    while alive(int(pid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(int(pid)), "the worker outlived its parent"


def test_a_worker_whose_parent_is_already_gone_exits():
    child = subprocess.run([sys.executable, "-c", CHILD], env={**os.environ, PARENT_PID: "1"}, timeout=30,
                           capture_output=True, text=True)
    assert child.returncode == 1 and "up" not in child.stdout
