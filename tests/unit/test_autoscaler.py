"""The autoscaler's evaluate / decide / guard-rail / execute steps on a fluid model with an injected clock."""

from __future__ import annotations

import math

import pytest
from streamjobs_autoscaler.autoscaler import Autoscaler
from streamjobs_autoscaler.collect import OperatorCounters, Snapshot
from streamjobs_autoscaler.decision import Rule
from streamjobs_autoscaler.evaluate import Rates, balanced, ds2, window_rates
from streamjobs_autoscaler.policies import ds2_policy
from streamjobs_autoscaler.ports import MemoryDecisionLog
from streamjobs_autoscaler.topology import OperatorInfo, Topology
from streamjobs_core.spec import AutoscalerSettings

from .fluid import TOPOLOGY, FluidJob, RecordingEvents

FAST = dict(interval_s=5, metrics_window_s=20, stabilization_s=20, scale_down_delay_s=60, catch_up_seconds=60,
            expected_rescale_s=0, target_utilization=0.8)


def autoscaler(job: FluidJob, policy: str = "ds2", **overrides) -> tuple[Autoscaler, RecordingEvents]:
    settings = AutoscalerSettings(policy=policy, **{**FAST, **overrides})
    events = RecordingEvents()
    job.parallelism_fn = lambda: dict(job.parallelism)
    scaler = type("S", (), {"parallelism": lambda _: dict(job.parallelism), "rescale": lambda _, o, n: job.rescale(o, n)})()
    return Autoscaler(TOPOLOGY, settings, job, scaler, MemoryDecisionLog(settings.history_size), events,
                      job.clock), events


def run(job: FluidJob, scaler: Autoscaler, seconds: float) -> list:
    decisions = []
    for _ in range(int(seconds)):
        job.advance(1)
        decision = scaler.tick()
        if decision is not None and decision.executed:
            decisions.append(decision)
    return decisions


# --- evaluate ------------------------------------------------------------------


def test_true_rate_counts_busy_time_only():
    a = Snapshot(0, {"op": OperatorCounters(instances=2, records_in=0, busy_s=0, idle_s=0)})
    b = Snapshot(10, {"op": OperatorCounters(instances=2, records_in=5000, records_out=2500, busy_s=5, idle_s=15,
                                             lag=300)})
    rates = window_rates([a, b])["op"]
    assert rates.input_per_s == 500 and rates.output_per_s == 250
    assert rates.true_rate_per_instance == 1000  # 5000 records in 5 busy seconds, whatever the wall time
    assert rates.busy_ratio == 0.25 and rates.backlog == 300


def counters(runs: list[tuple[int, float]]) -> OperatorCounters:
    """The counters a worker exports after batches of (records, busy seconds)."""
    return OperatorCounters(instances=1, records_in=sum(n for n, _ in runs), busy_s=sum(d for _, d in runs),
                            batches=len(runs), batch_records_sq=sum(n * n for n, _ in runs),
                            batch_records_busy=sum(n * d for n, d in runs), batch_busy_sq=sum(d * d for _, d in runs))


def batches(sizes: list[int], fixed_s: float, per_record_s: float) -> OperatorCounters:
    """The counters after batches of these sizes, each costing fixed + per-record time."""
    return counters([(n, fixed_s + per_record_s * n) for n in sizes])


def test_a_fixed_cost_per_batch_is_fitted_out_of_the_true_rate():
    # 0.3 s per batch + 1 ms per record: 200-record batches take 0.5 s, i.e. 400 records per busy second,
    # yet an instance given more load does close to 1,000 (its batches grow, the fixed cost does not).
    window = [Snapshot(0, {"op": OperatorCounters(instances=1)}),
              Snapshot(10, {"op": batches([100, 300] * 10, 0.3, 0.001)})]
    rates = window_rates(window)["op"]
    assert rates.true_rate_per_instance == pytest.approx(1000)
    assert rates.batch_cost_s == pytest.approx(0.3)


