"""The window join: rows of two keyed inputs with equal keys meet once per window that holds both.

Each input arrives partitioned by its own key columns (`on.left`, `on.right`),
so equal keys of both sides land in one key group. Rows wait in the key
group's state until their windows fire: a segment per (pane, side), a pane
being the `slide`-aligned stretch of event time whose rows share their windows
(`segment = 2 * pane + side`). A row is stored with its columns prefixed by its
side (`l_`, `r_`), so both sides' rows keep their own columns in one snapshot.
When a key group's watermark passes window ends, the panes of the windows due
are read, tagged with their window start, and matched in one Spark query per
batch (the user's `where` and `select` are Spark SQL); a pane leaves state once
the last window holding it has fired. Rescaling, prestaging and recovery need
nothing of their own: the rows are keyed state like any stage's.
"""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa
from streamjobs_core.keygroups import key_groups_of_columns
from streamjobs_core.spec import JoinStage

from . import phases, spark
from .stages import _EventTimeStage, collect, view_name
from .state import KG, KeyGroupStore, StateLayout, concat, groups_of, take

JOIN_STATE = StateLayout(key="_rid", segment="_seg")  # a row id (a join keeps duplicates), a segment per pane and side
_RID, _SEG, _WS = "_rid", "_seg", "_ws"
PREFIXES = ("l_", "r_")
_RIGHT_COLUMN = re.compile(r"\br\s*\.\s*`?([A-Za-z_][A-Za-z0-9_]*)")
_FAR = 2**61  # window bounds are clamped here: twice one plus one is still an int64 segment


def join_sql(spec: JoinStage, left: str, right: str, left_columns: list[str], right_columns: list[str]) -> str:
    """The join of the views `left` and `right`, whose rows carry their window start in `_ws`; shared with
    the oracle, which assigns windows with Spark's own window()."""
    pairs = [f"l.`{a}` = r.`{b}`" for a, b in zip(spec.on.left, spec.on.right)]
    select = list(spec.select or (
        [f"l.`{c}` AS `{PREFIXES[0]}{c}`" for c in left_columns if not c.startswith("_")]
        + [f"r.`{c}` AS `{PREFIXES[1]}{c}`" for c in right_columns if not c.startswith("_")]))
    size = spec.window.size_ms
    where = f" WHERE {spec.where}" if spec.where else ""
    how = "LEFT OUTER" if spec.how == "left" else "INNER"
    return (f"SELECT {', '.join(select)}, l.{_WS} AS window_start, l.{_WS} + {size} AS window_end, "
            f"l.{_WS} + {size - 1} AS event_time, l.{_WS} + {size} AS _ingest_ms "
            f"FROM (SELECT * FROM {left}{where}) l {how} JOIN (SELECT * FROM {right}{where}) r "
            f"ON {' AND '.join([*pairs, f'l.{_WS} = r.{_WS}'])}")


def _same_kind(a: pa.DataType, b: pa.DataType) -> bool:
    """Whether keys of these types hash alike (routing) and compare alike (Spark)."""
    if pa.types.is_integer(a) and pa.types.is_integer(b):
        return True
    strings = (pa.types.is_string, pa.types.is_large_string)
    return a == b or (any(f(a) for f in strings) and any(f(b) for f in strings))


