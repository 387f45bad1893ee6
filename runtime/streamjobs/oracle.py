"""The correctness oracle: the same query as a Spark batch job over the same input.

For deterministic sources the input is regenerated from the committed source
offsets; an external stream's is read back from its retained entries up to the
source's committed cursors (a run whose input was trimmed cannot be verified);
every operator is then evaluated over its whole input at once, with
Spark's own window() for window stages (an implementation independent of the
worker's incremental one). The sink's committed output is compared with the
expected rows as multisets.
"""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from functools import reduce
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType
from streamjobs_core import ddl, deadletters, generators, resplit, shedding
from streamjobs_core.deadletters import Kind
from streamjobs_core.exchange import entry_order
from streamjobs_core.keygroups import key_groups_of_columns
from streamjobs_core.plan import JobPlan
from streamjobs_core.spec import STATEFUL_TYPES
from streamjobs_core.statelog import state_layout
from streamjobs_worker import external
from streamjobs_worker.ports import Ports
from streamjobs_worker.spark import spark_types
from streamjobs_worker.stages.base import load_function, view_name
from streamjobs_worker.stages.join import on_clause, select_list, window_join_sql
from streamjobs_worker.stages.lookup import load_table, lookup_join
from streamjobs_worker.stages.over import over_sql

_READ_BYTES = 256 * 2**20  # read back in parts of at most this many bytes
_SPILL_ROWS = 1_000_000  # rows per Parquet row group: the unit Spark reads a spilled input in


class Unverifiable(Exception):
    """The run's input cannot be read back, so there is nothing to check its output against."""


@dataclass
class Decisions:
    """What the job itself decided to leave out, read from its dead letters, for the expected result to leave
    out too: records a stage rejected (onError: dead_letter) or met late, per consumer and input, and source
    entries quarantined (a worker kept dying at them). Records a source could not decode need nothing: the
    oracle decodes the input again and drops the same ones."""

    left_out: dict[str, dict[str, list[dict]]] = field(default_factory=dict)  # consumer -> upstream -> records
    quarantined: dict[str, set[bytes]] = field(default_factory=dict)  # input stream -> entry IDs
    counts: dict[str, dict[str, int]] = field(default_factory=dict)  # operator -> kind -> records left out

    @classmethod
    def of(cls, ports: Ports, plan: JobPlan) -> Decisions:
        letters = deadletters.read_all(ports.exchange, plan.keys.dead_letter)
        held: Counter = Counter(letter.operator for letter in letters)
        for op, kinds in deadletters.totals(ports.exchange, plan.keys.dead_letter_totals).items():
            if held[op] < sum(kinds.values()):
                raise Unverifiable(f"{op}: the dead-letter stream holds {held[op]} of the {sum(kinds.values())} "
                                   "records it dead-lettered (trimmed): what the job left out is not known")
        decisions = cls()
        sources = {s.name for p in ports.jobs.plans() for s in p.spec.sources}
        for letter in letters:
            if letter.kind in (Kind.REJECTED, Kind.LATE, Kind.QUARANTINED):
                kinds = decisions.counts.setdefault(letter.operator, {})
                kinds[letter.kind.value] = kinds.get(letter.kind.value, 0) + 1
            if letter.kind == Kind.QUARANTINED:
                if letter.operator not in sources:
                    raise Unverifiable(f"{letter.operator}: an entry between operators was quarantined; its records "
                                       "were not processed and cannot be told apart")
                decisions.quarantined.setdefault(letter.stream, set()).add(letter.entry_id)
            elif letter.kind in (Kind.REJECTED, Kind.LATE):
                if not letter.whole:
                    raise Unverifiable(f"{letter.operator}: a record it dead-lettered ({letter.size:,} bytes) is "
                                       "too large for its dead letter to show it whole")
                upstream = letter.stream.partition(">")[0]
                decisions.left_out.setdefault(letter.operator, {}).setdefault(upstream, []).append(
                    json.loads(letter.record))
        return decisions

    def inputs_of(self, spark: SparkSession, frames: dict[str, DataFrame], op: str) -> dict[str, DataFrame]:
        """The frames as operator `op` takes them: less the records it left out of each input."""
        left_out = self.left_out.get(op)
        if not left_out:
            return frames
        return {**frames, **{u: _without(spark, frames[u], records, op) for u, records in left_out.items()}}


