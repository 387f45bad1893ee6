"""Deterministic generator sources and their rate curves."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest
from streamjobs_core import generators as gen
from streamjobs_core.rates import RateCurve
from streamjobs_core.spec import NexmarkSource, RateProfile, YsbSource, ZipfSource

pytestmark = pytest.mark.unit

T0 = 1_700_000_000_000

PROFILES = {
    "constant": RateProfile(records_per_second=5000),
    "steps": RateProfile(
        profile="steps",
        records_per_second=2000,
        steps=(
            {"at_s": 0.5, "records_per_second": 50},
            {"at_s": 2, "records_per_second": 9000},
            {"at_s": 2, "records_per_second": 4000},  # the same instant: the later entry wins
            {"at_s": 3.25, "records_per_second": 700},
        ),
    ),
    "steps_at_zero": RateProfile(profile="steps", steps=({"at_s": 0, "records_per_second": 300},)),
    "sine": RateProfile(profile="sine", records_per_second=3000, amplitude=1200, period_s=1.5),
    "sine_full": RateProfile(profile="sine", records_per_second=3000, amplitude=3000, period_s=2),
    "spike": RateProfile(
        profile="spike", records_per_second=1000, spike_records_per_second=50_000, spike_at_s=1, spike_duration_s=0.5
    ),
}


def nexmark(**fields: object) -> NexmarkSource:
    return NexmarkSource(name="bids", type="nexmark", **fields)


def column(table: pa.Table, name: str) -> np.ndarray:
    return table.column(name).to_numpy(zero_copy_only=False)


# --- rate curves -----------------------------------------------------------


@pytest.mark.parametrize("name", PROFILES)
def test_count_at_starts_at_zero_and_never_decreases(name: str) -> None:
    curve = RateCurve(PROFILES[name])
    counts = np.array([curve.count_at(t) for t in np.linspace(0, 10, 4001)])
    assert curve.count_at(0.0) == 0.0
    assert np.all(np.diff(counts) >= 0)


@pytest.mark.parametrize("name", PROFILES)
def test_count_at_integrates_rate_at(name: str) -> None:
    curve = RateCurve(PROFILES[name])
    t = np.linspace(0, 6, 60_001)
    rates = np.array([curve.rate_at(x) for x in t])
    integral = np.concatenate(([0.0], np.cumsum((rates[1:] + rates[:-1]) / 2 * np.diff(t))))
    # The trapezoid rule errs by at most one grid step at each rate jump.
    jump_error = np.max(rates) * (t[1] - t[0]) * 4
    assert np.allclose([curve.count_at(x) for x in t], integral, rtol=1e-6, atol=jump_error)


def test_rate_curve_closed_forms() -> None:
    steps = RateCurve(PROFILES["steps"])
    assert steps.count_at(0.5) == pytest.approx(1000)
    assert steps.count_at(3) == pytest.approx(1000 + 75 + 4000)
    assert steps.rate_at(2) == 4000 and steps.rate_at(1.99) == 50
    assert RateCurve(PROFILES["steps_at_zero"]).count_at(2) == pytest.approx(600)
    spike = RateCurve(PROFILES["spike"])
    assert spike.count_at(2) == pytest.approx(1000 * 1.5 + 50_000 * 0.5)
    sine = RateCurve(PROFILES["sine"])
    assert sine.count_at(1.5 * 7) == pytest.approx(3000 * 1.5 * 7)
    assert sine.count_at(0.375) == pytest.approx(3000 * 0.375 + 1200 * 1.5 / (2 * math.pi))


@pytest.mark.parametrize("name", PROFILES)
def test_time_of_inverts_count_at(name: str) -> None:
    curve = RateCurve(PROFILES[name])
    t = np.linspace(0, 20, 20_001)
    counts = np.array([curve.count_at(x) for x in t])
    back = curve.time_of(counts)
    # Where the rate touches zero the count is flat to float precision, so
    # time is only recoverable where records actually flow.
    flowing = np.array([curve.rate_at(x) for x in t]) > 1.0
    assert np.max(np.abs(back - t)[flowing]) < 1e-6
    assert np.allclose([curve.count_at(x) for x in back], counts, rtol=1e-12, atol=1e-6)


@pytest.mark.parametrize("name", PROFILES)
def test_time_of_is_monotone_and_elementwise(name: str) -> None:
    curve = RateCurve(PROFILES[name])
    counts = np.arange(200_000, dtype=np.float64)
    times = curve.time_of(counts)
    assert times[0] == 0.0
    assert np.all(np.diff(times) > 0)
    # An element's time may not depend on what else is in the call.
    picks = np.random.default_rng(1).choice(counts.size, 500)
    assert np.array_equal(curve.time_of(counts[picks]), times[picks])
    assert np.array_equal([curve.time_of(counts[i : i + 1])[0] for i in picks[:50]], times[picks[:50]])


def test_full_amplitude_sine_passes_its_zero_rate_instants() -> None:
    curve = RateCurve(PROFILES["sine_full"])
    stall = 1.5  # sin(2*pi*t/2) = -1: the rate is zero
    assert curve.rate_at(stall) == pytest.approx(0, abs=1e-9)
    around = curve.count_at(stall) + np.linspace(-5, 5, 10_001)
    times = curve.time_of(around)
    assert np.all(np.diff(times) >= 0)
    assert np.allclose([curve.count_at(x) for x in times], around, atol=1e-6)
    assert curve.time_of(np.array([curve.count_at(stall)]))[0] == pytest.approx(stall, abs=1e-3)


# --- partitions ------------------------------------------------------------


@pytest.mark.parametrize("partitions", [1, 2, 3, 7, 16])
def test_local_count_and_global_indices_agree(partitions: int) -> None:
    for total in (0, 1, 5, 16, 17, 1001):
        owned = [gen.global_indices(p, partitions, 0, gen.local_count(p, partitions, total)) for p in range(partitions)]
        for p, g in enumerate(owned):
            assert np.array_equal(g, np.arange(p, total, partitions))
            assert g.dtype == np.int64
        assert np.array_equal(np.sort(np.concatenate(owned)), np.arange(total))
    assert np.array_equal(gen.global_indices(1, 3, 4, 6), [13, 16])


def test_partition_out_of_range_is_rejected() -> None:
    with pytest.raises(ValueError):
        gen.global_indices(3, 3, 0, 1)
    with pytest.raises(ValueError):
        gen.local_count(-1, 3, 10)


def test_local_total() -> None:
    assert gen.local_total(nexmark(), 0, 4) is None
    totals = [gen.local_total(nexmark(total_records=10), p, 4) for p in range(4)]
    assert totals == [3, 3, 2, 2]


# --- determinism -----------------------------------------------------------

SOURCES = {
    "nexmark": nexmark(seed=7, out_of_order_ms=250, rate=PROFILES["sine_full"], active_auctions=40),
    "zipf": ZipfSource(name="words", type="zipf", seed=7, out_of_order_ms=250, rate=PROFILES["spike"]),
    "ysb": YsbSource(name="ads", type="ysb", seed=7, out_of_order_ms=100, rate=PROFILES["steps"]),
}


@pytest.mark.parametrize("name", SOURCES)
def test_generate_is_deterministic(name: str) -> None:
    spec = SOURCES[name]
    g = np.arange(20_000)
    table = gen.generate(spec, T0, g)
    assert table.equals(gen.generate(spec, T0, g))
    assert table.schema == {"nexmark": gen.NEXMARK_SCHEMA, "zipf": gen.ZIPF_SCHEMA, "ysb": gen.YSB_SCHEMA}[name]
    assert np.array_equal(column(table, "event_time"), gen.event_times(spec, T0, g))
    other_seed = gen.generate(spec.model_copy(update={"seed": 8}), T0, g)
    assert not table.equals(other_seed)


@pytest.mark.parametrize("name", SOURCES)
@pytest.mark.parametrize("partitions", [2, 5])
def test_partitions_and_resumes_reproduce_the_whole(name: str, partitions: int) -> None:
    spec = SOURCES[name]
    total = 30_001
    whole = gen.generate(spec, T0, np.arange(total))
    parts, indices = [], []
    for p in range(partitions):
        end = gen.local_count(p, partitions, total)
        # Resume mid-way, as a worker does after a crash or rescale.
        for start, stop in ((0, end // 3), (end // 3, end)):
            g = gen.global_indices(p, partitions, start, stop)
            parts.append(gen.generate(spec, T0, g))
            indices.append(g)
    merged = pa.concat_tables(parts).take(np.argsort(np.concatenate(indices)))
    assert merged.equals(whole)


def test_out_of_order_index_order_is_kept() -> None:
    spec = SOURCES["nexmark"]
    g = np.array([700, 3, 50, 4, 700])
    table = gen.generate(spec, T0, g)
    for row, index in enumerate(g):
        assert table.slice(row, 1).equals(gen.generate(spec, T0, np.array([index])))


def test_negative_indices_are_rejected() -> None:
    with pytest.raises(ValueError):
        gen.generate(SOURCES["zipf"], T0, np.array([0, -1]))


# --- NEXMark ---------------------------------------------------------------


def test_nexmark_proportions_and_sequential_ids() -> None:
    table = gen.generate(nexmark(), T0, np.arange(50_000))
    kinds = column(table, "event_type")
    assert np.bincount(kinds).tolist() == [1000, 3000, 46_000]
    assert np.all(np.bincount(kinds[:50]) == [1, 3, 46])
    assert np.array_equal(column(table, "person_id")[kinds == gen.PERSON], np.arange(1000, 2000))
    assert np.array_equal(column(table, "auction_id")[kinds == gen.AUCTION], np.arange(1000, 4000))


def test_nexmark_columns_are_null_exactly_where_not_applicable() -> None:
    table = gen.generate(nexmark(), T0, np.arange(5000))
    kinds = column(table, "event_type")
    for name in gen.NEXMARK_SCHEMA.names:
        valid = table.column(name).is_valid().to_numpy(zero_copy_only=False)
        owner = {"person": gen.PERSON, "auction": gen.AUCTION, "bid": gen.BID}.get(name.split("_")[0])
        assert np.array_equal(valid, kinds == owner if owner is not None else np.ones(kinds.size, bool)), name


@pytest.mark.parametrize("hot_ratio", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("active", [1, 7, 1000])
def test_bids_reference_existing_recent_auctions_and_persons(hot_ratio: float, active: int) -> None:
    spec = nexmark(hot_auction_ratio=hot_ratio, active_auctions=active, out_of_order_ms=100)
    table = gen.generate(spec, T0, np.arange(120_000))
    kinds = column(table, "event_type")
    is_bid = kinds == gen.BID
    # The newest auction and person ids created so far, at every row.
    newest_auction = np.maximum.accumulate(np.nan_to_num(column(table, "auction_id").astype(float), nan=-1))
    newest_person = np.maximum.accumulate(np.nan_to_num(column(table, "person_id").astype(float), nan=-1))
    auction = column(table, "bid_auction")[is_bid].astype(np.int64)
    bidder = column(table, "bid_bidder")[is_bid].astype(np.int64)
    assert np.all(auction <= newest_auction[is_bid])
    assert np.all(auction > newest_auction[is_bid] - active)
    assert np.all((bidder >= 1000) & (bidder <= newest_person[is_bid]))
    is_auction = kinds == gen.AUCTION
    seller = column(table, "auction_seller")[is_auction]
    assert np.all((seller >= 1000) & (seller <= newest_person[is_auction]))
    hot = newest_auction[is_bid] - 1000
    hot = 1000 + hot // min(100, active) * min(100, active)
    share = np.mean(auction == hot)
    assert hot_ratio <= share <= hot_ratio + 1.5 / min(active, 100) + 0.01
    # Every bid on an auction falls before the auction expires.
    expires = dict(zip(column(table, "auction_id")[is_auction], column(table, "auction_expires")[is_auction]))
    bid_times = column(table, "event_time")[is_bid]
    assert all(t <= expires[a] for a, t in zip(auction.tolist(), bid_times.tolist()))


def test_nexmark_values_are_plausible() -> None:
    table = gen.generate(nexmark(), T0, np.arange(50_000))
    kinds = column(table, "event_type")
    price = column(table, "bid_price")[kinds == gen.BID]
    assert price.min() >= 100 and price.max() < 100_000_000
    assert np.mean(price) > 10 * np.median(price)  # skewed: a few large bids
    assert set(column(table, "bid_channel")[kinds == gen.BID]) == {"Google", "Facebook", "Baidu", "Apple"}
    initial = column(table, "auction_initial_bid")[kinds == gen.AUCTION]
    assert np.all(column(table, "auction_reserve")[kinds == gen.AUCTION] > initial)
    assert set(column(table, "auction_category")[kinds == gen.AUCTION]) == set(range(10, 15))
    emails = column(table, "person_email")[kinds == gen.PERSON]
    assert len(set(emails)) == emails.size and all(e.endswith("@example.com") for e in emails)


# --- event time and watermarks ---------------------------------------------


@pytest.mark.parametrize("name", PROFILES)
def test_out_of_order_is_bounded(name: str) -> None:
    bound = 300
    spec = nexmark(out_of_order_ms=bound, rate=PROFILES[name])
    g = np.arange(60_000)
    times = gen.event_times(spec, T0, g)
    offered = T0 + np.floor(RateCurve(PROFILES[name]).time_of(g) * 1000).astype(np.int64)
    lateness = offered - times
    assert lateness.min() == 0 and lateness.max() == bound
    assert np.all(np.maximum.accumulate(times) - times <= bound)
    assert np.any(np.diff(times) < 0)
    in_order = gen.event_times(spec.model_copy(update={"out_of_order_ms": 0}), T0, g)
    assert np.array_equal(in_order, offered)


@pytest.mark.parametrize("name", PROFILES)
@pytest.mark.parametrize("out_of_order_ms", [0, 40])
def test_watermark_never_passes_a_later_record(name: str, out_of_order_ms: int) -> None:
    partitions, total = 3, 90_000
    spec = nexmark(out_of_order_ms=out_of_order_ms, rate=PROFILES[name], total_records=total)
    rng = np.random.default_rng(5)
    for p in range(partitions):
        g = gen.global_indices(p, partitions, 0, gen.local_count(p, partitions, total))
        times = gen.event_times(spec, T0, g)
        later_min = np.minimum.accumulate(times[::-1])[::-1]  # min event time from local index j on
        for j in rng.integers(0, g.size, 400):
            mark = gen.watermark(spec, T0, int(g[j]))
            assert mark <= later_min[j]
        marks = [gen.watermark(spec, T0, int(x)) for x in g[::97]]
        assert np.all(np.diff(marks) >= 0)
        # Tight up to the jitter: the next record itself is at most that late.
        assert gen.watermark(spec, T0, int(g[-1])) >= times[-1] - out_of_order_ms
        assert gen.watermark(spec, T0, int(g[-1]) + partitions) == gen.MAX_WATERMARK


def test_unbounded_watermark_follows_the_formula() -> None:
    spec = nexmark(out_of_order_ms=40, rate=PROFILES["sine_full"])
    for next_g in (0, 1, 2999, 10**9):
        offered = math.floor(RateCurve(spec.rate).time_of(np.array([next_g]))[0] * 1000)
        assert gen.watermark(spec, T0, next_g) == T0 + offered - 40


# --- pacing ----------------------------------------------------------------


@pytest.mark.parametrize("name", PROFILES)
def test_due_local_index_paces_by_the_curve(name: str) -> None:
    partitions = 4
    spec = nexmark(rate=PROFILES[name], total_records=20_000)
    curve = RateCurve(PROFILES[name])
    previous = [0] * partitions
    for elapsed in np.linspace(0, 12, 241):
        due = [gen.due_local_index(spec, p, partitions, elapsed) for p in range(partitions)]
        assert sum(due) == min(math.floor(curve.count_at(elapsed)), 20_000)
        assert all(d >= prev for d, prev in zip(due, previous))
        for p, d in enumerate(due):
            if d:  # no record is due before the time it is offered
                assert curve.time_of(gen.global_indices(p, partitions, d - 1, d))[0] <= elapsed
        previous = due
    assert gen.due_local_index(spec, 0, partitions, 0.0) == 0
    assert [gen.due_local_index(spec, p, partitions, 1e6) for p in range(partitions)] == [5000] * 4
    unbounded = spec.model_copy(update={"total_records": None})
    assert gen.due_local_index(unbounded, 0, 1, 1e6) == math.floor(curve.count_at(1e6))


# --- Zipf ------------------------------------------------------------------


def test_zipf_words_follow_the_law() -> None:
    vocabulary, exponent, n = 500, 1.1, 200_000
    spec = ZipfSource(name="words", type="zipf", vocabulary=vocabulary, exponent=exponent)
    words = column(gen.generate(spec, T0, np.arange(n)), "word")
    ranks = np.array([int(w[1:]) for w in words])
    assert ranks.min() >= 1 and ranks.max() <= vocabulary
    counts = np.bincount(ranks, minlength=vocabulary + 1)[1:]
    assert counts.argmax() == 0
    law = np.arange(1, vocabulary + 1, dtype=float) ** -exponent
    expected = n * law / law.sum()
    # Within 5 standard deviations for the head, where counts are large.
    head = slice(0, 20)
    assert np.all(np.abs(counts[head] - expected[head]) < 5 * np.sqrt(expected[head]))
    # The log-log slope of the frequencies recovers the exponent.
    slope = np.polyfit(np.log(np.arange(1, 51)), np.log(counts[:50]), 1)[0]
    assert slope == pytest.approx(-exponent, abs=0.1)


def test_zipf_single_word_vocabulary() -> None:
    spec = ZipfSource(name="words", type="zipf", vocabulary=1)
    assert set(column(gen.generate(spec, T0, np.arange(1000)), "word")) == {"w1"}


def test_ysb_events_spread_over_ads_types_and_the_campaign_table_covers_every_ad() -> None:
    spec = YsbSource(name="ads", type="ysb", campaigns=20, ads_per_campaign=5)
    events = gen.generate(spec, T0, np.arange(60_000)).to_pandas()
    assert set(events.event_type) == set(gen.YSB_EVENT_TYPES) and set(events.ad_type) == set(gen.YSB_AD_TYPES)
    assert events.event_type.value_counts(normalize=True).between(0.3, 0.37).all()
    table = gen.ysb_campaigns(spec).to_pandas()
    assert len(table) == 100 and table.ad_id.is_unique and table.campaign_id.nunique() == 20
    assert set(events.ad_id) == set(table.ad_id)
    assert table.set_index("ad_id").campaign_id["ad-7"] == "campaign-1"
    assert all(len(ip.split(".")) == 4 and all(0 <= int(o) < 256 for o in ip.split(".")) for ip in events.ip_address[:50])
