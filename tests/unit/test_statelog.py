"""Where a stage's state rows belong (statelog.row_key_groups): the key group its input routing gives their key,
so a re-split puts each row where the stage under the new maxParallelism looks for it."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from streamjobs_core.keygroups import key_groups_of, key_groups_of_columns
from streamjobs_core.loading import load_job
from streamjobs_core.reconfigure import How, diff
from streamjobs_core.statelog import JOIN_PREFIXES, row_key_groups, state_layout

from ..e2e.conftest import ROOT

pytestmark = pytest.mark.unit


def _job(name: str):
    return load_job(ROOT / f"tests/jobs/{name}.yaml")


@pytest.mark.parametrize("max_parallelism", [7, 24, 128])
def test_a_join_row_belongs_where_its_sides_key_is_routed(max_parallelism):
    spec = _job("q8-join").spec.operator("new-users")
    left = pa.table({"person_id": pa.array([3, 9, None, 12], pa.int64()), "person_name": ["a", "b", "c", "d"]})
    right = pa.table({"auction_seller": pa.array([12, 3, 40], pa.int64()), "auctions": [1, 2, 3]})
    stored = []
    for side, (table, keys) in enumerate(((left, spec.on.left), (right, spec.on.right))):
        rows = table.rename_columns([JOIN_PREFIXES[side] + c for c in table.column_names])
        segments = 2 * np.array([5, -2, 0, 7][: table.num_rows]) + side  # panes before the origin too
        stored.append((rows.append_column("_seg", pa.array(segments)), key_groups_of_columns(table, keys, max_parallelism)))
    rows = pa.concat_tables([r for r, _ in stored], promote_options="permissive")
    assert row_key_groups(spec, rows, max_parallelism).tolist() == np.concatenate([g for _, g in stored]).tolist()


def test_keyed_rows_belong_where_their_key_is_routed():
    job = _job("wordcount-small")
    count = job.spec.operator("count")
    words = pa.array(["a", "b", None, "zeta"])
    assert state_layout(count).key == "k"
    assert row_key_groups(count, pa.table({"k": words}), 20).tolist() == key_groups_of(words, 20).tolist()


def test_max_parallelism_changes_at_a_restore_and_is_refused_live_saying_how():
    old = _job("wordcount-small")
    new = old.model_copy(update={"spec": old.spec.model_copy(update={"max_parallelism": 20})})
    [live] = diff(old, new).changes
    [restoring] = diff(old, new, restoring=True).changes
    assert live.how is How.REFUSED and "streamjobs savepoint" in live.reason
    assert restoring.how is How.LIVE and restoring.reason.startswith("12 -> 20")
