"""Queries a stage plans once per input schemas and runs again on each batch.

Per batch, planning (analysis, optimization, physical planning) was ~38 % of a small SQL stage's JVM time,
and turning the batch's Arrow columns into Spark rows most of the rest for larger batches. Here each input
of a stage's query is a current-batch relation (jvm/CurrentBatch.java) whose rows are the Arrow vectors
loaded into its slot: the query is planned once for its text and its inputs' schemas, and a batch loads its
tables, runs the planned query and frees the slots.

A plan is run again only where that gives what planning it anew would (jvm/Reuse.java): not one with an
exchange or subquery (each keeps its first run's result), the current time or randomness (fixed or seeded
at planning), or a scan of anything but the slots and literal rows. Those, and every query of a session
without the helpers' jar, are planned per batch as before.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Hashable

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

from . import phases, spark

log = logging.getLogger(__name__)

# Plans kept per stage: one per query and input schemas; a stage meets few (a schema changes rarely).
KEPT = 16


class _Plan:
    def __init__(self, slots: dict[str, str], query: DataFrame | None, why_not: str | None) -> None:
        self.slots = slots  # input name -> its slot
        self.query = query  # None: planned per batch
        self.why_not = why_not


class PreparedQueries:
    """One stage's planned queries (a stage runs in one thread, on its own session)."""

    def __init__(self, session: SparkSession) -> None:
        self._spark = session
        self._plans: dict[Hashable, _Plan] = {}
        self._on = spark.has_helpers(session)

    def run(self, key: Hashable, tables: dict[str, pa.Table],
            plan: Callable[[dict[str, DataFrame]], DataFrame]) -> pa.Table | None:
        """The result of the query `plan(frames)` makes over the inputs' frames, run over `tables`; planned on the
        first batch of the key (the query and its inputs' schemas). None where its plan may not run again:
        the caller plans it over this batch."""
        if not self._on:
            return None
        planned = self._plans.get(key)
        if planned is None:
            planned = self._prepare(key, tables, plan)
        if planned.query is None:
            return None
        bridge = spark.bridge(self._spark)
        try:
            with phases.phase("to_jvm"):
                for name, table in tables.items():
                    bridge.load(planned.slots[name], table)
            with phases.phase("execute"):
                return bridge.run_here(planned.query)
        finally:
            for slot in planned.slots.values():
                bridge.free(slot)

    def may_run(self, key: Hashable) -> bool:
        """Whether `run` may give the key's result: a reusable plan, or one not made yet (False without the
        helpers' jar)."""
        planned = self._plans.get(key)
        return self._on and (planned is None or planned.query is not None)

    def why_not(self, key: Hashable) -> str | None:
        """Why the key's query is planned per batch (None: it is not, or it was never met)."""
        planned = self._plans.get(key)
        return planned.why_not if planned is not None else None

    def _prepare(self, key: Hashable, tables: dict[str, pa.Table],
                 plan: Callable[[dict[str, DataFrame]], DataFrame]) -> _Plan:
        bridge = spark.bridge(self._spark)
        slots = {name: f"{name}-{uuid.uuid4()}" for name in tables}
        with phases.phase("plan"):
            query = plan({name: bridge.slot_frame(slots[name], table.schema) for name, table in tables.items()})
            why_not = self._spark._jvm.streamjobs.jvm.Reuse.whyNot(query._jdf)
        if why_not is not None:
            log.info("planned per batch: %s", why_not)
        if len(self._plans) >= KEPT:
            self._plans.pop(next(iter(self._plans)))
        planned = self._plans[key] = _Plan(slots, query if why_not is None else None, why_not)
        return planned
