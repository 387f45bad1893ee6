"""The StreamJob CRD: committed, structural, and agreeing with the pydantic spec model."""

from __future__ import annotations

import copy
import functools
import operator
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import pytest
import yaml
from pydantic import BaseModel, Field, ValidationError
from streamjobs_core.crd import crd_manifest, crd_yaml, structural_schema
from streamjobs_core.spec import API_VERSION, Sink, Source, Stage, StreamJob

pytestmark = pytest.mark.unit

CRD_FILE = Path(__file__).resolve().parents[2] / "crds" / "streamjob.yaml"

ZIPF_JOB: dict[str, Any] = {
    "apiVersion": API_VERSION,
    "kind": "StreamJob",
    "metadata": {"name": "word-count"},
    "spec": {
        "sources": [
            {
                "name": "words",
                "type": "zipf",
                "parallelism": 2,
                "vocabulary": 5000,
                "rate": {
                    "profile": "steps",
                    "recordsPerSecond": 500,
                    "steps": [{"atS": 60, "recordsPerSecond": 5000}],
                },
            }
        ],
        "stages": [
            {
                "name": "counts",
                "type": "window_aggregate",
                "inputs": ["words"],
                "keyBy": "word",
                "window": {"type": "sliding", "sizeMs": 10_000, "slideMs": 2_000},
                "aggregations": [{"function": "count", "as": "n"}],
            }
        ],
        "sinks": [{"name": "out", "type": "redis_stream", "inputs": ["counts"], "maxLength": 100_000}],
        "autoscaler": {"policy": "ds2", "maxParallelism": 8},
    },
}

NEXMARK_JOB: dict[str, Any] = {
    "apiVersion": API_VERSION,
    "kind": "StreamJob",
    "metadata": {"name": "nexmark-q1", "namespace": "bench"},
    "spec": {
        "maxParallelism": 60,
        "sources": [{"name": "events", "type": "nexmark", "totalRecords": 1_000_000, "hotAuctionRatio": 0.8}],
        "stages": [
            {
                "name": "q1",
                "type": "sql",
                "inputs": ["events"],
                "parallelism": 3,
                "query": "SELECT auction, bidder, price * 0.908 AS price FROM input WHERE event_type = 'bid'",
            }
        ],
        "sinks": [{"name": "bids", "type": "parquet", "inputs": ["q1"], "path": "/data/q1"}],
        "state": {"backend": "rocksdb", "directory": "/var/lib/streamjobs"},
    },
}


