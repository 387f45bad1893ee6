"""docs/spec.md, the StreamJob reference, generated from the spec model as the CRD is (a test fails on drift).

Every model reachable from `StreamJobSpec` gets a section: its docstring, then a table of its fields by their
YAML names with type, default and description. A field whose type is a model links to that model's section;
a union of operator kinds (sources, stages, sinks) lists each kind by its `type`.

    python -m streamjobs_core.specdoc > docs/spec.md
"""

from __future__ import annotations

import inspect
import types
import typing
from typing import Any, Literal

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from .spec import StreamJob

_HEADER = """# The StreamJob spec

Every field of a StreamJob, generated from the spec model (`core/streamjobs_core/spec.py`) by
`python -m streamjobs_core.specdoc`; the CRD in `crds/` comes from the same model. Names are as written in
YAML; `streamjobs validate FILE` checks a file and names the field of each error.
"""


def spec_markdown() -> str:
    sections: dict[str, str] = {}
    _collect(StreamJob, sections)
    return _HEADER + "\n" + "\n".join(sections.values())


def _collect(model: type[BaseModel], sections: dict[str, str]) -> None:
    if model.__name__ in sections:
        return
    sections[model.__name__] = ""  # claimed before its fields: models that refer to each other end
    rows, nested = [], []
    for name, info in model.model_fields.items():
        rows.append(_row(info.alias or name, info, nested))
    doc = inspect.getdoc(model) or ""
    if doc.startswith(("Usage docs:", "!!! abstract")):  # pydantic's own BaseModel docstring
        doc = ""
    kind = _kind(model)
    title = f"`{model.__name__}`" + (f" (type: {kind})" if kind else "")
    body = [f"## {title}", ""]
    if doc:
        body += [" ".join(doc.split()), ""]
    body += ["| field | type | default | description |", "|---|---|---|---|", *rows, ""]
    sections[model.__name__] = "\n".join(body)
    for child in nested:
        _collect(child, sections)


def _kind(model: type[BaseModel]) -> str | None:
    field = model.model_fields.get("type")
    if field is not None and typing.get_origin(field.annotation) is Literal:
        return ", ".join(str(a) for a in typing.get_args(field.annotation))
    return None


def _row(name: str, info: FieldInfo, nested: list[type[BaseModel]]) -> str:
    schema = next((m.json_schema for m in info.metadata if hasattr(m, "json_schema")), None)
    if schema and schema.get("type") == "object":  # a mapping the model keeps in another form
        kind = f"map of string to {schema.get('additionalProperties', {}).get('type', 'any')}"
    else:
        kind = _type(info.annotation, nested)
    default = "required" if info.is_required() else _default(info)
    description = " ".join((info.description or "").split()).replace("|", "\\|")
    return f"| `{name}` | {kind} | {default} | {description} |"


def _default(info: FieldInfo) -> str:
    value = info.get_default(call_default_factory=True) if info.default is PydanticUndefined else info.default
    if isinstance(value, BaseModel):
        return "see its section"
    if value in ((), [], {}):
        return "none"
    return f"`{value}`" if value is not None else "null"


_NAMES = {str: "string", int: "integer", float: "number", bool: "boolean"}


def _type(annotation: Any, nested: list[type[BaseModel]]) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _type(args[0], nested)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        shown = " \\| ".join(_type(a, nested) for a in options)
        return shown + (" or null" if len(options) < len(args) else "")
    if origin is Literal:
        return " \\| ".join(f"`{a}`" for a in args)
    if origin in (list, tuple):
        inner = [a for a in args if a is not Ellipsis]
        return "list of " + (_type(inner[0], nested) if inner else "any")
    if origin is dict:
        return f"map of {_type(args[0], nested)} to {_type(args[1], nested)}"
    if inspect.isclass(annotation) and issubclass(annotation, BaseModel):
        nested.append(annotation)
        return f"[{annotation.__name__}](#{annotation.__name__.lower()}{_anchor_suffix(annotation)})"
    return _NAMES.get(annotation, getattr(annotation, "__name__", str(annotation)))


def _anchor_suffix(model: type[BaseModel]) -> str:
    kind = _kind(model)
    return f"-type-{kind.replace(', ', '-')}" if kind else ""


if __name__ == "__main__":
    print(spec_markdown(), end="")
