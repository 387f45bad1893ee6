"""SQL in a spec that reaches the JVM (reflect, java_method, try_reflect) is refused, naming field and function."""

from __future__ import annotations

import pytest
import yaml
from streamjobs.cli import main as cli_main
from streamjobs_core.loading import SpecError, parse_job
from streamjobs_core.sqlguard import jvm_calls, refused_calls
from streamjobs_operator.config import Settings
from streamjobs_operator.reconcile import JobContext


@pytest.mark.parametrize("sql", [
    "SELECT reflect('java.lang.System', 'getenv', 'STREAMJOBS_REDIS_URL') AS u, event_time FROM input",
    "SELECT REFLECT ('java.lang.System', 'getenv') AS u FROM input",
    "SELECT `java_method`('java.lang.System', 'getenv') FROM input",
    "SELECT system.builtin.try_reflect('java.lang.System', 'getenv') FROM input",
    "SELECT reflect/* a comment */('java.lang.System', 'getenv') FROM input",
    "SELECT upper(word), reflect(\n'java.lang.System', 'getenv') FROM input",
])
def test_a_call_of_a_jvm_function_is_found_however_spelt(sql):
    assert len(jvm_calls(sql)) == 1


@pytest.mark.parametrize("sql", [
    "SELECT 'reflect(' AS s, \"java_method(\" AS t FROM input",
    "SELECT word FROM input -- reflect('java.lang.System', 'getenv')",
    "SELECT reflection(word), my_reflect(word), reflect_x(word), reflect FROM input",
    "SELECT word FROM input /* java_method('a', 'b') */",
])
def test_names_in_literals_comments_or_other_identifiers_are_not_calls(sql):
    assert jvm_calls(sql) == []


def _job(query: str, where: str | None = None, select: list[str] | None = None) -> dict:
    stage = {"name": "tag", "type": "sql", "inputs": ["words"], "query": query}
    if where:
        stage["where"] = where
    join = {"name": "pairs", "type": "join", "inputs": ["tag", "words"], "on": {"left": ["word"], "right": ["word"]},
            "kind": "regular", "ttlMs": 1000, "select": select or ["l.word AS word"]}
    return {"apiVersion": "streamjobs.dev/v1alpha1", "kind": "StreamJob", "metadata": {"name": "guarded"},
            "spec": {"sources": [{"name": "words", "type": "zipf"}], "stages": [stage, join],
                     "sinks": [{"name": "out", "type": "redis_stream", "inputs": ["pairs"]}]}}


def test_every_sql_field_is_searched_and_named():
    job = parse_job(_job("SELECT java_method('a', 'b') AS x, word, event_time FROM input",
                         where="reflect('java.lang.Math', 'abs', 1) > 0",
                         select=["l.word AS word", "try_reflect('a', 'b') AS y"]))
    refused = refused_calls(job)
    assert [(field, message.split(" ")[1]) for field, message in refused] == [
        ("spec.stages[0].query", "java_method(),"), ("spec.stages[0].where", "reflect(),"),
        ("spec.stages[1].select[1]", "try_reflect(),")]
    assert refused_calls(parse_job(_job("SELECT word, event_time FROM input"))) == []


def test_the_cli_refuses_it_unless_allowed(tmp_path, capsys):
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(_job("SELECT reflect('java.lang.System', 'getenv', 'HOME') AS h, word, "
                                        "event_time FROM input")))
    assert cli_main(["validate", str(path)]) == 1
    err = capsys.readouterr().err
    assert "spec.stages[0].query: calls reflect()" in err and "--allow-jvm-functions" in err
    assert cli_main(["validate", "--allow-jvm-functions", str(path)]) == 0


def test_the_operator_refuses_it_as_an_invalid_spec_unless_its_configuration_allows_it():
    body = {**_job("SELECT java_method('java.lang.System', 'getenv', 'HOME') AS h, word, event_time FROM input"),
            "metadata": {"name": "guarded", "namespace": "team", "uid": "u1"}}
    with pytest.raises(SpecError) as raised:
        JobContext.of(body, None, Settings())
    assert raised.value.errors[0][0] == "spec.stages[0].query" and "java_method()" in raised.value.errors[0][1]
    allowed = JobContext.of(body, None, Settings.from_env({"STREAMJOBS_ALLOW_JVM_FUNCTIONS": "true"}))
    assert allowed.owner.job == "team/guarded" and allowed.job.metadata.namespace == "team"