def _without(spark: SparkSession, frame: DataFrame, records: list[dict], op: str) -> DataFrame:
    """The frame less one row per record (matched on its columns but the internal `_` ones)."""
    table = frame.toArrow()
    columns = [c for c in table.column_names if not c.startswith("_")]
    wanted = Counter(tuple(_value_key(record.get(c)) for c in columns) for record in records)
    keep = np.ones(table.num_rows, dtype=bool)
    for i, row in enumerate(table.select(columns).to_pylist()):
        key = tuple(_value_key(row[c]) for c in columns)
        if wanted[key] > 0:
            wanted[key] -= 1
            keep[i] = False
    missing = sum(wanted.values())
    if missing:
        raise Unverifiable(f"{op}: {missing} records it dead-lettered are not among its input records")
    return spark.createDataFrame(table.filter(pa.array(keep)), schema=frame.schema)


def spilled(spark: SparkSession, table: pa.Table, path: Path) -> DataFrame:
    """The table as a DataFrame that Spark reads from a Parquet file at `path`, in splits: a run's whole input
    handed over in memory (createDataFrame) must fit the oracle JVM's heap at once, and a flood run's did not.
    Columns keep the types createDataFrame gives them; Parquet has no column of only nulls, so those come back
    as literals."""
    target, _, struct = spark_types(table.schema)
    nulls = [f.name for f in target if pa.types.is_null(f.type)]
    stored = table.cast(target).drop_columns(nulls)
    pq.write_table(stored, path, row_group_size=_SPILL_ROWS)
    frame = spark.read.schema(StructType([f for f in struct.fields if f.name not in nulls])).parquet(str(path))
    return frame.select(*[F.lit(None).alias(f.name) if f.name in nulls else F.col(f"`{f.name}`") for f in struct])


def _value_key(value: Any) -> Any:
    """One spelling per value, whether read back from a dead letter's JSON or from Spark."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def source_input(ports: Ports, plan: JobPlan, op: str, decisions: Decisions | None = None):
    """The exact records a source committed: regenerated from a generator's offsets, read back from an
    external stream's retained input."""
    spec = plan.spec.operator(op)
    if spec.type == "redis_stream":
        return external_input(ports, plan, op, quarantined=(decisions or Decisions()).quarantined)
    count = plan.key_groups(op)
    committed = ports.jobs.partitions(op, range(count))
    parts = [generators.global_indices(p, count, 0, int(progress.cursor) if progress else 0)
             for p, (progress, _) in committed.items()]
    indices = np.sort(np.concatenate(parts)) if parts else np.zeros(0, dtype=np.int64)
    if spec.load_shedding is not None:
        indices = np.setdiff1d(indices, shed_indices(ports, plan, op), assume_unique=True)
    return generators.generate(spec, plan.t0_ms, indices)


def external_input(ports: Ports, plan: JobPlan, op: str, cuts: list[dict] | None = None, first: int = 0,
                   quarantined: dict[str, set[bytes]] | None = None) -> pa.Table:
    """The records a redis_stream source committed: each partition's entries up to its committed cursor,
    decoded as the source decodes them (so the records it dead-lettered drop out the same way), less the
    records it shed and the entries it quarantined. Unverifiable when the source's retention trimmed entries
    that the run consumed.

    With `cuts` (per plan version from `first` + 1 on, the entry id each partition switched at), each record
    also says the plan version in force at its entry (`_v`): `first`, the version the source came in with."""
    spec = plan.spec.operator(op)
    keys = plan.keys
    committed = ports.jobs.partitions(op, range(spec.partitions))
    decoder = external.Decoder(spec)
    if ports.redis is None:
        raise Unverifiable(f"{op}: a redis_stream source's input is read back from the job's Redis, and this run "
                           "had none")
    reader = external.StreamReader(ports.redis, spec.limits.max_entry_bytes, _READ_BYTES)
    shed = shedding.shed_ids(ports.exchange, keys.shed, op) if spec.load_shedding is not None else set()
    total_shed = int(ports.exchange.hash_fields(keys.shed_totals, [op])[0] or 0)
    if len(shed) != total_shed:
        raise Unverifiable(f"{op}: the shed log names {len(shed)} of the {total_shed} records shed (trimmed)")
    tables = []
    for p in range(spec.partitions):
        progress = committed[p][0]
        if progress is None:
            continue  # never consumed from
        entries = _entries_up_to(reader, keys.input_stream(op, p), progress.cursor)
        consumed = progress.position - progress.start
        if len(entries) != consumed:
            raise Unverifiable(
                f"{op}: input stream {p} holds {len(entries)} of the {consumed} entries the run consumed; the "
                f"source's retention ({spec.retention.mode}) trimmed the others")
        skipped = (quarantined or {}).get(keys.input_stream(op, p))
        if skipped:
            entries = [entry for entry in entries if entry[0] not in skipped]
        if not entries:
            continue
        ids = [entry_id for entry_id, _ in entries]
        decoded = decoder.decode(ids, [fields for _, fields in entries])
        if decoded.table is None:
            continue
        table = decoded.table
        if cuts is not None:
            versions = _versions_of([ids[i] for i in decoded.entry], p, op, cuts, first)
            table = table.append_column("_v", pa.array(versions))
        if shed:
            rows = range(table.num_rows)
            names = [external.record_id(ids[decoded.entry[i]], None if decoded.row is None else int(decoded.row[i]))
                     for i in rows]
            table = table.filter(pa.array([(p, name) not in shed for name in names]))
        tables.append(table)
    if not tables:
        schema = ddl.parse(spec.schema_) if spec.schema_ else pa.schema([])
        versions = {} if cuts is None else {"_v": pa.array([], pa.int64())}
        return pa.table({**{f.name: pa.array([], f.type) for f in schema},
                         "event_time": pa.array([], pa.int64()), "_ingest_ms": pa.array([], pa.int64()), **versions})
    return pa.concat_tables(tables, promote_options="default")  # schemaless streams may differ in fields


