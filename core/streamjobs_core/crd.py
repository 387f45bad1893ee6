"""The StreamJob CustomResourceDefinition, generated from the pydantic spec model.

Kubernetes accepts only *structural* OpenAPI v3 schemas (every node typed, no
$ref, no oneOf/anyOf carrying types), so pydantic's JSON schema is rewritten
rather than embedded. The CRD schema is the early check that `kubectl apply`
reports; the operator still validates every object with the pydantic model,
which also enforces what a structural schema cannot express: fields that
belong to another variant of a union, cross-field and graph rules.
"""

from __future__ import annotations

import operator
from typing import Any

import yaml
from pydantic import BaseModel

from streamjobs_core.spec import API_GROUP, API_VERSION, KIND, StreamJobSpec

Schema = dict[str, Any]

PLURAL = f"{KIND.lower()}s"

# Keywords that mean the same in JSON schema and in Kubernetes' OpenAPI v3 subset.
_KEPT = frozenset(
    {"type", "description", "enum", "format", "pattern", "multipleOf"}
    | {"minimum", "maximum", "minLength", "maxLength", "minItems", "maxItems"}
)
# Kubernetes forbids titles and discriminators; defaults are pydantic's to apply, and
# a union merged into one object must not default the fields of its other variants.
_DROPPED = frozenset({"title", "default", "discriminator"})
_HANDLED = frozenset(
    {"$ref", "anyOf", "oneOf", "const", "properties", "required", "items", "prefixItems"}
    | {"additionalProperties", "exclusiveMinimum", "exclusiveMaximum"}
)
# OpenAPI 3.0 (hence Kubernetes) marks an exclusive bound with a boolean beside
# minimum/maximum; pydantic emits the JSON schema 2019+ numeric form, possibly
# next to an inclusive bound of the same side, of which the stricter one wins.
_EXCLUSIVE_BOUNDS = (
    ("minimum", "exclusiveMinimum", operator.ge),
    ("maximum", "exclusiveMaximum", operator.le),
)
# Readers of the generated YAML look for a node's type and meaning first.
_LEADING_KEYS = {"type": 0, "nullable": 1, "description": 2}

_STATUS_COLUMNS = (  # (column, status field, type, description)
    ("Phase", "phase", "string", "Lifecycle phase of the job."),
    ("Parallelism", "parallelismSummary", "string", "Instances of each operator, summarised for display."),
    ("Input rate", "inputRate", "number", "Records per second the sources emitted, over the last 15 s."),
    ("Lag", "lag", "integer", "Records sent between operators and not consumed yet."),
    ("Last decision", "lastDecision", "string", "The latest scaling decision and its reason."),
)


def structural_schema(model: type[BaseModel]) -> Schema:
    """The model's JSON schema (by alias) as a Kubernetes structural schema."""
    schema = model.model_json_schema(by_alias=True)
    return _convert(schema, schema.pop("$defs", {}))


def _convert(node: Schema, defs: Schema) -> Schema:
    out: Schema
    if "$ref" in node:
        out = _convert(defs[node["$ref"].removeprefix("#/$defs/")], defs)
    elif "anyOf" in node or "oneOf" in node:
        union = node.get("anyOf") or node["oneOf"]
        options = [_convert(option, defs) for option in union if option != {"type": "null"}]
        if len(options) == 1:
            out = options[0]
        elif "discriminator" in node:
            out = _merge_variants(options, node["discriminator"]["propertyName"])
        else:
            raise ValueError(f"only discriminated unions have a structural schema: {node}")
        if len(options) < len(union):
            out["nullable"] = True
    else:
        out = {}
    for key, value in node.items():
        if key == "description" and "description" in out:
            # A field's description is more specific than its model's docstring: it comes first.
            out[key] = f"{value}\n{out[key]}"
        elif key in _KEPT:
            out[key] = value
        elif key == "const":
            out["enum"] = [value]
        elif key == "properties":
            out[key] = {name: _convert(sub, defs) for name, sub in value.items()}
        elif key == "required":
            out[key] = list(value)
        elif key == "items":
            out[key] = _convert(value, defs)
        elif key == "prefixItems":
            items = [_convert(item, defs) for item in value]
            if any(item != items[0] for item in items):
                raise ValueError(f"a tuple of mixed item types has no structural schema: {node}")
            out["items"] = items[0]  # pydantic also emits minItems/maxItems for the length
        elif key == "additionalProperties":
            if value is True:
                out["x-kubernetes-preserve-unknown-fields"] = True
            # false: Kubernetes prunes unknown fields anyway, and forbids false next to properties.
            elif value is not False:
                out[key] = _convert(value, defs)
        elif key not in _DROPPED and key not in _HANDLED:
            raise ValueError(f"JSON schema keyword {key!r} has no Kubernetes equivalent: {node}")
    for bound, flag, stricter in _EXCLUSIVE_BOUNDS:
        if flag in node and (bound not in node or stricter(node[flag], node[bound])):
            out[bound], out[flag] = node[flag], True
    return _ordered(out)


