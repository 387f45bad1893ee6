"""Mistakes in a job end `streamjobs run` within seconds, naming the operator and what to fix: no restart loop,
no traceback, the report written. The start-up rehearsal meets them before any record is at stake."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
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


def _run(mistake: str, tmp_path: Path) -> tuple[subprocess.CompletedProcess, dict]:
    stage, changes, _ = MISTAKES[mistake]
    spec = json.loads(json.dumps(BASE))
    spec["spec"]["stages"][stage].update(changes)
    spec["spec"]["stages"][stage] = {k: v for k, v in spec["spec"]["stages"][stage].items() if v is not None}
    path = tmp_path / f"{mistake.replace(' ', '-')}.yaml"
    path.write_text(yaml.safe_dump(spec))
    report = path.with_suffix(".json")
    # Ten minutes to run: a run the mistake does not end at once outlasts the timeout. The timeout leaves room
    # for a loaded machine's JVM starts (two runs at once, each with a worker's and a rehearsal's session).
    done = subprocess.run([sys.executable, "-m", "streamjobs.cli", "run", str(path), "--duration", "600",
                           "--report", str(report)], capture_output=True, text=True, timeout=240, cwd=ROOT)
    return done, json.loads(report.read_text())


def test_each_mistake_ends_the_run_at_once_naming_the_operator_and_the_cause(tmp_path):
    with ThreadPoolExecutor(2) as pool:
        runs = dict(zip(MISTAKES, pool.map(lambda m: _run(m, tmp_path), MISTAKES)))
    for mistake, (done, report) in runs.items():
        screen = " ".join((done.stdout + done.stderr).split())  # rich folds long lines
        assert done.returncode == 1, (mistake, screen)
        assert "Traceback" not in done.stdout + done.stderr, (mistake, screen)
        for said in MISTAKES[mistake][2]:
            assert said in screen, (mistake, said, screen)
        assert report["failed"]["operator"] == "words" and report["restarts"] <= 1, (mistake, report)


@pytest.mark.parametrize("url", ["redis://127.0.0.1:1", "redis://:s3cret@127.0.0.1:1/0"])
def test_an_unreachable_redis_is_one_line_naming_the_url_without_its_password(url):
    done = subprocess.run([sys.executable, "-m", "streamjobs.cli", "status", "--job", "mistakes", "--redis-url", url],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert done.returncode != 0 and 1 <= len(lines) <= 3, lines
    assert "Traceback" not in done.stderr and "s3cret" not in done.stdout + done.stderr
    assert "127.0.0.1:1" in lines[0]