def _versions_of(ids: list[bytes], partition: int, op: str, cuts: list[dict], first: int = 0) -> list[int]:
    """Per entry id: `first` and how many of the cuts (entry ids a partition switched at, by version from
    `first` + 1 on) it comes after."""
    bounds = []
    for version, cut in enumerate(cuts, start=first + 1):
        if (op, partition) not in cut:
            raise Unverifiable(f"{op}: partition {partition} never switched to plan version {version}")
        bounds.append(entry_order(cut[(op, partition)]))
    return [first + sum(entry_order(i) > bound for bound in bounds) for i in ids]


def _entries_up_to(reader: external.StreamReader, key: str, last: bytes, chunk: int = 10_000) -> list:
    """A stream's entries up to `last`, read as the source read them (one past its size limit as its size)."""
    entries: list = []
    after: bytes = b"0-0"
    while True:
        read = reader.range({key: (after, last)}, chunk)
        part = read.streams[0][1] if read.streams else []
        entries.extend(part)
        if not part or (len(part) < chunk and not read.cut):
            return entries
        after = part[-1][0]


def shed_indices(ports: Ports, plan: JobPlan, op: str) -> np.ndarray:
    """The global indices of the records a source shed: each logged batch regenerated, the choice repeated."""
    spec = plan.spec.operator(op)
    count = plan.key_groups(op)
    logged = [(shed, ranges) for name, shed, ranges in shedding.read_log(ports.exchange, plan.keys.shed) if name == op]
    total = int(ports.exchange.hash_fields(plan.keys.shed_totals, [op])[0] or 0)
    if sum(shed for shed, _ in logged) != total:
        raise ValueError(f"{op}: the shed log holds {sum(s for s, _ in logged)} of {total} records shed "
                         "(trimmed): the run's input cannot be reproduced")
    shed_parts = []
    for shed, ranges in logged:
        g = np.concatenate([generators.global_indices(p, count, start, end) for p, start, end in ranges])
        mask = shedding.shed_mask(generators.generate(spec, plan.t0_ms, g), spec.load_shedding, ranges)
        if int(mask.sum()) != shed:
            raise ValueError(f"{op}: a logged batch shed {shed} records, the same choice now sheds {mask.sum()}")
        shed_parts.append(g[mask])
    return np.concatenate(shed_parts) if shed_parts else np.zeros(0, dtype=np.int64)


def _window(df: DataFrame, spec, since: dict[str, int] | None = None) -> DataFrame:
    """`since`: per aggregation added live, the plan version that added it; it covers records of that version
    on (`_v`), null in a window none of them reached (a count too: not counted is not none)."""
    size, step = f"{spec.window.size_ms} milliseconds", f"{spec.window.step_ms} milliseconds"
    aggs = []
    for agg in spec.aggregations:
        column = F.lit(1) if agg.function == "count" else F.col(f"`{agg.column}`")  # count(*), as the stage
        added = (since or {}).get(agg.as_, 0)
        if added:
            column = F.when(F.col("_v") >= added, column)
        fn = {"count": F.count, "sum": F.sum, "avg": F.avg, "min": F.min, "max": F.max}[agg.function]
        value = fn(column)
        if added and agg.function == "count":
            value = F.when(value > 0, value)
        aggs.append(value.alias(agg.as_))
    grouped = df.groupBy(F.col(f"`{spec.key_by}`"), F.window(F.timestamp_millis("event_time"), size, step).alias("w"))
    return (
        grouped.agg(*aggs)
        .withColumn("window_start", F.unix_millis("w.start"))
        .withColumn("window_end", F.unix_millis("w.end"))
        .withColumn("event_time", F.col("window_end") - 1)
        .withColumn("_ingest_ms", F.col("window_end"))
        .drop("w")
    )


