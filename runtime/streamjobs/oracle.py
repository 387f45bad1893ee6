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
from collections import Counter
from functools import reduce
from typing import Any

import numpy as np
import pyarrow as pa
import redis
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from streamjobs_core import ddl, generators, shedding
from streamjobs_core.jobstore import RedisJobStore
from streamjobs_core.keygroups import key_groups_of_columns
from streamjobs_core.plan import JobPlan
from streamjobs_core.spec import STATEFUL_TYPES
from streamjobs_worker import external
from streamjobs_worker.join import on_clause, select_list, window_join_sql
from streamjobs_worker.lookup import load_table, lookup_join
from streamjobs_worker.over import over_sql
from streamjobs_worker.stages import load_function, view_name


class Unverifiable(Exception):
    """The run's input cannot be read back, so there is nothing to check its output against."""


def source_input(r: redis.Redis, plan: JobPlan, op: str):
    """The exact records a source committed: regenerated from a generator's offsets, read back from an
    external stream's retained input."""
    spec = plan.spec.operator(op)
    if spec.type == "redis_stream":
        return external_input(r, plan, op)
    count = plan.key_groups(op)
    committed = RedisJobStore(r, plan.name).partitions(op, range(count))
    parts = [generators.global_indices(p, count, 0, int(progress.cursor) if progress else 0)
             for p, (progress, _) in committed.items()]
    indices = np.sort(np.concatenate(parts)) if parts else np.zeros(0, dtype=np.int64)
    if spec.load_shedding is not None:
        indices = np.setdiff1d(indices, shed_indices(r, plan, op), assume_unique=True)
    return generators.generate(spec, plan.t0_ms, indices)


def external_input(r: redis.Redis, plan: JobPlan, op: str, cuts: list[dict] | None = None, first: int = 0) -> pa.Table:
    """The records a redis_stream source committed: each partition's entries up to its committed cursor,
    decoded as the source decodes them (so the records it dead-lettered drop out the same way), less the
    records it shed. Unverifiable when the source's retention trimmed entries that the run consumed.

    With `cuts` (per plan version from `first` + 1 on, the entry id each partition switched at), each record
    also says the plan version in force at its entry (`_v`): `first`, the version the source came in with."""
    spec = plan.spec.operator(op)
    keys = plan.keys
    committed = RedisJobStore(r, plan.name).partitions(op, range(spec.partitions))
    decoder = external.Decoder(spec)
    shed = shedding.shed_ids(r, keys.shed, op) if spec.load_shedding is not None else set()
    total_shed = int(r.hget(keys.shed_totals, op) or 0)
    if len(shed) != total_shed:
        raise Unverifiable(f"{op}: the shed log names {len(shed)} of the {total_shed} records shed (trimmed)")
    tables = []
    for p in range(spec.partitions):
        progress = committed[p][0]
        if progress is None:
            continue  # never consumed from
        entries = _entries_up_to(r, keys.input_stream(op, p), progress.cursor)
        consumed = progress.position - progress.start
        if len(entries) != consumed:
            raise Unverifiable(
                f"{op}: input stream {p} holds {len(entries)} of the {consumed} entries the run consumed; the "
                f"source's retention ({spec.retention.mode}) trimmed the others")
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
        bounds.append(_id_key(cut[(op, partition)]))
    return [first + sum(_id_key(i) > bound for bound in bounds) for i in ids]


def _id_key(entry_id: bytes | str) -> tuple[int, int]:
    ms, _, seq = (entry_id.decode() if isinstance(entry_id, bytes) else entry_id).partition("-")
    return int(ms), int(seq or 0)


def _entries_up_to(r: redis.Redis, key: str, last: bytes, chunk: int = 10_000) -> list:
    entries: list = []
    low = "-"
    while True:
        part = r.xrange(key, min=low, max=last, count=chunk)
        entries.extend(part)
        if len(part) < chunk:
            return entries
        low = "(" + part[-1][0].decode()


def shed_indices(r: redis.Redis, plan: JobPlan, op: str) -> np.ndarray:
    """The global indices of the records a source shed: each logged batch regenerated, the choice repeated."""
    spec = plan.spec.operator(op)
    count = plan.key_groups(op)
    logged = [(shed, ranges) for name, shed, ranges in shedding.read_log(r, plan.keys.shed) if name == op]
    total = int(r.hget(plan.keys.shed_totals, op) or 0)
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


