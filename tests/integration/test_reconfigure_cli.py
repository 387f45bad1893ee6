"""`streamjobs reconfigure` against a job deployed in a real Redis: what it prints and how it exits."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from streamjobs.cli import main
from streamjobs_core.jobstore import RedisJobStore
from streamjobs_core.loading import load_job
from streamjobs_core.plan import JobPlan

JOBS = Path(__file__).resolve().parents[1] / "jobs"


@pytest.fixture
def deployed(r):
    store = RedisJobStore(r, "reconfigured")
    store.clear()
    store.deploy(JobPlan(load_job(JOBS / "reconfigured.yaml"), 0))
    yield store
    store.clear()


def test_a_dry_run_prints_each_change_and_applies_nothing(deployed, redis_server, capsys):
    code = main(["reconfigure", "--job", "reconfigured", "-f", str(JOBS / "reconfigured-v1.yaml"),
                 "--redis-url", redis_server.url, "--dry-run"])
    assert code == 0
    assert capsys.readouterr().out.splitlines() == [
        "spec.batching.maxWaitMs: live", "spec.stages[count].where: live", "spec.stages[tag].query: live"]
    assert deployed.plan().version == 0 and deployed.next_reconfigure_request() is None


def test_a_refused_field_is_named_and_nothing_is_asked_for(deployed, redis_server, capsys, tmp_path):
    doc = yaml.safe_load((JOBS / "reconfigured-v1.yaml").read_text())
    doc["spec"]["stages"][1]["window"]["sizeMs"] = 5000
    edited = tmp_path / "v2.yaml"
    edited.write_text(yaml.safe_dump(doc))
    code = main(["reconfigure", "--job", "reconfigured", "-f", str(edited), "--redis-url", redis_server.url])
    assert code == 2
    out = capsys.readouterr()
    assert "spec.stages[count].window: refused (the window_aggregate state depends on it" in out.out
    assert "nothing applied" in out.err
    assert deployed.next_reconfigure_request() is None


@pytest.mark.parametrize(("args", "message"), [
    (["--operator", "nope", "--event", "load"], "--operator: no operator 'nope' (operators: words, tag, count"),
    (["--operator", "count", "--event", "flush"], "--event: the job has no handler 'flush' (spec.controlHandlers "
                                                  "and built-ins: load, state)"),
    (["--operator", "count", "--event", "load", "--arg", "oops"], "--arg: 'oops' is not key=value"),
])
def test_a_control_event_the_job_cannot_take_is_refused_before_it_is_sent(deployed, redis_server, capsys, args,
                                                                          message):
    code = main(["control", "--job", "reconfigured", *args, "--redis-url", redis_server.url])
    assert code == 2
    assert message in capsys.readouterr().err
    assert deployed.next_control_request() is None
