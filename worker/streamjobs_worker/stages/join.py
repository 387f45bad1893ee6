"""Stream joins: rows of two keyed inputs with equal keys meet in event time.

Each input arrives partitioned by its own key columns (`on.left`, `on.right`),
so equal keys of both sides land in one key group. Rows wait in the key
group's state, in segments per side (`segment = 2 * n + side`), stored with
their columns prefixed by their side (`l_`, `r_`) so that both sides keep their
own columns in one snapshot, and with a row id (a join keeps duplicates apart).
Matching runs in one Spark query per batch (the user's `where` and `select`
are Spark SQL). Rescaling, prestaging and recovery need nothing of their own:
the rows are keyed state like any stage's.

- window (`WindowJoin`): a segment per pane (the `slide`-aligned stretch of
  event time whose rows share their windows). When a key group's watermark
  passes window ends, the panes of the windows due are read, tagged with their
  window start and joined on (keys, window); a pane leaves state once the last
  window holding it has fired.
- interval and regular (`IntervalJoin`): a pair meets when its later row
  arrives, if `r.t - l.t` lies in [lower, upper] (regular: [-ttl, ttl]). A row
  waits until no partner can come: a left row until the watermark passes
  `t + upper`, a right row until it passes `t - lower`; a segment per bucket of
  that expiry time. A row older than its key group's watermark is late and
  dropped (counted), as in Flink's interval join: so which pairs meet never
  depends on timing.
"""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from streamjobs_core.keygroups import key_groups_of_columns
from streamjobs_core.spec import JoinStage
from streamjobs_core.statelog import JOIN_PREFIXES as PREFIXES
from streamjobs_core.statelog import JOIN_STATE
from streamjobs_core.watermarks import MAX_WATERMARK

from .. import phases
from ..state import KG, KeyGroupStore, concat, groups_of, per_key_group, row_ids, take
from .base import LateRecords, _EventTimeStage, view_name

_RID, _SEG, _WS, _MATCHED, _LRID = "_rid", "_seg", "_ws", "_m", "_lrid"
_RIGHT_COLUMN = re.compile(r"\br\s*\.\s*`?([A-Za-z_][A-Za-z0-9_]*)")
# Matching builds a hash table of the right side's rows: a sort-merge join sorts both sides, and each run
# of its sorts generated their orderings anew (a fifth of a small join's JVM time).
_HASHED = "/*+ SHUFFLE_HASH(r) */"
_FAR = 2**61  # time bounds are clamped here: twice one plus one is still an int64 segment


def select_list(spec: JoinStage, left_columns: list[str], right_columns: list[str]) -> list[str]:
    """The user's `select`, or every column of each side (not the internal `_` ones), prefixed by side."""
    return list(spec.select or (
        [f"l.`{c}` AS `{PREFIXES[0]}{c}`" for c in left_columns if not c.startswith("_")]
        + [f"r.`{c}` AS `{PREFIXES[1]}{c}`" for c in right_columns if not c.startswith("_")]))


def on_clause(spec: JoinStage) -> str:
    """Equal keys, and for an interval or regular join the time bounds (inclusive, as Flink's)."""
    pairs = [f"l.`{a}` = r.`{b}`" for a, b in zip(spec.on.left, spec.on.right)]
    if spec.kind == "window":
        pairs.append(f"l.{_WS} = r.{_WS}")
    else:
        lower, upper = spec.bounds_ms
        pairs.append(f"r.event_time BETWEEN l.event_time + {lower} AND l.event_time + {upper}")
    return " AND ".join(pairs)


def window_join_sql(spec: JoinStage, left: str, right: str, left_columns: list[str], right_columns: list[str]) -> str:
    """The window join of the views `left` and `right`, whose rows carry their window start in `_ws`; shared
    with the oracle, which assigns windows with Spark's own window()."""
    size = spec.window.size_ms
    how = "LEFT OUTER" if spec.how == "left" else "INNER"
    return (f"SELECT {_HASHED} {', '.join(select_list(spec, left_columns, right_columns))}, l.{_WS} AS window_start, "
            f"l.{_WS} + {size} AS window_end, l.{_WS} + {size - 1} AS event_time, l.{_WS} + {size} AS _ingest_ms "
            f"FROM {_filtered(spec, left)} l {how} JOIN {_filtered(spec, right)} r ON {on_clause(spec)}")