def expected_outputs(spark: SparkSession, r: redis.Redis, plan: JobPlan) -> dict[str, DataFrame]:
    plans = RedisJobStore(r, plan.name).plans()
    if len(plans) > 1:
        return _reconfigured_outputs(spark, r, plans)
    frames: dict[str, DataFrame] = {}
    for name in plan.spec.topological_order():
        op = plan.spec.operator(name)
        if op in plan.spec.sources:
            # Ingest time is not reproducible; a constant keeps queries that select it valid.
            frames[name] = spark.createDataFrame(source_input(r, plan, name)).withColumn("_ingest_ms", F.lit(0))
            continue
        inputs = [frames[u].filter(op.where) if getattr(op, "where", None) else frames[u] for u in op.inputs]
        frames[name] = _evaluate(spark, r, op, inputs)
    return frames


def _evaluate(spark: SparkSession, r: redis.Redis, op, inputs: list[DataFrame],
              since: dict[str, int] | None = None) -> DataFrame:
    """One operator over its whole input (each input already filtered by its `where`); `since` as _window's."""
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
        return lookup_join(union, load_table(spark, r, op), op)
    if op.type == "stateful":
        key_field = union.schema[op.key_by]
        state = spark.createDataFrame([], f"`{op.key_by}` {key_field.dataType.simpleString()}, {op.state_schema}")
        return load_function(op.function)(union, state)[0]
    return union


# Fields that change how an operator runs, not what it computes; `inputs`, where its records come from, is
# followed per version (_wired).
_HOW_IT_RUNS = ("parallelism", "onError", "simulatedCostUs", "allowedLatenessMs", "maxLength", "path", "inputs")


def _reconfigured_outputs(spark: SparkSession, r: redis.Redis, plans: list[JobPlan]) -> dict[str, DataFrame]:
    """The job reconfigured live: every source record carries the plan version in force at its offset (`_v`,
    from the recorded cuts), and every operator computes each record under that version's spec.

    A stateful stage merges records of every version into one state, so its own changes may only be to its
    `where` (applied per record), and what it emits has no single version: an operator downstream of one
    that changed what it computes cannot be verified per record, and is reported so.
    """
    latest = plans[-1]
    store = RedisJobStore(r, latest.name)
    cuts = {p.version: store.cut(p.version) for p in plans[1:]}
    frames: dict[str, DataFrame] = {}
    versioned: dict[str, bool] = {}  # whether each row of the frame says its version
    for name in _in_order(plans):
        # None where a version has no such operator (a member added to or removed from a chain live)
        specs = [_operator_or_none(p, name) for p in plans]
        op = next(spec for spec in reversed(specs) if spec is not None)
        if any(spec is not None and spec in p.spec.sources for p, spec in zip(plans, specs)):
            frames[name] = spark.createDataFrame(_versioned_source(r, plans, name, cuts)).withColumn(
                "_ingest_ms", F.lit(0))
            versioned[name] = True
            continue
        resets = [p.version for p in plans if name in p.resets]
        if resets:
            frames[name] = _with_resets(spark, r, store, plans, name, frames, versioned, resets)
            versioned[name] = False
            continue
        since = _aggregations_added(specs)
        computes = {json.dumps(_what_it_computes(s, keep_where=op.type not in STATEFUL_TYPES,
                                                 keep_aggregations=not since), sort_keys=True)
                    for s in specs if s is not None}
        inputs = _wired(frames, versioned, specs, range(len(plans)))
        if since and not all(v for _, v in inputs):
            raise Unverifiable(f"{name}: aggregations added live downstream of a stateful stage")
        if len(computes) > 1 and (op.type in STATEFUL_TYPES or not all(v for _, v in inputs)):
            raise Unverifiable(f"{name}: changed live {'' if op.type in STATEFUL_TYPES else 'downstream of a '}"
                               "stateful stage; records of several plan versions meet in its state, so the oracle "
                               "cannot tell which version each output row met")
        if op.type in STATEFUL_TYPES or not all(v for _, v in inputs):
            frames[name] = _evaluate(spark, r, op, [_where_per_version(f, specs, v) for f, v in inputs], since)
            versioned[name] = False
            continue
        parts = []
        for version, spec in enumerate(specs):
            if spec is None:
                continue
            inputs = [frames[u].filter(F.col("_v") == version) for u in spec.inputs]
            if getattr(spec, "where", None):
                inputs = [frame.filter(spec.where) for frame in inputs]
            parts.append(_evaluate(spark, r, spec, inputs).withColumn("_v", F.lit(version)))
        frames[name] = reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), parts)
        versioned[name] = True
    return frames