def test_a_step_in_load_gives_a_fit_within_a_few_batches():
    # Four equal batches, then two of four times the size: enough to tell the costs apart at once.
    window = [Snapshot(0, {"op": OperatorCounters(instances=1)}),
              Snapshot(10, {"op": batches([600] * 4 + [2400] * 2, 0.08, 0.0011)})]
    rates = window_rates(window)["op"]
    assert rates.true_rate_per_instance == pytest.approx(1 / 0.0011)
    assert rates.batch_cost_s == pytest.approx(0.08)


def test_a_fit_on_batch_sizes_too_alike_to_outweigh_contention_is_not_settled():
    """Eight 300-record batches at 75 ms + 1 ms per record, then the load steps up: the first larger batch, of
    600, also runs 10 % slow (contention from the source that just sped up). A fit at once rests on a spread
    of 300 records and reads a fifth less than the records' 1,000 per busy second; the next interval's large
    batch carries it to 1,000, settled."""
    steady, slow, large = [(300, 0.375)] * 8, (600, 0.675 * 1.1), (2400, 2.475)
    window = [Snapshot(2 * i, {"op": counters(steady[:2 * i])}) for i in range(5)]
    window.append(Snapshot(10, {"op": counters([*steady, slow])}))
    at_once = window_rates(window)["op"]
    assert at_once.true_rate_per_instance == pytest.approx(816, abs=1) and not at_once.settled
    later = window_rates([*window[1:], Snapshot(12, {"op": counters([*steady, slow, large])})])["op"]
    assert later.true_rate_per_instance == pytest.approx(1000, abs=5) and later.settled


def noisy(sizes: list[int], fixed_s: float, per_record_s: float, jitter_s: float) -> OperatorCounters:
    """As `batches`, with busy times alternately jitter_s longer and shorter."""
    return counters([(n, fixed_s + per_record_s * n + jitter_s * (-1) ** i) for i, n in enumerate(sizes)])


@pytest.mark.parametrize("sizes", [[200] * 20, [200, 210] * 10, [100, 300]], ids=[
    "equal sizes", "sizes within the noise", "too few batches"])
def test_without_a_sure_fit_the_true_rate_is_records_per_busy_second(sizes):
    window = [Snapshot(0, {"op": OperatorCounters(instances=1)}),
              Snapshot(10, {"op": noisy(sizes, 0.3, 0.001, 0.02)})]
    rates = window_rates(window)["op"]
    assert rates.true_rate_per_instance == pytest.approx(sum(sizes) / (0.3 * len(sizes) + 0.001 * sum(sizes)))
    assert rates.batch_cost_s == 0


def test_a_fixed_cost_fitted_once_is_taken_out_of_later_windows_of_equal_batches():
    """Under a steady load every batch is alike and no fit can tell the costs apart; records per busy second
    would count 0.08 s of every 600-record batch as per-record time (a quarter off the capacity). The cost
    an earlier window fitted is taken out instead; unless it would leave too little for the records."""
    window = [Snapshot(0, {"op": OperatorCounters(instances=1)}), Snapshot(10, {"op": batches([600] * 5, 0.08, 0.001)})]
    assert window_rates(window)["op"].true_rate_per_instance == pytest.approx(3000 / 3.4)
    remembered = window_rates(window, {"op": 0.08})["op"]
    assert (remembered.true_rate_per_instance, remembered.batch_cost_s) == (pytest.approx(1000), 0.08)
    assert window_rates(window, {"op": 0.6})["op"].true_rate_per_instance == pytest.approx(3000 / 3.4)


def test_the_autoscaler_remembers_the_fixed_cost_it_fitted():
    job = FluidJob(rate=700, batch_cost_s=0.3)
    scaler, _ = autoscaler(job)
    run(job, scaler, 60)
    assert scaler._batch_costs["stage"] == pytest.approx(0.3)


