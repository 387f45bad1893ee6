"""What every stage builds on: the bridge of a batch's inputs into Spark, their columns and filters, and
results back as Arrow."""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from streamjobs_core.watermarks import MAX_WATERMARK, MIN_WATERMARK

from .. import phases, pushdown, spark
from ..prepared import PreparedQueries
from ..state import KeyGroupStore


def load_function(ref: str) -> Callable[..., Any]:
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


def view_name(op: str) -> str:
    return op.replace("-", "_")


@dataclass(frozen=True)
class LateRecords:
    """Records of one input that a stage met behind their key group's watermark: the window or join they
    belonged to had moved on. The chain dead-letters each with its reason (never only a metric)."""

    upstream: str
    rows: pa.Table  # as the stage met them
    reasons: list[str]  # per row: the window it missed, or the watermark it was behind


class _SparkStage:
    def __init__(self, spec, store: KeyGroupStore) -> None:
        self.spec = spec
        self.store = store
        self.spark = spark.session()
        self._schemas: dict[str, pa.Schema] = {}
        self.late: list[LateRecords] = []  # met by batches that went through, since the chain last took them
        self._read_views = self._views()
        self._kept: dict[tuple[str, ...], list[str]] = {}  # _columns per input's column names
        # pushdown.py: per input and schema, the filter its rows pass before Spark (None: none), once learned
        # from a plan; and the inputs of the batch at hand whose filter its plan is to tell (their relation ids)
        self._pushed: dict[tuple[str, pa.Schema], Any] = {}
        self._learning: dict[str, int] = {}
        self._prepared = PreparedQueries(self.spark)

    def reconfigure(self, spec) -> None:
        """A live change (reconfigure.py) to fields the state does not depend on: the state stays."""
        self.spec = spec
        self._read_views = self._views()
        self._kept = {}
        self._pushed = {}
        self._prepared = PreparedQueries(self.spark)

    # Whether the stage calls _learn_pushdown with the query that reads its inputs (pushdown.py)
    _pushes_down = False

    def _views(self) -> set[str]:
        """The views the stage's query reads: `input` (the union) and each input by its name. Registering
        one costs a round trip and an analysis in the JVM: a stage registers only those it reads."""
        return set()

    def _columns(self, names: list[str]) -> list[str]:
        """Those of an input's columns the stage's query may read (every one unless the stage can tell). Each
        column sent costs the JVM a conversion per record: the largest part of a simple stage's work."""
        return names

    def _kept_of(self, names: list[str]) -> list[str]:
        known = self._kept.get(key := tuple(names))
        if known is None:
            known = self._kept[key] = self._columns(names)
        return known

    def _input_tables(self, batch) -> dict[str, pa.Table]:
        """Each input's table of this batch as the stage reads it: only the columns it may read; an input absent
        from the batch empty in its last schema (left out if never met)."""
        tables = {}
        for upstream in self.spec.inputs:
            table = batch.table(upstream)
            if table is not None and len(kept := self._kept_of(table.column_names)) < table.num_columns:
                table = table.select(kept)
            if table is not None:
                self._schemas[upstream] = table.schema
            elif upstream in self._schemas:
                table = self._schemas[upstream].empty_table()
            else:
                continue
            tables[upstream] = table
        return tables

    def _register_inputs(self, batch) -> Any:
        """Register the views the stage reads over this batch's inputs; return their union."""
        return self._register_tables(self._input_tables(batch))

    def _register_tables(self, tables: dict[str, pa.Table]) -> Any:
        frames = {}
        for upstream, table in tables.items():
            learn = self._pushes_down and table.num_rows and (upstream, table.schema) not in self._pushed
            if self._pushes_down and not learn:
                table = self._filtered(upstream, table)
            with phases.phase("to_jvm"):
                frames[upstream] = frame = spark.bridge(self.spark).frame(table)
                if learn:
                    self._learning[upstream] = pushdown.relation_id(frame)
        return self._register(frames)

    def _register(self, frames: dict[str, Any]) -> Any:
        """Register the views the stage reads (each input, and their union as `input`) over the inputs' frames;
        return the union."""
        views = self._read_views
        union = None
        for upstream, frame in frames.items():
            # One chunk, one partition: Spark would otherwise make a partition per tiny entry, and an
            # aggregation over a single partition needs no exchange.
            df = frame.coalesce(1)
            if self.spec.where:
                df = df.filter(self.spec.where)
            if view_name(upstream) in views:
                df.createOrReplaceTempView(view_name(upstream))
            union = df if union is None else union.unionByName(df, allowMissingColumns=True)
        if "input" in views:
            union.createOrReplaceTempView("input")
        return union

    def _query(self, batch, sql: str) -> pa.Table:
        """The result of the stage's SQL over this batch's inputs: planned once per input schemas where that plan
        may run again (prepared.py), once pushdown learned its filters; else planned over this batch."""
        tables = self._input_tables(batch)
        learnt = not self._pushes_down or all(not t.num_rows or (u, t.schema) in self._pushed for u, t in tables.items())
        key = (sql, tuple((u, t.schema) for u, t in tables.items()))
        if learnt and self._prepared.may_run(key):
            filtered = {u: self._filtered(u, t) for u, t in tables.items()}

            def planned(frames: dict[str, Any]) -> Any:
                self._register(frames)
                return self.spark.sql(sql)

            result = self._prepared.run(key, filtered, planned)
            if result is not None:
                return result
        self._register_tables(tables)
        with phases.phase("plan"):
            df = self.spark.sql(sql)
            self._learn_pushdown(df)
        return collect(df)

    def _over_views(self, tables: dict[str, pa.Table], sql: str) -> pa.Table:
        """The result of `sql` over `tables`, each the view of its name in one partition: planned once per input
        schemas where that plan may run again (prepared.py), else over this batch."""

        def registered(frames: dict[str, Any]) -> Any:
            for view, frame in frames.items():
                frame.coalesce(1).createOrReplaceTempView(view)
            return self.spark.sql(sql)

        result = self._prepared.run((sql, tuple((v, t.schema) for v, t in tables.items())), tables, registered)
        if result is not None:
            return result
        bridge = spark.bridge(self.spark)
        with phases.phase("to_jvm"):
            frames = {view: bridge.frame(table) for view, table in tables.items()}
        with phases.phase("plan"):
            df = registered(frames)
        return collect(df)

    def _filtered(self, upstream: str, table: pa.Table) -> pa.Table:
        pushed = self._pushed.get((upstream, table.schema))
        if pushed is None or not table.num_rows:
            return table
        try:
            return table.filter(pushed)
        except pa.ArrowException:  # a type Arrow cannot compare so (a dictionary, say): Spark alone filters
            self._pushed[(upstream, table.schema)] = None
            return table

    def _learn_pushdown(self, df) -> None:
        """What the plan of `df`, the query over this batch's inputs, lets later batches filter first."""
        if self._learning:
            schemas = {name: self._schemas[name] for name in self._learning}
            for name, pushed in pushdown.learned(df, self._learning).items():
                self._pushed[(name, schemas[name])] = pushed
            self._learning = {}

    def restore(self, watermarks: dict[int, int] | None = None) -> None:
        """Stateless stages have nothing to rebuild."""

    def watermarks(self) -> dict[int, int]:
        """Per owned key group, the watermark every timer fired before (stages without timers: none)."""
        return {}

    def acquire(self, kg: int, watermark: int = MIN_WATERMARK) -> None:
        """A key group taken over mid-run (its state is in the store): stages without timers need nothing."""

    def release(self, kg: int) -> None:
        """A key group handed over (its state leaves the store): stages without timers need nothing."""


