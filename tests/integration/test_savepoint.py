"""Savepoints against a real Redis: what a copy holds and leaves out, what it refuses, how a restore replaces."""

from __future__ import annotations

import dataclasses
import time

import pytest
import redis
import yaml
from streamjobs.cli import main
from streamjobs_core.control import ControlEvent, InstanceAddress, ReconfigureRecord, ReconfigureState
from streamjobs_core.jobstore import RedisJobStore
from streamjobs_core.keygroups import Assignment
from streamjobs_core.savepoint import Savepoint, SavepointError, Trust, restore, take

from ..jobs.control import JOB


def _job_keys(r, jobs) -> dict[bytes, bytes]:
    return {key: r.dump(key) for key in r.scan_iter(match=jobs.keys.pattern)}


def _with_progress(r, plan, jobs) -> None:
    """What a running job leaves besides its plan: input, state, a kg stream, a TTL'd key, its deployer, a
    request."""
    keys = jobs.keys
    r.xadd(keys.input_stream("src", 0), {"word": "a"})
    r.set(keys.snapshot("agg", 3), b"state 17")
    r.xadd(keys.kg_stream("src", "agg", 3), {"m": b"x"})
    jobs.request_control(ControlEvent("e-1", "agg", "asked", {}))
    r.xadd(keys.latency_samples, {"t": "1"})
    r.pexpire(keys.latency_samples, 600_000)
    jobs.deploy(plan, owner="uid-1")


def test_a_savepoint_copies_the_jobs_keys_but_input_owner_and_requests(r, plan, jobs, redis_server, tmp_path):
    _with_progress(r, plan, jobs)
    savepoint = take(jobs)
    copied = {key for key, _, _ in savepoint.keys}
    keys = jobs.keys
    assert ":snap:agg:3" in copied and ":kg:src>agg:3" in copied
    assert not {":in:src:0", ":k8s-owner", ":control:requests", ":plan", ":plans"} & copied  # plans travel as data
    assert next(ttl for key, ttl, _ in savepoint.keys if key == ":latency") > 0
    assert savepoint.plan == plan and savepoint.job == plan.name

    path = tmp_path / "sp" / "one.savepoint"
    savepoint.write(path)
    read = Savepoint.read(path)
    assert read == savepoint and not list(path.parent.glob(".*partial"))

    # Restored over a job that went on: everything of the copy comes back, what came since goes, the input stays.
    before = _job_keys(r, jobs)
    r.set(keys.snapshot("agg", 3), b"state 99")
    r.set(keys.snapshot("agg", 5), b"later")
    r.xadd(keys.input_stream("src", 0), {"word": "b"})
    restore(jobs, read)
    after = _job_keys(r, jobs)
    assert r.get(keys.snapshot("agg", 3)) == b"state 17"
    assert not r.exists(keys.snapshot("agg", 5)) and jobs.deployed_by() is None
    assert r.xlen(keys.input_stream("src", 0)) == 2  # producers' streams are theirs
    assert {k: v for k, v in before.items() if k.decode().removeprefix(keys.prefix) in copied | {":plan"}} == {
        k: v for k, v in after.items() if not k.startswith(keys.input_prefix.encode())}
    assert 0 < r.pttl(keys.latency_samples) <= 600_000

    # Into another Redis database: the same job, key for key.
    other = redis.Redis.from_url(f"{redis_server.url}/1")
    other.flushdb()
    restore(RedisJobStore(other, plan.name), read)
    assert other.get(keys.snapshot("agg", 3)) == b"state 17" and RedisJobStore(other, plan.name).plan() == plan
    other.flushdb()


def test_what_a_savepoint_refuses(r, plan, jobs):
    with pytest.raises(SavepointError, match="no job 'nope'"):
        take(RedisJobStore(r, "nope"))
    jobs.publish_plan(plan, ReconfigureState(version=1, started_at=0.0, changes=()))
    with pytest.raises(SavepointError, match="a reconfiguration of 'ctl' is in progress"):
        take(jobs)
    jobs.end_reconfigure(ReconfigureRecord(version=1, changes=(), duration_s=0.0))
    jobs.request_stop()
    with pytest.raises(SavepointError, match="stopped and drained"):
        take(jobs)


def test_a_file_that_is_no_savepoint_is_named(tmp_path):
    bad = tmp_path / "bad"
    bad.write_bytes(b"\x00not msgpack at all")
    with pytest.raises(SavepointError, match=f"{bad} is not a StreamJobs savepoint"):
        Savepoint.read(bad)
    with pytest.raises(SavepointError, match="cannot read savepoint"):
        Savepoint.read(tmp_path / "missing")


