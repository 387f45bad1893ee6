"""The spare protocol's records and the setting that asks for spares."""

from __future__ import annotations

import pytest
from streamjobs_core.control import Promotion
from streamjobs_core.loading import SpecError, parse_job


@pytest.mark.parametrize("promotion", [Promotion(3), Promotion(0, await_epoch=7)])
def test_a_promotion_round_trips(promotion):
    assert Promotion.decode(promotion.encode().encode()) == promotion


def _job(rescale: dict):
    return parse_job({
        "apiVersion": "streamjobs.dev/v1alpha1", "kind": "StreamJob", "metadata": {"name": "j"},
        "spec": {"sources": [{"name": "s", "type": "zipf", "vocabulary": 10, "rate": {"recordsPerSecond": 10}}],
                 "stages": [{"name": "c", "type": "sql", "inputs": ["s"], "query": "SELECT * FROM s"}],
                 "sinks": [{"name": "k", "type": "redis_stream", "inputs": ["c"]}],
                 "rescale": rescale},
    })


def test_spares_default_to_none_and_a_negative_count_is_refused_by_name():
    assert _job({}).spec.rescale.spare_instances == 0
    with pytest.raises(SpecError, match=r"spec\.rescale\.spareInstances: Input should be greater than or equal to 0"):
        _job({"spareInstances": -1})