def test_a_source_is_sized_by_what_arrives_and_catches_its_backlog_up_apart():
    a = Snapshot(0, {"src": OperatorCounters(records_in=0, pending=0, busy_s=0.0)})
    b = Snapshot(10, {"src": OperatorCounters(instances=1, records_in=10_000, records_out=10_000, pending=6_000,
                                              busy_s=1)})
    settings = AutoscalerSettings(catch_up_seconds=60, expected_rescale_s=30)
    topology = Topology((OperatorInfo("src", (), 1, 120, True),))
    target = ds2(topology, window_rates([a, b]), settings)["src"]
    # 1,600 rec/s arrive (1,000 emitted + 600 piling up); 6,000 pending caught up in 60 s.
    assert target.steady_rate == pytest.approx(1600)
    assert target.catch_up_rate == pytest.approx(1600 + 100)
    # One instance does 10,000 records per busy second: a live rescale piles nothing up.
    assert target.pile_up_rate == 0
    stopping = Topology(topology.operators, rescale_stops=True)
    assert ds2(stopping, window_rates([a, b]), settings)["src"].pile_up_rate == pytest.approx(1600 * 30 / 60)


def test_targets_flow_downstream_through_selectivity():
    job = FluidJob(rate=4000, selectivity=0.25)
    job.advance(30)
    a = job.collect(job.now)
    job.advance(30)
    targets = ds2(TOPOLOGY, window_rates([a, job.collect(job.now)]), AutoscalerSettings(expected_rescale_s=0))
    assert targets["stage"].steady_rate == pytest.approx(4000)
    assert targets["stage"].catch_up_rate > 4000  # the input rate plus the lag that already piled up
    assert targets["sink"].catch_up_rate == pytest.approx(targets["stage"].catch_up_rate * 0.25)


def _window(counters: dict[str, dict]) -> dict:
    """Rates of a 10 s window whose end counters are these (its start: all zero)."""
    start = Snapshot(0, {op: OperatorCounters(instances=c.get("instances", 1)) for op, c in counters.items()})
    end = Snapshot(10, {op: OperatorCounters(**{"instances": 1, **c}) for op, c in counters.items()})
    return window_rates([start, end])


def test_one_decision_sizes_every_stage_of_a_dataflow_through_its_selectivities():
    """NEXMark Q5's shape: bids -> a sliding window (each bid in 5 windows) -> a max per window -> a sink.
    The source's step up reaches the later stages through the selectivities the window saw before, so both
    are sized in the decision that sees it, each by its own true rate, before their own input has grown."""
    topology = Topology((
        OperatorInfo("bids", (), 1, 120, True),
        OperatorInfo("counts", ("bids",), 1, 120, False),
        OperatorInfo("hottest", ("counts",), 1, 120, False),
        OperatorInfo("sink", ("hottest",), 0, 120, False),
    ))
    rates = _window({
        "bids": dict(records_in=20_000, records_out=20_000, pending=30_000, busy_s=0.5),  # 2,000 emitted, 5,000 due
        "counts": dict(records_in=20_000, records_out=4_000, busy_s=5.0),  # 4,000 rec per busy s
        "hottest": dict(records_in=4_000, records_out=400, busy_s=4.0),  # 1,000 rec per busy s
        "sink": dict(records_in=400, busy_s=0.1),
    })
    settings = AutoscalerSettings(policy="ds2", target_utilization=0.5, expected_rescale_s=0)
    decided = {d.operator: d for d in ds2_policy(topology, rates, {op: 1 for op in rates}, settings)}
    # 5,000 bids a second: counts needs 5,000 / (4,000 x 0.5) = 2.5 -> 3; hottest gets 5,000 x 0.2 = 1,000 a
    # second and needs 1,000 / (1,000 x 0.5) = 2.
    assert (decided["counts"].parallelism, decided["hottest"].parallelism) == (3, 2)
    assert "needs 2.00 for 1,000 rec/s" in decided["hottest"].explain()


