"""Which records a shedding source drops: the share asked for, lowest priority first, and the same choice
again for the same batch (the oracle repeats it)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from pydantic import ValidationError
from streamjobs_core import generators
from streamjobs_core.loading import parse_job
from streamjobs_core.shedding import shed_mask
from streamjobs_core.spec import LoadShedding


def _job(shedding: dict):
    return parse_job({"metadata": {"name": "shed"}, "spec": {
        "sources": [{"name": "bids", "type": "nexmark", "loadShedding": shedding}],
        "sinks": [{"name": "out", "type": "redis_stream", "inputs": ["bids"]}]}})


def test_random_shedding_drops_the_share_asked_for_and_repeats_for_the_same_batch():
    table = pa.table({"x": np.arange(1000)})
    rule = LoadShedding(max_backlog_records=1, fraction=0.3)
    mask = shed_mask(table, rule, [(0, 0, 500), (1, 0, 500)])
    assert mask.sum() == 300
    assert np.array_equal(mask, shed_mask(table, rule, [(0, 0, 500), (1, 0, 500)]))
    other = shed_mask(table, rule, [(0, 500, 1000), (1, 500, 1000)])
    assert other.sum() == 300 and not np.array_equal(mask, other), "another batch, another draw"
    # Spread over the batch, not a block of it: each tenth holds some of the dropped rows.
    assert all(mask[i:i + 100].any() for i in range(0, 1000, 100))


def test_priority_shedding_drops_the_lowest_values_first_nulls_lowest():
    table = pa.table({"price": pa.array([50, None, 10, 90, 10, 70], pa.int64())})
    mask = shed_mask(table, LoadShedding(max_backlog_records=1, fraction=0.5, priority_field="price"), [])
    assert mask.tolist() == [False, True, True, False, True, False]


def test_a_small_batch_sheds_nothing_below_half_a_record():
    mask = shed_mask(pa.table({"x": [1]}), LoadShedding(max_backlog_records=1, fraction=0.4), [(0, 0, 1)])
    assert not mask.any()


def test_generated_records_shed_by_priority_are_the_cheapest_bids():
    spec = _job({"maxBacklogRecords": 10, "fraction": 0.25, "priorityField": "bid_price"}).spec.sources[0]
    table = generators.generate(spec, 0, np.arange(400))
    mask = shed_mask(table, spec.load_shedding, [(0, 0, 400)])
    prices = table.column("bid_price").to_numpy(zero_copy_only=False)
    kept = prices[~mask]
    # Non-bids have no price (null): they go first, then the cheapest bids.
    assert mask.sum() == 100
    assert np.isnan(prices[mask]).sum() == min(100, int(np.isnan(prices).sum()))
    if np.isnan(prices[mask]).sum() < 100:
        assert np.nanmax(prices[mask]) <= np.nanmin(kept)


@pytest.mark.parametrize(("shedding", "field"), [
    ({"maxBacklogRecords": 10, "priorityField": "price"}, "loadShedding.priorityField"),
    ({"maxBacklogRecords": 0}, "maxBacklogRecords"),
    ({"maxBacklogRecords": 10, "fraction": 1.5}, "fraction"),
    ({"fraction": 0.5}, "maxBacklogRecords"),
])
def test_a_bad_shedding_rule_is_refused_naming_its_field(shedding, field):
    with pytest.raises((ValidationError, ValueError)) as error:
        _job(shedding)
    assert field in str(error.value)


def test_shedding_is_off_unless_set():
    job = parse_job({"metadata": {"name": "plain"}, "spec": {
        "sources": [{"name": "bids", "type": "nexmark"}],
        "sinks": [{"name": "out", "type": "redis_stream", "inputs": ["bids"]}]}})
    assert job.spec.sources[0].load_shedding is None


def test_an_external_streams_string_priority_is_read_as_a_number_missing_or_not_numeric_lowest():
    table = pa.table({"priority": pa.array(["9", "10", None, "n/a", "2.5", "100"], pa.string())})
    mask = shed_mask(table, LoadShedding(max_backlog_records=1, fraction=0.5, priority_field="priority"), [])
    # As strings "10" and "100" would sort below "9"; as numbers the dropped are null, "n/a" and 2.5.
    assert mask.tolist() == [False, False, True, True, True, False]


def test_an_external_stream_source_takes_a_shedding_rule():
    job = parse_job({"metadata": {"name": "ext"}, "spec": {
        "sources": [{"name": "in", "type": "redis_stream",
                     "loadShedding": {"maxBacklogRecords": 100, "priorityField": "anything"}}],
        "sinks": [{"name": "out", "type": "redis_stream", "inputs": ["in"]}]}})
    assert job.spec.sources[0].load_shedding.priority_field == "anything"  # its fields are the producers'
