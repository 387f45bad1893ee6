"""The autoscale benchmark's measures, on timelines whose answers are known."""

from __future__ import annotations

from streamjobs.bench.autoscale import after_step, optimal, provisioning, trace


def _optimum(t: float) -> int:
    return 1 if t < 10 else 3


def test_provisioning_counts_instance_seconds_over_and_under_the_optimum():
    rows = [{"t": t, "parallelism": p} for t, p in ((0, 2), (10, 2), (20, 3), (30, 3))]
    # 0-10 s: 2 where 1 suffices (10 over); 10-20 s: 2 where 3 are needed (10 under); 20-30 s: right.
    over, under = provisioning(rows, _optimum)
    needed = 10 * 1 + 20 * 3
    assert (over, under) == (round(100 * 10 / needed, 1), round(100 * 10 / needed, 1))
    assert provisioning(rows[:1], _optimum) == (None, None)


def test_after_a_step_counts_the_decisions_until_the_optimum_is_running():
    changes = [(12.0, {"parallelism": 2}), (16.0, {"parallelism": 3}), (40.0, {"parallelism": 1})]
    assert after_step(10, 30, 1, changes, _optimum) == {"at_s": 10, "optimal": 3, "decisions": 2,
                                                        "sustainable_after_s": 6.0}
    # Already enough instances when the load changed: nothing to decide.
    assert after_step(30, 50, 1, changes, _optimum)["decisions"] == 0
    # Never reached before the next change.
    assert after_step(10, 15, 1, changes, _optimum)["sustainable_after_s"] is None


def test_the_optimum_is_the_measured_capacity_at_the_target_utilization():
    assert optimal(1200, 0.7) == 2  # nominal 1 ms a record: 1.71
    assert optimal(1200, 0.7, per_record_s=0.0013) == 3  # measured 1.3 ms: 2.23
    profile, duration, first_change = trace(1.0)
    assert (duration, first_change) == (360, 40)
    assert [step["atS"] for step in trace(2.0)[0]["steps"]][:2] == [80, 160]


def test_a_stages_measured_cost_is_never_below_the_sleep_each_record_costs():
    from streamjobs.bench.autoscale import Timeline
    from streamjobs_autoscaler.collect import OperatorCounters

    def batches(per_record_s: float) -> OperatorCounters:
        sums = OperatorCounters()
        for size in (100, 200, 300, 400, 500, 600):
            busy = 0.05 + per_record_s * size
            sums.batches += 1
            sums.records_in += size
            sums.busy_s += busy
            sums.batch_records_sq += size * size
            sums.batch_records_busy += size * busy
            sums.batch_busy_sq += busy * busy
        return sums

    timeline = Timeline(None, 10, ("count",))
    assert timeline.per_record_s("count", 0.001) == 0.001  # no batches: the nominal cost
    timeline.batches["count"] = batches(0.0012)
    assert abs(timeline.per_record_s("count", 0.001) - 0.0012) < 1e-9  # the worker's own work on top
    timeline.batches["count"] = batches(0.0008)  # a fit that put part of the sleep into the fixed cost
    assert timeline.per_record_s("count", 0.001) == 0.001