def test_a_join_is_sized_by_both_of_its_inputs():
    topology = Topology((
        OperatorInfo("auctions", (), 1, 4, True),
        OperatorInfo("bids", (), 1, 4, True),
        OperatorInfo("join", ("auctions", "bids"), 1, 120, False),
    ))
    rates = _window({
        "auctions": dict(records_in=2_000, records_out=2_000, busy_s=0.1),
        "bids": dict(records_in=20_000, records_out=20_000, pending=10_000, busy_s=0.5),  # 3,000 due a second
        "join": dict(records_in=22_000, records_out=1_000, busy_s=5.5),  # 4,000 rec per busy s
    })
    settings = AutoscalerSettings(policy="ds2", target_utilization=0.5, expected_rescale_s=0)
    target = ds2(topology, rates, settings)["join"]
    assert target.steady_rate == pytest.approx(200 + 3_000)
    assert target.parallelism == pytest.approx(3_200 / (4_000 * 0.5))


@pytest.mark.parametrize(("needed", "key_groups", "bounds", "expected"), [
    (6.2, 120, (1, 120), (7, False)),  # 18 key groups at most for one, within its share of 120 / 6.2 = 19.4
    (4.0, 120, (1, 120), (4, False)),
    (0.3, 120, (1, 120), (1, False)),
    (9.0, 120, (1, 8), (8, True)),  # the bound keeps it below what is needed: the decision says so
    (2.5, 120, (3, 120), (3, False)),
    (2.56, 128, (1, 128), (3, False)),  # 43, 43, 42: no divisor of 128 needed
    (2.99, 128, (1, 128), (4, False)),  # 43 key groups are more than a third of the need's share
    (3.0, 4, (1, 4), (4, False)),  # 4 partitions: 3 instances leave one with two
    (3.5, 10, (1, 4), (4, True)),  # 4 leave one with 3 key groups, over its share 2.9: balanced needs 5
    (12.0, 10, (1, 20), (10, True)),  # one key group each is the most there can be
])
def test_parallelism_is_the_fewest_instances_whose_busiest_carries_its_share(needed, key_groups, bounds, expected):
    assert balanced(needed, key_groups, *bounds) == expected


# --- decide and execute ------------------------------------------------------------


def test_ds2_reaches_the_optimum_in_one_decision_on_a_step_up():
    job = FluidJob(rate=700)
    scaler, _ = autoscaler(job)
    run(job, scaler, 60)
    job.rate = 2800  # x4
    decisions = run(job, scaler, 120)
    optimum = math.ceil(2800 / (1000 * 0.8))
    assert job.rescales[0] == ("stage", balanced(optimum, 120, 1, 120)[0])
    assert len(decisions) == 1 and decisions[0].changes[0].rule == Rule.DS2
    assert "true rate 1,000 rec/s per instance" in decisions[0].changes[0].explain()


def test_ds2_sizes_by_per_record_cost_when_batches_pay_a_fixed_cost():
    """Counted as per-record time, 2 x 0.3 s of fixed cost per second would halve the true rate and DS2
    would ask for twice the instances; fitted out, it asks for the optimum."""
    job = FluidJob(rate=700, batch_cost_s=0.3)
    scaler, _ = autoscaler(job)
    run(job, scaler, 60)
    job.rate = 2800
    decisions = run(job, scaler, 120)
    assert job.rescales[0] == ("stage", balanced(2800 / (1000 * 0.8), 120, 1, 120)[0])
    assert "fixed 300 ms per batch" in decisions[0].changes[0].explain()


def test_reactive_climbs_one_instance_at_a_time():
    job = FluidJob(rate=700)
    scaler, _ = autoscaler(job, policy="reactive", lag_high_records=2000)
    run(job, scaler, 60)
    job.rate = 2800
    run(job, scaler, 400)
    steps = [n for op, n in job.rescales if op == "stage"]
    assert steps[:3] == [2, 3, 4]


def test_no_decision_on_metrics_that_include_a_rescale():
    job = FluidJob(rate=2800)
    scaler, _ = autoscaler(job)
    first = run(job, scaler, 50)
    assert len(first) == 1
    rescaled_at = first[0].time
    later = []
    for _ in range(120):
        job.advance(1)
        later.extend([d] if (d := scaler.tick()) is not None else [])
    assert later and later[0].time >= rescaled_at + FAST["stabilization_s"] + FAST["metrics_window_s"]


