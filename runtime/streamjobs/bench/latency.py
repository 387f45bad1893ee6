"""`streamjobs bench latency`: NEXMark Q5 end to end, ours against Spark Structured Streaming (and Flink).

Ours: Q5 as examples/nexmark-q5.yaml computes it (a sliding count of bids per
auction, a sql stage, a tumbling max per window end, a window join of the counts
with their window's maximum), with shorter windows, on the local runtime, at 2,000 events/s and at half
of our saturation. Saturation is what the first stage consumed per second of a
run offered far more than it could take (backpressure holds the source back).
A result's latency is the sink's time minus its window end.

The peer: the same query in SSS (sss_peer.py) at the same rates on a `local[2]`
session, in a fresh process so that its JVM is configured by the peer alone.
Latency = the time a result row reaches its sink minus its window end.

Both sides count only the second half of each run: the first batches pay query
compilation and JIT warm-up, which the steady state does not.
"""

from __future__ import annotations

import numpy as np
from streamjobs_core.loading import parse_job
from streamjobs_core.spec import StreamJob

from ..live import percentiles
from . import sss_peer
from .cpus import apart
from .flink.session import INSTALL_HINT

LIGHT_LOAD_RECORDS_PER_S = 2000
CORES = 2  # the machine's: our job's processes share them; the peer gets local[2]
FLINK_MISSING = f"not installed ({INSTALL_HINT})"
FIRST_STAGE = "bids-per-auction"


def q5_job(rate: float) -> StreamJob:
    return parse_job({
        "apiVersion": "streamjobs.dev/v1alpha1", "kind": "StreamJob", "metadata": {"name": "bench-latency"},
        "spec": {
            "sources": [{"name": "events", "type": "nexmark", "activeAuctions": 200, "outOfOrderMs": 100,
                         "rate": {"recordsPerSecond": rate}}],
            "stages": [
                {"name": FIRST_STAGE, "type": "window_aggregate", "inputs": ["events"],
                 "where": "event_type = 2", "keyBy": "bid_auction",
                 "window": {"type": "sliding", "sizeMs": 4000, "slideMs": 1000},
                 "aggregations": [{"function": "count", "as": "bids"}]},
                {"name": "by-window", "type": "sql", "inputs": [FIRST_STAGE],
                 "query": "SELECT bid_auction, window_end AS slide_end, bids, event_time, _ingest_ms FROM input"},
                {"name": "max-bids", "type": "window_aggregate", "inputs": ["by-window"], "keyBy": "slide_end",
                 "window": {"sizeMs": 1000}, "aggregations": [{"function": "max", "column": "bids", "as": "max_bids"}]},
                {"name": "hottest", "type": "join", "inputs": ["by-window", "max-bids"],
                 "on": {"left": ["slide_end", "bids"], "right": ["slide_end", "max_bids"]},
                 "window": {"sizeMs": 1000}, "select": ["l.bid_auction AS auction", "l.bids AS num"]},
            ],
            "sinks": [{"name": "hot-items", "type": "redis_stream", "inputs": ["hottest"]}],
        },
    })


def q5_shape(job: StreamJob) -> sss_peer.Q5Shape:
    """What the peer must match, read from our job so that the two cannot drift apart."""
    source = job.spec.sources[0]
    count, maximum = job.spec.operator(FIRST_STAGE), job.spec.operator("max-bids")
    return sss_peer.Q5Shape(
        size_ms=count.window.size_ms, slide_ms=count.window.slide_ms, max_window_ms=maximum.window.size_ms,
        active_auctions=source.active_auctions, hot_auction_ratio=source.hot_auction_ratio,
        out_of_order_ms=source.out_of_order_ms,
    )


def run_ours(rate: float, duration_s: float) -> dict:
    from rich.console import Console

    from ..run import run_job

    return run_job(q5_job(rate), duration_s, console=Console(quiet=True))


def saturation(flood: dict) -> float:
    """Records/s the first stage took over a flood run."""
    return flood["operators"][FIRST_STAGE]["records_in"] / flood["duration_s"]


def p99_ratio(ours_p99: float | None, peer_p99: float | None) -> float | None:
    """ours / peer; None when either side has no measurement (no result rows in the measured half)."""
    if ours_p99 is None or not peer_p99:
        return None
    return ours_p99 / peer_p99


def at_rate(ours: dict, peer: dict) -> dict:
    """The keys of one rate: ours from a run_job report, the peer from sss_peer.measure_latency."""
    mine = ours["latency_second_half_ms"]
    theirs = percentiles(np.asarray(peer["latencies_ms"], dtype=np.float64))
    return {
        "ours_p50_ms": mine["p50_ms"], "ours_p99_ms": mine["p99_ms"],
        "peer_p50_ms": theirs["p50_ms"], "peer_p99_ms": theirs["p99_ms"],
        "p99_ratio": p99_ratio(mine["p99_ms"], theirs["p99_ms"]),
        "peer_samples": len(peer["latencies_ms"]),
        "peer_input_records_per_s": peer["input_records_per_s"],
        "peer_batches": peer["batches"],
        "peer_batch_p50_ms": peer["batch_p50_ms"],
    }


def verification_totals(reports: list[dict]) -> dict:
    """lost and duplicated summed over our runs; correct only if every run verified correct."""
    checks = [report.get("verification") or {} for report in reports]
    return {
        "lost": sum(check.get("lost") or 0 for check in checks),
        "duplicated": sum(check.get("duplicated") or 0 for check in checks),
        "correct": all(check.get("correct") is True for check in checks),
    }


def flink_peer():
    """flink_peer, or None when Flink is not installed (it lives in the optional `bench` extra)."""
    from . import flink_peer

    return flink_peer if flink_peer.installed() else None


def measure_peer(shape: sss_peer.Q5Shape, rates: list[float], duration_s: float, warm_up_s: float) -> list[dict]:
    # A fresh JVM with the peer's own options (our oracle has already started one in this process).
    return apart(sss_peer.measure_latencies, shape, rates, duration_s, CORES, warm_up_s)


def run(quick: bool) -> dict:
    flink = flink_peer()  # before minutes of runs: a missing flink_peer module fails now
    duration_s = 40.0 if quick else 120.0
    flood = run_ours(1e6, duration_s / 2)
    saturated = saturation(flood)
    half = saturated / 2
    light_run = run_ours(LIGHT_LOAD_RECORDS_PER_S, duration_s)
    half_run = run_ours(half, duration_s)
    shape = q5_shape(q5_job(half))
    peer_light, peer_half = measure_peer(shape, [LIGHT_LOAD_RECORDS_PER_S, half], duration_s, warm_up_s=duration_s / 4)
    result = {
        "cores": CORES,
        "run_s": duration_s,
        "records_per_s": LIGHT_LOAD_RECORDS_PER_S,
        **at_rate(light_run, peer_light),
        "at_half_saturation": {
            "records_per_s": half,
            "saturation_records_per_s": saturated,
            **at_rate(half_run, peer_half),
        },
        **verification_totals([flood, light_run, half_run]),
        "peer_query": sss_peer.PEER_QUERY,
        "peer_stateful_operators": peer_light["stateful_operators"],
        "peer_source": sss_peer.PEER_SOURCE,
    }
    if flink is None:
        result["flink"] = FLINK_MISSING
    else:
        result.update(flink.measure_latency(LIGHT_LOAD_RECORDS_PER_S, duration_s, shape))
        result["at_half_saturation"].update(flink.measure_latency(half, duration_s, shape))
    return result
