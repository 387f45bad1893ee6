"""A redis_stream source against a real redis-server: input XADDed before the job starts survives the
start, arrives exactly once with typed columns (bad values dead-lettered with their field named), its
latency counts from the XADD, consumed input is trimmed as the retention says, and the oracle verifies
the run from the retained input or says it cannot.

The job's workers run in-process, stepped by hand, as in test_bad_input.py.
"""

from __future__ import annotations

import json
import time

import msgpack
import pyarrow as pa
import pytest
from streamjobs.local import LocalRuntime
from streamjobs.oracle import verify
from streamjobs_core.codec import encode_table
from streamjobs_core.control import PartitionProgress
from streamjobs_core.exchange import Fenced, Transaction
from streamjobs_core.jobstore import RedisJobStore
from streamjobs_core.loading import parse_job
from streamjobs_core.plan import JobPlan
from streamjobs_core.resplit import in_flight
from streamjobs_worker.ports import Ports
from streamjobs_worker.sources import RedisInputSource
from streamjobs_worker.worker import Worker

SCHEMA = "user string, amount double, n bigint"
BAD_EVERY = 25  # every 25th record's amount does not parse


def job(name: str, partitions: int = 2, **source):
    return parse_job({"metadata": {"name": name}, "spec": {
        "maxParallelism": 4,
        "sources": [{"name": "in", "type": "redis_stream", "partitions": partitions, "schema": SCHEMA, **source}],
        "sinks": [{"name": "out", "type": "redis_stream", "inputs": ["in"]}],
    }})


def deploy(r, job_) -> JobPlan:
    plan = JobPlan(job_, int(time.time() * 1000))
    RedisJobStore(r, plan.name).deploy(plan)
    return plan


def feed(r, keys, partitions: int, first: int, count: int) -> dict[int, bytes]:
    """XADD records first..first+count-1 spread over the partitions; the entry ID of each."""
    pipe = r.pipeline(transaction=False)
    for n in range(first, first + count):
        amount = "lots" if n % BAD_EVERY == 0 else str(n / 4)
        pipe.xadd(keys.input_stream("in", n % partitions), {"user": f"u{n % 7}", "amount": amount, "n": n})
    return dict(zip(range(first, first + count), pipe.execute()))


def run_until_drained(r, plan, workers, records: int, timeout_s: float = 20.0) -> None:
    """Step until the source committed all records fed, then stop it and step until the sink is done."""
    deadline = time.monotonic() + timeout_s
    jobs = RedisJobStore(r, plan.name)
    partitions = range(plan.spec.operator("in").partitions)
    while sum(p.records or 0 for p, _ in jobs.partitions("in", partitions).values() if p) < records:
        assert time.monotonic() < deadline, "the source did not consume its input"
        for worker in workers:
            worker.step()
    jobs.request_stop()
    while r.scard(plan.keys.done("out")) < 1:
        assert time.monotonic() < deadline, "the job did not drain"
        for worker in workers:
            worker.step()


def output(r, plan) -> list[int]:
    return sorted(int(fields[b"n"]) for _, fields in r.xrange(plan.keys.output_stream("out")))