def test_ds2_keeps_an_operator_whose_load_swings_within_the_utilization_band():
    """1,000 rec/s per instance at 80 % target: 3 instances carry 1,800-2,600 rec/s at 60-87 % busy
    (within 80 +- 20 %), so a load swinging there causes no rescale; leaving the band does."""
    job = FluidJob(rate=2200)
    job.parallelism["stage"] = 3
    job.parallelism["sink"] = 1
    scaler, _ = autoscaler(job, utilization_boundary=0.2)
    for rate in (2200, 2600, 1800, 2500, 1900, 2200):
        job.rate = rate
        run(job, scaler, 60)
    assert [r for r in job.rescales if r[0] == "stage"] == []
    start = job.collect(job.now)
    job.advance(20)
    rates = window_rates([start, job.collect(job.now)])
    kept = next(d for d in ds2_policy(TOPOLOGY, rates, job.parallelism, scaler.settings) if d.operator == "stage")
    assert (kept.parallelism, kept.rule) == (3, Rule.DS2_IN_BAND) and "busy 73%" in kept.explain()
    job.rate = 4000  # 133 % busy on 3 instances
    run(job, scaler, 120)
    first = [n for op, n in job.rescales if op == "stage"][0]
    assert 5 <= first <= 6  # 4,000 / 800 plus the backlog that piled up while activation confirmed it


def test_a_live_rescale_that_keeps_up_sizes_for_the_steady_rate_alone():
    """1,200 rec/s on one instance of 1,000: the step needs 2 at 80 %. A live rescale's old instance keeps
    processing, so only the 200 rec/s it cannot carry pile up meanwhile, and 2 instances' headroom catches
    that and the backlog up well within a minute: 2, not the 4 that counting 2 minutes of all input asked."""
    job = FluidJob(rate=700)
    scaler, _ = autoscaler(job, expected_rescale_s=120)
    run(job, scaler, 60)
    job.rate = 1200
    decisions = run(job, scaler, 120)
    assert job.rescales == [("stage", 2)]
    change = decisions[0].changes[0]
    assert (change.rule, change.steady_parallelism) == (Rule.DS2, 2)
    assert "needs 1.50 for 1,200 rec/s" in change.explain()


def test_when_the_job_stops_to_rescale_its_whole_input_piles_up_meanwhile():
    job = FluidJob(rate=700)
    job.advance(20)
    start = job.collect(job.now)
    job.rate = 1200
    job.advance(20)
    rates = window_rates([start, job.collect(job.now)])
    settings = AutoscalerSettings(policy="ds2", **{**FAST, "expected_rescale_s": 60})
    live, stopping = TOPOLOGY, Topology(TOPOLOGY.operators, rescale_stops=True)
    assert ds2(live, rates, settings)["stage"].pile_up_rate == pytest.approx(200)
    assert ds2(stopping, rates, settings)["stage"].pile_up_rate == pytest.approx(1200)
    sized = next(d for d in ds2_policy(stopping, rates, job.parallelism, settings) if d.operator == "stage")
    assert sized.parallelism > sized.steady_parallelism == 2  # instances for the catch-up, beyond the steady 2


def test_a_backlog_gets_instances_of_its_own_and_they_go_when_it_is_caught_up():
    """120,000 records behind at 700 rec/s: one instance keeps up (70 % busy) but would need 6 minutes to
    catch up. ds2 adds instances for the catch-up alone and takes them back once the backlog is gone, as
    planned then: the 10-minute scale-down delay does not apply to it."""
    job = FluidJob(rate=700)
    scaler, events = autoscaler(job, scale_down_delay_s=600)
    run(job, scaler, 40)
    job.counters["stage"].lag = 120_000
    decisions = run(job, scaler, 200)
    assert [n for op, n in job.rescales if op == "stage"] == [3, 1]
    out, back = (d.changes[0] for d in decisions)
    assert (out.parallelism, out.steady_parallelism) == (3, 1)
    assert "3 catch up the backlog within 60 s, back to 1 when it is gone" in out.explain()
    assert back.rule == Rule.CATCH_UP_DONE and decisions[1].time - decisions[0].time < 120
    assert [reason for reason, _, _ in events.events] == ["ScaledUp", "ScaledDown"]