def _join(spark: SparkSession, spec, left: DataFrame, right: DataFrame) -> DataFrame:
    """window: each side's rows once per window holding them (Spark's window()), joined on keys and window.
    interval and regular: every pair within the time bounds; an unmatched left row at its time plus upper."""
    if spec.kind != "window":
        lower, upper = spec.bounds_ms
        left.createOrReplaceTempView(f"{view_name(spec.name)}__oracle_left")
        right.withColumn("_present", F.lit(True)).createOrReplaceTempView(f"{view_name(spec.name)}__oracle_right")
        how = "LEFT OUTER" if spec.how == "left" else "INNER"
        return spark.sql(
            f"SELECT {', '.join(select_list(spec, left.columns, right.columns))}, CASE WHEN r._present IS NULL "
            f"THEN l.event_time + {upper} ELSE greatest(l.event_time, r.event_time) END AS event_time, "
            f"CAST(0 AS BIGINT) AS _ingest_ms "
            f"FROM {view_name(spec.name)}__oracle_left l {how} JOIN {view_name(spec.name)}__oracle_right r "
            f"ON {on_clause(spec)}")
    size, step = f"{spec.window.size_ms} milliseconds", f"{spec.window.step_ms} milliseconds"
    views = []
    for side, frame in zip(("left", "right"), (left, right)):
        windowed = (frame.withColumn("_w", F.window(F.timestamp_millis("event_time"), size, step))
                    .withColumn("_ws", F.unix_millis("_w.start")).drop("_w"))
        views.append(f"{view_name(spec.name)}__oracle_{side}")
        windowed.createOrReplaceTempView(views[-1])
    return spark.sql(window_join_sql(spec, *views, left.columns, right.columns))


@dataclass(frozen=True)
class Expected:
    """What each operator emits over the run's whole input, and each stateful stage's final state."""

    frames: dict[str, DataFrame]
    states: dict[str, DataFrame]

    def __getitem__(self, op: str) -> DataFrame:
        return self.frames[op]


def expected_outputs(spark: SparkSession, ports: Ports, plan: JobPlan, spill: Path,
                     decisions: Decisions | None = None) -> Expected:
    """Every operator's expected output, lazily: its sources' records are spilled into `spill`, which must
    outlive the frames' use."""
    decisions = decisions or Decisions()
    plans = ports.jobs.plans()
    states: dict[str, DataFrame] = {}
    if len(plans) > 1:
        return Expected(_reconfigured_outputs(spark, ports, plans, decisions, states, spill), states)
    frames: dict[str, DataFrame] = {}
    for name in plan.spec.topological_order():
        op = plan.spec.operator(name)
        if op in plan.spec.sources:
            # Ingest time is not reproducible; a constant keeps queries that select it valid.
            frames[name] = spilled(spark, source_input(ports, plan, name, decisions), spill / name).withColumn(
                "_ingest_ms", F.lit(0))
            continue
        taken = decisions.inputs_of(spark, frames, name)
        inputs = [taken[u].filter(op.where) if getattr(op, "where", None) else taken[u] for u in op.inputs]
        frames[name] = _evaluate(spark, ports, op, inputs, states=states)
    return Expected(frames, states)


