"""Which records of a batch make a stage's SQL fail: found from Spark's error in one pass over the batch.

Spark names the expression that raised (its error's query context: the SQL
fragment and where it sits in the query or the stage's `where`). A probe
evaluates that fragment on every record of the batch, each under Spark's
`TryEval` (the expression behind the `try_` functions: an error on one row
gives that row NULL instead of failing the job), so the records the fragment
raises on are found at once, whatever the error (a cast, a division, an
overflow, `raise_error`). Only the columns the fragment may name go to the
JVM (only their distinct values when it names one); up to 20k records go as a
local relation, which the optimizer evaluates on the driver
(`ConvertToLocalRelation`): no Spark job.

A probe is `trusted` when the fragment is deterministic and evaluated on every
record that reaches it: it sits in the stage's `where`, or in a single SELECT
over one input view, with nothing around it that may skip it for some rows
(CASE, IF, COALESCE, AND/OR, WHERE, JOIN, LIMIT, a subquery...; see
`_CONDITIONAL`). Then a record the fragment raises on is one the stage fails
on alone. Otherwise the
probe only narrows the search: the stage is run on the records it flags (group
testing), and only those it fails on alone are dead-lettered.
"""

from __future__ import annotations

import functools
import re
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import redis
from py4j.protocol import Py4JError, Py4JNetworkError
from pyspark.errors import QueryContextType

from .stages.base import view_name

