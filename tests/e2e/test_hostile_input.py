"""A redis_stream job fed every kind of hostile entry among numbered good records runs to its end: no worker
restarts, every bad record a dead letter with its reason, every good one in the sinks exactly once, the
verification exact (it leaves out what the job dead-lettered), worker memory bounded."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
from rich.console import Console
from streamjobs.run import run_job
from streamjobs_core.deadletters import Kind, read_all
from streamjobs_core.exchange import RedisStreams
from streamjobs_core.layout import JobKeys
from streamjobs_core.loading import parse_job

BASE_MS = int(time.time() * 1000) - 60_000  # a minute ago: every good record is on time at the start
GOOD = 600  # numbered good records, 0..599, over two partitions and two formats
CAST_FAILS = 1500  # records whose `v` no SQL cast takes, in a row


def job():
    return parse_job({"metadata": {"name": "hostile"}, "spec": {
        "maxParallelism": 8,
        "sources": [
            {"name": "events", "type": "redis_stream", "format": "json", "partitions": 2, "eventTimeField": "ts",
             "schema": "n bigint, k string, v string, ts bigint", "limits": {"maxEntryBytes": 1048576}},
            {"name": "batches", "type": "redis_stream", "format": "arrow", "eventTimeField": "ts",
             "schema": "n bigint, k string, v string, ts bigint", "limits": {"maxPayloadBytes": 8388608}},
        ],
        "stages": [
            {"name": "parsed", "type": "sql", "inputs": ["events", "batches"],
             "query": "SELECT n, k, CAST(v AS INT) AS x, event_time FROM input"},
            {"name": "counts", "type": "window_aggregate", "inputs": ["parsed"], "keyBy": "k",
             "window": {"type": "tumbling", "sizeMs": 1000}, "aggregations": [{"function": "count", "as": "c"}]},
        ],
        "sinks": [{"name": "records", "type": "redis_stream", "inputs": ["parsed"]},
                  {"name": "windows", "type": "redis_stream", "inputs": ["counts"]}],
        "restarts": {"initialBackoffMs": 100},
    }})


def ipc(table: pa.Table, compression: str | None = None) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema, options=pa.ipc.IpcWriteOptions(compression=compression)) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def good(n: int) -> dict:
    return {"n": n, "k": f"k{n % 7}", "v": str(n), "ts": BASE_MS + 10 * n}


def rows(records: list[dict]) -> pa.Table:
    return pa.table({"n": pa.array([r["n"] for r in records], pa.int64()), "k": [r["k"] for r in records],
                     "v": [r["v"] for r in records], "ts": pa.array([r["ts"] for r in records], pa.int64())})


def feed(r, keys) -> dict[str, int]:
    """The good records and every bad kind, interleaved; the bad ones expected per dead-letter kind."""
    events = [keys.input_stream("events", p) for p in range(2)]
    arrow = keys.input_stream("batches", 0)
    expected = {kind: 0 for kind in Kind}

    def json_entry(stream, doc) -> None:
        r.xadd(stream, {"data": doc if isinstance(doc, bytes) else json.dumps(doc)})

    json_entry(events[0], {**good(0), "ts": BASE_MS + 3_600_000})  # an hour ahead: must move no watermark
    expected[Kind.FUTURE] += 1
    for n in range(0, 300, 2):
        json_entry(events[n % 4 // 2], good(n))
        if n == 100:  # a deep document (a good record) beside a malformed one
            deep = json.dumps(good(10_000))[:-1] + ', "x": ' + "[" * 100_000 + "]" * 100_000 + "}"
            json_entry(events[0], deep.encode())
            json_entry(events[0], b'{"n": 1, "k": ')
            expected[Kind.UNDECODABLE] += 1
        if n == 150:
            json_entry(events[1], {"n": 3, "k": "x", "v": "1", "ts": -(2**63)})  # out of range
            r.xadd(events[1], {"data": b"\xff" * (3 * 2**20)})  # past maxEntryBytes (1 MiB)
            expected[Kind.UNDECODABLE] += 1
            expected[Kind.OVERSIZE] += 1
    json_entry(events[0], good(10_001))
    for start in range(1, 300, 60):  # Arrow payloads of 30 odd-numbered records each
        r.xadd(arrow, {"data": ipc(rows([good(n) for n in range(start, start + 60, 2)]))})
    r.xadd(arrow, {"data": ipc(pa.Table.from_arrays([pa.array([1]), pa.array([2])], names=["n", "n"]))})
    two = rows([good(n) for n in range(301, 321, 2)])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, two.schema) as writer:
        writer.write_table(two.slice(0, 5))
        cut = sink.tell()
        writer.write_table(two.slice(5))
    r.xadd(arrow, {"data": sink.getvalue().to_pybytes()[:cut]})  # cut after its first batch: no records
    bomb = pa.table({"n": pa.array(np.arange(1000)), "k": ["b"] * 1000, "v": ["\0" * 16384] * 1000,
                     "ts": pa.array(np.full(1000, BASE_MS))})
    r.xadd(arrow, {"data": ipc(bomb, "zstd")})  # a few KB that decode to 16 MB, past maxPayloadBytes (8 MiB)
    expected[Kind.UNDECODABLE] += 2
    expected[Kind.OVERSIZE] += 1
    for i in range(CAST_FAILS):  # no cast takes them: each a dead letter of the stage, none stops it
        json_entry(events[i % 2], {"n": 20_000 + i, "k": "bad", "v": "not a number", "ts": BASE_MS + 2000})
    expected[Kind.REJECTED] += CAST_FAILS
    for n in range(300, GOOD, 2):
        json_entry(events[n % 4 // 2], good(n))
    for start in range(301, GOOD, 60):
        r.xadd(arrow, {"data": ipc(rows([good(n) for n in range(start, min(start + 60, GOOD), 2)]))})
    r.xadd(events[1], {"data": json.dumps(good(10_002))}, id="9223372036854775808-0")  # its ID past event times
    expected[Kind.UNDECODABLE] += 1
    return expected


def worker_rss_mb(runtime) -> float:
    """The largest resident memory of a worker and its JVM (its own session), MB."""
    groups: dict[int, float] = {}
    pids = {inst.process.pid for inst in list(runtime.processes.instances.values())}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            sid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[3])
            rss = next(int(line.split()[1]) for line in (entry / "status").read_text().splitlines()
                       if line.startswith("VmRSS:"))
        except (OSError, StopIteration, IndexError, ValueError):
            continue
        if sid in pids:
            groups[sid] = groups.get(sid, 0.0) + rss / 1024
    return max(groups.values(), default=0.0)


def test_a_job_fed_every_kind_of_hostile_entry_runs_exactly_with_each_bad_one_dead_lettered(redis_server, r, tmp_path):
    spec = job()
    keys = JobKeys(spec.metadata.name)
    expected = feed(r, keys)
    late_sent: list[int] = []
    peak = [0.0]

    def during(runtime, elapsed: float) -> None:
        peak[0] = max(peak[0], worker_rss_mb(runtime))
        if not late_sent and r.xlen(keys.output_stream("windows")) > 0:
            # Windows fired: a record of the first second now is behind its key group's watermark.
            r.xadd(keys.input_stream("events", 0), {"data": json.dumps({**good(10_003), "k": "k3", "ts": BASE_MS})})
            late_sent.append(1)
        elif late_sent and r.xlen(keys.output_stream("records")) >= GOOD + 3:  # every good record arrived
            runtime.request_stop()

    report = run_job(spec, 30, redis_url=redis_server.url, console=Console(force_terminal=False),
                     log_dir=str(tmp_path / "logs"), during=during, fresh=True)
    assert late_sent, "the window stage never fired"
    assert report["restarts"] == 0 and report["drained"]
    letters = read_all(RedisStreams(r), keys.dead_letter)
    kinds = {kind: sum(1 for letter in letters if letter.kind == kind) for kind in Kind}
    expected[Kind.LATE] = 1
    assert kinds == expected, [(l.kind.value, l.error[:100]) for l in letters if l.kind != Kind.REJECTED]
    assert all(letter.error for letter in letters)
    assert max(letter.size for letter in letters) == 3 * 2**20 + len("data")  # the oversize entry, not read
    assert max(len(letter.record) for letter in letters) < 20_000  # previews, never the record whole
    numbered = sorted(int(f[b"n"]) for _, f in r.xrange(keys.output_stream("records")))
    assert numbered == sorted([*range(GOOD), 10_000, 10_001, 10_003])  # every good record exactly once
    verification = report["verification"]
    assert verification["correct"] is True, verification
    assert verification["left_out"]["parsed"] == {"rejected": CAST_FAILS}
    assert verification["left_out"]["counts"] == {"late": 1}
    assert peak[0] < 2048, f"a worker peaked at {peak[0]:.0f} MB"
    assert os.path.exists(tmp_path / "logs" / "report.json")
