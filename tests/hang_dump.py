"""What every JVM under this test process is doing, for a test about to time out.

pytest-timeout prints the Python threads of a hung test; a hang inside Spark (a job that never ends, a
dead scheduler thread) shows only as a socket read there, so the JVMs' own thread dumps are printed too.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the process ended while we looked
        tree.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    return tree


def descendant_jvms(root: int) -> list[int]:
    tree, found, todo = _children(), [], [root]
    while todo:
        for child in tree.get(todo.pop(), []):
            todo.append(child)
            try:
                if Path(f"/proc/{child}/comm").read_text().strip() == "java":
                    found.append(child)
            except OSError:
                continue
    return found


def dump_jvms(why: str) -> None:
    """Each JVM's thread dump (jcmd Thread.print) on stderr: the report of the test that then times out shows it."""
    out = sys.__stderr__
    for pid in descendant_jvms(os.getpid()):
        try:
            dump = subprocess.run(["jcmd", str(pid), "Thread.print"], capture_output=True, text=True,
                                  timeout=30).stdout
        except (OSError, subprocess.TimeoutExpired) as e:
            dump = f"no dump: {e}"
        print(f"\n===== {why}: JVM {pid} =====\n{dump}", file=out, flush=True)