def _evaluate(spark: SparkSession, ports: Ports, op, inputs: list[DataFrame],
              since: dict[str, int] | None = None, states: dict[str, DataFrame] | None = None) -> DataFrame:
    """One operator over its whole input (each input already filtered by its `where`); `since` as _window's; a
    stateful stage's final state goes to `states`."""
    union = None
    for upstream, frame in zip(op.inputs, inputs):
        frame.createOrReplaceTempView(view_name(upstream))
        union = frame if union is None else union.unionByName(frame, allowMissingColumns=True)
    union.createOrReplaceTempView("input")
    if op.type == "join":
        return _join(spark, op, *inputs)
    if op.type == "sql":
        return spark.sql(op.query)
    if op.type == "pyspark":
        return load_function(op.function)(union)
    if op.type == "window_aggregate":
        return _window(union, op, since)
    if op.type == "over":
        out = spark.sql(over_sql(op, "input", union.columns))
        for name, version in (since or {}).items():  # read before the switch (`_v`): it went out without them
            out = out.withColumn(name, F.when(F.col("_v") >= version, F.col(f"`{name}`")))
        return out
    if op.type == "lookup":
        return lookup_join(union, load_table(spark, ports.redis, op), op)
    if op.type == "stateful":
        key_field = union.schema[op.key_by]
        state = spark.createDataFrame([], f"`{op.key_by}` {key_field.dataType.simpleString()}, {op.state_schema}")
        output, final = load_function(op.function)(union, state)
        if states is not None:
            states[op.name] = final
        return output
    return union


# Fields that change how an operator runs, not what it computes; `inputs`, where its records come from, is
# followed per version (_wired).
_HOW_IT_RUNS = ("parallelism", "onError", "simulatedCostUs", "allowedLatenessMs", "maxLength", "path", "inputs")


def _reconfigured_outputs(spark: SparkSession, ports: Ports, plans: list[JobPlan], decisions: Decisions,
                          states: dict[str, DataFrame], spill: Path) -> dict[str, DataFrame]:
    """The job reconfigured live: every source record carries the plan version in force at its offset (`_v`,
    from the recorded cuts), and every operator computes each record under that version's spec.

    A stateful stage merges records of every version into one state, so its own changes may only be to its
    `where` (applied per record), and what it emits has no single version: an operator downstream of one
    that changed what it computes cannot be verified per record, and is reported so.
    """
    cuts = {p.version: ports.jobs.cut(p.version) for p in plans[1:]}
    frames: dict[str, DataFrame] = {}
    versioned: dict[str, bool] = {}  # whether each row of the frame says its version
    for name in _in_order(plans):
        # None where a version has no such operator (a member added to or removed from a chain live)
        specs = [_operator_or_none(p, name) for p in plans]
        op = next(spec for spec in reversed(specs) if spec is not None)
        if any(spec is not None and spec in p.spec.sources for p, spec in zip(plans, specs)):
            frames[name] = spilled(spark, _versioned_source(ports, plans, name, cuts, decisions),
                                   spill / name).withColumn("_ingest_ms", F.lit(0))
            versioned[name] = True
            continue
        taken = decisions.inputs_of(spark, frames, name)
        resets = [p.version for p in plans if name in p.resets]
        if resets:
            frames[name] = _with_resets(spark, ports, plans, name, taken, versioned, resets)
            versioned[name] = False
            continue
        since = _aggregations_added(specs)
        computes = {json.dumps(_what_it_computes(s, keep_where=op.type not in STATEFUL_TYPES,
                                                 keep_aggregations=not since), sort_keys=True)
                    for s in specs if s is not None}
        inputs = _wired(taken, versioned, specs, range(len(plans)))
        if since and not all(v for _, v in inputs):
            raise Unverifiable(f"{name}: aggregations added live downstream of a stateful stage")
        if len(computes) > 1 and (op.type in STATEFUL_TYPES or not all(v for _, v in inputs)):
            raise Unverifiable(f"{name}: changed live {'' if op.type in STATEFUL_TYPES else 'downstream of a '}"
                               "stateful stage; records of several plan versions meet in its state, so the oracle "
                               "cannot tell which version each output row met")
        if op.type in STATEFUL_TYPES or not all(v for _, v in inputs):
            frames[name] = _evaluate(spark, ports, op, [_where_per_version(f, specs, v) for f, v in inputs], since,
                                     states)
            versioned[name] = False
            continue
        parts = []
        for version, spec in enumerate(specs):
            if spec is None:
                continue
            inputs = [taken[u].filter(F.col("_v") == version) for u in spec.inputs]
            if getattr(spec, "where", None):
                inputs = [frame.filter(spec.where) for frame in inputs]
            parts.append(_evaluate(spark, ports, spec, inputs).withColumn("_v", F.lit(version)))
        frames[name] = reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), parts)
        versioned[name] = True
    return frames