# Words that may leave an expression outside them unevaluated for some rows (lower case).
_CONDITIONAL = frozenset(
    "case when if iff nvl nvl2 ifnull coalesce elt decode and or in where having qualify filter join "
    "semi anti cross natural lateral limit offset tablesample pivot unpivot explode explode_outer posexplode "
    "posexplode_outer inline inline_outer stack exists union except intersect minus with transform aggregate "
    "reduce forall zip_with map_filter map_zip_with transform_keys transform_values array_sort".split()
)
# Functions whose value is not the record's alone: a fragment calling one may raise on a record or not.
_NONDETERMINISTIC = frozenset(
    "rand randn random uniform randstr uuid shuffle now current_timestamp current_date current_time "
    "localtimestamp monotonically_increasing_id spark_partition_id input_file_name reflect java_method "
    "try_reflect".split()
)
# Clauses that may follow a single SELECT's view without dropping or repeating rows.
_AFTER_VIEW = frozenset({None, ";", "group", "order", "sort", "cluster", "distribute", "window"})
_LITERALS = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|`[^`]*`|--[^\n]*|/\*.*?\*/", re.S)
_TOKENS = re.compile(r"[a-z_][a-z0-9_]*|\S")
_STAR = re.compile(r"(?:^|[(,.])\s*\*")  # `*` as all columns, not as a product
_THRESHOLD = "spark.sql.execution.arrow.localRelationThreshold"
# Up to this many records a local relation is cheaper than a Spark job; beyond, decoding them all into rows
# on the driver costs more (measured: 1k records 160 vs 440 ms, 10k 200 vs 260 ms, 100k 1,040 vs 630 ms).
_LOCAL_RECORDS = 20_000
_NUMBER = "__streamjobs_record"  # a record's number in the batch, beside its columns


@dataclass(frozen=True)
class Probe:
    fragment: str
    error: str  # what a record it flags is dead-lettered with
    source: str | None  # "query" or "where": the stage text it sits in (None: not found in either)
    upstreams: tuple[str, ...] | None  # the inputs whose records reach it (None: all of them)
    trusted: bool

    @property
    def after_where(self) -> bool:
        """A fragment of the query sees only records the stage's `where` let through."""
        return self.source == "query"


def from_error(stage, exc: BaseException) -> Probe | None:
    """A probe for the SQL fragment Spark's error names, or None when it names none."""
    try:
        contexts = [c for c in exc.getQueryContext() if c.contextType() == QueryContextType.SQL]
        condition = exc.getCondition()
    except AttributeError:  # not Spark's error
        return None
    except Py4JError as error:  # one whose context the JVM cannot describe
        if outage(error):
            raise
        return None
    if not contexts:
        return None
    context = contexts[0]
    fragment, start, stop = context.fragment(), context.startIndex(), context.stopIndex()
    if not fragment:
        return None
    spec = getattr(stage, "spec", None)
    texts = {name: getattr(spec, name, None) for name in ("query", "where")}
    found = [name for name, text in texts.items() if text and text[start : stop + 1] == fragment]
    source = found[0] if len(found) == 1 else None
    upstreams, trusted = None, False
    if source == "where":
        trusted = _unconditional(_outside(texts["where"], start, stop))
    elif source == "query":
        views = {view_name(u): u for u in spec.inputs}
        view = _single_select_view(_outside(texts["query"], start, stop))
        trusted = view is not None and (view == "input" or view in views)
        upstreams = (views[view],) if trusted and view in views else None
    if _NONDETERMINISTIC.intersection(_TOKENS.findall(fragment.lower())) or _STAR.search(fragment):
        trusted = False  # whether it raises is chance, or `*` would expand to the probe's columns, not the stage's
    error = f"{type(exc).__name__}: [{condition}] {fragment} raises on this record"
    return Probe(fragment, error, source, upstreams, trusted)


def outage(exc: BaseException) -> bool:
    """The JVM, the connection to it or to Redis (a lookup's table) is gone: no record's fault, and nothing
    can succeed now; the worker restarts from its last commit."""
    return isinstance(exc, (ConnectionError, Py4JNetworkError, redis.ConnectionError, redis.TimeoutError))


def _outside(text: str, start: int, stop: int) -> list[str]:
    """The tokens of the text around the fragment, without literals, quoted names and comments."""
    around = f"{text[:start]} _fragment_ {text[stop + 1 :]}"
    return _TOKENS.findall(_LITERALS.sub(" _literal_ ", around).lower())


def _unconditional(tokens: list[str]) -> bool:
    return not _CONDITIONAL.intersection(tokens) and "select" not in tokens


def _single_select_view(tokens: list[str]) -> str | None:
    """The view a query reads when it is one SELECT over one view with nothing conditional in it."""
    if _CONDITIONAL.intersection(tokens) or tokens.count("select") != 1 or tokens.count("from") != 1:
        return None
    if tokens[0] != "select":
        return None
    rest = tokens[tokens.index("from") + 1 :] + [None, None, None]
    view, follows = rest[0], rest[1:]
    if follows[0] == "as":
        follows = follows[1:]
    if follows[0] is not None and re.fullmatch(r"[a-z_][a-z0-9_]*", follows[0]) and follows[0] not in _AFTER_VIEW:
        follows = follows[1:]  # an alias
    return view if view and follows[0] in _AFTER_VIEW else None


def find(stage, probes: list[Probe], tables: dict[str, tuple[pa.Table, np.ndarray]]) -> dict[int, Probe]:
    """The records each probe flags, by their number in the batch (the first probe that flags one names it).

    `tables`: per upstream, its records to look at and their numbers. A probe that Spark cannot
    analyse on an upstream (a fragment of a subquery, a column that input lacks), or that fails as a
    whole, flags nothing there.
    """
    flagged: dict[int, Probe] = {}
    spark = stage.spark
    small = sum(table.num_rows for table, _ in tables.values()) <= _LOCAL_RECORDS
    with _local_relations(spark) if small else nullcontext():
        for upstream, (table, numbers) in tables.items():
            wanted = [p for p in probes if p.upstreams is None or upstream in p.upstreams]
            if not wanted or not table.num_rows:
                continue
            text = " ".join(p.fragment for p in wanted) + " " + (stage.spec.where or "")
            columns = [c for c in table.column_names if c.lower() in text.lower()]
            probed, owners = _distinct(table, columns)
            numbered = probed.append_column(_NUMBER, pa.array(np.arange(probed.num_rows, dtype=np.int64)))
            df = None
            for probe in wanted:
                where = stage.spec.where if probe.after_where else None
                try:
                    df = spark.createDataFrame(numbered) if df is None else df
                    hits = df.filter(_raises(spark, probe.fragment, where)).collect()
                except Exception as exc:  # Spark cannot analyse it here, or a Python UDF in it raised: no finds
                    if outage(exc):
                        raise
                    continue
                for position in np.flatnonzero(np.isin(owners, [row[_NUMBER] for row in hits])):
                    flagged.setdefault(int(numbers[position]), probe)
    return flagged


def _distinct(table: pa.Table, columns: list[str]) -> tuple[pa.Table, np.ndarray]:
    """The rows to probe and, per record, the one that stands for it: a column's distinct values when the
    fragment can name only that column (a fragment that is deterministic raises on all records with one
    value or on none; one that is not gets no trust, see `from_error`), else every record as it is."""
    if len(columns) == 1:
        try:
            encoded = pc.dictionary_encode(table.column(columns[0]).combine_chunks(), null_encoding="encode")
        except pa.ArrowException:  # a type Arrow cannot hash (nested)
            pass
        else:
            return pa.table({columns[0]: encoded.dictionary}), encoded.indices.to_numpy()
    return table.select(columns), np.arange(table.num_rows)


@functools.lru_cache(maxsize=64)
def _raises(spark, fragment: str, where: str | None):
    """The predicate: the fragment raises on the row (that the `where` lets through). Kept: each py4j call
    costs ~1 ms, and a probe is run on every batch while its records keep coming."""
    from pyspark.sql import functions as F

    # Wrapped in a struct, the fragment's value is never NULL unless evaluating it raised.
    raised = _try_eval(spark, f"named_struct('v', {fragment})").isNull()
    return F.coalesce(_try_eval(spark, where), F.lit(False)) & raised if where else raised


def _try_eval(spark, sql: str):
    """The expression under TryEval, which has no SQL name: built with the classic session's Column internals."""
    from pyspark.sql import functions as F
    from pyspark.sql.classic.column import Column

    jvm = spark._jvm
    utils = jvm.org.apache.spark.sql.classic.ExpressionUtils
    expression = utils.expression(F.expr(sql)._jc)
    return Column(utils.column(jvm.org.apache.spark.sql.catalyst.expressions.TryEval(expression)))


@contextmanager
def _local_relations(spark):
    """Arrow data becomes a local relation the optimizer evaluates on the driver: no Spark job for a probe.
    (A session-wide setting, for the probe only: a worker runs one batch at a time on its session.)"""
    before = spark.conf.get(_THRESHOLD)
    spark.conf.set(_THRESHOLD, str(1 << 40))
    try:
        yield
    finally:
        spark.conf.set(_THRESHOLD, before)
