"""Live reconfiguration of a running job, checked per record against the oracle."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter

import redis
import yaml
from streamjobs_core.jobstore import RedisJobStore
from streamjobs_core.layout import JobKeys
from streamjobs_core.loading import load_job

from .conftest import ROOT, assert_exact, grown, in_a_thread

# An `over` stage after `tag` on a worker of its own: records wait in its state until the watermark passes them.
# Its aggregates are of event_time only (`k` counts up to 3), so that records tied on it, which go out in no
# fixed order, come out alike whichever goes first.
RECENT = {"name": "recent", "type": "over", "inputs": ["tag"], "keyBy": "word", "parallelism": 1, "rows": 3,
          "aggregations": [{"function": "count", "as": "k"}]}


def with_recent(path: str, out) -> None:
    doc = yaml.safe_load((ROOT / path).read_text())
    doc["spec"]["stages"].append(dict(RECENT))
    doc["spec"]["sinks"].append({"name": "recents", "type": "redis_stream", "inputs": ["recent"]})
    out.write_text(yaml.safe_dump(doc))


def test_a_new_query_where_and_stages_switch_at_one_cut_through_sigkills_mid_alignment(redis_server, run_in_process,
                                                                                         tmp_path):
    """`tag` (a query on its own workers) and `count` (a window) change live while words flow; a `tag` and a
    `count` instance are SIGKILLed while the barriers travel. Every record is processed under the plan in
    force at its source offset by every operator: the oracle replays each one under its version, so a record
    processed under both plans, or neither, or the wrong one, shows as lost or duplicated. Then `streamjobs
    reconfigure` asks the running job for more versions, after one it refuses: a stage `mark` added to the
    sources' chain (the streams into `tag` now come from it), two aggregations added to `count` and one to
    `recent` (their state kept), with a source instance SIGKILLed as the version is published, a `tag` instance
    before it switched, `recent` as soon as it switched (records read before wait in its state, to go out
    without the added aggregation) and a `count` instance after; then `mark` removed again."""
    first, v1 = tmp_path / "v0.yaml", tmp_path / "v1.yaml"
    with_recent("tests/jobs/reconfigured.yaml", first)
    with_recent("tests/jobs/reconfigured-v1.yaml", v1)
    new = load_job(v1)
    doc = yaml.safe_load(v1.read_text())
    doc["spec"]["stages"][1]["keyBy"] = "tag"
    refused = tmp_path / "refused.yaml"
    refused.write_text(yaml.safe_dump(doc))
    doc = yaml.safe_load(v1.read_text())
    tag = doc["spec"]["stages"][0]
    tag["simulatedCostUs"] = 50
    doc["spec"]["stages"][1]["aggregations"] += [{"function": "max", "column": "event_time", "as": "last"},
                                                 {"function": "count", "as": "since"}]
    doc["spec"]["stages"][2]["aggregations"] += [{"function": "max", "column": "event_time", "as": "latest"}]
    v2 = yaml.safe_dump(doc)
    # v3: a sink on workers of its own comes (`retagged`), one goes (`tagged`); a source comes, with its sink
    doc["spec"]["sinks"] = [{"name": "retagged", "type": "redis_stream", "inputs": ["tag"]},
                            {"name": "extras", "type": "redis_stream", "inputs": ["extra"]},
                            *(s for s in doc["spec"]["sinks"] if s["name"] != "tagged")]
    doc["spec"]["sources"].append({"name": "extra", "type": "redis_stream", "partitions": 2})
    removed = tmp_path / "v3.yaml"
    removed.write_text(yaml.safe_dump(doc))
    doc = yaml.safe_load(v2)
    tag = doc["spec"]["stages"][0]
    tag["inputs"] = ["mark"]
    doc["spec"]["stages"].insert(0, {"name": "mark", "type": "sql", "inputs": ["words"], "parallelism": 2,
                                     "query": "SELECT * FROM input WHERE word <> 'w2'"})
    added = tmp_path / "v2.yaml"
    added.write_text(yaml.safe_dump(doc))
    records, cli = [], []
    killed: dict[str, dict[int, int]] = {}  # instance -> the versions of its operator's key groups when killed

    def reconfigure_cli(path, during=lambda: None) -> None:
        with subprocess.Popen([sys.executable, "-m", "streamjobs.cli", "reconfigure", "--job", "reconfigured",
                               "-f", str(path), "--redis-url", redis_server.url, "--wait", "120"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as asked:
            during()
            out, err = asked.communicate(timeout=180)
        cli.append(subprocess.CompletedProcess(asked.args, asked.returncode, out, err))

    def produce(n: int, start: int) -> None:  # into the input of the source v3 adds, before and after it
        pipe = redis.Redis.from_url(redis_server.url).pipeline()
        for i in range(start, start + n):
            pipe.xadd(JobKeys("reconfigured").input_stream("extra", i % 2), {"n": i})
        pipe.execute()

    def change(runtime) -> None:
        def kill(op: str, index: int) -> None:
            killed[f"{op}/{index}"] = runtime.jobs.versions(op)
            runtime.kill(op, index)

        def kill_once_published(op: str, index: int) -> None:
            deadline = time.monotonic() + 60
            while runtime.jobs.reconfigure_state() is None and time.monotonic() < deadline:
                time.sleep(0.01)
            kill(op, index)

        def kill_once_switched(op: str, index: int, version: int) -> None:
            deadline = time.monotonic() + 120
            while set(runtime.jobs.versions(op).values()) != {version} and time.monotonic() < deadline:
                time.sleep(0.01)
            kill(op, index)

        try:
            in_a_thread(lambda _: records.append(runtime.reconfigure(new)))(runtime)
            kill_once_published("tag", 0)  # tag/0 comes back to barriers it has not passed yet
            time.sleep(0.5)
            kill("count", 1)
            while not records:
                time.sleep(0.1)
            reconfigure_cli(refused)
            # words/0 (its chain gains `mark`) comes back while the version is out; tag/1 then meets the barriers
            reconfigure_cli(added, lambda: (kill_once_published("words", 0), kill("tag", 1),
                                            kill_once_switched("recent", 0, 2)))
            tagged = runtime.keys.output_stream("tagged")
            grown(runtime.r, tagged, 1500)  # words flow through `mark`, and count holds rows of both versions
            kill("count", 0)
            grown(runtime.r, tagged, 1500)
            # as the sources switch: retagged/0, new, and tagged/0, which comes back to pass the barriers on
            produce(300, 0)
            reconfigure_cli(removed, lambda: (kill_once_published("retagged", 0), kill("tagged", 0)))
            produce(300, 300)
            grown(runtime.r, runtime.keys.output_stream("retagged"), 5000)  # words flow under the last version
        finally:
            runtime.request_stop()  # however long the changes took on a loaded machine

    reconfigure = in_a_thread(change)

    def during(runtime, elapsed: float) -> None:
        if _flowing(runtime):
            reconfigure(runtime)

    report = run_in_process(str(first), None, during=during)
    assert_exact(report)
    assert list(killed) == ["tag/0", "count/1", "words/0", "tag/1", "recent/0", "count/0", "retagged/0",
                            "tagged/0"] and report["restarts"] >= 8
    assert not any(killed["tag/0"].values()) and not any(killed["count/1"].values()), killed  # before they switched
    assert set(killed["tag/1"].values()) == {1}, killed  # before it switched to the version adding `mark`
    assert len(records) == 1 and records[0].version == 1, records
    assert [c.returncode for c in cli] == [2, 0, 0], cli
    assert "spec.stages[count].keyBy: refused" in cli[0].stdout
    assert "spec.stages[mark]: live (added at the cut)" in cli[1].stdout
    assert {"spec.sinks[retagged]: live (added at the cut)", "spec.sinks[tagged]: live (removed at the cut)",
            "spec.sources[extra]: live (its input read from its start, under the new plan)"} <= set(
        cli[2].stdout.splitlines())
    assert "spec.stages[count].aggregations: live (aggregations only added" in cli[1].stdout
    assert "spec.stages[recent].aggregations: live (aggregations only added" in cli[1].stdout
    assert set(killed["count/0"].values()) == {2}, killed  # with rows of windows open before the switch
    assert set(killed["recent/0"].values()) == {2}, killed
    assert [json.loads(c.stdout.splitlines()[-1])["version"] for c in cli[1:]] == [2, 3]
    assert [r["version"] for r in report["reconfigurations"]] == [1, 2, 3]
    streams = redis.Redis.from_url(redis_server.url).keys(JobKeys("reconfigured").kg_stream("mark", "tag", 0))
    assert not streams, "the streams from `mark` went when it was removed"
    assert report["reconfigurations"][0] == records[0].as_dict()
    assert set(records[0].aligned_ms) >= {"tag/0", "tag/1", "count/0", "count/1"}
    tags = Counter(fields[b"tag"] for _, fields in redis.Redis.from_url(redis_server.url).xrange(
        JobKeys("reconfigured").output_stream("tagged")))
    assert tags[b"v0"] > 1000 and tags[b"v1"] > 1000, tags
    store = RedisJobStore(redis.Redis.from_url(redis_server.url), "reconfigured")
    assert store.plan().vertices.count("retagged") == 1 and "tagged" not in store.plan().vertices
    assert set(killed["tagged/0"].values()) == {2}, killed
    assert set(store.versions("tagged").values()) == {3}, "`tagged` passed the last version on, then stopped"
    assert redis.Redis.from_url(redis_server.url).xlen(JobKeys("reconfigured").output_stream("retagged")) > 1000
    extras = redis.Redis.from_url(redis_server.url).xrange(JobKeys("reconfigured").output_stream("extras"))
    assert sorted(int(fields[b"n"]) for _, fields in extras) == list(range(600)), "the added source read from its start"
    assert not redis.Redis.from_url(redis_server.url).keys(JobKeys("reconfigured").kg_stream("tag", "tagged", "*"))
    counted = [fields for _, fields in redis.Redis.from_url(redis_server.url).xrange(
        JobKeys("reconfigured").output_stream("counts"))]
    spanning = [f for f in counted if b"since" in f and int(f[b"since"]) < int(f[b"n"])]
    assert spanning and any(b"last" not in f for f in counted), "windows before, across and after the switch"
    recents = [fields for _, fields in redis.Redis.from_url(redis_server.url).xrange(
        JobKeys("reconfigured").output_stream("recents"))]
    assert any(b"latest" in f for f in recents) and any(b"latest" not in f for f in recents)


def test_a_rebalance_by_load_unloads_the_instance_holding_the_hot_key_groups_exactly(redis_server, run_in_process):
    """The hottest key groups all start on count/0; `streamjobs rebalance` measures each key group's load and
    moves some of them, batched, while words flow: count/0's busy share drops, and the output stays exact."""
    from streamjobs.bench.reconfigure import busy_shares, hot_first

    shares, cli, dry = [], [], []

    def streamjobs(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "streamjobs.cli", *args, "--redis-url", redis_server.url],
                              capture_output=True, text=True, timeout=180)

    def rebalance(runtime) -> None:
        version = runtime.jobs.plan().version
        dry.append(streamjobs("rebalance", "--job", "skewed", "--operator", "count", "--measure-s", "2", "--dry-run"))
        dry.append(runtime.jobs.plan().version == version and runtime.jobs.control_history() == [])
        dry.append(streamjobs("status", "--job", "skewed"))
        shares.append(busy_shares(runtime.jobs, "count", 6))
        cli.append(subprocess.run(
            [sys.executable, "-m", "streamjobs.cli", "rebalance", "--job", "skewed", "--operator", "count",
             "--measure-s", "5", "--redis-url", redis_server.url, "--wait", "120"],
            capture_output=True, text=True, timeout=180))
        time.sleep(4)
        shares.append(busy_shares(runtime.jobs, "count", 6))
        runtime.request_stop()

    start = in_a_thread(rebalance)
    report = run_in_process("tests/jobs/skewed.yaml", None,
                            during=lambda runtime, elapsed: elapsed > 12 and start(runtime),
                            prepare=hot_first())
    assert_exact(report)
    assert dry[0].returncode == 0 and json.loads(dry[0].stdout)["moves"] > 0, dry[0].stderr
    assert dry[1], "a dry run sent a control event or made a plan version"
    table = dry[2].stdout
    assert dry[2].returncode == 0 and "count" in table and "in rec/s" in table and "plan version 0" in table, table
    assert cli[0].returncode == 0, cli[0].stderr
    planned, record = (json.loads(line) for line in cli[0].stdout.splitlines()[-2:])
    # What the rebalance decides on (records per key group) is measured; busy time also holds each instance's
    # fixed per-batch cost, which a loaded machine inflates: count/0's share must fall, by how much is the bench's.
    assert planned["shares_before"][0] == planned["busiest_share_before"] > 0.4
    assert planned["busiest_share_after"] < 0.75 * planned["busiest_share_before"] and planned["moves"] > 0
    assert record["strategy"] == "batched" and record["from"] == record["to"] == 4
    before, after = shares
    assert after[0] < before[0], shares