def _with_resets(spark: SparkSession, ports: Ports, plans: list[JobPlan], name: str,
                 frames: dict[str, DataFrame], versioned: dict[str, bool], resets: list[int]) -> DataFrame:
    """A window stage whose state live changes reset (--reset-state): each stretch of versions between resets
    is a state of its own, over the records of those versions. A stretch a reset ended emits the windows that
    fired before it: per key group, those its watermark at the reset had passed (end + lateness); the rest
    were dropped with the state."""
    specs = [p.spec.operator(name) for p in plans]
    if any(spec.type != "window_aggregate" for spec in specs):
        raise Unverifiable(f"{name}: its state was reset live; the oracle replays the resets of window stages only")
    if not all(versioned[u] for stretch in specs for u in stretch.inputs):
        raise Unverifiable(f"{name}: its state was reset live downstream of a stateful stage")
    bounds = [0, *resets, len(plans)]
    parts = []
    for start, end in zip(bounds, bounds[1:]):
        stretch = specs[start:end]
        if len({json.dumps(_what_it_computes(s, keep_where=False), sort_keys=True) for s in stretch}) > 1:
            raise Unverifiable(f"{name}: changed live without a reset of its state")
        spec = stretch[-1]
        inputs = [_where_per_version(frame, specs, True)
                  for frame, _ in _wired(frames, versioned, specs, range(start, end))]
        out = _evaluate(spark, ports, spec, inputs)
        if end < len(plans):
            out = _fired_before(spark, out, spec, ports.jobs.resets(end, name), plans[end].spec.max_parallelism)
        parts.append(out)
    return reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), parts)


def _in_order(plans: list[JobPlan]) -> list[str]:
    """Every operator of every version, each after all its inputs in any version."""
    inputs: dict[str, set[str]] = {}
    for plan in plans:
        for op in plan.spec.operators:
            inputs.setdefault(op.name, set()).update(getattr(op, "inputs", ()))
    order: list[str] = []
    while len(order) < len(inputs):
        ready = sorted(n for n, ups in inputs.items() if n not in order and ups <= set(order))
        if not ready:  # members of a chain reordered: no one order serves every version
            raise Unverifiable(f"operators {sorted(inputs.keys() - set(order))} feed each other across versions")
        order.extend(ready)
    return order


def _operator_or_none(plan: JobPlan, name: str):
    try:
        return plan.spec.operator(name)
    except KeyError:
        return None


def _wired(frames: dict[str, DataFrame], versioned: dict[str, bool], specs: list,
           versions: range) -> list[tuple[DataFrame, bool]]:
    """Each input of an operator over `versions`, and whether its rows say their version: the records of the
    upstream each version names (a member added to or removed from a chain live renames its next one's input)."""
    present = [v for v in versions if specs[v] is not None]
    out = []
    for i in range(len(specs[present[-1]].inputs)):
        names = {specs[v].inputs[i] for v in present}
        if len(names) == 1:
            (name,) = names
            whole = versions.start == 0 and versions.stop == len(specs)
            frame = frames[name] if whole else frames[name].filter(F.col("_v").between(versions.start,
                                                                                       versions.stop - 1))
            out.append((frame, versioned[name]))
            continue
        if not all(versioned[n] for n in names):
            raise Unverifiable(f"{specs[present[-1]].name}: its input was rewired live downstream of a stateful stage")
        parts = [frames[specs[v].inputs[i]].filter(F.col("_v") == v) for v in present]
        out.append((reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), parts), True))
    return out


def _fired_before(spark: SparkSession, windows: DataFrame, spec, watermarks: dict[int, int],
                  max_parallelism: int) -> DataFrame:
    """The windows whose key group's watermark had passed their end + lateness."""
    table = windows.toArrow()
    if not table.num_rows:
        return windows
    kgs = key_groups_of_columns(table, (spec.key_by,), max_parallelism)
    missing = sorted(set(kgs.tolist()) - watermarks.keys())
    if missing:
        raise Unverifiable(f"{spec.name}: key groups {missing[:5]} recorded no watermark at the reset")
    marks = np.array([watermarks[int(kg)] for kg in kgs], dtype=np.int64)
    fired = table.column("window_end").to_numpy() + spec.allowed_lateness_ms <= marks
    return spark.createDataFrame(table.filter(pa.array(fired)))


def _what_it_computes(spec, keep_where: bool, keep_aggregations: bool = True) -> dict:
    fields = spec.model_dump(mode="json", by_alias=True)
    return {k: v for k, v in fields.items() if k not in _HOW_IT_RUNS and (keep_where or k != "where")
            and (keep_aggregations or k != "aggregations")}


