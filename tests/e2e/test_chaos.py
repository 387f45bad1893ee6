"""`streamjobs chaos` in small: worker SIGKILLs, a rescale controller that dies mid-handover and a
redis-server SIGKILLed and restarted from its AOF, with the ds2 autoscaler on; nothing lost or duplicated."""

from __future__ import annotations

import json

from streamjobs import chaos


def test_a_job_survives_kills_a_controller_death_and_a_redis_restart_exactly():
    # Under one instance's capacity: the test asks for the rescale the controller dies in, and a backlog
    # would only make the handover and the drain longer.
    # markerMaxLagRecords 0: the moved key groups of an owner with anything queued go at its next commit, so
    # the kills and the controller's death hit that path (tests/e2e/test_rescale.py aims kills at markers).
    result = chaos.run(duration_s=65, kills=6, seed=3, records_per_s=400, marker_max_lag_records=0)
    shown = json.dumps(result, indent=1)  # the whole result: which fault did what, when
    assert result["kills"] >= 5 and result["controller_restarts"] == 1 and result["redis_restarts"] == 1, shown
    assert result["unrecovered"] == 0 and not result["harness_errors"], shown
    assert any(r["strategy"] == "batched" and r["operator"] == chaos.STAGE and r["released_at_commit"]
               for r in result["rescales"]), shown
    assert (result["lost"], result["duplicated"], result["correct"]) == (0, 0, True), shown