def test_control_events_reach_every_instance_at_one_cut_through_a_sigkill(redis_server, run_in_process, tmp_path):
    """`streamjobs control` sends events to the running job while words flow; `count/1` is SIGKILLed while
    the first one travels. Every instance of the operator replies once, at its sync point: the records its key
    groups read by then are exactly those the sources emitted before the event's cut (the stages between filter
    nothing), and the output stays exact."""
    doc = yaml.safe_load((ROOT / "tests/jobs/reconfigured.yaml").read_text())
    doc["spec"]["controlHandlers"] = {"echo": "tests.jobs.handlers:echo", "fail": "tests.jobs.handlers:fail"}
    path = tmp_path / "handled.yaml"
    path.write_text(yaml.safe_dump(doc))
    store = RedisJobStore(redis.Redis.from_url(redis_server.url), "reconfigured")
    answers, killed = [], []

    def control(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "streamjobs.cli", "control", "--job", "reconfigured", *args,
                               "--redis-url", redis_server.url, "--wait", "120"],
                              capture_output=True, text=True, timeout=180)

    def send(runtime) -> None:
        echo = in_a_thread(lambda _: answers.append(control("--operator", "count", "--event", "echo",
                                                            "--arg", "who=test")))
        echo(runtime)
        while store.reconfigure_state() is None:  # published: the barriers are on their way
            time.sleep(0.01)
        runtime.kill("count", 1)
        killed.append(store.versions("count"))
        while not answers:
            time.sleep(0.1)
        for args in (("tag", "load"), ("count", "state"), ("tag", "fail"), ("count", "flush")):
            answers.append(control("--operator", args[0], "--event", args[1]))
        runtime.request_stop()

    start = in_a_thread(send)
    report = run_in_process(str(path), None, during=lambda runtime, elapsed: _flowing(runtime) and start(runtime))
    assert_exact(report)
    echo, load, state, fail, unknown = answers
    assert [a.returncode for a in answers] == [0, 0, 0, 1, 2], [a.stderr for a in answers]
    # count/1 had not switched when it was killed: its restart met the barriers again and replied then, once.
    assert not any(killed[0].values()) and report["restarts"] >= 1, (killed, report["restarts"])
    records = []
    for answer in (echo, load):
        record = json.loads(answer.stdout)
        cut = store.cut(record["version"])
        emitted = sum(int(offset) for (source, _), offset in cut.items() if source == "words")
        replies = record["replies"]
        if answer is echo:
            assert set(replies) == {"count/0", "count/1"}
            assert sorted(kg for r in replies.values() for kg in r["key_groups"]) == list(range(12))
            assert all(r["args"] == {"who": "test"} and r["version"] == record["version"] for r in replies.values())
            read = sum(r["records"] for r in replies.values())
        else:
            assert set(replies) == {"tag/0", "tag/1"}
            read = sum(n for r in replies.values() for n in r["records"].values())
        assert read == emitted > 0, (read, cut)
        records.append(record)
    rows = json.loads(state.stdout)["replies"]
    assert sum(n for r in rows.values() for n in r["rows"].values()) > 0
    assert "tag/0: ValueError: asked to fail on instance 0" in fail.stderr
    assert "--event: the job has no handler 'flush'" in unknown.stderr
    assert [r["event"]["name"] for r in report["control_events"]] == ["echo", "load", "state", "fail"]


def _flowing(runtime) -> bool:
    """Words flow through every operator of tests/jobs/reconfigured.yaml: 3,000 tagged (3 s of input), a window
    fired. What the changes then meet is a running job's, whatever the machine's speed."""
    return (runtime.r.xlen(runtime.keys.output_stream("tagged")) >= 3000
            and runtime.r.xlen(runtime.keys.output_stream("counts")) > 0)