def test_scale_down_waits_and_applies_the_largest_recommendation_of_the_delay():
    job = FluidJob(rate=3000)
    job.parallelism["stage"] = 4
    scaler, events = autoscaler(job)
    seen = []
    for rate, seconds in ((3000, 40), (400, 20), (1500, 20), (400, 60)):
        job.rate = rate
        for _ in range(seconds):
            job.advance(1)
            if (decision := scaler.tick()) is not None:
                seen.append(decision)
    stage = [next(d for d in decision.operators if d.operator == "stage") for decision in seen]
    delayed = [d for d in stage if d.rule == Rule.SCALE_DOWN_DELAY]
    applied = [d for d in stage if d.changes]
    assert delayed and applied and job.rescales == [("stage", applied[0].parallelism)]
    # Not the latest recommendation (1, for the last minute's load) but the largest of the delay: 2, for the
    # 20 s at 1,500 rec/s; the first ask's 3 came from a window still holding the 3,000 rec/s before the drop.
    asks = [d.recommended for d in [*delayed, applied[0]]]
    assert asks[0] == max(asks) == 3 and applied[0].parallelism == 2 > applied[0].recommended
    assert any(reason == "ScaleDownDelayed" for reason, _, _ in events.events)
    # Kept above the steady need by the delay, not for a catch-up: no scale-back planned, the next scale-down
    # waits its delay like any other.
    assert not scaler._catching_up


def test_max_scale_factor_limits_one_step():
    job = FluidJob(rate=20_000)
    scaler, _ = autoscaler(job, max_scale_factor=2)
    run(job, scaler, 50)
    assert job.rescales == [("stage", 2)]


def test_ineffective_scale_up_blocks_further_scale_ups_and_alerts():
    job = FluidJob(rate=3000, capacity_cap=1000)  # a shared bottleneck: more instances add nothing
    scaler, events = autoscaler(job)
    run(job, scaler, 200)
    stage_ups = [n for op, n in job.rescales if op == "stage"]
    assert len(stage_ups) == 1
    assert any(reason == "IneffectiveScaling" and warning for reason, _, warning in events.events)
    judged = [e for e in scaler.log.entries() if "gain_share" in e]
    assert judged and judged[0]["gain_share"] < 0.1


def test_history_vetoes_a_scale_down_that_a_recent_scale_up_would_undo():
    job = FluidJob(rate=2800)
    scaler, events = autoscaler(job, scale_down_delay_s=0, scale_down_history_horizon_s=600)
    run(job, scaler, 50)
    assert job.rescales == [("stage", 4)]
    job.rate = 300
    run(job, scaler, 120)
    assert job.rescales == [("stage", 4)]
    assert any(reason == "ScaleDownVetoed" for reason, _, _ in events.events)


def test_off_never_collects():
    job = FluidJob(rate=50_000)
    scaler, _ = autoscaler(job, policy="off")
    assert run(job, scaler, 120) == [] and job.rescales == []


def test_a_failed_rescale_is_reported_and_the_loop_goes_on():
    job = FluidJob(rate=2800)
    scaler, events = autoscaler(job)

    def broken(op, n):
        raise RuntimeError("standbys not ready")

    scaler.scaler = type("S", (), {"parallelism": lambda _: dict(job.parallelism), "rescale": lambda _, o, n: broken(o, n)})()
    for _ in range(50):
        job.advance(1)
        scaler.tick()
    assert any(reason == "RescaleFailed" and "standbys not ready" in message for reason, message, _ in events.events)
    assert scaler.log.entries()[-1]["executed"] is False