def _aggregations_added(specs: list) -> dict[str, int]:
    """A window or `over` stage whose live changes added aggregations after its others (reconfigure.py): per
    aggregation added, the first version that has it. Empty when none was added, or they changed otherwise."""
    if any(spec is None or spec.type not in ("window_aggregate", "over") for spec in specs):
        return {}  # a stateful stage is never added or removed live
    lists = [spec.aggregations for spec in specs]
    if any(b[:len(a)] != a for a, b in zip(lists, lists[1:])):
        return {}
    return {agg.as_: first for i, agg in enumerate(lists[-1])
            if (first := next(v for v, aggs in enumerate(lists) if len(aggs) > i))}


def _where_per_version(frame: DataFrame, specs: list, versioned: bool) -> DataFrame:
    wheres = [getattr(spec, "where", None) for spec in specs]
    if len(set(wheres)) == 1:
        return frame.filter(wheres[0]) if wheres[0] else frame
    if not versioned:
        raise Unverifiable(f"{specs[-1].name}: its where changed live downstream of a stateful stage")
    condition = reduce(lambda a, b: a | b, [(F.col("_v") == v) & (F.expr(w) if w else F.lit(True))
                                            for v, w in enumerate(wheres)])
    return frame.filter(condition)


def _versioned_source(ports: Ports, plans: list[JobPlan], op: str, cuts: dict[int, dict],
                      decisions: Decisions) -> pa.Table:
    """A source's committed records, each with the plan version in force at its offset. A source added live
    starts under the version that added it; one removed switched to the version that removed it at its last
    offset, after which it read nothing."""
    present = [i for i, p in enumerate(plans) if _operator_or_none(p, op) is not None]
    first, last = present[0], present[-1]
    switches = range(first + 1, min(last + 1, len(plans) - 1) + 1)  # the versions it switched to
    plan = plans[last]
    spec = plan.spec.operator(op)
    if spec.type == "redis_stream":
        return external_input(ports, plan, op, [cuts[v] for v in switches], first, decisions.quarantined)
    count = plan.key_groups(op)
    committed = ports.jobs.partitions(op, range(count))
    shed = shed_indices(ports, plan, op) if spec.load_shedding is not None else None
    bounds = {}  # per partition: the offsets where each version starts, and the end of its committed input
    for p, (progress, _) in committed.items():
        missing = [v for v in switches if (op, p) not in cuts[v]]
        if missing:
            raise Unverifiable(f"{op}: partition {p} never switched to plan version {missing[0]}")
        bounds[p] = [0, *(int(cuts[v][(op, p)]) for v in switches), int(progress.cursor) if progress else 0]
    tables = []
    for i in range(len(switches) + 1):
        parts = [generators.global_indices(p, count, edges[i], edges[i + 1]) for p, edges in bounds.items()]
        indices = np.sort(np.concatenate(parts)) if parts else np.zeros(0, dtype=np.int64)
        if shed is not None:
            indices = np.setdiff1d(indices, shed, assume_unique=True)
        table = generators.generate(spec, plan.t0_ms, indices)
        tables.append(table.append_column("_v", pa.array(np.full(table.num_rows, first + i, dtype=np.int32))))
    return pa.concat_tables(tables)


def canonical(value: Any) -> Any:
    """One spelling per value, whether it came back from Redis as text or from Parquet typed."""
    if value is None:
        return None
    text = value if isinstance(value, str) else json.dumps(value)
    try:
        return str(int(text))
    except ValueError:
        pass
    try:
        return f"{float(text):.9g}"
    except ValueError:
        return text


def _rows(records: list[dict], columns: list[str]) -> Counter:
    return Counter(tuple(canonical(rec.get(c)) for c in columns) for rec in records)


def actual_output(spark: SparkSession, ports: Ports, plan: JobPlan, sink: str) -> list[dict] | None:
    spec = plan.spec.operator(sink)
    if spec.type == "redis_stream":
        key = plan.keys.output_stream(sink)
        return [{k.decode(): v.decode() for k, v in fields.items()}
                for _, fields in ports.exchange.after({key: None})[key]]
    if spec.type == "parquet":
        dirs = [d.decode() for d in ports.exchange.items(plan.keys.manifest(sink))]
        return [row.asDict() for row in spark.read.parquet(*dirs).collect()] if dirs else []
    return None


def verify(spark: SparkSession, ports: Ports, plan: JobPlan) -> dict:
    """The run's committed output against the expected one: per sink, lost, duplicated and unexpected rows.
    `correct` is None, with the reason, where the run cannot be verified; a sink downstream of a stateful
    stage whose outputs are per batch is not compared (its rows depend on where batches began), and that
    stage's final state per key is instead."""
    with tempfile.TemporaryDirectory(prefix="streamjobs-oracle-") as spill:
        return _verify(spark, ports, plan, Path(spill))


