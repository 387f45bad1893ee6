"""The SSS peer of the latency benchmark: its bids follow our generator's rules, its query computes Q5,
and a short streaming run chains both aggregations and their join and timestamps rows after their windows end."""

from __future__ import annotations

import pandas as pd
from pyspark.sql import functions as F
from streamjobs.bench import latency, sss_peer

SHAPE = latency.q5_shape(latency.q5_job(2000))
T0_MS = 1_800_000_000_000


def _events(spark, count: int):
    """`count` events at 2,000/s, as the rate source gives them: (value, timestamp)."""
    return spark.range(count).select(
        F.col("id").alias("value"), F.timestamp_millis(F.lit(T0_MS) + F.floor(F.col("id") / 2)).alias("timestamp")
    )


def test_bids_follow_the_nexmark_rules(spark):
    bids = sss_peer.nexmark_bids(_events(spark, 50_000), SHAPE).select(
        "value", "bid_auction", F.unix_millis("event_time").alias("event_ms")
    ).toPandas()
    assert len(bids) == 50_000 * 46 // 50
    g = bids["value"].to_numpy()
    auctions = 3 * (g // 50) + 3
    assert ((bids["bid_auction"] < auctions) & (bids["bid_auction"] >= auctions - SHAPE.active_auctions)).all()
    hot_share = (bids["bid_auction"] == (auctions - 1) // 100 * 100).mean()
    assert 0.47 < hot_share < 0.54  # half go to the hot auction, and a cold pick hits it 1 in 200
    lag = T0_MS + g // 2 - bids["event_ms"].to_numpy()
    assert lag.min() == 0 and lag.max() == SHAPE.out_of_order_ms


def test_the_query_gives_every_auction_at_its_sliding_windows_maximum(spark):
    bids = sss_peer.nexmark_bids(_events(spark, 20_000), SHAPE)
    got = sss_peer.q5(bids, SHAPE).toPandas().sort_values(["window_end_ms", "auction"]).reset_index(drop=True)

    rows = bids.select("bid_auction", F.unix_millis("event_time").alias("t")).toPandas()
    ends = pd.concat(  # every 4 s window, sliding by 1 s, that holds the bid
        rows.assign(end=(rows["t"] // SHAPE.slide_ms + 1 + k) * SHAPE.slide_ms)
        for k in range(SHAPE.size_ms // SHAPE.slide_ms)
    )
    counts = ends.groupby(["end", "bid_auction"]).size().rename("num").reset_index()
    hottest = counts[counts["num"] == counts.groupby("end")["num"].transform("max")]
    expected = hottest.rename(columns={"end": "window_end_ms", "bid_auction": "auction"})
    expected = expected.sort_values(["window_end_ms", "auction"]).reset_index(drop=True)
    assert len(got) >= len(expected["window_end_ms"].unique()) > 5
    assert got[["window_end_ms", "auction", "num"]].astype("int64").equals(
        expected[["window_end_ms", "auction", "num"]].astype("int64"))


def test_a_short_streaming_run_chains_both_aggregations_and_measures_after_window_end(spark):
    # A discarded run first, as the bench's warm-up: the session's first streaming query loads and compiles
    # for seconds, which on a loaded machine took the whole measured run.
    sss_peer.measure_latency(spark, SHAPE, 2000, 5)
    measured = sss_peer.measure_latency(spark, SHAPE, 2000, 15)
    assert measured["stateful_operators"] >= 3  # two aggregations and their join
    assert measured["rows"] > 0 and measured["input_records_per_s"] > 0
    latencies = measured["latencies_ms"]
    assert 0 < len(latencies) <= measured["rows"]
    assert (latencies > 0).all()  # a window closes only once the watermark passes its end
