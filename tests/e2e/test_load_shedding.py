"""Load shedding under overload, with the source and the stage SIGKILLed while the source sheds: what
was shed is counted and logged, and what was kept reaches the sink exactly once."""

from __future__ import annotations

from rich.console import Console
from streamjobs.run import run_job
from streamjobs_core.loading import parse_job

from .conftest import assert_exact, killer

OFFERED = 3_000  # records/s; the stage sleeps 1 ms per record, so it takes under 1,000
BACKLOG_BOUND = 1_500


def _job():
    return parse_job({"metadata": {"name": "shedding"}, "spec": {
        "maxParallelism": 4,
        "sources": [{"name": "words", "type": "zipf", "vocabulary": 200,
                     "rate": {"recordsPerSecond": OFFERED},
                     "loadShedding": {"maxBacklogRecords": BACKLOG_BOUND, "fraction": 0.5}}],
        "stages": [{"name": "slow", "type": "sql", "inputs": ["words"], "simulatedCostUs": 1000,
                    "query": "SELECT word, event_time FROM input"}],
        "sinks": [{"name": "out", "type": "redis_stream", "inputs": ["slow"]}],
        # Backpressure holds the source back, so the backlog builds where shedding sees it.
        "batching": {"maxLagRecords": 1_000, "maxRecords": 500},
    }})


def test_an_overloaded_source_sheds_counted_and_the_rest_is_exact_under_sigkill(redis_server, tmp_path):
    during = killer([(8, "words", 0), (12, "slow", 0), (16, "words", 0)])
    report = run_job(_job(), 22, redis_url=redis_server.url, console=Console(force_terminal=False),
                     log_dir=str(tmp_path), during=during)
    assert len(during.killed) == 3 and report["restarts"] >= 3
    shed = report["shed"].get("words", 0)
    words = report["operators"]["words"]
    # Every record the source consumed was either written downstream or shed and counted: none vanished.
    assert words["records_in"] == words["records_out"] + shed, (words, shed)
    # Half of each batch while over the bound (here every batch: 1,500 kept/s still exceed the stage's
    # capacity), never more.
    assert 1_000 <= shed <= words["records_in"] / 2, (words, shed)
    # The oracle regenerates the input from the source's offsets less the logged shed records.
    assert_exact(report)