class WindowJoin(_EventTimeStage):
    spec: JoinStage

    def __init__(self, spec: JoinStage, store: KeyGroupStore, max_parallelism: int) -> None:
        super().__init__(spec, store)
        store.bind(JOIN_STATE)
        self._max_parallelism = max_parallelism
        self._size, self._step = spec.window.size_ms, spec.window.step_ms
        self._rng = np.random.default_rng()
        self._seen: dict[int, pa.Schema] = {}  # each side's input columns, as its last batch had them
        self._views_of = tuple(f"{view_name(spec.name)}__{side}" for side in ("left", "right"))

    def _bounds(self) -> dict[int, int]:
        """Per owned key group, the last window start that has fired (window end <= watermark)."""
        return {kg: min(max(self._fired_before(kg) - self._size, -_FAR), _FAR) for kg in self.store.key_groups}

    def process(self, batch, watermark: int) -> tuple[pa.Table | None, int]:
        before = self._bounds()
        if batch.records:
            with phases.phase("state"):
                for side, upstream in enumerate(self.spec.inputs):
                    table = batch.table(upstream)
                    if table is not None and table.num_rows:
                        self._add(side, table, before)
        self._advance(batch, watermark)
        with phases.phase("state"):
            left, right = self._due(before, self._bounds())
        out = self._match(left, right) if left is not None else None
        return out, watermark

    # --- state --------------------------------------------------------------------------------

    def _add(self, side: int, table: pa.Table, fired: dict[int, int]) -> None:
        keys = (self.spec.on.left, self.spec.on.right)[side]
        for name in (*keys, "event_time"):
            if name not in table.column_names:
                raise ValueError(f"{self.spec.name}: input '{self.spec.inputs[side]}' has no column '{name}'")
        times = table.column("event_time")
        if times.null_count:
            raise ValueError(f"{self.spec.name}: a record of '{self.spec.inputs[side]}' has no event_time")
        self._seen[side] = table.schema
        kgs = key_groups_of_columns(table, keys, self._max_parallelism)
        t = times.to_numpy().astype(np.int64)
        panes = t - np.mod(t, self._step)
        bound = np.full(self._max_parallelism, -_FAR, dtype=np.int64)
        for kg, value in fired.items():
            bound[kg] = value
        late = panes <= bound[kgs]  # the last window holding the row has fired
        if late.any():
            self.late_records += int(late.sum())
            keep = ~late
            table, kgs, panes = table.filter(pa.array(keep)), kgs[keep], panes[keep]
            if not table.num_rows:
                return
        rows = table.rename_columns([PREFIXES[side] + c for c in table.column_names])
        rows = (rows.append_column(_RID, pa.array(self._rng.integers(0, 2**63 - 1, rows.num_rows, dtype=np.int64)))
                .append_column(_SEG, pa.array(2 * panes + side))
                .append_column(KG, pa.array(kgs)))
        for segment, positions in groups_of(2 * panes + side):
            part = take(rows, positions)

            def append(current: pa.Table | None, part: pa.Table = part):
                return concat([current, part]), part, None

            self.store.update(segment, np.unique(kgs[positions]), append)

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

    # --- matching -----------------------------------------------------------------------------

    def _side(self, side: int, rows: pa.Table) -> pa.Table:
        """A side's rows under their input's column names (the store holds both sides' columns)."""
        prefix = PREFIXES[side]
        names = [c for c in rows.column_names if c.startswith(prefix)]
        return rows.select([*names, _WS]).rename_columns([c[len(prefix):] for c in names] + [_WS])

    def _no_right_rows(self, left: pa.Table) -> pa.Table:
        """The right side of a left join when none of its rows is due: empty, with the right input's columns
        as last seen (in a batch or in state), else with just its keys, typed as the left's."""
        schema = self._seen.get(1) or self._stored_schema(1)
        if schema is None:
            # Never seen here (a new instance, before any right row): the columns `select` reads, typed null.
            named = [c for c in dict.fromkeys(_RIGHT_COLUMN.findall(" ".join(self.spec.select or ())))
                     if c not in self.spec.on.right]
            schema = pa.schema([*(pa.field(b, left.schema.field(a).type)
                                  for a, b in zip(self.spec.on.left, self.spec.on.right)),
                                *(pa.field(c, pa.null()) for c in named)])
        return schema.append(pa.field(_WS, pa.int64())).empty_table()

    def _stored_schema(self, side: int) -> pa.Schema | None:
        prefix = PREFIXES[side]
        for kg in self.store.key_groups:
            for segment in self.store.segments(kg):
                if segment % 2 == side:
                    stored = self.store.read([kg], segment).schema
                    return pa.schema([pa.field(f.name[len(prefix):], f.type) for f in stored
                                      if f.name.startswith(prefix)])
        return None

    def _match(self, left: pa.Table, right: pa.Table | None) -> pa.Table | None:
        if right is None and self.spec.how == "inner":
            return None
        lefts = self._side(0, left)
        rights = self._side(1, right) if right is not None else self._no_right_rows(lefts)
        for a, b in zip(self.spec.on.left, self.spec.on.right):
            ta, tb = lefts.schema.field(a).type, rights.schema.field(b).type
            if not _same_kind(ta, tb):
                raise ValueError(f"{self.spec.name}: key column '{a}' of '{self.spec.inputs[0]}' is {ta}, "
                                 f"'{b}' of '{self.spec.inputs[1]}' is {tb}: equal keys must share a type")
        bridge = spark.bridge(self.spark)
        with phases.phase("to_jvm"):
            for view, table in zip(self._views_of, (lefts, rights)):
                bridge.frame(table).coalesce(1).createOrReplaceTempView(view)
        with phases.phase("plan"):
            df = self.spark.sql(join_sql(self.spec, *self._views_of, lefts.column_names, rights.column_names))
        out = collect(df)
        return out if out.num_rows else None