# SQL that may read columns it does not name: a star where a column or argument list goes (SELECT *, t.*,
# struct(*); count(*) reads none, `a * b` is a product), NATURAL joins and USING clauses; and any SQL with a
# comment, which may hide the star's place.
_COUNT_ROWS = re.compile(r"\bcount\s*\(\s*\*\s*\)", re.IGNORECASE)
_UNNAMED_COLUMNS = re.compile(r"(?:^|\bselect|\bdistinct|\ball|[,(.])\s*\*|\bnatural\b|\busing\b", re.IGNORECASE)


def mentioned(names: list[str], sql: str, also: set[str] = frozenset()) -> list[str]:
    """The columns among `names` that `sql` may read: those it names (case aside, as Spark resolves them,
    quoted or not; a name in a string literal or comment counts too, which costs only its conversion), or
    every one where it may read columns it does not name. `also`: columns kept whatever the text says."""
    if "--" in sql or "/*" in sql or _UNNAMED_COLUMNS.search(_COUNT_ROWS.sub("", sql)):
        return names  # a comment may stand between SELECT and its star (`SELECT -- all\n *`)
    named = [name for name in names if name in also
             or re.search(rf"(?<![\w$]){re.escape(name)}(?![\w$])", sql, re.IGNORECASE)]
    return named or names[:1]  # a batch without columns would lose its row count on the way