def _ordered(schema: Schema) -> Schema:
    return dict(sorted(schema.items(), key=lambda item: _LEADING_KEYS.get(item[0], len(_LEADING_KEYS))))


def _merge_variants(variants: list[Schema], key: str) -> Schema:
    """One object schema accepting every variant, as structural schemas cannot branch on a discriminator."""
    tags = ["/".join(variant["properties"][key]["enum"]) for variant in variants]
    fields = [[name for name in variant["properties"] if name != key] for variant in variants]
    properties: dict[str, Schema] = {}
    docs: dict[str, dict[str, list[str]]] = {}  # field -> description -> tags of the variants using it
    for variant, tag, own in zip(variants, tags, fields, strict=True):
        for name in own:
            prop = dict(variant["properties"][name])
            doc = prop.pop("description", None)
            # Optional in one variant, required in another: the merged field accepts null (pydantic still
            # requires it of the variant that does).
            nullable = prop.pop("nullable", False) or properties.get(name, {}).get("nullable", False)
            known = {k: v for k, v in properties.setdefault(name, prop).items() if k != "nullable"}
            if known != prop:
                raise ValueError(f"field {name!r} of {key} {tag!r} differs from the same field of another {key}")
            if nullable:
                properties[name] = {**known, "nullable": True}
            if doc:
                docs.setdefault(name, {}).setdefault(doc, []).append(tag)
    for name, by_doc in docs.items():
        doc = next(iter(by_doc)) if len(by_doc) == 1 else "; ".join(f"{', '.join(t)}: {d}" for d, t in by_doc.items())
        properties[name] = _ordered({**properties[name], "description": doc})
    common = [name for name in fields[0] if all(name in own for own in fields)]
    lines = [f"Variants selected by {key}; every variant has {', '.join(common)}."]
    for variant, tag, own in zip(variants, tags, fields, strict=True):
        extra = [name for name in own if name not in common]
        doc = f"{variant['description']} " if "description" in variant else ""
        lines.append(f"{tag}: {doc}" + (f"Fields: {', '.join(extra)}." if extra else "No other fields."))
    values = [value for variant in variants for value in variant["properties"][key]["enum"]]
    shared = set.intersection(*(set(variant.get("required", ())) for variant in variants))
    return {
        "type": "object",
        "description": "\n".join(lines),
        "properties": {key: {"type": "string", "enum": values}, **properties},
        "required": [name for name in variants[0].get("required", ()) if name in shared],
    }


def crd_manifest() -> dict[str, Any]:
    """The apiextensions.k8s.io/v1 CustomResourceDefinition of StreamJob."""
    status = {
        "type": "object",
        "description": "Observed state, written by the operator.",
        # The operator may add fields (conditions, per-operator detail) without a CRD change.
        "x-kubernetes-preserve-unknown-fields": True,
        "properties": {field: {"type": kind, "description": doc} for _, field, kind, doc in _STATUS_COLUMNS},
    }
    columns = [
        {"name": name, "type": kind, "description": doc, "jsonPath": f".status.{field}"}
        for name, field, kind, doc in _STATUS_COLUMNS
    ]
    columns.append({"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"})
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{API_GROUP}"},
        "spec": {
            "group": API_GROUP,
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": KIND.lower(),
                "shortNames": ["sj"],
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": API_VERSION.removeprefix(f"{API_GROUP}/"),
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": columns,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": "A stream job: a dataflow of sources, stages and sinks.",
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},  # Kubernetes owns its schema
                                "spec": structural_schema(StreamJobSpec),
                                "status": status,
                            },
                            "required": ["spec"],
                        }
                    },
                }
            ],
        },
    }


def crd_yaml() -> str:
    """The CRD as YAML, byte for byte what crds/streamjob.yaml holds."""
    header = "# Generated from core/streamjobs_core/spec.py by `streamjobs crd`; do not edit.\n"
    return header + yaml.safe_dump(crd_manifest(), sort_keys=False)
