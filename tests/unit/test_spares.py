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


def test_a_pods_ordinal_is_an_instance_below_the_parallelism_or_while_promoted_in_the_epoch_in_force():
    from streamjobs_core.jobstore import MemoryJobStore
    from streamjobs_core.keygroups import Assignment
    from streamjobs_core.spares import serves_as_instance

    store = MemoryJobStore()
    store.write_assignment("c", Assignment.ranges(2, 12, epoch=3))
    assert [serves_as_instance(store, "c", k) for k in range(4)] == [True, True, False, False]
    store.promote_pod("c", 2, 3)  # a scale-out to 3 moves key groups to pod 2: a restart keeps it an instance
    assert serves_as_instance(store, "c", 2) and not serves_as_instance(store, "c", 3)
    store.write_assignment("c", Assignment.ranges(3, 12, epoch=4))  # the scale-out done
    assert serves_as_instance(store, "c", 2)
    store.write_assignment("c", Assignment.ranges(2, 12, epoch=5))  # a scale-in: a promotion of epoch 3 is stale
    assert not serves_as_instance(store, "c", 2)


def test_an_instance_pod_demotes_itself_once_a_scale_in_emptied_it():
    import threading

    from streamjobs_core.jobstore import MemoryJobStore
    from streamjobs_core.keygroups import Assignment
    from streamjobs_core.spares import watch_demotion

    store, demoted, stop = MemoryJobStore(), threading.Event(), threading.Event()
    store.write_assignment("c", Assignment.ranges(3, 12, epoch=1))
    watcher = threading.Thread(target=watch_demotion, args=(store, "c", 2, demoted.set, stop, 0.01))
    watcher.start()
    assert not demoted.wait(0.1)
    store.write_assignment("c", Assignment.ranges(2, 12, epoch=2))
    assert demoted.wait(5)
    watcher.join(5)
    assert not watcher.is_alive()