def test_a_worker_restart_restarts_the_window_like_a_rescale():
    job = FluidJob(rate=700)
    scaler, _ = autoscaler(job)
    run(job, scaler, 38)
    job.counters["stage"].records_in = job.counters["stage"].busy_s = 0.0  # the restarted worker counts from 0
    assert run(job, scaler, 10) == [] and not scaler._window
    job.rate = 2800
    decisions = run(job, scaler, 80)
    assert decisions and decisions[0].time >= 38 + FAST["stabilization_s"] + FAST["metrics_window_s"]


def test_a_graph_changed_live_is_followed_from_a_fresh_window():
    job = FluidJob(rate=700)
    scaler, _ = autoscaler(job)
    run(job, scaler, 38)
    scaler.follow(TOPOLOGY)
    assert scaler._window, "the same graph: nothing restarts"
    scaler._up_streak["gone"] = 2
    extra = Topology((*TOPOLOGY.operators, OperatorInfo("more", ("stage",), 0, 120, False)))
    scaler.follow(extra)
    assert scaler.topology == extra and not scaler._window and "gone" not in scaler._up_streak
    job.rate = 2800
    decisions = run(job, scaler, 80)
    assert decisions and decisions[0].time >= 38 + FAST["stabilization_s"] + FAST["metrics_window_s"]


def test_the_wait_after_a_restart_counts_from_the_workers_return():
    """A restarted worker's first batches (its JVM warming up) say nothing of its steady rate, so the
    stabilization runs from its return, not from when it was first missed."""
    job = FluidJob(rate=700)
    scaler, _ = autoscaler(job)
    run(job, scaler, 38)
    away = {"until": 38 + 0.75 * FAST["stabilization_s"]}  # back while the scaler is still waiting

    def collect(now):
        snapshot = job.collect(now)
        if now < away["until"]:
            del snapshot.operators["stage"]
            job.counters["stage"].records_in = job.counters["stage"].busy_s = 0.0
        return snapshot

    scaler.collector = type("C", (), {"collect": lambda _, now: collect(now)})()
    job.rate = 2800
    decisions = run(job, scaler, 150)
    assert decisions and decisions[0].time >= away["until"] + FAST["stabilization_s"] + FAST["metrics_window_s"]


def test_unreachable_metrics_skip_a_tick_and_keep_the_window():
    job = FluidJob(rate=700)
    scaler, _ = autoscaler(job)
    run(job, scaler, 60)
    window = list(scaler._window)

    def refuse(now):
        raise OSError("connection refused")

    real, scaler.collector = scaler.collector, type("C", (), {"collect": lambda _, now: refuse(now)})()
    assert run(job, scaler, 10) == [] and list(scaler._window) == window
    scaler.collector = real
    run(job, scaler, 10)
    assert len(scaler._window) > 1


def test_a_scale_up_that_activation_holds_goes_along_with_another_operators_rescale(monkeypatch):
    """DS2 sizes every operator in one step: when one operator's scale-up is confirmed and another's is one
    interval short (its true rate not settled yet), both go now; waiting would cost the second a whole
    stabilization after the first one's rescale."""
    from streamjobs_autoscaler import autoscaler as module
    from streamjobs_autoscaler.decision import OperatorDecision

    job = FluidJob(rate=700)
    scaler, _ = autoscaler(job, activation_intervals=1)
    asks = [OperatorDecision("stage", 1, 3, 3, Rule.DS2), OperatorDecision("sink", 1, 2, 2, Rule.DS2)]
    monkeypatch.setitem(module.POLICIES, "ds2", lambda *_: asks)
    rates = {op: Rates(1, 100, 100, 100, 0.5, 1000, 0, settled=op != "sink") for op in ("stage", "sink")}
    decision = scaler._decide(rates, 0.0)
    assert [(d.operator, d.parallelism) for d in decision.changes] == [("stage", 3), ("sink", 2)]
    assert "along with the others' rescale" in decision.changes[1].note and decision.executed
    assert job.parallelism["stage"] == 3 and job.parallelism["sink"] == 2
    alone = autoscaler(FluidJob(rate=700), activation_intervals=1)[0]
    monkeypatch.setitem(module.POLICIES, "ds2", lambda *_: asks[1:])
    assert not alone._decide(rates, 0.0).changes  # with no other rescale it waits its interval