def _filtered(spec: JoinStage, view: str) -> str:
    return f"(SELECT * FROM {view} WHERE {spec.where})" if spec.where else view


def _same_kind(a: pa.DataType, b: pa.DataType) -> bool:
    """Whether keys of these types hash alike (routing) and compare alike (Spark)."""
    if pa.types.is_integer(a) and pa.types.is_integer(b):
        return True
    strings = (pa.types.is_string, pa.types.is_large_string)
    return a == b or (any(f(a) for f in strings) and any(f(b) for f in strings))


class _Join(_EventTimeStage):
    spec: JoinStage

    def __init__(self, spec: JoinStage, store: KeyGroupStore, max_parallelism: int) -> None:
        super().__init__(spec, store)
        store.bind(JOIN_STATE)
        self._max_parallelism = max_parallelism
        self._keys = (spec.on.left, spec.on.right)
        self._seen: dict[int, pa.Schema] = {}  # each side's input columns, as its last batch had them
        self._view = view_name(spec.name)

    def _new_rows(self, side: int, table: pa.Table) -> tuple[pa.Table, np.ndarray, np.ndarray]:
        """A batch's rows of one side, prefixed and with row ids; their key groups and event times."""
        for name in (*self._keys[side], "event_time"):
            if name not in table.column_names:
                raise ValueError(f"{self.spec.name}: input '{self.spec.inputs[side]}' has no column '{name}'")
        times = table.column("event_time")
        if times.null_count:
            raise ValueError(f"{self.spec.name}: a record of '{self.spec.inputs[side]}' has no event_time")
        self._seen[side] = table.schema
        kgs = key_groups_of_columns(table, self._keys[side], self._max_parallelism)
        rows = table.rename_columns([PREFIXES[side] + c for c in table.column_names])
        rows = rows.append_column(_RID, row_ids(rows.num_rows))
        return rows, kgs, times.to_numpy().astype(np.int64)

    def _late(self, side: int, table: pa.Table, late: np.ndarray, kgs: np.ndarray, why) -> LateRecords:
        """A side's late rows as they came, each with why (`why(i)`) and its key group's watermark."""
        rows = np.flatnonzero(late)
        return LateRecords(self.spec.inputs[side], table.take(pa.array(rows)), [
            f"late: {why(i)} in key group {kgs[i]} (watermark {self._fired_before(int(kgs[i]))})"
            for i in rows.tolist()])

    def _insert(self, rows: pa.Table, segments: np.ndarray, kgs: np.ndarray) -> None:
        rows = rows.append_column(_SEG, pa.array(segments)).append_column(KG, pa.array(kgs))
        for segment, positions in groups_of(segments):
            part = take(rows, positions)

            def append(current: pa.Table | None, part: pa.Table = part):
                return concat([current, part]), part, None

            self.store.update(segment, np.unique(kgs[positions]), append)

    def _side(self, side: int, rows: pa.Table, extra: tuple[str, ...] = ()) -> pa.Table:
        """A side's rows under their input's column names (the store holds both sides' columns)."""
        prefix = PREFIXES[side]
        names = [c for c in rows.column_names if c.startswith(prefix)]
        return rows.select([*names, *extra]).rename_columns([c[len(prefix):] for c in names] + list(extra))

    def _schema(self, side: int, like: pa.Schema) -> pa.Schema:
        """A side's input columns as last seen (in a batch or in state); never seen here (a new instance
        before any such row): its keys typed as the other side's, and the columns `select` reads, typed null."""
        schema = self._seen.get(side) or self._stored_schema(side)
        if schema is not None:
            return schema
        other = self._keys[1 - side]
        named = [c for c in dict.fromkeys(_RIGHT_COLUMN.findall(" ".join(self.spec.select or ())))
                 if c not in self._keys[side]] if side == 1 else []
        return pa.schema([*(pa.field(b, like.field(a).type) for a, b in zip(other, self._keys[side])),
                          *(pa.field(c, pa.null()) for c in named)])

    def _stored_schema(self, side: int) -> pa.Schema | None:
        prefix = PREFIXES[side]
        for kg in self.store.key_groups:
            for segment in self.store.segments(kg):
                if segment % 2 == side:
                    stored = self.store.read([kg], segment).schema
                    return pa.schema([pa.field(f.name[len(prefix):], f.type) for f in stored
                                      if f.name.startswith(prefix)])
        return None

    def _check_keys(self, left: pa.Schema, right: pa.Schema) -> None:
        for a, b in zip(*self._keys):
            ta, tb = left.field(a).type, right.field(b).type
            if not _same_kind(ta, tb):
                raise ValueError(f"{self.spec.name}: key column '{a}' of '{self.spec.inputs[0]}' is {ta}, "
                                 f"'{b}' of '{self.spec.inputs[1]}' is {tb}: equal keys must share a type")

