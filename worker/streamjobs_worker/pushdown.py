"""Filter pushdown into a stage's input: the rows Spark's plan would drop right after reading them never cross
into the JVM.

Spark pushes a query's filters down to its data sources (a Parquet reader skips what they exclude) and still
applies them itself; here the source is the Arrow table a stage hands over. The stage's query is planned as
usual; where the optimized plan filters one of its inputs right above the input's relation, the conjuncts that
Spark's own pushdown translates (DataSourceStrategy.translateFilter: a column against literals) and that Arrow
evaluates exactly as Spark does become an Arrow filter on that input's next batches. The condition stays in
the plan, so a pushed filter only removes rows the plan removes anyway: the result is the same, a filter that
drops 95 % of the events (NEXMark's per-type stages) saves converting them.

Pushed down only where it is exact: to an input that appears once in the plan (a self-join may need the rows
one side filters out), for deterministic conditions, with integer, string or boolean literals (Spark orders
NaN above every number and equals it to itself, Arrow does neither), under NOT only a filter pushed whole.
"""

from __future__ import annotations

from typing import Any

import pyarrow.compute as pc

_COMPARISONS = {"EqualTo": "__eq__", "GreaterThan": "__gt__", "GreaterThanOrEqual": "__ge__",
                "LessThan": "__lt__", "LessThanOrEqual": "__le__"}
_STRING_TESTS = {"StringStartsWith": "starts_with", "StringEndsWith": "ends_with", "StringContains": "match_substring"}


def relation_id(frame) -> int:
    """The id of the RDD behind a frame made by spark.bridge (a LogicalRDD): how its relation is found in a plan."""
    return frame._jdf.queryExecution().analyzed().rdd().id()


def learned(df, inputs: dict[str, int]) -> dict[str, pc.Expression | None]:
    """Per input (name -> relation_id of its frame in `df`'s plan): the Arrow filter its rows may be cut to, or
    None. Every input gets None when the plan reads anything else than these relations, or one of them twice."""
    plan = df._jdf.queryExecution().optimizedPlan()
    above: dict[int, list] = {}  # relation id -> the node right above each occurrence of it
    if not _leaves(plan, None, above) or set(above) - set(inputs.values()):
        return dict.fromkeys(inputs)
    pushed = {}
    for name, rdd in inputs.items():
        parents = above.get(rdd, [])
        parent = parents[0] if len(parents) == 1 else None
        if parent is None or parent.nodeName() != "Filter" or not parent.condition().deterministic():
            pushed[name] = None
            continue
        translated = [_arrow(f) for f in map(_translated, _conjuncts(parent.condition())) if f is not None]
        pushed[name] = _all([expr for expr, _ in filter(None, translated)])
    return pushed


def _leaves(node, parent, above: dict[int, list]) -> bool:
    """Record each LogicalRDD leaf with its parent; False where a leaf is another kind of relation."""
    children = node.children()
    if children.isEmpty():
        if node.nodeName() != "LogicalRDD":
            return False
        above.setdefault(node.rdd().id(), []).append(parent)
        return True
    return all(_leaves(children.apply(i), node, above) for i in range(children.size()))


def _conjuncts(condition) -> list:
    if condition.nodeName() == "And":
        return _conjuncts(condition.left()) + _conjuncts(condition.right())
    return [condition]


def _translated(condition):
    from pyspark import SparkContext

    # a Scala object's method: py4j reaches it through the object's single instance
    strategy = SparkContext._jvm.java.lang.Class.forName(
        "org.apache.spark.sql.execution.datasources.DataSourceStrategy$").getField("MODULE$").get(None)
    found = strategy.translateFilter(condition, False)
    return found.get() if found.isDefined() else None


def _arrow(source_filter) -> tuple[pc.Expression, bool] | None:
    """A data source filter as an Arrow expression, and whether it is exact (else only implied by the filter:
    an AND of which a part could not go). None where nothing of it can."""
    kind = source_filter.getClass().getSimpleName()
    if kind in ("And", "Or"):
        left, right = _arrow(source_filter.left()), _arrow(source_filter.right())
        if kind == "Or":
            return None if left is None or right is None else (left[0] | right[0], left[1] and right[1])
        if left is None or right is None:
            kept = left or right
            return None if kept is None else (kept[0], False)
        return left[0] & right[0], left[1] and right[1]
    if kind == "Not":
        inner = _arrow(source_filter.child())
        return (~inner[0], True) if inner is not None and inner[1] else None
    if kind in ("IsNull", "IsNotNull"):
        column = pc.field(source_filter.attribute())
        return (column.is_null() if kind == "IsNull" else column.is_valid()), True
    column = pc.field(source_filter.attribute()) if kind in (*_COMPARISONS, *_STRING_TESTS, "In") else None
    if kind in _COMPARISONS and _exact(value := source_filter.value()):
        return getattr(column, _COMPARISONS[kind])(value), True
    if kind in _STRING_TESTS and isinstance(value := source_filter.value(), str):
        return getattr(pc, _STRING_TESTS[kind])(column, pattern=value), True
    if kind == "In":
        values = list(source_filter.values())
        if values and all(_exact(v) for v in values) and len({type(v) for v in values}) == 1:
            return column.isin(values), True
    return None


def _exact(value: Any) -> bool:
    """A literal Arrow compares as Spark does: not a float (NaN), a decimal or a time (Java objects)."""
    return isinstance(value, (bool, int, str))


def _all(parts: list[pc.Expression]) -> pc.Expression | None:
    if not parts:
        return None
    joined = parts[0]
    for part in parts[1:]:
        joined = joined & part
    return joined