def _schema() -> dict[str, Any]:
    schema: dict[str, Any] = crd_manifest()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def _nodes(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path or ".", schema
    for name, sub in schema.get("properties", {}).items():
        yield from _nodes(sub, f"{path}.{name}")
    if "items" in schema:
        yield from _nodes(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from _nodes(schema["additionalProperties"], f"{path}{{}}")


def test_committed_crd_is_current() -> None:
    stale = "crds/streamjob.yaml is stale: run `streamjobs crd > crds/streamjob.yaml`"
    assert CRD_FILE.read_text() == crd_yaml(), stale


def test_yaml_renders_the_manifest() -> None:
    assert yaml.safe_load(crd_yaml()) == crd_manifest()


def test_manifest_names_version_and_columns() -> None:
    crd = crd_manifest()
    spec = crd["spec"]
    assert (crd["apiVersion"], crd["kind"]) == ("apiextensions.k8s.io/v1", "CustomResourceDefinition")
    assert crd["metadata"]["name"] == "streamjobs.streamjobs.dev"
    assert spec["group"] == "streamjobs.dev" and spec["scope"] == "Namespaced"
    assert spec["names"] == {
        "kind": "StreamJob",
        "listKind": "StreamJobList",
        "plural": "streamjobs",
        "singular": "streamjob",
        "shortNames": ["sj"],
    }
    [version] = spec["versions"]
    assert f"{spec['group']}/{version['name']}" == API_VERSION
    assert version["served"] and version["storage"] and version["subresources"] == {"status": {}}
    columns = {c["name"]: (c["jsonPath"], c["type"]) for c in version["additionalPrinterColumns"]}
    assert columns == {
        "Phase": (".status.phase", "string"),
        "Parallelism": (".status.parallelismSummary", "string"),
        "Input rate": (".status.inputRate", "number"),
        "Lag": (".status.lag", "integer"),
        "Last decision": (".status.lastDecision", "string"),
        "Age": (".metadata.creationTimestamp", "date"),
    }
    root = version["schema"]["openAPIV3Schema"]
    assert root["properties"]["metadata"] == {"type": "object"}
    status = root["properties"]["status"]
    assert status["x-kubernetes-preserve-unknown-fields"] is True
    for path, kind in list(columns.values())[:-1]:
        # A column's type must be the status field's, or kubectl prints <invalid>.
        assert status["properties"][path.removeprefix(".status.")]["type"] == kind


def test_schema_is_structural() -> None:
    forbidden = {"$ref", "$defs", "anyOf", "oneOf", "allOf", "not", "const", "default", "title", "discriminator"}
    forbidden |= {"prefixItems", "definitions"}
    for path, node in _nodes(_schema()):
        assert not forbidden & node.keys(), f"{path}: {sorted(forbidden & node.keys())}"
        untyped_ok = node.get("x-kubernetes-preserve-unknown-fields") or node.get("x-kubernetes-int-or-string")
        assert "type" in node or untyped_ok, f"{path} has no type"
        if node.get("type") == "array":
            assert "items" in node, f"{path}: an array needs items"
        assert not ("properties" in node and "additionalProperties" in node), path
        assert set(node.get("required", ())) <= node.get("properties", {}).keys(), path
        for bound, flag in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
            if flag in node:
                assert node[flag] is True and bound in node, f"{path}: {flag} must be a boolean beside {bound}"


@pytest.mark.parametrize(("union", "field"), [(Source, "sources"), (Stage, "stages"), (Sink, "sinks")])
def test_union_merges_every_variant(union: Any, field: str) -> None:
    merged = _schema()["properties"]["spec"]["properties"][field]["items"]
    schemas = [variant.model_json_schema(by_alias=True) for variant in get_args(get_args(union)[0])]
    tags = [schema["properties"]["type"]["const"] for schema in schemas]
    assert merged["properties"]["type"] == {"type": "string", "enum": tags}
    assert set(merged["required"]) == set.intersection(*(set(schema["required"]) for schema in schemas))
    owns = [schema["properties"].keys() - {"type"} for schema in schemas]
    common = set.intersection(*map(set, owns))
    lines = merged["description"].splitlines()
    for tag, own in zip(tags, owns, strict=True):
        assert own <= merged["properties"].keys()
        # Each variant's line lists the fields only some variants have, so `kubectl explain` tells whose they are.
        line = next(line for line in lines if line.startswith(f"{tag}: "))
        assert set(line.partition("Fields: ")[2].rstrip(".").split(", ")) - {""} == own - common


class _Edge(BaseModel):
    maybe: int | None = Field(None, gt=0, description="Optional and exclusive.")
    pair: tuple[int, int]
    weights: dict[str, float]
    both: Annotated[float, Field(ge=5), Field(gt=0)]
    below: float = Field(lt=1)
    mode: Literal["only"] = "only"


def test_converter_edge_cases() -> None:
    properties = structural_schema(_Edge)["properties"]
    assert properties == {
        "maybe": {
            "type": "integer",
            "nullable": True,
            "description": "Optional and exclusive.",
            "minimum": 0,
            "exclusiveMinimum": True,
        },
        "pair": {"type": "array", "items": {"type": "integer"}, "maxItems": 2, "minItems": 2},
        "weights": {"type": "object", "additionalProperties": {"type": "number"}},
        "both": {"type": "number", "minimum": 5},  # ge=5 is stricter than gt=0
        "below": {"type": "number", "maximum": 1, "exclusiveMaximum": True},
        "mode": {"type": "string", "enum": ["only"]},
    }


@pytest.mark.parametrize("annotation", [tuple[int, str], int | str])
def test_converter_rejects_what_has_no_structural_schema(annotation: Any) -> None:
    model = type("Bad", (BaseModel,), {"__annotations__": {"value": annotation}})
    with pytest.raises(ValueError, match="structural schema"):
        structural_schema(model)


# --- round trip through a JSON schema validator ------------------------------


def _as_draft4(node: dict[str, Any]) -> dict[str, Any]:
    """Kubernetes' OpenAPI 3.0 schema as JSON schema draft 4, which shares its boolean exclusive bounds."""
    out = {key: value for key, value in node.items() if key != "nullable"}
    if node.get("nullable"):
        out["type"] = [node["type"], "null"]
    if "properties" in node:
        out["properties"] = {name: _as_draft4(sub) for name, sub in node["properties"].items()}
        if not node.get("x-kubernetes-preserve-unknown-fields"):
            # The API server prunes unknown fields; kubectl's default strict field validation rejects them.
            out["additionalProperties"] = False
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            out[key] = _as_draft4(node[key])
    return out


@pytest.fixture(scope="module")
def validator() -> Any:
    jsonschema = pytest.importorskip("jsonschema")
    schema = _as_draft4(_schema())
    jsonschema.Draft4Validator.check_schema(schema)
    return jsonschema.Draft4Validator(schema)


@pytest.mark.parametrize("doc", [ZIPF_JOB, NEXMARK_JOB], ids=["zipf", "nexmark"])
def test_valid_jobs_pass_the_crd(validator: Any, doc: dict[str, Any]) -> None:
    job = StreamJob.model_validate(doc)
    assert not list(validator.iter_errors(doc))
    # Every default and null the model dumps must also be admitted: the operator may write specs back.
    dumped = job.model_dump(mode="json", by_alias=True)
    assert not list(validator.iter_errors(dumped)), [e.message for e in validator.iter_errors(dumped)]


_DELETE = object()

_INVALID: dict[str, tuple[tuple[Any, ...], Any]] = {
    "unknown-stage-type": (("spec", "stages", 0, "type"), "flatmap"),
    "negative-parallelism": (("spec", "sources", 0, "parallelism"), -1),
    "zero-rate": (("spec", "sources", 0, "rate", "recordsPerSecond"), 0),
    "sink-without-inputs": (("spec", "sinks", 0, "inputs"), _DELETE),
    "no-sources": (("spec", "sources"), []),
    "unknown-field": (("spec", "stages", 0, "windw"), {"sizeMs": 1}),
    "string-for-integer": (("spec", "stages", 0, "window", "slideMs"), "2s"),
}


@pytest.mark.parametrize(("path", "value"), _INVALID.values(), ids=_INVALID.keys())
def test_invalid_jobs_fail_the_crd_and_the_model(validator: Any, path: tuple[Any, ...], value: Any) -> None:
    doc = copy.deepcopy(ZIPF_JOB)
    *parents, last = path
    holder = functools.reduce(operator.getitem, parents, doc)
    if value is _DELETE:
        del holder[last]
    else:
        holder[last] = value
    # A missing or unknown field is reported on the object that should (not) hold it.
    assert {tuple(error.absolute_path) for error in validator.iter_errors(doc)} & {path, tuple(parents)}
    with pytest.raises(ValidationError):
        StreamJob.model_validate(doc)


def test_fields_of_another_variant_pass_the_crd_only(validator: Any) -> None:
    """A merged union admits a zipf source with redis_stream's partitions: the operator must use pydantic."""
    doc = copy.deepcopy(ZIPF_JOB)
    doc["spec"]["sources"][0]["partitions"] = 4
    assert not list(validator.iter_errors(doc))
    with pytest.raises(ValidationError):
        StreamJob.model_validate(doc)


def test_the_spec_reference_is_generated_from_the_model():
    from streamjobs_core.specdoc import spec_markdown

    reference = Path(__file__).resolve().parents[2] / "docs" / "spec.md"
    assert reference.read_text() == spec_markdown(), "docs/spec.md is stale: python -m streamjobs_core.specdoc > docs/spec.md"