class WindowJoin(_Join):
    def __init__(self, spec: JoinStage, store: KeyGroupStore, max_parallelism: int) -> None:
        super().__init__(spec, store, max_parallelism)
        self._size, self._step = spec.window.size_ms, spec.window.step_ms

    def _bounds(self) -> dict[int, int]:
        """Per owned key group, the last window start that has fired (window end <= watermark)."""
        return {kg: min(max(self._fired_before(kg) - self._size, -_FAR), _FAR) for kg in self.store.key_groups}

    def process(self, batch, watermark: int) -> tuple[pa.Table | None, int]:
        before = self._bounds()
        late: list[LateRecords] = []
        if batch.records:
            with phases.phase("state"):
                for side, upstream in enumerate(self.spec.inputs):
                    table = batch.table(upstream)
                    if table is not None and table.num_rows:
                        self._add(side, table, before, late)
        self._advance(batch, watermark)
        with phases.phase("state"):
            left, right = self._due(before, self._bounds())
        out = self._match(left, right) if left is not None else None
        self.late.extend(late)
        return out, watermark

    def _add(self, side: int, table: pa.Table, fired: dict[int, int], late_rows: list[LateRecords]) -> None:
        rows, kgs, t = self._new_rows(side, table)
        panes = t - np.mod(t, self._step)
        late = panes <= per_key_group(fired, self._max_parallelism, -_FAR)[kgs]  # the last window holding the row has fired
        if late.any():
            late_rows.append(self._late(side, table, late, kgs, lambda i: f"its last window [{panes[i]}, "
                                                                          f"{panes[i] + self._size}) had fired"))
            keep = ~late
            rows, kgs, panes = rows.filter(pa.array(keep)), kgs[keep], panes[keep]
        if rows.num_rows:
            self._insert(rows, 2 * panes + side, kgs)

    def _due(self, before: dict[int, int], after: dict[int, int]) -> tuple[pa.Table | None, pa.Table | None]:
        """The rows of the windows that fired since `before`, tagged with their window start; panes whose last
        window fired leave state."""
        wanted: dict[int, dict[int, tuple[int, ...]]] = {}  # segment -> key group -> window starts due
        cuts = {}
        for kg in self.store.key_groups:
            low, high = before[kg], after[kg]
            if high <= low:
                continue
            cuts[kg] = 2 * high + 1
            for segment in self.store.segments(kg):
                pane = segment // 2
                starts = tuple(s for s in range(pane - self._size + self._step, pane + 1, self._step)
                               if low < s <= high)
                if starts:
                    wanted.setdefault(segment, {})[kg] = starts
        sides: tuple[list, list] = ([], [])
        for segment, per_kg in wanted.items():
            by_starts: dict[tuple[int, ...], list[int]] = {}
            for kg, starts in per_kg.items():
                by_starts.setdefault(starts, []).append(kg)
            for starts, kgs in by_starts.items():
                rows = self.store.read(kgs, segment)
                if rows is None:
                    continue
                for start in starts:
                    sides[segment % 2].append(rows.append_column(_WS, pa.repeat(pa.scalar(start, pa.int64()),
                                                                                  rows.num_rows)))
        if cuts:
            self.store.cut(cuts)
        return concat(sides[0]), concat(sides[1])

    def _match(self, left: pa.Table, right: pa.Table | None) -> pa.Table | None:
        if right is None and self.spec.how == "inner":
            return None
        lefts = self._side(0, left, (_WS,))
        if right is not None:
            rights = self._side(1, right, (_WS,))
        else:
            rights = self._schema(1, lefts.schema).append(pa.field(_WS, pa.int64())).empty_table()
        self._check_keys(lefts.schema, rights.schema)
        views = {f"{self._view}__left": lefts, f"{self._view}__right": rights}
        out = self._over_views(views, window_join_sql(self.spec, *views, lefts.column_names, rights.column_names))
        return out if out.num_rows else None


