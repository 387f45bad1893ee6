"""The `over` stage: each record with aggregates over the last N records of its key, in event time.

SQL's `agg(x) OVER (PARTITION BY key ORDER BY event_time, ... ROWS BETWEEN N-1
PRECEDING AND CURRENT ROW)`, computed as it becomes final: a record waits in
state (segment 1) until its key group's watermark passes it, as Flink's
bounded OVER aggregation buffers rows until their time is complete; the
records released by a batch go out in order, each aggregated with its key's
last N-1 records before it, which state keeps (segment 0). The aggregation is
Spark's own window function over the released records and that history, the
same query the oracle runs over the whole input.

Aggregations added live (reconfigure.py) need no state of their own: the
history holds records, not aggregates, so an added one covers a record's whole
frame at once. The records waiting at the switch were read under the old plan,
and every record meets the plan in force at its source offset: the switch
marks them (`_pre`, the names added), and they go out with those null.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from streamjobs_core.keygroups import key_groups_of
from streamjobs_core.spec import OverStage
from streamjobs_core.statelog import OVER_STATE
from streamjobs_core.watermarks import MIN_WATERMARK

from .. import phases
from ..state import KG, KeyGroupStore, concat, per_key_group, row_ids, take
from .base import LateRecords, _EventTimeStage, view_name

_RID, _SEG, _HISTORY = "_rid", "_seg", "_h"
_PRE = "_pre"  # on a record waiting at a live switch: the aggregations added then, comma-separated
HISTORY, WAITING = 0, 1
_FUNCTIONS = {"count": "count(1)", "sum": "sum({c})", "avg": "avg({c})", "min": "min({c})", "max": "max({c})"}


def over_sql(spec: OverStage, view: str, columns: list[str]) -> str:
    """The view's records, each with the stage's aggregates; shared with the oracle."""
    window = (f"PARTITION BY `{spec.key_by}` ORDER BY {', '.join(f'`{c}`' for c in spec.order_by)} "
              f"ROWS BETWEEN {spec.rows - 1} PRECEDING AND CURRENT ROW")
    aggregates = [f"{_FUNCTIONS[a.function].format(c=f'`{a.column}`')} OVER ({window}) AS `{a.as_}`"
                  for a in spec.aggregations]
    return f"SELECT {', '.join([*(f'`{c}`' for c in columns), *aggregates])} FROM {view}"


class Over(_EventTimeStage):
    spec: OverStage

    def __init__(self, spec: OverStage, store: KeyGroupStore, max_parallelism: int) -> None:
        super().__init__(spec, store)
        store.bind(OVER_STATE)
        self._max_parallelism = max_parallelism
        self._view = f"{view_name(spec.name)}__over"

    def reconfigure(self, spec: OverStage) -> None:
        """Besides what any stage may change live, aggregations added after the others (reconfigure.py allows
        no other change to them without a reset): the records waiting now are marked to go out without them."""
        added = [a.as_ for a in spec.aggregations[len(self.spec.aggregations):]]
        super().reconfigure(spec)
        if added and self.store.key_groups:
            self.store.update(WAITING, self.store.key_groups, lambda waiting: _marked(waiting, added))

    def process(self, batch, watermark: int) -> tuple[pa.Table | None, int]:
        before = {kg: self._fired_before(kg) for kg in self.store.key_groups}
        late: list[LateRecords] = []
        if batch.records:
            with phases.phase("state"):
                for upstream in self.spec.inputs:
                    table = batch.table(upstream)
                    if table is not None and table.num_rows:
                        self._wait(upstream, table, before, late)
        self._advance(batch, watermark)
        with phases.phase("state"):
            released = self._release({kg: self._fired_before(kg) for kg in self.store.key_groups}, before)
        if released is None:
            self.late.extend(late)
            return None, watermark
        with phases.phase("state"):
            history = self._history(released)
        out = self._aggregate(released, history)
        with phases.phase("state"):
            self._remember(released, history)
        self.late.extend(late)
        return out, watermark

    def _wait(self, upstream: str, table: pa.Table, watermarks: dict[int, int], late_rows: list[LateRecords]) -> None:
        """Park a batch's records until the watermark passes them; those it already passed go to `late_rows`."""
        for name in (self.spec.key_by, *self.spec.order_by):
            if name not in table.column_names:
                raise ValueError(f"{self.spec.name}: an input record has no column '{name}'")
        times = table.column("event_time")
        if times.null_count:
            raise ValueError(f"{self.spec.name}: a record has no event_time")
        kgs = key_groups_of(table.column(self.spec.key_by), self._max_parallelism)
        t = times.to_numpy().astype(np.int64)
        late = t < per_key_group(watermarks, self._max_parallelism, MIN_WATERMARK)[kgs]
        if late.any():
            rows = np.flatnonzero(late)
            late_rows.append(LateRecords(upstream, table.take(pa.array(rows)), [
                f"late: event time {t[i]} is behind key group {kgs[i]}'s watermark {watermarks.get(int(kgs[i]))}: "
                "the records before it in its key's order went out" for i in rows.tolist()]))
            table, kgs = table.filter(pa.array(~late)), kgs[~late]
        if not table.num_rows:
            return
        rows = (table.append_column(_RID, row_ids(table.num_rows))
                .append_column(_SEG, pa.array(np.full(table.num_rows, WAITING, dtype=np.int64)))
                .append_column(KG, pa.array(kgs)))
        self.store.update(WAITING, np.unique(kgs), lambda current: (concat([current, rows]), rows, None))

    def _release(self, after: dict[int, int], before: dict[int, int]) -> pa.Table | None:
        """The waiting records the watermark passed, out of state."""
        moved = [kg for kg in self.store.key_groups if after[kg] > before[kg]]
        waiting = self.store.read(moved, WAITING) if moved else None
        if waiting is None:
            return None
        bound = per_key_group({kg: after[kg] for kg in moved}, self._max_parallelism, MIN_WATERMARK)
        due = waiting.column("event_time").to_numpy().astype(np.int64) < bound[waiting.column(KG).to_numpy()]
        if not due.any():
            return None
        released = waiting.filter(pa.array(due))
        gone = released.select([_SEG, _RID, KG])
        self.store.update(WAITING, moved, lambda current: (waiting.filter(pa.array(~due)), None, gone))
        return released

    def _history(self, released: pa.Table) -> pa.Table | None:
        """The last records before these of the same keys (at most rows - 1 each)."""
        if self.spec.rows == 1:
            return None
        stored = self.store.read(np.unique(released.column(KG).to_numpy()), HISTORY)
        if stored is None:
            return None
        key = self.spec.key_by
        values = released.column(key).cast(stored.schema.field(key).type)
        stored = stored.filter(pc.is_in(stored.column(key), value_set=values))
        return stored if stored.num_rows else None

    def _aggregate(self, released: pa.Table, history: pa.Table | None) -> pa.Table | None:
        columns = [c for c in released.column_names if c not in (_RID, _SEG, KG, _PRE)]
        marked = [_PRE] if _PRE in released.column_names else []
        parts = [released.select([*columns, *marked]).append_column(_HISTORY, pa.repeat(False, released.num_rows))]
        if history is not None:
            # A column the input gained live (a query upstream changed) is null in the records kept from before.
            kept = [c for c in columns if c in history.column_names]
            parts.append(history.select(kept).append_column(_HISTORY, pa.repeat(True, history.num_rows)))
        both = concat(parts)  # nullable where the records kept or waiting from before the column was gained lack it
        sql = f"SELECT * FROM ({over_sql(self.spec, self._view, [*columns, *marked, _HISTORY])}) WHERE NOT {_HISTORY}"
        out = self._over_views({self._view: both}, sql).drop_columns([_HISTORY])
        if marked:
            out = _without_added(out, [a.as_ for a in self.spec.aggregations])
        return out if out.num_rows else None

    def _remember(self, released: pa.Table, history: pa.Table | None) -> None:
        """Each affected key's last rows - 1 records become its history."""
        if self.spec.rows == 1:
            return
        if _PRE in released.column_names:
            released = released.drop_columns([_PRE])
        released = released.set_column(released.schema.get_field_index(_SEG), _SEG,
                                       pa.array(np.full(released.num_rows, HISTORY, dtype=np.int64)))
        both = concat([history, released])
        order = pc.sort_indices(both, sort_keys=[(self.spec.key_by, "ascending"),
                                                 *((c, "ascending") for c in self.spec.order_by)])
        both = take(both, order.to_numpy())
        keys = both.column(self.spec.key_by).to_numpy(zero_copy_only=False)
        # A record is kept if fewer than rows - 1 records of its key come after it.
        starts = np.r_[True, keys[1:] != keys[:-1]]
        ends = np.r_[np.flatnonzero(starts)[1:], len(keys)]
        last = np.repeat(ends, np.diff(np.r_[np.flatnonzero(starts), len(keys)]))
        kept = both.filter(pa.array(last - np.arange(len(keys)) <= self.spec.rows - 1))
        dropped = history.filter(pc.invert(pc.is_in(history.column(_RID), value_set=kept.column(_RID)))) \
            if history is not None else None
        added = kept.filter(pc.invert(pc.is_in(kept.column(_RID), value_set=history.column(_RID)))) \
            if history is not None else kept
        touched = np.unique(released.column(KG).to_numpy())
        gone = dropped.select([_SEG, _RID, KG]) if dropped is not None and dropped.num_rows else None

        def merge(current: pa.Table | None):
            if current is None:
                return added, added, None
            keep = current
            if gone is not None:
                keep = keep.filter(pc.invert(pc.is_in(keep.column(_RID), value_set=gone.column(_RID))))
            return concat([keep, added]), added, gone

        self.store.update(HISTORY, touched, merge)


