"""Mistakes in a job end `streamjobs run` within seconds, naming the operator and what to fix: no restart loop,
no traceback, the report written. The start-up rehearsal meets them before any record is at stake."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
BASE = {
    "apiVersion": "streamjobs.dev/v1alpha1", "kind": "StreamJob", "metadata": {"name": "mistakes"},
    "spec": {
        "sources": [{"name": "words", "type": "zipf", "vocabulary": 500, "rate": {"recordsPerSecond": 500}}],
        "stages": [
            {"name": "upper", "type": "sql", "inputs": ["words"],
             "query": "SELECT upper(word) AS word, event_time FROM input"},
            {"name": "count", "type": "window_aggregate", "inputs": ["upper"], "keyBy": "word",
             "window": {"type": "tumbling", "sizeMs": 1000}, "aggregations": [{"function": "count", "as": "n"}]},
        ],
        "sinks": [{"name": "counts", "type": "redis_stream", "inputs": ["count"]}],
    },
}
MISTAKES = {
    "a syntax error": (0, {"query": "SELECT upper(word) AS word,, event_time FROM input"},
                       ["upper: Spark refuses its query", "PARSE_SYNTAX_ERROR", "AS word,, event_time"]),
    "a key column the input lacks": (1, {"keyBy": "wrd"},
                                     ["count is keyed by 'wrd', which the output of upper does not have"]),
    "a function that does not import": (0, {"type": "pyspark", "query": None, "function": "tests.jobs.nope:f"},
                                        ["upper: cannot be built", "ModuleNotFoundError", "tests.jobs.nope"]),
    "a stage that drops event_time": (0, {"query": "SELECT upper(word) AS word FROM input"},
                                      ["upper: its output has no column event_time, which count needs"]),
}


CLI_MISTAKE = "a syntax error"  # what the command shows; the others' causes are the same text in the report


def _job(mistake: str, tmp_path: Path) -> Path:
    stage, changes, _ = MISTAKES[mistake]
    spec = json.loads(json.dumps(BASE))
    spec["spec"]["stages"][stage].update(changes)
    spec["spec"]["stages"][stage] = {k: v for k, v in spec["spec"]["stages"][stage].items() if v is not None}
    path = tmp_path / f"{mistake.replace(' ', '-')}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _names_operator_and_cause(mistake: str, report: dict) -> None:
    assert report["failed"]["operator"] == "words" and report["restarts"] <= 1, (mistake, report)
    for said in MISTAKES[mistake][2]:
        assert said in report["failed"]["cause"], (mistake, said, report["failed"])


def test_a_mistake_ends_the_cli_run_at_once_naming_the_operator_and_the_cause_without_a_traceback(tmp_path):
    path = _job(CLI_MISTAKE, tmp_path)
    report = path.with_suffix(".json")
    # Ten minutes to run: a run the mistake does not end at once outlasts the timeout.
    done = subprocess.run([sys.executable, "-m", "streamjobs.cli", "run", str(path), "--duration", "600",
                           "--report", str(report)], capture_output=True, text=True, timeout=240, cwd=ROOT)
    screen = " ".join((done.stdout + done.stderr).split())  # rich folds long lines
    assert done.returncode == 1, screen
    assert "Traceback" not in done.stdout + done.stderr, screen
    for said in MISTAKES[CLI_MISTAKE][2]:
        assert said in screen, (said, screen)
    _names_operator_and_cause(CLI_MISTAKE, json.loads(report.read_text()))


@pytest.mark.parametrize("mistake", [m for m in MISTAKES if m != CLI_MISTAKE])
def test_each_mistake_ends_the_run_at_once_naming_the_operator_and_the_cause(mistake, run_in_process, tmp_path):
    # Workers in threads of this process: what ends the run is the rehearsal, the same code a process runs.
    # Two minutes to run: a run the mistake does not end has no failure to report.
    _names_operator_and_cause(mistake, run_in_process(str(_job(mistake, tmp_path)), 120))


@pytest.mark.parametrize("url", ["redis://127.0.0.1:1", "redis://:s3cret@127.0.0.1:1/0"])
def test_an_unreachable_redis_is_one_line_naming_the_url_without_its_password(url):
    done = subprocess.run([sys.executable, "-m", "streamjobs.cli", "status", "--job", "mistakes", "--redis-url", url],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert done.returncode != 0 and 1 <= len(lines) <= 3, lines
    assert "Traceback" not in done.stderr and "s3cret" not in done.stdout + done.stderr
    assert "127.0.0.1:1" in lines[0]
