"""The StreamJob spec model and its loading: defaults, and every error named by its exact field path."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from streamjobs.cli import main as cli_main
from streamjobs_core.loading import SpecError, load_job, parse_job
from streamjobs_core.spec import StreamJob

pytestmark = pytest.mark.unit

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "wordcount.yaml"

TOP_FIELDS = ("apiVersion", "kind", "metadata", "spec")

# words (zipf) -> count (window_aggregate, keyed) -> out (console)
VALID: dict[str, Any] = {
    "apiVersion": "streamjobs.dev/v1alpha1",
    "kind": "StreamJob",
    "metadata": {"name": "wc"},
    "spec": {
        "sources": [{"name": "words", "type": "zipf"}],
        "stages": [
            {
                "name": "count",
                "type": "window_aggregate",
                "inputs": ["words"],
                "keyBy": "word",
                "window": {"sizeMs": 1000},
                "aggregations": [{"function": "count", "as": "n"}],
            }
        ],
        "sinks": [{"name": "out", "type": "console", "inputs": ["count"]}],
    },
}


def doc(mutate: Callable[[dict[str, Any]], Any] | None = None) -> dict[str, Any]:
    d = copy.deepcopy(VALID)
    if mutate is not None:
        mutate(d)
    return d


def spec_of(d: dict[str, Any]) -> dict[str, Any]:
    return d["spec"]


def errors_of(data: Any) -> list[tuple[str, str]]:
    with pytest.raises(SpecError) as info:
        parse_job(data)
    assert info.value.errors, "a SpecError must name at least one error"
    return info.value.errors


def paths_of(data: Any) -> list[str]:
    return [path for path, _ in errors_of(data)]


def sql(name: str, *inputs: str) -> dict[str, Any]:
    return {"name": name, "type": "sql", "inputs": list(inputs), "query": "select * from input"}


def replace_stage(d: dict[str, Any], stage: dict[str, Any]) -> None:
    spec_of(d)["stages"][0] = stage


# --- valid documents ------------------------------------------------------------


def test_minimal_document_parses_with_defaults() -> None:
    job = parse_job(doc())
    spec = job.spec
    assert job.api_version == "streamjobs.dev/v1alpha1"
    assert job.kind == "StreamJob"
    assert job.metadata.name == "wc"
    assert spec.max_parallelism == 120
    assert spec.suspend is False
    source = spec.sources[0]
    assert source.parallelism == 1
    assert source.seed == 42
    assert source.vocabulary == 1000
    assert source.rate.profile == "constant"
    assert source.rate.records_per_second == 1000.0
    assert source.out_of_order_ms == 0
    stage = spec.stages[0]
    assert stage.inputs == ("words",)
    assert stage.key_by == "word"
    assert stage.window.type == "tumbling"
    assert stage.window.slide_ms is None
    assert stage.window.step_ms == 1000
    assert stage.aggregations[0].as_ == "n"
    assert stage.allowed_lateness_ms == 0
    assert spec.state.backend == "memory"
    assert spec.state.snapshot_every_batches == 50
    assert spec.batching.min_records == 1
    assert spec.batching.max_records == 200_000
    assert spec.batching.target_batch_ms == 1000
    assert spec.autoscaler.policy == "off"
    assert spec.autoscaler.target_utilization == 0.7
    assert spec.rescale.strategy == "all_at_once"
    assert spec.rescale.assignment == "ranges"
    assert spec.redis.url is None
    assert spec.redis.cluster is False


def test_api_version_and_kind_default_when_omitted() -> None:
    d = doc()
    del d["apiVersion"], d["kind"]
    job = parse_job(d)
    assert (job.api_version, job.kind) == ("streamjobs.dev/v1alpha1", "StreamJob")


def test_snake_case_field_names_are_accepted_too() -> None:
    d = doc(lambda d: spec_of(d).update(max_parallelism=60))
    d["spec"]["stages"][0]["key_by"] = d["spec"]["stages"][0].pop("keyBy")
    job = parse_job(d)
    assert job.spec.max_parallelism == 60
    assert job.spec.stages[0].key_by == "word"


def test_example_file_loads() -> None:
    job = load_job(EXAMPLE)
    assert job.metadata.name == "wordcount"
    assert job.spec.max_parallelism == 120
    assert [op.name for op in job.spec.operators] == ["words", "count", "counts"]
    words, count, counts = job.spec.operators
    assert (words.type, words.vocabulary, words.exponent, words.out_of_order_ms) == ("zipf", 500, 1.2, 200)
    assert words.rate.records_per_second == 2000
    assert (count.type, count.key_by, count.parallelism) == ("window_aggregate", "word", 2)
    assert (count.window.type, count.window.size_ms) == ("tumbling", 2000)
    assert [(a.function, a.as_) for a in count.aggregations] == [("count", "n")]
    assert (counts.type, counts.inputs) == ("redis_stream", ("count",))
    assert job.spec.topological_order() == ("words", "count", "counts")


def test_load_job_accepts_the_same_document_as_parse_job(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc()))
    assert load_job(path) == parse_job(doc())
    assert load_job(str(path)) == parse_job(doc())


def test_model_is_frozen() -> None:
    job = parse_job(doc())
    with pytest.raises(ValidationError):
        job.spec.max_parallelism = 7  # type: ignore[misc]
    with pytest.raises(ValidationError):
        job.spec.stages[0].parallelism = 3  # type: ignore[misc]
    with pytest.raises(ValidationError):
        job.metadata.name = "other"  # type: ignore[misc]
    assert job.spec.max_parallelism == 120
    assert job.spec.stages[0].parallelism == 1
    # Frozen models are hashable and equal by value.
    assert hash(job) == hash(parse_job(doc()))


def test_sliding_window_and_all_variants_parse() -> None:
    def build(d: dict[str, Any]) -> None:
        s = spec_of(d)
        s["sources"].append({"name": "bids", "type": "nexmark", "rate": {"profile": "sine", "amplitude": 10}})
        s["sources"].append({"name": "ext", "type": "redis_stream", "partitions": 4})
        s["stages"][0]["window"] = {"type": "sliding", "sizeMs": 1000, "slideMs": 250}
        s["stages"].append({"name": "fn", "type": "pyspark", "inputs": ["bids", "ext"], "function": "pkg.mod:fn"})
        s["stages"].append(
            {"name": "st", "type": "stateful", "inputs": ["fn"], "keyBy": "k", "function": "m:f", "stateSchema": "n long"}
        )
        s["sinks"].append({"name": "files", "type": "parquet", "inputs": ["st"], "path": "/tmp/x"})

    job = parse_job(doc(build))
    assert job.spec.stages[0].window.step_ms == 250
    assert [type(op).__name__ for op in job.spec.operators] == [
        "ZipfSource", "NexmarkSource", "RedisStreamSource",
        "WindowAggregateStage", "PySparkStage", "StatefulStage",
        "ConsoleSink", "ParquetSink",
    ]  # fmt: skip


# --- topological order ----------------------------------------------------------


def test_topological_order_with_fan_out_and_fan_in() -> None:
    # Listed in an order that is not topological: join before its inputs.
    def build(d: dict[str, Any]) -> None:
        s = spec_of(d)
        s["sources"] = [{"name": "a", "type": "zipf"}, {"name": "b", "type": "zipf"}]
        s["stages"] = [sql("join", "left", "right", "b"), sql("left", "a"), sql("right", "a"), sql("tail", "join")]
        s["sinks"] = [{"name": "out", "type": "console", "inputs": ["tail", "left"]}]

    spec = parse_job(doc(build)).spec
    order = spec.topological_order()
    assert sorted(order) == sorted(op.name for op in spec.operators)
    position = {name: i for i, name in enumerate(order)}
    for op in spec.operators:
        for upstream in getattr(op, "inputs", ()):
            assert position[upstream] < position[op.name], (upstream, op.name, order)
    assert order[-1] == "out"
    assert {c.name for c in spec.consumers("a")} == {"left", "right"}
    assert {c.name for c in spec.consumers("left")} == {"join", "out"}
    assert spec.operator("join").inputs == ("left", "right", "b")
    with pytest.raises(KeyError):
        spec.operator("missing")


# --- field errors, each with its exact path -------------------------------------


@pytest.mark.parametrize(
    ("mutate", "path", "message"),
    [
        pytest.param(
            lambda d: spec_of(d)["sources"][0].update(rate={"recordsPerSecond": -5}),
            "spec.sources[0].rate.recordsPerSecond",
            "greater than 0",
            id="source-rate",
        ),
        pytest.param(
            lambda d: spec_of(d)["sources"][0].update(rate={"profile": "steps", "steps": [{"atS": 1, "recordsPerSecond": 0}]}),
            "spec.sources[0].rate.steps[0].recordsPerSecond",
            "greater than 0",
            id="rate-step",
        ),
        pytest.param(
            lambda d: spec_of(d)["sources"][0].update(rate={"profile": "steps"}),
            "spec.sources[0].rate",
            "at least one entry",
            id="steps-profile-without-steps",
        ),
        pytest.param(
            lambda d: spec_of(d)["sources"][0].update(outOfOrderMs=60_001),
            "spec.sources[0].outOfOrderMs",
            "less than or equal to 60000",
            id="out-of-order",
        ),
        pytest.param(
            lambda d: spec_of(d)["stages"][0]["window"].update(type="sliding", slideMs=0),
            "spec.stages[0].window.slideMs",
            "greater than or equal to 1",
            id="slide-ms",
        ),
        pytest.param(
            lambda d: spec_of(d)["stages"][0]["window"].update(type="sliding", slideMs=300),
            "spec.stages[0].window",
            "slideMs must divide sizeMs",
            id="slide-divides-size",
        ),
        pytest.param(
            lambda d: spec_of(d)["stages"][0]["window"].update(slideMs=500),
            "spec.stages[0].window",
            "only for sliding",
            id="slide-on-tumbling",
        ),
        pytest.param(
            lambda d: spec_of(d)["stages"][0]["aggregations"][0].update(function="sum"),
            "spec.stages[0].aggregations[0]",
            "needs a column",
            id="aggregation-column",
        ),
        pytest.param(
            lambda d: spec_of(d)["stages"][0]["aggregations"][0].update({"function": "median"}),
            "spec.stages[0].aggregations[0].function",
            "'count'",
            id="aggregation-function",
        ),
        pytest.param(
            lambda d: spec_of(d)["sinks"][0].update(type="parquet"),
            "spec.sinks[0].path",
            "Field required",
            id="sink-missing-field",
        ),
        pytest.param(
            lambda d: spec_of(d)["sinks"][0].update(name="Out_1"),
            "spec.sinks[0].name",
            "DNS label",
            id="operator-name",
        ),
        pytest.param(
            lambda d: d["metadata"].update(name="x" * 41),
            "metadata.name",
            "DNS label",
            id="job-name-too-long",
        ),
        pytest.param(
            lambda d: spec_of(d)["stages"][0].update(type="bogus"),
            "spec.stages[0]",
            "'bogus'",
            id="unknown-stage-type",
        ),
        pytest.param(
            lambda d: spec_of(d)["sources"][0].pop("type"),
            "spec.sources[0]",
            "discriminator 'type'",
            id="missing-source-type",
        ),
        pytest.param(
            lambda d: spec_of(d)["stages"][0].update(colour="red"),
            "spec.stages[0].colour",
            "Extra inputs are not permitted",
            id="extra-field-in-stage",
        ),
        pytest.param(
            lambda d: spec_of(d)["batching"].update(surprise=1) if "batching" in spec_of(d) else spec_of(d).update(batching={"surprise": 1}),
            "spec.batching.surprise",
            "Extra inputs are not permitted",
            id="extra-field-in-settings",
        ),
        pytest.param(
            lambda d: d.update(status={}),
            "status",
            "Extra inputs are not permitted",
            id="extra-top-level-field",
        ),
        pytest.param(
            lambda d: d.update(kind="Deployment"),
            "kind",
            "'StreamJob'",
            id="wrong-kind",
        ),
        pytest.param(
            lambda d: spec_of(d).update(batching={"minRecords": 10, "maxRecords": 5}),
            "spec.batching",
            "minRecords may not exceed maxRecords",
            id="batching-bounds",
        ),
        pytest.param(
            lambda d: spec_of(d).update(sinks=[]),
            "spec.sinks",
            "at least 1 item",
            id="no-sinks",
        ),
        pytest.param(
            lambda d: replace_stage(d, sql("count", "words") | {"query": "delete from x"}),
            "spec.stages[0].query",
            "SELECT",
            id="sql-not-select",
        ),
        pytest.param(
            lambda d: replace_stage(d, {"name": "count", "type": "pyspark", "inputs": ["words"], "function": "no_colon"}),
            "spec.stages[0].function",
            "package.module:function",
            id="function-ref",
        ),
    ],
)
def test_field_error_has_exact_path(mutate: Callable[[dict[str, Any]], Any], path: str, message: str) -> None:
    errors = errors_of(doc(mutate))
    assert [p for p, _ in errors] == [path], errors
    assert message in errors[0][1]


# --- graph errors ---------------------------------------------------------------


def test_unknown_operator_in_inputs() -> None:
    def build(d: dict[str, Any]) -> None:
        spec_of(d)["stages"].append(sql("extra", "words", "nope"))
        spec_of(d)["sinks"][0]["inputs"].append("extra")

    errors = errors_of(doc(build))
    assert errors == [("spec.stages[1].inputs[1]", "unknown operator 'nope'")]


def test_unknown_operator_in_sink_inputs() -> None:
    errors = errors_of(doc(lambda d: spec_of(d)["sinks"][0]["inputs"].append("ghost")))
    assert errors == [("spec.sinks[0].inputs[1]", "unknown operator 'ghost'")]


def test_duplicate_names_across_groups() -> None:
    def build(d: dict[str, Any]) -> None:
        spec_of(d)["sinks"].append({"name": "count", "type": "console", "inputs": ["count"]})

    errors = errors_of(doc(build))
    assert ("spec.sinks[1].name", "duplicate operator name 'count' (also spec.stages[0])") in errors
    assert not any(p.startswith("spec.stages[0].name") for p, _ in errors)


def test_duplicate_source_names() -> None:
    errors = errors_of(doc(lambda d: spec_of(d)["sources"].append({"name": "words", "type": "nexmark"})))
    assert [p for p, _ in errors] == ["spec.sources[1].name"]
    assert "duplicate operator name 'words'" in errors[0][1]


@pytest.mark.parametrize("stage_type", ["window_aggregate", "stateful"])
def test_keyed_stages_need_key_by(stage_type: str) -> None:
    def build(d: dict[str, Any]) -> None:
        stage = spec_of(d)["stages"][0]
        del stage["keyBy"]
        if stage_type == "stateful":
            del stage["window"], stage["aggregations"]
            stage.update(type="stateful", function="m:f", stateSchema="n long")

    assert errors_of(doc(build)) == [("spec.stages[0].keyBy", f"a {stage_type} stage needs keyBy")]


def test_sql_stage_does_not_need_key_by() -> None:
    job = parse_job(doc(lambda d: spec_of(d).update(stages=[sql("count", "words")])))
    assert job.spec.stages[0].key_by is None


def test_cycle_is_reported_on_stages() -> None:
    def build(d: dict[str, Any]) -> None:
        spec_of(d)["stages"] += [sql("a", "words", "b"), sql("b", "a")]
        spec_of(d)["sinks"][0]["inputs"].append("b")

    errors = errors_of(doc(build))
    assert [p for p, _ in errors] == ["spec.stages"]
    assert "cycle" in errors[0][1]
    assert "a" in errors[0][1] and "b" in errors[0][1]


def test_self_loop_is_reported_on_its_input() -> None:
    errors = errors_of(doc(lambda d: spec_of(d)["stages"][0]["inputs"].append("count")))
    assert ("spec.stages[0].inputs[1]", "an operator cannot read its own output") in errors


def test_sink_used_as_input() -> None:
    def build(d: dict[str, Any]) -> None:
        spec_of(d)["stages"].append(sql("after", "out"))
        spec_of(d)["sinks"].append({"name": "out2", "type": "console", "inputs": ["after"]})

    assert errors_of(doc(build)) == [("spec.stages[1].inputs[0]", "'out' is a sink and has no output")]


def test_output_that_reaches_no_sink() -> None:
    errors = errors_of(doc(lambda d: spec_of(d)["stages"].append(sql("dangling", "words"))))
    assert errors == [("spec.stages[1].name", "output of 'dangling' reaches no sink")]


def test_input_listed_twice() -> None:
    errors = errors_of(doc(lambda d: spec_of(d)["sinks"][0]["inputs"].append("count")))
    assert errors == [("spec.sinks[0].inputs", "lists an input twice")]


def test_input_listed_twice_is_reported_along_with_its_unknown_items() -> None:
    # Regression: the filter meant for pydantic's "list too short" errors dropped graph errors
    # whose path is a prefix of another one.
    errors = errors_of(doc(lambda d: spec_of(d)["stages"][0].update(inputs=["nope", "nope"])))
    paths = [p for p, _ in errors]
    assert "spec.stages[0].inputs" in paths
    assert "spec.stages[0].inputs[0]" in paths and "spec.stages[0].inputs[1]" in paths


def test_cycle_is_reported_along_with_a_dangling_stage() -> None:
    # Regression: "spec.stages" (cycle) was dropped as a prefix of "spec.stages[3].name".
    def build(d: dict[str, Any]) -> None:
        spec_of(d)["stages"] += [sql("a", "b"), sql("b", "a"), sql("dangling", "words")]

    paths = [p for p, _ in errors_of(doc(build))]
    assert "spec.stages" in paths
    assert "spec.stages[3].name" in paths


@pytest.mark.parametrize(("max_parallelism", "parallelism"), [(None, 121), (4, 5), (1, 2)])
def test_parallelism_above_max_parallelism(max_parallelism: int | None, parallelism: int) -> None:
    def build(d: dict[str, Any]) -> None:
        if max_parallelism is not None:
            spec_of(d)["maxParallelism"] = max_parallelism
        spec_of(d)["stages"][0]["parallelism"] = parallelism

    limit = 120 if max_parallelism is None else max_parallelism
    assert errors_of(doc(build)) == [
        ("spec.stages[0].parallelism", f"{parallelism} exceeds maxParallelism {limit}")
    ]


def test_parallelism_equal_to_max_parallelism_is_fine() -> None:
    job = parse_job(doc(lambda d: spec_of(d).update(maxParallelism=4) or spec_of(d)["stages"][0].update(parallelism=4)))
    assert job.spec.stages[0].parallelism == 4


# --- several errors at once -------------------------------------------------------


def test_all_field_errors_are_reported() -> None:
    def build(d: dict[str, Any]) -> None:
        d["metadata"]["name"] = "Bad Name"
        spec_of(d)["sources"][0]["rate"] = {"recordsPerSecond": 0}
        spec_of(d)["stages"][0]["window"] = {"type": "sliding", "sizeMs": 1000, "slideMs": 0}
        spec_of(d)["sinks"][0]["extra"] = True

    assert sorted(paths_of(doc(build))) == sorted(
        [
            "metadata.name",
            "spec.sources[0].rate.recordsPerSecond",
            "spec.stages[0].window.slideMs",
            "spec.sinks[0].extra",
        ]
    )


def test_all_graph_errors_are_reported() -> None:
    def build(d: dict[str, Any]) -> None:
        spec_of(d)["stages"][0]["parallelism"] = 500
        spec_of(d)["stages"][0]["inputs"] = ["nope"]
        del spec_of(d)["stages"][0]["keyBy"]
        spec_of(d)["sinks"].append({"name": "out", "type": "console", "inputs": ["count"]})

    assert sorted(paths_of(doc(build))) == sorted(
        [
            "spec.stages[0].parallelism",
            "spec.sinks[1].name",
            "spec.stages[0].inputs[0]",
            "spec.stages[0].keyBy",
            "spec.sources[0].name",  # words now reaches no sink
        ]
    )


def test_graph_errors_are_reported_along_with_field_errors() -> None:
    # Pydantic skips the spec's graph validator once a field is invalid; loading checks the graph anyway.
    def build(d: dict[str, Any]) -> None:
        spec_of(d)["sources"][0]["rate"] = {"recordsPerSecond": -1}
        spec_of(d)["stages"][0]["window"]["sizeMs"] = 0
        spec_of(d)["sinks"][0]["inputs"] = ["count", "ghost"]
        spec_of(d)["stages"][0]["parallelism"] = 121

    assert paths_of(doc(build)) == [
        "spec.sources[0].rate.recordsPerSecond",
        "spec.stages[0].window.sizeMs",
        "spec.stages[0].parallelism",
        "spec.sinks[0].inputs[1]",
    ]


def test_graph_of_a_spec_with_unreadable_operators_is_not_guessed() -> None:
    # A stage that is not a mapping: its inputs are unknown, so "words reaches no sink" would be a guess.
    errors = errors_of(doc(lambda d: spec_of(d)["stages"].__setitem__(0, "count")))
    assert [p for p, _ in errors] == ["spec.stages[0]"]


# --- non-mappings and files ------------------------------------------------------------


@pytest.mark.parametrize("data", [None, [], ["a"], "text", 3, 2.5, True])
def test_non_mapping_document(data: Any) -> None:
    errors = errors_of(data)
    assert len(errors) == 1
    assert errors[0][0] == "(document)"
    assert "mapping" in errors[0][1]


def test_empty_mapping_names_missing_fields() -> None:
    assert sorted(paths_of({})) == ["metadata", "spec"]


def test_spec_error_message_lists_every_error() -> None:
    with pytest.raises(SpecError) as info:
        parse_job({})
    assert str(info.value).splitlines() == [f"{p}: {m}" for p, m in info.value.errors]
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("apiVersion: [unclosed\n", "not valid YAML"),
        ("a: b: c\n", "not valid YAML"),
        ("- just\n- a list\n", "mapping"),
        ("", "mapping"),  # an empty file is None
        ("42\n", "mapping"),
    ],
)
def test_load_job_errors_of_bad_files(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(text)
    with pytest.raises(SpecError) as info:
        load_job(path)
    assert [p for p, _ in info.value.errors] == ["(document)"]
    assert message in info.value.errors[0][1]


def test_load_job_of_missing_or_binary_file_is_a_spec_error(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as info:
        load_job(tmp_path / "missing.yaml")
    assert info.value.errors[0][0] == "(document)"
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\xff\xfe\x00\x01")
    with pytest.raises(SpecError) as info:
        load_job(binary)
    assert info.value.errors[0][0] == "(document)"


# --- the CLI -------------------------------------------------------------------------


def write(tmp_path: Path, name: str, data: Any) -> str:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return str(path)


def test_cli_validate_valid_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "ok.yaml", doc())
    assert cli_main(["validate", path, str(EXAMPLE)]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert out.splitlines() == [
        f"{path}: valid StreamJob 'wc' (3 operators)",
        f"{EXAMPLE}: valid StreamJob 'wordcount' (3 operators)",
    ]


def test_cli_validate_prints_every_error_with_file_and_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def build(d: dict[str, Any]) -> None:
        spec_of(d)["sources"][0]["rate"] = {"recordsPerSecond": 0}
        spec_of(d)["stages"][0]["window"] = {"type": "sliding", "sizeMs": 1000, "slideMs": 0}

    bad = write(tmp_path, "bad.yaml", doc(build))
    assert cli_main(["validate", bad]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith(f"{bad}: spec.sources[0].rate.recordsPerSecond: ")
    assert lines[1].startswith(f"{bad}: spec.stages[0].window.slideMs: ")


def test_cli_validate_checks_every_file_and_fails_if_any_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ok = write(tmp_path, "ok.yaml", doc())
    broken = write(tmp_path, "broken.yaml", "spec: [\n")
    missing = str(tmp_path / "missing.yaml")
    cyclic = write(tmp_path, "cyclic.yaml", doc(lambda d: spec_of(d)["stages"][0]["inputs"].append("count")))
    assert cli_main(["validate", broken, missing, ok, cyclic]) == 1
    out, err = capsys.readouterr()
    assert out.splitlines() == [f"{ok}: valid StreamJob 'wc' (3 operators)"]
    lines = err.splitlines()
    # One line per error (a YAML error's message is multi-line unless flattened).
    assert len(lines) == 3, lines
    assert lines[0].startswith(f"{broken}: (document): not valid YAML (line 2, column 1): ")
    assert lines[1].startswith(f"{missing}: (document): ")
    assert lines[2] == f"{cyclic}: spec.stages[0].inputs[1]: an operator cannot read its own output"


def test_cli_validate_needs_a_file(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli_main(["validate"])
    assert info.value.code == 2


# --- property: any document gives a StreamJob or a SpecError with sane paths ---------------

KEYS = [
    "name", "type", "inputs", "keyBy", "window", "sizeMs", "slideMs", "sources", "stages", "sinks",
    "rate", "recordsPerSecond", "profile", "steps", "parallelism", "maxParallelism", "aggregations",
    "function", "as", "query", "path", "batching", "state", "extra",
]  # fmt: skip
LEAVES = [
    "zipf", "nexmark", "redis_stream", "sql", "pyspark", "window_aggregate", "stateful", "console",
    "parquet", "sliding", "tumbling", "steps", "count", "sum", "words", "count", "out", "select 1", "m:f",
]  # fmt: skip

junk = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=6)
    | st.sampled_from(LEAVES),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.sampled_from(KEYS), children, max_size=4),
    max_leaves=16,
)

PATH = re.compile(r"^(\(document\)|(apiVersion|kind|metadata|spec)(\.[A-Za-z_]\w*|\[\d+\])*)$")


def check_outcome(data: Any) -> None:
    try:
        job = parse_job(data)
    except SpecError as exc:
        assert exc.errors
        for path, message in exc.errors:
            assert isinstance(message, str) and message
            if isinstance(data, dict) and path in data and path not in TOP_FIELDS:
                assert message == "Extra inputs are not permitted"  # an unknown top-level field
            else:
                assert PATH.match(path), path
    else:
        assert isinstance(job, StreamJob)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.one_of(
        junk,
        st.fixed_dictionaries(
            {}, optional={"apiVersion": junk, "kind": junk, "metadata": junk, "spec": junk}
        ),
    )
)
def test_random_documents_only_raise_spec_errors(data: Any) -> None:
    check_outcome(data)


def _containers(node: Any, trail: tuple = ()) -> list[tuple]:
    """Paths to every dict or list inside node (node itself included)."""
    out = [trail] if isinstance(node, (dict, list)) else []
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in items:
        out += _containers(child, (*trail, key))
    return out


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_mutated_valid_documents_only_raise_spec_errors(data: st.DataObject) -> None:
    d = doc()
    for _ in range(data.draw(st.integers(1, 3))):
        trail = data.draw(st.sampled_from(_containers(d["spec"])))
        container = d["spec"]
        for key in trail:
            container = container[key]
        if isinstance(container, dict):
            key = data.draw(st.sampled_from(sorted(container) + KEYS))
            if key in container and data.draw(st.booleans()):
                del container[key]
                continue
        else:
            if not container:
                continue
            key = data.draw(st.integers(0, len(container) - 1))
        container[key] = data.draw(junk)
    check_outcome(d)


def _lookup(**stage: Any) -> dict[str, Any]:
    doc = copy.deepcopy(VALID)
    doc["spec"]["stages"].append({"name": "enrich", "type": "lookup", "inputs": ["words"], "by": "word",
                                  "table": {"redisKeyPrefix": "w:", "key": "word"}, **stage})
    doc["spec"]["sinks"].append({"name": "enriched", "type": "console", "inputs": ["enrich"]})
    return doc


@pytest.mark.parametrize(("stage", "field", "message"), [
    ({"table": {"key": "word"}}, "spec.stages[1].table", "set exactly one of redisKeyPrefix and parquetPath"),
    ({"table": {"redisKeyPrefix": "w:", "parquetPath": "/t", "key": "word"}}, "spec.stages[1].table",
     "set exactly one"),
    ({"inputs": ["words", "count"]}, "spec.stages[1]", "a lookup enriches one input, got 2"),
    ({"how": "right"}, "spec.stages[1].how", "'inner' or 'left'"),
    ({"by": "bad name"}, "spec.stages[1]", "not an identifier: bad name"),
])
def test_a_bad_lookup_is_refused_with_its_field(stage: dict, field: str, message: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_job(_lookup(**stage))
    assert any(path.startswith(field) and message in text for path, text in caught.value.errors), caught.value.errors


def test_a_lookup_parses_with_its_defaults() -> None:
    stage = parse_job(_lookup()).spec.stages[1]
    assert (stage.how, stage.columns, stage.table.refresh_ms, stage.table.schema_) == ("inner", None, 0, None)


def _join(**stage: Any) -> dict[str, Any]:
    doc = copy.deepcopy(VALID)
    doc["spec"]["stages"].append({"name": "pair", "type": "join", "inputs": ["words", "count"],
                                  "on": {"left": ["word"], "right": ["word"]}, "window": {"sizeMs": 1000}, **stage})
    doc["spec"]["sinks"].append({"name": "pairs", "type": "console", "inputs": ["pair"]})
    return doc


@pytest.mark.parametrize(("stage", "field", "message"), [
    ({"inputs": ["words"]}, "spec.stages[1]", "a join reads two inputs (left, right), got 1"),
    ({"on": {"left": ["word", "n"], "right": ["word"]}}, "spec.stages[1].on",
     "left names 2 key columns, right 1: they pair up"),
    ({"on": {"left": [], "right": []}}, "spec.stages[1].on.left", "at least 1"),
    ({"on": {"left": ["a b"], "right": ["word"]}}, "spec.stages[1].on", "not an identifier: a b"),
    ({"keyBy": "word"}, "spec.stages[1]", "keyBy: a join is keyed by `on`, per input"),
    ({"window": None}, "spec.stages[1]", "window: a window join needs window"),
    ({"how": "right"}, "spec.stages[1].how", "'inner' or 'left'"),
    ({"kind": "interval", "window": None}, "spec.stages[1]", "lowerMs: an interval join needs lowerMs"),
    ({"kind": "interval", "lowerMs": 0, "upperMs": 10}, "spec.stages[1]", "window: an interval join takes no window"),
    ({"kind": "interval", "window": None, "lowerMs": 5, "upperMs": -5}, "spec.stages[1]",
     "lowerMs: 5 is above upperMs -5"),
    ({"kind": "regular", "window": None}, "spec.stages[1]", "ttlMs: a regular join needs ttlMs"),
    ({"kind": "regular", "window": None, "ttlMs": 0}, "spec.stages[1].ttlMs", "greater than or equal to 1"),
    ({"upperMs": 10}, "spec.stages[1]", "upperMs: a window join takes no upperMs"),
    ({"select": ["l.word AS w", " "]}, "spec.stages[1]", "select: an expression is empty"),
    ({"inputs": ["words", "nowhere"]}, "spec.stages[1].inputs[1]", "unknown operator 'nowhere'"),
])
def test_a_bad_join_is_refused_with_its_field(stage: dict, field: str, message: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_job(_join(**stage))
    assert any(path.startswith(field) and message in text for path, text in caught.value.errors), caught.value.errors


def test_a_joins_inputs_are_routed_by_their_own_key_columns() -> None:
    from streamjobs_core.plan import JobPlan

    doc = _join(on={"left": ["word"], "right": ["n"]})
    plan = JobPlan(parse_job(doc), 0)
    assert [(e.upstream, e.key_by) for e in plan.edges_in("pair")] == [("words", ("word",)), ("count", ("n",))]
    assert [(e.downstream, e.key_by) for e in plan.edges_out("words")] == [("count", ("word",)), ("pair", ("word",))]


def test_an_unquoted_on_in_yaml_is_the_join_keys_not_a_boolean(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(_join(), sort_keys=False).replace("'on':", "on:"))
    assert "\n    on:" in path.read_text()
    stage = load_job(path).spec.stages[1]
    assert (stage.on.left, stage.on.right, stage.how, stage.select) == (("word",), ("word",), "inner", None)


@pytest.mark.parametrize(("stage", "field", "message"), [
    ({"orderBy": ["sale"]}, "spec.stages[1]", "orderBy: records are ordered by event_time first, not 'sale'"),
    ({"orderBy": ["event_time", "a b"]}, "spec.stages[1]", "orderBy: not an identifier: a b"),
    ({"rows": 0}, "spec.stages[1].rows", "greater than or equal to 1"),
    ({"keyBy": None}, "spec.stages[1].keyBy", "an over stage needs keyBy"),
])
def test_a_bad_over_stage_is_refused_with_its_field(stage: dict, field: str, message: str) -> None:
    doc = copy.deepcopy(VALID)
    doc["spec"]["stages"].append({"name": "last", "type": "over", "inputs": ["count"], "keyBy": "word", "rows": 3,
                                  "aggregations": [{"function": "count", "as": "m"}], **stage})
    doc["spec"]["sinks"].append({"name": "lasts", "type": "console", "inputs": ["last"]})
    with pytest.raises(SpecError) as caught:
        parse_job(doc)
    assert any(path.startswith(field) and message in text for path, text in caught.value.errors), caught.value.errors