def _marked(waiting: pa.Table | None, added: list[str]) -> tuple[pa.Table | None, pa.Table | None, None]:
    """Waiting records with `added` among the aggregations they go out without; all rewritten (upserted)."""
    if waiting is None:
        return None, None, None
    names = ",".join(added)
    if _PRE in waiting.column_names:
        before = waiting.column(_PRE)
        pre = pc.if_else(pc.is_null(before), names, pc.binary_join_element_wise(before, names, ","))
        waiting = waiting.set_column(waiting.schema.get_field_index(_PRE), _PRE, pre)
    else:
        waiting = waiting.append_column(_PRE, pa.repeat(pa.scalar(names, pa.string()), waiting.num_rows))
    return waiting, waiting, None


def _without_added(out: pa.Table, aggregates: list[str]) -> pa.Table:
    """Each record marked at a switch with the aggregates added there nulled (they came after it was read)."""
    pre = out.column(_PRE)
    for name in aggregates:
        hit = pc.fill_null(pc.match_substring_regex(pre, f"(^|,){name}(,|$)"), False)
        if pc.any(hit).as_py():
            column = out.column(name)
            out = out.set_column(out.schema.get_field_index(name), name,
                                 pc.if_else(hit, pa.nulls(out.num_rows, column.type), column))
    return out.drop_columns([_PRE])