def test_a_device_a_huge_file_or_a_file_elsewhere_is_refused_at_once(tmp_path, r, plan, jobs):
    sparse = tmp_path / "sparse"
    with open(sparse, "wb") as f:
        f.truncate(2 << 30)  # 2 GB of zeros, none of it on disk
    started = time.monotonic()
    with pytest.raises(SavepointError, match="/dev/zero is not a regular file"):
        Savepoint.read("/dev/zero")
    with pytest.raises(SavepointError, match="is not a StreamJobs savepoint"):
        Savepoint.read(sparse)  # within the default bound: its first bytes say what it is not
    with pytest.raises(SavepointError, match="2,147,483,648 bytes, more than the 1,073,741,824"):
        Savepoint.read(sparse, Trust(max_bytes=1 << 30))
    assert time.monotonic() - started < 1.0

    mount = tmp_path / "savepoints"
    take(jobs).write(mount / "ok.savepoint")
    (mount / "elsewhere").symlink_to(tmp_path / "outside.savepoint")
    take(jobs).write(tmp_path / "outside.savepoint")
    assert Savepoint.read(mount / "ok.savepoint", Trust(root=mount)).plan == plan
    for path in (tmp_path / "outside.savepoint", mount / "elsewhere", mount / ".." / "outside.savepoint"):
        with pytest.raises(SavepointError, match=f"is not under {mount}"):
            Savepoint.read(path, Trust(root=mount))


def _refused_before_any_key_is_written(r, jobs, savepoint: Savepoint, data: bytes, match: str, path) -> None:
    path.write_bytes(data)
    before = _job_keys(r, jobs)
    with pytest.raises(SavepointError, match=match):
        restore(jobs, Savepoint.read(path))
    assert _job_keys(r, jobs) == before


def test_a_crafted_savepoint_is_refused_before_any_key_is_written(r, plan, jobs, tmp_path):
    _with_progress(r, plan, jobs)
    good = take(jobs)
    path = tmp_path / "crafted.savepoint"
    # A plan of another job among the keys, where the restore would take it as the job's plan.
    other = dataclasses.replace(plan, version=7)
    r.set("scratch", other.to_json())
    planted = dataclasses.replace(good, keys=(*good.keys, (":plan", 0, r.dump("scratch"))))
    _refused_before_any_key_is_written(r, jobs, good, planted.encode(), "no place for: ':plan'", path)
    # A key of an operator the job does not have, the deployer's key, and a stream where state is a string.
    for name in (":snap:intruder:3", ":k8s-owner"):
        foreign = dataclasses.replace(good, keys=(*good.keys, (name, 0, r.dump("scratch"))))
        _refused_before_any_key_is_written(r, jobs, good, foreign.encode(), f"no place for: '{name}'", path)
    stream_payload = r.dump(jobs.keys.kg_stream("src", "agg", 3))
    retyped = dataclasses.replace(good, keys=tuple((k, t, stream_payload if k == ":snap:agg:3" else p)
                                                   for k, t, p in good.keys))
    _refused_before_any_key_is_written(r, jobs, good, retyped.encode(), "':snap:agg:3' should hold a string", path)
    # One byte changed anywhere in its content.
    data = bytearray(good.encode())
    at = data.index(b"state 17")
    data[at] ^= 1
    _refused_before_any_key_is_written(r, jobs, good, bytes(data), "digest does not match", path)
    r.delete("scratch")


def test_a_signing_key_admits_only_savepoints_signed_with_it(r, plan, jobs, tmp_path):
    savepoint, path = take(jobs), tmp_path / "signed.savepoint"
    savepoint.write(path, b"key one")
    assert Savepoint.read(path, Trust(signing_key=b"key one")) == savepoint
    assert Savepoint.read(path) == savepoint  # a reader without a key checks the digest only
    with pytest.raises(SavepointError, match="signature does not match"):
        Savepoint.read(path, Trust(signing_key=b"key two"))
    savepoint.write(path)
    with pytest.raises(SavepointError, match="is not signed, and savepoints must be"):
        Savepoint.read(path, Trust(signing_key=b"key one"))


