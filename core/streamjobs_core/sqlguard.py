"""SQL a spec may not run unless the one who runs the job allows it: functions that reach the JVM.

Spark's `reflect`, `java_method` and `try_reflect` call any static Java method
with the worker's rights: `reflect('java.lang.System', 'getenv', ...)` in a SQL
stage reads the worker's environment, Redis credentials included. A spec alone
(no code) could do that, so the operator and `streamjobs run` refuse such a
call, naming the field and the function, unless their configuration allows it.
A pyspark or stateful stage runs code of the job's author anyway: what it can
do is the job's own rights (docs/security.md).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from .spec import JoinStage, StreamJob

JVM_FUNCTIONS = ("reflect", "java_method", "try_reflect")

# Literals and comments hide nothing from Spark's lexer but would hide a call from the search: out first.
_NOT_CODE = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|--[^\n]*|/\*.*?\*/", re.DOTALL)
# A name (bare, backquoted, or the last part of a qualified one: system.builtin.reflect) and its call's paren.
_CALL = re.compile(rf"(?<![\w$])`?({'|'.join(JVM_FUNCTIONS)})`?\s*\(", re.IGNORECASE)


def _code(sql: str) -> str:
    return _NOT_CODE.sub(lambda m: " " if m.group(0)[0] in "-/" else "''", sql)


def jvm_calls(sql: str) -> list[str]:
    """The JVM-reaching functions `sql` calls, lowercased, in order."""
    return [m.group(1).lower() for m in _CALL.finditer(_code(sql))]


def _sql_fields(job: StreamJob) -> Iterator[tuple[str, str]]:
    """(field path, SQL text) of every field of the spec that Spark parses."""
    for group in ("stages", "sinks"):
        for index, op in enumerate(getattr(job.spec, group)):
            prefix = f"spec.{group}[{index}]"
            for attr, name in (("query", "query"), ("where", "where")):
                text = getattr(op, attr, None)
                if text:
                    yield f"{prefix}.{name}", text
            if isinstance(op, JoinStage):
                for i, expression in enumerate(op.select or ()):
                    yield f"{prefix}.select[{i}]", expression


def refused_calls(job: StreamJob) -> list[tuple[str, str]]:
    """(field, message) per SQL field of `job` that calls a JVM-reaching function."""
    refused = []
    for field, text in _sql_fields(job):
        for function in dict.fromkeys(jvm_calls(text)):
            refused.append((field, f"calls {function}(), which runs any Java method with the worker's rights (its "
                                   "Redis credentials included); refused unless the operator's configuration (or "
                                   "`streamjobs run --allow-jvm-functions`) allows it"))
    return refused