def _verify(spark: SparkSession, ports: Ports, plan: JobPlan, spill: Path) -> dict:
    try:
        decisions = Decisions.of(ports, plan)
        expected = expected_outputs(spark, ports, plan, spill, decisions)
    except Unverifiable as exc:
        return {"correct": None, "reason": f"cannot verify: {exc}"}
    result: dict[str, Any] = {"correct": True, "lost": 0, "duplicated": 0, "unexpected": 0, "sinks": {},
                              "left_out": decisions.counts}
    per_batch = _per_batch_stages(plan)
    behind = _downstream(plan, per_batch)
    # Every sink of every version, with the last plan it is in: one removed live holds what it wrote before.
    last_in = {sink.name: p for p in ports.jobs.plans() for sink in p.spec.sinks}
    for name, owner in last_in.items():
        if name in behind:
            result["sinks"][name] = {"checked": False, "reason": f"downstream of stateful stage {behind[name]!r} "
                                     "(outputs: per_batch): what it emits depends on its batches; its final state "
                                     "per key is checked instead"}
            continue
        actual = actual_output(spark, ports, owner, name)
        if actual is None:
            result["sinks"][name] = {"checked": False, "reason": "console output is not kept"}
            continue
        frame = expected[name]
        columns = sorted(c for c in frame.columns if not c.startswith("_"))
        want = _rows([row.asDict() for row in frame.select(*[f"`{c}`" for c in columns]).collect()], columns)
        _tally(result, result["sinks"].setdefault(name, {}), want, _rows(actual, columns))
    if per_batch:
        result["states"] = {}
        for op in per_batch:
            want, got = _states(spark, ports, plan, op, expected)
            _tally(result, result["states"].setdefault(op, {}), want, got)
    checked = [s for s in (*result["sinks"].values(), *result.get("states", {}).values()) if "expected" in s]
    if not checked:
        return {**result, "correct": None, "reason": "cannot verify: nothing the job keeps could be checked"}
    result["correct"] = result["lost"] == result["duplicated"] == result["unexpected"] == 0
    return result


def _tally(result: dict, into: dict, want: Counter, got: Counter) -> None:
    lost = sum((want - got).values())
    extra = got - want
    duplicated = sum(n for row, n in extra.items() if row in want)
    unexpected = sum(n for row, n in extra.items() if row not in want)
    into.update({
        "expected": sum(want.values()), "actual": sum(got.values()),
        "lost": lost, "duplicated": duplicated, "unexpected": unexpected,
        "examples_lost": [list(r) for r in list(want - got)[:3]],
        "examples_unexpected": [list(r) for r in list(extra)[:3]],
    })
    result["lost"] += lost
    result["duplicated"] += duplicated
    result["unexpected"] += unexpected


def _per_batch_stages(plan: JobPlan) -> list[str]:
    return [op.name for op in plan.spec.stages if op.type == "stateful" and op.outputs == "per_batch"]


def _downstream(plan: JobPlan, stages: list[str]) -> dict[str, str]:
    """Every operator fed (directly or not) by one of `stages`, with the first such stage."""
    behind: dict[str, str] = {}
    for name in plan.spec.topological_order():
        op = plan.spec.operator(name)
        for upstream in getattr(op, "inputs", ()):
            origin = upstream if upstream in stages else behind.get(upstream)
            if origin is not None:
                behind.setdefault(name, origin)
    return behind


def _states(spark: SparkSession, ports: Ports, plan: JobPlan, op: str, expected) -> tuple[Counter, Counter]:
    """A stateful stage's final state per key: expected (its function once over all its input, from no state)
    and as the job left it in Redis."""
    spec = plan.spec.operator(op)
    names = [spec.key_by, *spark.createDataFrame([], spec.state_schema).columns]
    want_frame = expected.states[op]
    nulls = reduce(lambda a, b: a & b, [F.col(f"`{c}`").isNull() for c in names[1:]])
    want = _rows([row.asDict() for row in want_frame.filter(~nulls).select(*[f"`{c}`" for c in names]).collect()],
                 names)
    rows = resplit.state_rows(ports.jobs, op, plan.spec.max_parallelism, state_layout(spec))
    got = _rows([] if rows is None else rows.select(names).to_pylist(), names)
    return want, got