def _with_resets(spark: SparkSession, r: redis.Redis, store: RedisJobStore, plans: list[JobPlan], name: str,
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
        out = _evaluate(spark, r, spec, inputs)
        if end < len(plans):
            out = _fired_before(spark, out, spec, store.resets(end, name), plans[end].spec.max_parallelism)
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


def _versioned_source(r: redis.Redis, plans: list[JobPlan], op: str, cuts: dict[int, dict]) -> pa.Table:
    """A source's committed records, each with the plan version in force at its offset. A source added live
    starts under the version that added it; one removed switched to the version that removed it at its last
    offset, after which it read nothing."""
    present = [i for i, p in enumerate(plans) if _operator_or_none(p, op) is not None]
    first, last = present[0], present[-1]
    switches = range(first + 1, min(last + 1, len(plans) - 1) + 1)  # the versions it switched to
    plan = plans[last]
    spec = plan.spec.operator(op)
    if spec.type == "redis_stream":
        return external_input(r, plan, op, [cuts[v] for v in switches], first)
    count = plan.key_groups(op)
    committed = RedisJobStore(r, plan.name).partitions(op, range(count))
    shed = shed_indices(r, plan, op) if spec.load_shedding is not None else None
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


def actual_output(spark: SparkSession, r: redis.Redis, plan: JobPlan, sink: str) -> list[dict] | None:
    spec = plan.spec.operator(sink)
    if spec.type == "redis_stream":
        rows = []
        last = "-"
        while True:
            chunk = r.xrange(plan.keys.output_stream(sink), min=last, count=10_000)
            if not chunk:
                return rows
            for _, fields in chunk:
                rows.append({k.decode(): v.decode() for k, v in fields.items()})
            last = "(" + chunk[-1][0].decode()
    if spec.type == "parquet":
        dirs = [d.decode() for d in r.lrange(plan.keys.manifest(sink), 0, -1)]
        return [row.asDict() for row in spark.read.parquet(*dirs).collect()] if dirs else []
    return None


def verify(spark: SparkSession, r: redis.Redis, plan: JobPlan) -> dict:
    try:
        expected = expected_outputs(spark, r, plan)
    except Unverifiable as exc:
        return {"correct": None, "reason": f"cannot verify: {exc}"}
    result: dict[str, Any] = {"correct": True, "lost": 0, "duplicated": 0, "unexpected": 0, "sinks": {}}
    # Every sink of every version, with the last plan it is in: one removed live holds what it wrote before.
    last_in = {sink.name: p for p in RedisJobStore(r, plan.name).plans() for sink in p.spec.sinks}
    for name, owner in last_in.items():
        actual = actual_output(spark, r, owner, name)
        if actual is None:
            result["sinks"][name] = {"checked": False, "reason": "console output is not kept"}
            continue
        frame = expected[name]
        columns = sorted(c for c in frame.columns if not c.startswith("_"))
        want = _rows([row.asDict() for row in frame.select(*[f"`{c}`" for c in columns]).collect()], columns)
        got = _rows(actual, columns)
        lost = sum((want - got).values())
        extra = got - want
        duplicated = sum(n for row, n in extra.items() if row in want)
        unexpected = sum(n for row, n in extra.items() if row not in want)
        result["sinks"][name] = {
            "expected": sum(want.values()), "actual": sum(got.values()),
            "lost": lost, "duplicated": duplicated, "unexpected": unexpected,
            "examples_lost": [list(r) for r in list(want - got)[:3]],
            "examples_unexpected": [list(r) for r in list(extra)[:3]],
        }
        result["lost"] += lost
        result["duplicated"] += duplicated
        result["unexpected"] += unexpected
    result["correct"] = result["lost"] == result["duplicated"] == result["unexpected"] == 0
    return result
