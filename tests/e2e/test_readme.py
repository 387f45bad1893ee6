"""The README's "Write your first job": its commands, run in order as written, print the output it shows."""

from __future__ import annotations

import re
import socket
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _section(text: str, title: str) -> str:
    start = text.index(f"## {title}")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else len(text)]


def test_the_first_job_commands_print_what_the_readme_shows():
    section = _section((ROOT / "README.md").read_text(), "Write your first job")
    commands, shown = re.findall(r"```(?:sh)?\n(.*?)```", section, re.S)[:2]
    lines = [line for line in commands.splitlines() if line.strip()]
    assert len(lines) >= 8 and lines[-1].startswith("redis-cli -p 6390 shutdown")
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", 6390)) != 0, "port 6390, which the README uses, is taken"
    outputs = []
    try:
        for line in lines:
            done = subprocess.run(["bash", "-c", line], cwd=ROOT, capture_output=True, text=True, timeout=180)
            assert done.returncode == 0, (line, done.stdout[-2000:], done.stderr[-2000:])
            outputs.append(done.stdout)
    finally:
        subprocess.run(["redis-cli", "-p", "6390", "shutdown", "nosave"], capture_output=True)
    run = next(out for line, out in zip(lines, outputs) if " run " in line)
    assert "verification: correct" in " ".join(run.split()), run
    printed = next(out for line, out in zip(lines, outputs) if " output " in line)
    assert printed == shown