def test_the_cli_takes_one_and_run_refuses_what_it_cannot_restore(r, plan, jobs, redis_server, tmp_path, capsys):
    path = tmp_path / "ctl.savepoint"
    assert main(["savepoint", "--job", plan.name, "--redis-url", redis_server.url, "--path", str(path)]) == 0
    out = capsys.readouterr().out
    assert "savepoint of plan version 0" in out and f"--from-savepoint {path}" in out
    assert Savepoint.read(path).plan == plan
    assert main(["savepoint", "--job", plan.name, "--redis-url", redis_server.url, "--path", str(path),
                 "--stop"]) == 0  # no worker runs: it stops at once
    assert "stopped at its last commits" in capsys.readouterr().out and jobs.suspend_requested()

    assert main(["savepoint", "--job", "nope", "--redis-url", redis_server.url, "--path", str(path)]) == 1
    assert main(["run", "examples/wordcount.yaml", "--from-savepoint", str(path)]) == 2
    assert "metadata.name is 'wordcount', but the savepoint holds job 'ctl'" in capsys.readouterr().err
    assert main(["run", "examples/wordcount.yaml", "--from-savepoint", str(tmp_path / "none")]) == 2
    assert "--from-savepoint: cannot read savepoint" in capsys.readouterr().err


def test_a_spec_the_savepoint_cannot_take_is_refused_before_anything_is_replaced(
        r, plan, jobs, redis_server, tmp_path, capsys):
    path = tmp_path / "ctl.savepoint"
    take(jobs).write(path)
    r.set(jobs.keys.snapshot("agg", 3), b"state 99")  # the job went on
    agg = {**JOB["spec"]["stages"][0], "keyBy": "user"}
    edited = tmp_path / "ctl.yaml"
    edited.write_text(yaml.safe_dump({**JOB, "spec": {**JOB["spec"], "stages": [agg]}}))
    assert main(["run", str(edited), "--from-savepoint", str(path), "--redis-url", redis_server.url]) == 2
    assert "the savepoint cannot go on with this spec: spec.stages[agg].keyBy" in capsys.readouterr().err
    assert r.get(jobs.keys.snapshot("agg", 3)) == b"state 99"

    jobs.register(InstanceAddress("agg", 0, "10.0.0.1:9100"))  # a run may be going on
    same = tmp_path / "same.yaml"
    same.write_text(yaml.safe_dump(JOB))
    assert main(["run", str(same), "--from-savepoint", str(path), "--redis-url", redis_server.url]) == 2
    assert "workers of job 'ctl' are registered" in capsys.readouterr().err
    assert r.get(jobs.keys.snapshot("agg", 3)) == b"state 99"


def test_a_restore_the_key_groups_cannot_take_is_refused_and_leaves_the_savepoints_job(
        r, plan, jobs, redis_server, tmp_path, capsys):
    """Rescaled to 3 `agg` instances when the savepoint was taken, the job cannot go on under 2 key groups: the
    restore says so and what to do, and the job's Redis holds the savepoint's job, under its 12 key groups."""
    jobs.write_assignment("agg", Assignment.ranges(3, 12, epoch=2))
    path = tmp_path / "ctl.savepoint"
    take(jobs).write(path)
    edited = tmp_path / "ctl.yaml"
    edited.write_text(yaml.safe_dump({**JOB, "spec": {**JOB["spec"], "maxParallelism": 2}}))
    assert main(["run", str(edited), "--from-savepoint", str(path), "--redis-url", redis_server.url]) == 2
    assert "spec.maxParallelism: 'agg' runs 3 instances, more than the 2 key groups maxParallelism 2 gives it: " \
           "rescale it first" in capsys.readouterr().err
    assert jobs.plan() == plan and jobs.assignment("agg").parallelism == 3


def test_the_cli_signs_a_savepoint_and_run_goes_on_only_from_one_signed_with_its_key(
        plan, jobs, redis_server, tmp_path, capsys):
    key, other, path = tmp_path / "key", tmp_path / "other", tmp_path / "ctl.savepoint"
    key.write_text("s3cret\n")
    other.write_text("another\n")
    assert main(["savepoint", "--job", plan.name, "--redis-url", redis_server.url, "--path", str(path),
                 "--signing-key-file", str(key)]) == 0
    assert Savepoint.read(path, Trust(signing_key=b"s3cret")).plan == plan
    same = tmp_path / "same.yaml"
    same.write_text(yaml.safe_dump(JOB))
    capsys.readouterr()
    assert main(["run", str(same), "--from-savepoint", str(path), "--signing-key-file", str(other)]) == 2
    assert "--from-savepoint: " in capsys.readouterr().err
