"""Load shedding under overload, with the source (and the sink) SIGKILLed while the source sheds: what
was shed is counted and logged, and what was kept reaches the sink exactly once. A generator source's
run is checked by the oracle; an external stream's by the IDs the shed log names."""

from __future__ import annotations

import redis
from rich.console import Console
from streamjobs.launchers import ThreadLauncher
from streamjobs.run import run_job
from streamjobs_core import shedding
from streamjobs_core.exchange import RedisStreams
from streamjobs_core.jobstore import RedisJobStore
from streamjobs_core.layout import JobKeys
from streamjobs_core.loading import parse_job

from .conftest import assert_exact, killer

OFFERED = 3_000  # records/s; the sink sleeps 1 ms per record, so it takes under 1,000
BACKLOG_BOUND = 1_500


def _job():
    return parse_job({"metadata": {"name": "shedding"}, "spec": {
        "maxParallelism": 4,
        "sources": [{"name": "words", "type": "zipf", "vocabulary": 200,
                     "rate": {"recordsPerSecond": OFFERED},
                     "loadShedding": {"maxBacklogRecords": BACKLOG_BOUND, "fraction": 0.5}}],
        # No Spark stage: the slow sink makes the overload, and the test starts no worker JVM.
        "sinks": [{"name": "out", "type": "redis_stream", "inputs": ["words"], "simulatedCostUs": 1000,
                   "chain": False}],  # its own worker, behind an edge whose backpressure holds the source back
        # Backpressure holds the source back, so the backlog builds where shedding sees it.
        "batching": {"maxLagRecords": 1_000, "maxRecords": 500},
    }})


def test_an_overloaded_source_sheds_counted_and_the_rest_is_exact_under_sigkill(redis_server, tmp_path):
    during = killer([(8, "words", 0), (12, "out", 0), (16, "words", 0)])
    report = run_job(_job(), 22, redis_url=redis_server.url, console=Console(force_terminal=False), launcher=ThreadLauncher(),
                     log_dir=str(tmp_path), during=during)
    assert len(during.killed) == 3 and report["restarts"] >= 3
    shed = report["shed"].get("words", 0)
    words = report["operators"]["words"]
    # Every record the source consumed was either written downstream or shed and counted: none vanished.
    assert words["records_in"] == words["records_out"] + shed, (words, shed)
    # Half of each batch while over the bound (here every batch: 1,500 kept/s still exceed the sink's
    # capacity), never more.
    assert 1_000 <= shed <= words["records_in"] / 2, (words, shed)
    # The oracle regenerates the input from the source's offsets less the logged shed records.
    assert_exact(report)


FED = 24_000  # already in the input streams when the job starts: a backlog far over the bound


def _external_job():
    return parse_job({"metadata": {"name": "shed-external"}, "spec": {
        "maxParallelism": 4,
        "sources": [{"name": "orders", "type": "redis_stream", "partitions": 2,
                     "loadShedding": {"maxBacklogRecords": 4_000, "fraction": 0.5, "priorityField": "priority"}}],
        "sinks": [{"name": "out", "type": "redis_stream", "inputs": ["orders"]}],
        "batching": {"maxLagRecords": 1_000, "maxRecords": 500},
    }})


def _feed(r, plan) -> None:
    pipe = r.pipeline(transaction=False)
    for n in range(FED):
        # Each partition gets every other record, so its consecutive entries run through all ten priorities.
        pipe.xadd(plan.keys.input_stream("orders", n % 2), {"n": n, "priority": (n // 2) % 10})
    pipe.execute()


def test_an_external_stream_sheds_its_lowest_priorities_logs_their_ids_and_the_rest_arrives_once(
        redis_server, tmp_path):
    during = killer([(3, "orders", 0), (7, "orders", 0)])
    job = _external_job()
    report = run_job(job, 16, redis_url=redis_server.url, console=Console(force_terminal=False), launcher=ThreadLauncher(),
                     log_dir=str(tmp_path), during=during, prepare=_feed)
    assert len(during.killed) == 2 and report["restarts"] >= 2
    r = redis.Redis.from_url(redis_server.url)
    keys = JobKeys("shed-external")
    committed = RedisJobStore(r, "shed-external").partitions("orders", (0, 1))
    consumed = {(p, entry_id): fields for p in (0, 1)
                for entry_id, fields in r.xrange(keys.input_stream("orders", p), "-", committed[p][0].cursor)}
    shed = shedding.shed_ids(RedisStreams(r), keys.shed, "orders")
    out = [int(fields[b"n"]) for _, fields in r.xrange(keys.output_stream("out"))]
    # Nothing vanished and nothing arrived twice: what the source consumed was either shed (and logged by
    # ID) or reached the sink once.
    assert shed <= consumed.keys() and len(shed) == report["shed"]["orders"] > 0
    orders = report["operators"]["orders"]
    assert orders["records_in"] == len(consumed) == orders["records_out"] + len(shed), orders
    assert len(out) == len(set(out))
    assert set(out) == {int(consumed[k][b"n"]) for k in consumed.keys() - shed}
    # Only while the backlog was over the bound, and then the lower half of each batch's priorities.
    assert len(shed) < len(consumed) / 2
    low = sum(int(consumed[k][b"priority"]) < 5 for k in shed)
    print(f"fed {FED:,}, consumed {len(consumed):,}, shed {len(shed):,} ({low:,} of priority < 5), "
          f"delivered {len(out):,}")
    assert low >= 0.95 * len(shed), (low, len(shed))
