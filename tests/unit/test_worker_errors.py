"""What `streamjobs run` says when a worker dies of an error: the exception its log ends with."""

from __future__ import annotations

from pathlib import Path

import pytest
from streamjobs.supervisor import last_error

pytestmark = pytest.mark.unit

TRACEBACK = """\
2026-11-24 06:00:00,000 streamjobs_worker.worker INFO persons/0 owns 120 key groups (incarnation 1)
{"ts": "2026-11-24 06:00:01.000", "level": "ERROR", "logger": "SQLQueryContextLogger", "msg": "[X] ValueError: no"}
Traceback (most recent call last):
  File "/w/worker.py", line 160, in step
    written = self.router.route(output, watermark, txn)
streamjobs_worker.outputs.MissingKeyColumn: output of 'persons' lacks column 'pid', the key of 'pairs'
"""


def test_the_last_exception_of_a_workers_log_is_its_error(tmp_path: Path) -> None:
    log = tmp_path / "persons-0.log"
    log.write_text("ValueError: an older failure\n" + TRACEBACK)
    assert last_error(log) == "MissingKeyColumn: output of 'persons' lacks column 'pid', the key of 'pairs'"


def test_a_log_without_an_exception_or_no_log_says_nothing(tmp_path: Path) -> None:
    log = tmp_path / "words-0.log"
    log.write_text(TRACEBACK.splitlines()[0] + "\n")
    assert last_error(log) is None
    assert last_error(tmp_path / "missing.log") is None