def test_input_written_before_the_start_arrives_once_typed_and_bad_values_are_dead_lettered(r, redis_server, spark,
                                                                                          tmp_path):
    job_ = job("ext")
    runtime = LocalRuntime(job_, redis_server.url, tmp_path)
    keys = runtime.keys
    ids = feed(r, keys, 2, 0, 300)
    r.xadd(keys.output_stream("out"), {"n": "-1"})  # an earlier run's output and progress
    txn = Transaction()
    runtime.jobs.record_partitions(txn, "in", {0: PartitionProgress(b"1-0")})
    commit(r, txn)
    runtime.jobs.clear(keep_input=True)  # as `streamjobs run` does before it deploys
    assert [r.xlen(keys.input_stream("in", p)) for p in (0, 1)] == [150, 150]  # producers' input kept
    assert not r.exists(keys.output_stream("out"))  # the earlier run's reset
    assert runtime.jobs.partitions("in", [0]) == {0: (None, None)}
    time.sleep(0.3)  # the records wait in their streams: their latency counts from the XADD

    plan = deploy(r, job_)
    first = [Worker(Ports.over_redis(r, plan.id), plan, op, 0) for op in plan.vertices]
    for worker in first:
        worker.restore()
        worker.step()
    ids.update(feed(r, keys, 2, 300, 100))
    time.sleep(0.3)
    # Restarted: a new incarnation of each.
    second = [Worker(Ports.over_redis(r, plan.id), plan, op, 0) for op in plan.vertices]
    for worker in second:
        worker.restore()
    with pytest.raises(Fenced):
        first[0].step()  # the old incarnation reads the new input but cannot commit it
    run_until_drained(r, plan, second, 400)

    good = [n for n in range(400) if n % BAD_EVERY]
    assert output(r, plan) == good  # every good record once, none twice, none lost
    row = next(fields for _, fields in r.xrange(plan.keys.output_stream("out")) if fields[b"n"] == b"1")
    assert (row[b"user"], float(row[b"amount"])) == (b"u1", 0.25)
    dead = [{k.decode(): v.decode() for k, v in fields.items()} for _, fields in r.xrange(keys.dead_letter)]
    assert sorted(d["id"] for d in dead) == sorted(ids[n].decode() for n in range(0, 400, BAD_EVERY))
    assert {d["error"] for d in dead} == {"field 'amount': 'lots' is not a double"}
    assert {d["operator"] for d in dead} == {"in"}
    latencies = [ms for _, fields in r.xrange(keys.latency_samples) for ms in msgpack.unpackb(fields[b"l"])]
    assert min(latencies) >= 300, "latency counts from the XADD, at least 300 ms before a worker read it"
    assert r.xlen(keys.input_stream("in", 0)) == 200  # kept for the retention's 10 minutes

    result = verify(spark, Ports.over_redis(r, plan.id), plan)
    assert result["correct"] is True and result["sinks"]["out"]["expected"] == len(good), result


def test_a_trimming_source_keeps_no_consumed_input_and_its_run_cannot_be_verified(r, spark):
    plan = deploy(r, job("trim", partitions=1, retention={"mode": "trim"}))
    feed(r, plan.keys, 1, 0, 2_000)
    workers = [Worker(Ports.over_redis(r, plan.id), plan, op, 0) for op in plan.vertices]
    for worker in workers:
        worker.restore()
    run_until_drained(r, plan, workers, 2_000)
    assert output(r, plan) == [n for n in range(2_000) if n % BAD_EVERY]
    # XTRIM MINID ~ drops whole nodes of the stream: at most one node's entries (100) stay.
    assert r.xlen(plan.keys.input_stream("in", 0)) <= 100
    result = verify(spark, Ports.over_redis(r, plan.id), plan)
    assert result["correct"] is None and "cannot verify" in result["reason"], result


def commit(r, txn: Transaction) -> None:
    """The source's share of a commit, applied as the checkpoint does but trimming exactly."""
    for key, mapping in txn.hsets.items():
        r.hset(key, mapping=mapping)
    for key, minid in txn.trims.items():
        r.xtrim(key, minid=minid, approximate=False)


def test_consumed_input_is_trimmed_when_the_retention_says_and_unconsumed_input_never(r):
    plan = deploy(r, job("keep", partitions=1, retention={"ms": 300}))
    stream = plan.keys.input_stream("in", 0)
    ids = feed(r, plan.keys, 1, 0, 500)
    source = RedisInputSource(r, RedisJobStore(r, plan.name), plan, "in", (0,))
    source.restore()
    now = time.time()
    table, _ = source.poll(200, now, False)
    txn = Transaction()
    source.add_progress(txn)
    commit(r, txn)
    assert not txn.trims and r.xlen(stream) == 500  # consumed, but committed less than 300 ms ago
    source.poll(100, now + 0.1, False)
    txn = Transaction()
    source.add_progress(txn)
    commit(r, txn)
    source.poll(100, now + 0.35, False)  # the first commit is now 350 ms old, the second 250 ms
    txn = Transaction()
    source.add_progress(txn)
    commit(r, txn)
    assert r.xrange(stream, count=1)[0][0] == ids[200]  # the first 200 trimmed, the next 200 not yet
    assert r.xlen(stream) == 300

    restarted = RedisInputSource(r, RedisJobStore(r, plan.name), plan, "in", (0,))  # resumes from the committed cursor
    restarted.restore()
    table, _ = restarted.poll(1_000, time.time(), False)
    assert table.column("n").to_pylist() == [n for n in range(400, 500) if n % BAD_EVERY]
    assert [bad.entry_id for bad in restarted.bad] == [ids[n] for n in range(400, 500, BAD_EVERY)]


