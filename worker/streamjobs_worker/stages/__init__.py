"""Stage operators; each runs its batch on the worker's SparkSession.

`sql` and `pyspark` are stateless. `window_aggregate` lets Spark compute the
batch's partial aggregates per (key, window) and merges them into keyed state;
`stateful` hands the user function the batch and the state of the batch's keys.
Both keep state per key group (state.py) so it can be restored and moved per
key group, as Arrow tables: what Spark returns merges into state, and state
goes to Spark, over whole columns, never a Python loop per key.
"""

from __future__ import annotations

from ..state import KeyGroupStore
from .join import make_join
from .lookup import LookupStage
from .over import Over
from .sql import PySparkStage, SqlStage
from .stateful import Stateful
from .window import WindowAggregate


class StageBroken(ValueError):
    """A mistake in the job that every batch would meet (a function that does not import, a query Spark refuses):
    the operator and Python's (or Spark's) words. No restart mends it: the job fails."""


def build_stage(spec, store: KeyGroupStore, max_parallelism: int, r=None):
    """make_stage, its failures (a function that does not import, a spec the stage refuses) a StageBroken."""
    try:
        return make_stage(spec, store, max_parallelism, r)
    except Exception as exc:  # noqa: BLE001 - anything a function's import raises is the job's mistake
        lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
        raise StageBroken(f"{spec.name}: cannot be built: {type(exc).__name__}: {lines[0] if lines else ''}") from None


def make_stage(spec, store: KeyGroupStore, max_parallelism: int, r=None):
    """`r`: the job's Redis, where a lookup stage's table may live."""
    if spec.type == "lookup":
        return LookupStage(spec, store, r)
    if spec.type == "join":
        return make_join(spec, store, max_parallelism)
    if spec.type == "over":
        return Over(spec, store, max_parallelism)
    if spec.type == "sql":
        return SqlStage(spec, store)
    if spec.type == "pyspark":
        return PySparkStage(spec, store)
    if spec.type == "window_aggregate":
        return WindowAggregate(spec, store, max_parallelism)
    return Stateful(spec, store, max_parallelism)