def test_guard_rails_return_what_to_remember_and_name_their_rule():
    from streamjobs_autoscaler import guards
    from streamjobs_autoscaler.decision import OperatorDecision

    settings = AutoscalerSettings(activation_intervals=2, scale_down_delay_s=30, max_scale_factor=2.0,
                                  metrics_window_s=5)
    up = OperatorDecision("agg", 2, 9, 9, Rule.DS2)
    held, streak = guards.activation(up, 0, settings)
    assert (held.parallelism, held.rule, streak) == (2, Rule.ACTIVATION, 1) and up.parallelism == 9
    assert guards.activation(up, streak, settings) == (up, 0)  # the second interval in a row acts
    unsure, streak = guards.activation(up, 1, settings, settled=False)  # a true rate not settled yet
    assert (unsure.parallelism, streak) == (2, 2) and "too alike" in unsure.note
    assert guards.activation(up, streak, settings, settled=False) == (up, 0)  # one interval more, not forever
    assert guards.max_step(up, settings).parallelism == 4 and guards.max_step(up, settings).rule == Rule.MAX_SCALE_FACTOR
    assert guards.ineffective(up, "it did not help").rule == Rule.INEFFECTIVE and guards.ineffective(up, None) is up
    down = OperatorDecision("agg", 4, 1, 1, Rule.DS2)
    waiting, asked = guards.scale_down_delay(down, 100.0, None, settings)
    assert (waiting.parallelism, waiting.rule, asked) == (4, Rule.SCALE_DOWN_DELAY, (100.0, 1, None))
    _, asked = guards.scale_down_delay(OperatorDecision("agg", 4, 2, 2, Rule.DS2), 110.0, asked, settings)
    done, asked = guards.scale_down_delay(down, 131.0, asked, settings)
    assert (done.parallelism, asked) == (2, None)  # the largest recommendation over the delay
    assert Rule.SCALE_DOWN_DELAY.event == "ScaleDownDelayed" and Rule.ACTIVATION.event is None


def test_a_scale_down_counts_only_recommendations_from_windows_after_its_first_ask():
    """The load fell at 100: the window ending at 104 still holds some of the load before, and asks for 3 where
    every window wholly after the drop asks for at most 2. Without a window wholly after the ask (a delay shorter
    than the window), the largest of all counts."""
    from streamjobs_autoscaler import guards
    from streamjobs_autoscaler.decision import OperatorDecision

    settings = AutoscalerSettings(scale_down_delay_s=15, metrics_window_s=10)
    asked = None
    for now, recommended in ((100.0, 3), (104.0, 3), (110.0, 2), (112.0, 1), (116.0, 1)):
        d, asked = guards.scale_down_delay(OperatorDecision("agg", 4, recommended, recommended, Rule.DS2), now,
                                           asked, settings)
    assert (d.parallelism, asked) == (2, None)
    short = AutoscalerSettings(scale_down_delay_s=5, metrics_window_s=10)
    _, asked = guards.scale_down_delay(OperatorDecision("agg", 4, 3, 3, Rule.DS2), 100.0, None, short)
    d, _ = guards.scale_down_delay(OperatorDecision("agg", 4, 1, 1, Rule.DS2), 106.0, asked, short)
    assert d.parallelism == 3


def test_the_console_shows_a_decisions_rule_in_its_brackets():
    import io

    from rich.console import Console
    from streamjobs.autoscaling import ConsoleEvents

    console = Console(file=io.StringIO(), force_terminal=False)
    ConsoleEvents(console).emit("ScaledUp", "count 1 -> 3 [ds2]: target 1,900 rec/s")
    assert "count 1 -> 3 [ds2]: target 1,900 rec/s" in console.file.getvalue()  # not eaten as rich markup