def test_ingest_time_and_event_time_are_the_entry_ids_time_and_idle_partitions_follow_redis_clock(r):
    plan = deploy(r, job("times"))
    ids = feed(r, plan.keys, 2, 1, 6)  # partition 1 gets 1, 3, 5; partition 0 gets 2, 4, 6
    source = RedisInputSource(r, RedisJobStore(r, plan.name), plan, "in", (0, 1))
    source.restore()
    table, watermark = source.poll(1_000, time.time(), False)
    id_ms = {n: int(entry_id.split(b"-")[0]) for n, entry_id in ids.items()}
    rows = table.to_pylist()
    assert {row["n"]: row["_ingest_ms"] for row in rows} == {n: id_ms[n] for n in range(1, 7)}
    assert all(row["event_time"] == row["_ingest_ms"] for row in rows)
    seconds, micros = r.time()
    # Both partitions read all they had: a later entry's ID is no earlier than the clock read before (in the same
    # millisecond it equals the watermark, which is not late).
    assert max(id_ms.values()) <= watermark <= seconds * 1000 + micros // 1000


@pytest.mark.parametrize("fmt", ["json", "arrow"])
def test_the_oracle_verifies_a_run_of_json_and_arrow_input(r, spark, fmt):
    schema = "user string, amount double, n bigint, small int, ok boolean, f float"
    plan = deploy(r, parse_job({"metadata": {"name": f"v-{fmt}"}, "spec": {
        "maxParallelism": 4,
        "sources": [{"name": "in", "type": "redis_stream", "format": fmt, "schema": schema}],
        "sinks": [{"name": "out", "type": "redis_stream", "inputs": ["in"]}]}}))
    records = [{"user": f"u{n}", "amount": n / 4, "n": n, "small": n % 5, "ok": n % 2 == 0, "f": n / 8}
               for n in range(200)]
    records[7]["amount"] = "lots"  # does not parse: dead-lettered, and left out by the oracle too
    stream = plan.keys.input_stream("in", 0)
    if fmt == "json":
        for record in records:
            r.xadd(stream, {"data": json.dumps(record)})
    else:
        for i in range(0, 200, 50):
            part = records[i:i + 50]
            r.xadd(stream, {"data": encode_table(pa.table({k: [str(x[k]) for x in part] for k in part[0]}))})
    workers = [Worker(Ports.over_redis(r, plan.id), plan, op, 0) for op in plan.vertices]
    for worker in workers:
        worker.restore()
    run_until_drained(r, plan, workers, 200)
    assert output(r, plan) == [n for n in range(200) if n != 7]
    assert r.xlen(plan.keys.dead_letter) == 1
    result = verify(spark, Ports.over_redis(r, plan.id), plan)
    assert result["correct"] is True and result["sinks"]["out"]["expected"] == 199, result


def test_a_paused_source_reads_nothing_more_while_what_it_read_drains_and_reads_on_when_resumed(r):
    """`savepoint --drain-in-flight`'s pause: the source's offsets stay where the pause found them, the operators
    after it take what is in flight (resplit.in_flight empties), and once resumed the source reads what arrived."""
    plan = deploy(r, parse_job({"metadata": {"name": "paused"}, "spec": {
        "maxParallelism": 4,
        "sources": [{"name": "in", "type": "redis_stream", "partitions": 2, "schema": SCHEMA}],
        "sinks": [{"name": "out", "type": "redis_stream", "inputs": ["in"], "chain": False}]}}))
    jobs = RedisJobStore(r, plan.name)
    source, sink = (Worker(Ports.over_redis(r, plan.id), plan, op, 0) for op in plan.vertices)
    for worker in (source, sink):
        worker.restore()
    feed(r, plan.keys, 2, 0, 100)
    taken = lambda: sum(p.records or 0 for p, _ in jobs.partitions("in", range(2)).values() if p)  # noqa: E731
    while taken() < 100:
        source.step()
    assert in_flight(jobs, plan) == [f"{100 - 4} records from 'in' not processed by 'out' yet"]
    paused = int(time.time() * 1000)
    jobs.request_pause(paused, paused + 60_000)
    assert jobs.paused_at(paused + 59_999) == paused and jobs.paused_at(paused + 60_000) is None  # it lapses
    time.sleep(0.25)  # a source reads the job's control requests every 0.2 s
    feed(r, plan.keys, 2, 100, 100)
    deadline = time.monotonic() + 20
    while in_flight(jobs, plan):
        assert time.monotonic() < deadline, in_flight(jobs, plan)
        source.step()
        sink.step()
    for _ in range(5):
        source.step()
    assert taken() == 100 and output(r, plan) == [n for n in range(100) if n % BAD_EVERY]

    jobs.resumed()
    time.sleep(0.25)
    while taken() < 200 or in_flight(jobs, plan):
        assert time.monotonic() < deadline + 20, "the source did not read on"
        source.step()
        sink.step()
    assert output(r, plan) == [n for n in range(200) if n % BAD_EVERY]


