"""Reading StreamJob documents, with every error named by its field path."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import yaml
from pydantic import ValidationError

from .spec import StreamJob, graph_errors


class SpecError(ValueError):
    def __init__(self, errors: list[tuple[str, str]]) -> None:
        self.errors = errors
        super().__init__("\n".join(f"{path}: {message}" for path, message in errors))


def _path(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(document)"


def _strip_union_tags(loc: tuple) -> tuple:
    # Discriminated unions add the variant tag ("zipf", "sql", ...) to the path.
    return tuple(p for i, p in enumerate(loc) if not (i and isinstance(loc[i - 1], int) and isinstance(p, str)
                                                      and p in _VARIANT_TAGS))


_VARIANT_TAGS = {"nexmark", "zipf", "ysb", "redis_stream", "sql", "pyspark", "window_aggregate", "stateful", "over", "lookup",
                 "join", "parquet", "console"}


def parse_job(data: Any) -> StreamJob:
    if not isinstance(data, dict):
        raise SpecError([("(document)", "a StreamJob must be a mapping with apiVersion, kind, metadata, spec")])
    try:
        return StreamJob.model_validate(data)
    except ValidationError as exc:
        errors: list[tuple[str, str]] = []
        graph: list[tuple[str, str]] | None = None
        for err in exc.errors(include_url=False):
            if err["type"] == "graph":
                graph = list(err["ctx"]["errors"])
            else:
                errors.append((_path(_strip_union_tags(err["loc"])), err["msg"]))
        # An invalid item also makes pydantic call its list too short: report the item only.
        # (Graph errors are exact already; this filter would drop e.g. the cycle error on "spec.stages".)
        errors = [(p, m) for p, m in errors if not any(q.startswith(p + "[") for q, _ in errors)]
        if graph is None and any(p.startswith("spec.") for p, _ in errors):
            graph = _graph_errors_of_invalid_spec(data.get("spec"))
        raise SpecError(errors + (graph or [])) from None


def _graph_errors_of_invalid_spec(spec: Any) -> list[tuple[str, str]]:
    """The graph rules, which pydantic skips once a field of the spec is invalid, on the raw
    document: only if every operator still has a string name (and stages and sinks a
    non-empty list of string inputs), so the graph is known."""
    if not isinstance(spec, dict):
        return []
    groups: dict[str, tuple[SimpleNamespace, ...]] = {}
    for group in ("sources", "stages", "sinks"):
        ops = spec.get(group, [] if group == "stages" else None)
        if not isinstance(ops, (list, tuple)) or (group != "stages" and not ops):
            return []
        views = []
        for op in ops:
            if not isinstance(op, dict) or not isinstance(op.get("name"), str):
                return []
            view = SimpleNamespace(name=op["name"], type=op.get("type"), key_by=op.get("keyBy", op.get("key_by")))
            view.parallelism = op["parallelism"] if type(op.get("parallelism")) is int else 1
            if group != "sources":
                inputs = op.get("inputs")
                if not (isinstance(inputs, (list, tuple)) and inputs and all(isinstance(i, str) for i in inputs)):
                    return []
                view.inputs = tuple(inputs)
            views.append(view)
        groups[group] = tuple(views)
    max_parallelism = spec.get("maxParallelism", spec.get("max_parallelism", 120))
    if type(max_parallelism) is not int or not 1 <= max_parallelism <= 32768:
        max_parallelism = 32768  # reported as a field error; check parallelism against the upper bound only
    view = SimpleNamespace(max_parallelism=max_parallelism, **groups)
    view.operators = (*view.sources, *view.stages, *view.sinks)
    return graph_errors(view)  # type: ignore[arg-type]


class _Loader(yaml.SafeLoader):
    """YAML 1.2's booleans, only true and false: YAML 1.1 (PyYAML's default) also reads on, off, yes and no
    as booleans, which would turn a join's `on:` into `true:`."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, pattern) for tag, pattern in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                              list("tTfF"))


def load_job(path: str | Path) -> StreamJob:
    return parse_job(load_document(path))


def load_document(path: str | Path) -> Any:
    """A job's YAML file as data, unchecked (`on:` stays a key: YAML 1.1's yes/no/on/off are not booleans here)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError([("(document)", f"cannot read the file: {exc}")]) from None
    try:
        data = yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader
    except yaml.YAMLError as exc:
        # One line, like every other error (the CLI prints one error per line).
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = getattr(exc, "problem", None) or " ".join(str(exc).split())
        raise SpecError([("(document)", f"not valid YAML{where}: {problem}")]) from None
    return data