class _EventTimeStage(_SparkStage):
    """A stage with timers in event time, kept per key group: a key group taken over from another instance
    resumes at its own streams' progress, which may lag this instance's other key groups."""

    def __init__(self, spec, store: KeyGroupStore) -> None:
        super().__init__(spec, store)
        self._watermarks: dict[int, int] = {}

    def restore(self, watermarks: dict[int, int] | None = None) -> None:
        for kg in self.store.key_groups:
            self.acquire(kg, (watermarks or {}).get(kg, MIN_WATERMARK))

    def acquire(self, kg: int, watermark: int = MIN_WATERMARK) -> None:
        """`watermark`: the key group's committed input watermark, which every timer fired before (a late
        record after a restart or handover must not open such a window again)."""
        self._watermarks[kg] = watermark

    def release(self, kg: int) -> None:
        self._watermarks.pop(kg, None)

    def watermarks(self) -> dict[int, int]:
        return dict(self._watermarks)

    def _fired_before(self, kg: int) -> int:
        return self._watermarks.get(kg, MIN_WATERMARK)

    def _advance(self, batch, watermark: int) -> None:
        """Each owned key group's watermark after the batch (never back)."""
        for kg in self.store.key_groups:
            mark = watermark if watermark == MAX_WATERMARK else batch.watermarks.get(kg, watermark)
            self._watermarks[kg] = max(self._fired_before(kg), mark)


def collect_both(first, second) -> tuple[pa.Table, pa.Table]:
    """Two DataFrames as Arrow in one Spark job: each as a struct column of one union, the other's null.

    One job instead of two halves the fixed cost (planning, scheduling) of a stateful batch. A result
    without columns, or with one name twice, cannot be a struct: such results are collected one by one.
    """
    from pyspark.sql import functions as F

    if any(not df.columns or len(set(df.columns)) < len(df.columns) for df in (first, second)):
        return collect(first), collect(second)

    def nested(df):
        return F.struct(*[F.col("`" + c.replace("`", "``") + "`") for c in df.columns]).cast(_nullable(df.schema))

    both = first.select(nested(first).alias("a"), F.lit(None).cast(_nullable(second.schema)).alias("b")).union(
        second.select(F.lit(None).cast(_nullable(first.schema)).alias("a"), nested(second).alias("b")))
    table = collect(both)
    return _unnest(table, "a", first), _unnest(table, "b", second)


def collect(df) -> pa.Table:
    """Run the query and bring its result back as Arrow. Under a profile (phases.py) the physical plan is
    made first, so planning and execution are told apart (the plan is made once either way)."""
    if phases.active():
        with phases.phase("plan"):
            df._jdf.queryExecution().executedPlan()
    with phases.phase("execute"):
        return spark.bridge(df.sparkSession).table(df)


def _nullable(schema):
    """The struct type with every field nullable, nested structs too: the other branch's rows are null."""
    from pyspark.sql.types import StructField, StructType

    def loose(kind):
        return _nullable(kind) if isinstance(kind, StructType) else kind

    return StructType([StructField(f.name, loose(f.dataType), True) for f in schema.fields])


def _unnest(table: pa.Table, name: str, df) -> pa.Table:
    """One DataFrame's rows of the union, typed as its own toArrow() would type them."""
    schema = spark.bridge(df.sparkSession).arrow_schema(df)
    column = table.column(name)
    rows = column.filter(pc.is_valid(column)).combine_chunks()
    return pa.Table.from_struct_array(rows).cast(schema) if len(rows) else schema.empty_table()