def test_a_bounded_read_returns_an_entry_past_the_size_limit_as_its_size_and_stops_at_the_byte_budget(r):
    from streamjobs_worker.external import Oversize, StreamReader

    r.xadd("s", {"a": "1"}, id="1-0")
    r.xadd("s", {"big": b"\xff" * 5000}, id="2-0")
    r.xadd("s", {"b": "x" * 600}, id="3-0")
    r.xadd("s", {"c": "y" * 600}, id="4-0")
    read = StreamReader(r, max_entry_bytes=4096, max_bytes=1024).read({"s": b"0-0"}, 10)
    [(name, entries)] = read.streams
    assert name == b"s" and [entry_id for entry_id, _ in entries] == [b"1-0", b"2-0", b"3-0"] and read.cut
    assert entries[0][1] == [b"a", b"1"]
    assert entries[1][1] == Oversize(5003, [b"big", b"\xff" * 5000])  # its size in full, its head shown
    assert abs(read.server_ms - time.time() * 1000) < 5000
    rest = StreamReader(r, 4096, 1024).read({"s": b"3-0"}, 10)
    assert [entry_id for entry_id, _ in rest.streams[0][1]] == [b"4-0"] and not rest.cut
    r.xadd("s", {"last": "1"}, id="18446744073709551615-18446744073709551615")
    end = StreamReader(r, 4096, 1024).read({"s": b"18446744073709551615-18446744073709551615"}, 10, block_ms=10)
    assert end.streams == [(b"s", [])]  # nothing can follow the largest ID; no error either


def test_a_source_reads_past_every_hostile_entry_and_dead_letters_each_with_its_reason(r):
    """Entries that crashed a worker or were read in part (issue 30), each among good records, read by the real
    source from a real redis-server: the good records all arrive, each bad entry is a dead letter."""
    plan = deploy(r, job("hostile-read", partitions=1, format="arrow", limits={"maxEntryBytes": 2**20}))
    stream = plan.keys.input_stream("in", 0)

    def payload(table: pa.Table) -> bytes:
        return encode_table(table)

    good = [pa.table({"user": [f"u{n}"], "amount": [n / 2], "n": pa.array([n], pa.int64())}) for n in range(6)]
    r.xadd(stream, {"data": payload(good[0])})
    r.xadd(stream, {"data": payload(pa.Table.from_arrays([pa.array(["a"]), pa.array(["b"])], names=["user", "user"]))})
    r.xadd(stream, {"data": payload(good[1])})
    r.xadd(stream, {"data": payload(good[2])[:-8]})  # no end-of-stream marker
    r.xadd(stream, {"data": b"\xff" * (3 * 2**20)})  # past maxEntryBytes: never read whole
    r.xadd(stream, {"data": payload(good[3])})
    r.xadd(stream, {"data": payload(good[4]), "extra": b"\xc3\x28"})
    r.xadd(stream, {"data": payload(good[5])})
    r.xadd(stream, {"data": payload(good[5])}, id="9223372036854775808-0")
    source = RedisInputSource(r, RedisJobStore(r, plan.name), plan, "in", (0,))
    source.restore()
    table, _ = source.poll(1000, time.time(), False)
    assert table.column("n").to_pylist() == [0, 1, 3, 4, 5]
    reasons = {bad.entry_id: (bad.kind.value, bad.error) for bad in source.bad}
    assert len(reasons) == 4 and source.offsets()[0] == b"9223372036854775808-0"  # read past all of them
    found = sorted(reasons.values())
    assert [kind for kind, _ in found] == ["oversize", "undecodable", "undecodable", "undecodable"]
    assert "3,145,732 bytes, over limits.maxEntryBytes" in found[0][1]
    assert any("column 'user' more than once" in error for _, error in found)
    assert any("end-of-stream marker" in error for _, error in found)
    assert any("its time is past" in error for _, error in found)