class IntervalJoin(_Join):
    """kind interval and regular: see the module's docstring."""

    def __init__(self, spec: JoinStage, store: KeyGroupStore, max_parallelism: int) -> None:
        super().__init__(spec, store, max_parallelism)
        self._lower, self._upper = spec.bounds_ms
        # Expiry times are bucketed: a bucket leaves state once the watermark passed all of it, so a row may
        # stay up to a bucket longer than it can meet anyone, and an unmatched left row is emitted that late.
        self._bucket = max(1, min(1000, (self._upper - self._lower) // 4))
        # An unmatched left row is emitted at its time plus upper, after up to a bucket's wait: the output
        # watermark stays that far behind, so the row is never late downstream.
        self._holdback = self._bucket + max(0, -self._upper)

    def _expiry(self, side: int, t: np.ndarray) -> np.ndarray:
        """When a row can meet no more partners: the watermark past this, every later row is too late."""
        return t + self._upper if side == 0 else t - self._lower

    def _cut_bound(self, watermark: int) -> int:
        """The last segment whose rows have all expired under `watermark`."""
        return 2 * (min(max(watermark, -_FAR), _FAR) // self._bucket - 1) + 1

    def process(self, batch, watermark: int) -> tuple[pa.Table | None, int]:
        before = {kg: self._fired_before(kg) for kg in self.store.key_groups}
        new: list = [None, None]
        late: list[LateRecords] = []
        if batch.records:
            with phases.phase("state"):
                for side, upstream in enumerate(self.spec.inputs):
                    table = batch.table(upstream)
                    if table is not None and table.num_rows:
                        new[side] = self._new_side(side, table, before, late)
        self._advance(batch, watermark)
        cuts = {kg: self._cut_bound(self._fired_before(kg)) for kg in self.store.key_groups}
        cut_at = per_key_group(cuts, self._max_parallelism, -_FAR)
        with phases.phase("state"):
            old = [self._old(side, new[1 - side]) for side in (0, 1)]
            expiring = self._expiring(cuts) if self.spec.how == "left" else None
        out, matched = self._match(new, old, expiring, cut_at)
        with phases.phase("state"):
            self._keep(new, old[0], matched, cut_at)
            self.store.cut(cuts)
        self.late.extend(late)
        if self.spec.how == "left" and watermark != MAX_WATERMARK:
            watermark -= self._holdback
        return out, watermark

    # --- state --------------------------------------------------------------------------------

    def _new_side(self, side: int, table: pa.Table, watermarks: dict[int, int], late_rows: list[LateRecords]):
        """(rows, key groups, expiry) of a side's new rows that are not late; the late ones to `late_rows`."""
        rows, kgs, t = self._new_rows(side, table)
        clamped = {kg: min(max(value, -_FAR), _FAR) for kg, value in watermarks.items()}
        late = t < per_key_group(clamped, self._max_parallelism, -_FAR)[kgs]
        if late.any():
            late_rows.append(self._late(side, table, late, kgs, lambda i: f"event time {t[i]} is behind"))
            keep = ~late
            rows, kgs, t = rows.filter(pa.array(keep)), kgs[keep], t[keep]
        return (rows, kgs, self._expiry(side, t)) if rows.num_rows else None

    def _old(self, side: int, probe) -> pa.Table | None:
        """The stored rows of a side that the other side's new rows may meet: of their key groups, with one of
        their first key column's values (Spark checks the whole key)."""
        if probe is None:
            return None
        rows, kgs, _ = probe
        mine = np.unique(kgs).tolist()
        segments = {s for kg in mine for s in self.store.segments(kg) if s % 2 == side}
        stored = concat(self.store.read(mine, segment) for segment in sorted(segments))
        if stored is None:
            return None
        key = PREFIXES[side] + self._keys[side][0]
        probe_key = PREFIXES[1 - side] + self._keys[1 - side][0]
        values = rows.column(probe_key).cast(stored.schema.field(key).type)
        stored = stored.filter(pc.is_in(stored.column(key), value_set=values))
        return stored if stored.num_rows else None

    def _expiring(self, cuts: dict[int, int]) -> pa.Table | None:
        """The stored left rows that leave state at this batch and met no right row so far."""
        parts = []
        for segment, kgs in self.store.due(cuts).items():
            if segment % 2 == 0:
                rows = self.store.read(kgs, segment)
                parts.append(rows.filter(pc.invert(rows.column(_MATCHED))))
        return concat(parts)

    def _keep(self, new: list, old_left: pa.Table | None, matched: np.ndarray, cut_at: np.ndarray) -> None:
        """Store the new rows that can still meet partners (their segment above their key group's `cut_at`);
        mark the stored left rows met at this batch."""
        outer = self.spec.how == "left"
        if outer and old_left is not None and len(matched):
            met = old_left.filter(pc.and_(pc.invert(old_left.column(_MATCHED)),
                                          pc.is_in(old_left.column(_RID), value_set=pa.array(matched))))
            segments = met.column(_SEG).to_numpy()
            for segment, positions in groups_of(segments):
                rids = take(met, positions).column(_RID).combine_chunks()
                self.store.update(segment, np.unique(met.column(KG).to_numpy()[positions]), _mark_met(rids))
        for side, part in enumerate(new):
            if part is None:
                continue
            rows, kgs, expiry = part
            segments = 2 * (expiry // self._bucket) + side
            if side == 0 and outer:
                rows = rows.append_column(_MATCHED, pc.is_in(rows.column(_RID), value_set=pa.array(matched)))
            waiting = segments > cut_at[kgs]
            if waiting.any():
                self._insert(rows.filter(pa.array(waiting)), segments[waiting], kgs[waiting])

    # --- matching -----------------------------------------------------------------------------

    def _match(self, new: list, old: list, expiring: pa.Table | None,
               cut_at: np.ndarray) -> tuple[pa.Table | None, np.ndarray]:
        """One Spark query: new left rows with all right rows, old left rows with new right rows, and the
        left rows leaving state that never met one (left join). The output and the left row ids that met."""
        none = np.zeros(0, dtype=np.int64)
        new_left = self._side(0, new[0][0], (_RID,)) if new[0] is not None else None
        new_right = self._side(1, new[1][0]) if new[1] is not None else None
        old_left = self._side(0, old[0], (_RID,)) if old[0] is not None else None
        old_right = self._side(1, old[1]) if old[1] is not None else None
        padded = None
        if expiring is not None or new_left is not None:
            padded = self._unmet(new, expiring, cut_at)
        if new_right is None and (new_left is None or old_right is None) and padded is None:
            return None, none
        if new_left is None and old_left is None and padded is None:
            return None, none  # right rows alone meet no left row (a left join pads left rows only)
        lefts = _aligned({"ln": new_left, "lo": old_left, "lp": padded})
        left_schema = next(iter(lefts.values())).schema
        rights = _aligned({"rn": new_right, "ro": old_right},
                          self._schema(1, left_schema) if new_right is None and old_right is None else None)
        right_schema = next(iter(rights.values())).schema
        self._check_keys(left_schema, right_schema)
        views = {f"{self._view}__{n}": t for n, t in {**lefts, **rights}.items()}
        out = self._over_views(views, self._sql(left_schema.names, right_schema.names))
        matched = np.unique(out.column(_LRID).drop_null().to_numpy()) if out.num_rows else none
        out = out.drop_columns([_LRID])
        return (out if out.num_rows else None), matched

    def _unmet(self, new: list, expiring: pa.Table | None, cut_at: np.ndarray) -> pa.Table | None:
        """Left rows that leave state at this batch unmatched so far (stored, or new ones already past their
        time): the query pads those no right row meets in it."""
        parts = []
        if expiring is not None:
            parts.append(self._side(0, expiring, (_RID,)))
        if new[0] is not None and self.spec.how == "left":
            rows, kgs, expiry = new[0]
            gone = 2 * (expiry // self._bucket) <= cut_at[kgs]
            if gone.any():
                parts.append(self._side(0, rows.filter(pa.array(gone)), (_RID,)))
        return concat(parts)

    def _sql(self, left_columns: list[str], right_columns: list[str]) -> str:
        v = self._view
        select = ", ".join(select_list(self.spec, left_columns, right_columns))
        latency = ("greatest(l._ingest_ms, r._ingest_ms)" if "_ingest_ms" in left_columns
                   and "_ingest_ms" in right_columns else "CAST(NULL AS BIGINT)")
        met = f"{select}, greatest(l.event_time, r.event_time) AS event_time, {latency} AS _ingest_ms"
        on = on_clause(self.spec)

        def side(name: str) -> str:
            return _filtered(self.spec, f"{v}__{name}")

        # Every right row, in one partition: a union of two is two, and joining that took a shuffle per batch.
        rights = f"(SELECT /*+ COALESCE(1) */ * FROM (SELECT * FROM {side('rn')} UNION ALL SELECT * FROM {side('ro')}))"
        parts = [f"SELECT {_HASHED} {met}, l.{_RID} AS {_LRID} FROM {side('ln')} l JOIN {rights} r ON {on}",
                 f"SELECT {_HASHED} {met}, l.{_RID} AS {_LRID} FROM {side('lo')} l JOIN {side('rn')} r ON {on}"]
        if self.spec.how == "left":
            # A stored row can have met only new right rows here; a new one any right row.
            # Not LEFT ANTI JOIN: Spark moves that below its left side's one partition, which then takes a shuffle.
            unmet = (f"(SELECT {_HASHED} l.* FROM {side('lp')} l LEFT JOIN (SELECT *, true AS _hit FROM {rights}) r ON {on} "
                     f"WHERE r._hit IS NULL)")
            own = "l._ingest_ms" if "_ingest_ms" in left_columns else "CAST(NULL AS BIGINT)"
            parts.append(f"SELECT {select}, l.event_time + {self._upper} AS event_time, {own} AS _ingest_ms, "
                         f"CAST(NULL AS BIGINT) AS {_LRID} FROM {unmet} l LEFT JOIN {v}__rn r ON false")
        return " UNION ALL ".join(parts)


def _aligned(tables: dict[str, pa.Table | None], schema: pa.Schema | None = None) -> dict[str, pa.Table]:
    """The tables under one schema, columns in one order (Spark's UNION ALL goes by position); a missing
    table empty. `schema` when all are missing."""
    present = [t for t in tables.values() if t is not None]
    if present:
        schema = pa.unify_schemas([t.schema for t in present], promote_options="permissive")
    out = {}
    for name, table in tables.items():
        if table is None:
            out[name] = schema.empty_table()
            continue
        columns = [table.column(f.name).cast(f.type) if f.name in table.column_names else pa.nulls(table.num_rows, f.type)
                   for f in schema]
        out[name] = pa.Table.from_arrays(columns, schema=schema)
    return out


def _mark_met(rids: pa.Array | pa.ChunkedArray):
    def merge(current: pa.Table | None):
        if current is None:
            return None, None, None
        met = pc.is_in(current.column(_RID), value_set=rids)
        index = current.schema.get_field_index(_MATCHED)
        updated = current.set_column(index, _MATCHED, pc.or_(current.column(_MATCHED), met))
        return updated, updated.filter(met), None

    return merge


def make_join(spec: JoinStage, store: KeyGroupStore, max_parallelism: int) -> _Join:
    return (WindowJoin if spec.kind == "window" else IntervalJoin)(spec, store, max_parallelism)
