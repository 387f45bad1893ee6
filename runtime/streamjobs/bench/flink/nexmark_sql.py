"""`bench nexmark`'s Flink side: the nexmark project's own SQL (nexmark-flink's queries/qN.sql) over our events.

Text in, text out: nothing here needs Flink. The events are ours, written to a CSV
file (bench/nexmark.py), one row per event with its index `seq` first; the views
`person`, `auction` and `bid` are nexmark's (ddl_views.sql) over them, with the
columns our generator makes (no `extra`, `url`, `itemName`, `description` or
`creditCard`: the queries that select them select the others). Each query text is
nexmark's with its blackhole sink and only those columns left out. `customTime` is
the event time, with a watermark `outOfOrderMs` behind it, as our sources have.

A print sink gets the time (CURRENT_TIMESTAMP, per row) at which every
`step`-th event left the source: the progress a run is timed by.
"""

from __future__ import annotations

from collections.abc import Iterable

from .sql import FlinkJob, _print_sink, _with, epoch_ms

NEXMARK_COLUMNS = (  # in our generator's order (generators.NEXMARK_SCHEMA), after `seq`
    ("event_type", "INT"), ("person_id", "BIGINT"), ("person_name", "STRING"), ("person_email", "STRING"),
    ("person_city", "STRING"), ("person_state", "STRING"), ("auction_id", "BIGINT"), ("auction_seller", "BIGINT"),
    ("auction_category", "BIGINT"), ("auction_initial_bid", "BIGINT"), ("auction_reserve", "BIGINT"),
    ("auction_expires", "BIGINT"), ("bid_auction", "BIGINT"), ("bid_bidder", "BIGINT"), ("bid_price", "BIGINT"),
    ("bid_channel", "STRING"), ("event_time", "BIGINT"),
)
YSB_COLUMNS = (
    ("user_id", "STRING"), ("page_id", "STRING"), ("ad_id", "STRING"), ("ad_type", "STRING"),
    ("event_type", "STRING"), ("ip_address", "STRING"), ("event_time", "BIGINT"),
)

_VIEWS = (
    "CREATE TEMPORARY VIEW person AS SELECT person_id AS id, person_name AS name, person_email AS emailAddress, "
    "person_city AS city, person_state AS state, customTime FROM events WHERE event_type = 0",
    "CREATE TEMPORARY VIEW auction AS SELECT auction_id AS id, auction_initial_bid AS initialBid, "
    "auction_reserve AS reserve, customTime, TO_TIMESTAMP_LTZ(auction_expires, 3) AS expires, "
    "auction_seller AS seller, auction_category AS category FROM events WHERE event_type = 1",
    "CREATE TEMPORARY VIEW bid AS SELECT bid_auction AS auction, bid_bidder AS bidder, bid_price AS price, "
    "bid_channel AS channel, customTime FROM events WHERE event_type = 2",
)

# Per query: its sink's columns and its INSERT's SELECT, as nexmark writes them.
QUERIES: dict[str, tuple[str, str]] = {
    "q1": ("auction BIGINT, bidder BIGINT, price DECIMAL(23, 3), customTime TIMESTAMP_LTZ(3)",
           "SELECT auction, bidder, 0.908 * price as price, customTime FROM bid"),
    "q2": ("auction BIGINT, price BIGINT",
           "SELECT auction, price FROM bid WHERE MOD(auction, 123) = 0"),
    "q3": ("name VARCHAR, city VARCHAR, state VARCHAR, id BIGINT",
           "SELECT P.name, P.city, P.state, A.id FROM auction AS A INNER JOIN person AS P on A.seller = P.id "
           "WHERE A.category = 10 and (P.state = 'OR' OR P.state = 'ID' OR P.state = 'CA')"),
    "q4": ("id BIGINT, final BIGINT",
           "SELECT Q.category, AVG(Q.final) FROM (SELECT MAX(B.price) AS final, A.category FROM auction A, bid B "
           "WHERE A.id = B.auction AND B.customTime BETWEEN A.customTime AND A.expires GROUP BY A.id, A.category) Q "
           "GROUP BY Q.category"),
    "q5": ("auction BIGINT, num BIGINT",
           "SELECT AuctionBids.auction, AuctionBids.num FROM (SELECT auction, count(*) AS num, window_start AS "
           "starttime, window_end AS endtime FROM TABLE(HOP(TABLE bid, DESCRIPTOR(customTime), INTERVAL '2' SECOND, "
           "INTERVAL '10' SECOND)) GROUP BY auction, window_start, window_end) AS AuctionBids JOIN (SELECT "
           "max(CountBids.num) AS maxn, CountBids.starttime, CountBids.endtime FROM (SELECT count(*) AS num, "
           "window_start AS starttime, window_end AS endtime FROM TABLE(HOP(TABLE bid, DESCRIPTOR(customTime), "
           "INTERVAL '2' SECOND, INTERVAL '10' SECOND)) GROUP BY auction, window_start, window_end) AS CountBids "
           "GROUP BY CountBids.starttime, CountBids.endtime) AS MaxBids ON AuctionBids.starttime = MaxBids.starttime "
           "AND AuctionBids.endtime = MaxBids.endtime AND AuctionBids.num >= MaxBids.maxn"),
    # nexmark's own comment: "not supported yet in Flink SQL, because the OVER WINDOW operator doesn't support to
    # consume retractions". Run as written, so that the report says what Flink says.
    "q6": ("seller BIGINT, avg_price BIGINT",
           "SELECT Q.seller, AVG(Q.price) OVER (PARTITION BY Q.seller ORDER BY Q.customTime ROWS BETWEEN 10 PRECEDING "
           "AND CURRENT ROW) FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY A.id, A.seller ORDER BY B.price DESC) "
           "AS rownum FROM (SELECT A.id, A.seller, B.price, B.customTime FROM auction AS A, bid AS B WHERE "
           "A.id = B.auction and B.customTime between A.customTime and A.expires)) AS Q WHERE rownum <= 1"),
    "q7": ("auction BIGINT, bidder BIGINT, price BIGINT, customTime TIMESTAMP_LTZ(3)",
           "SELECT B.auction, B.bidder, B.price, B.customTime from bid B JOIN (SELECT MAX(price) AS maxprice, "
           "window_end as customTime FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(customTime), INTERVAL '10' SECOND)) "
           "GROUP BY window_start, window_end) B1 ON B.price = B1.maxprice WHERE B.customTime BETWEEN "
           "B1.customTime - INTERVAL '10' SECOND AND B1.customTime"),
    "q8": ("id BIGINT, name VARCHAR, stime TIMESTAMP(3)",
           "SELECT P.id, P.name, P.starttime FROM (SELECT id, name, window_start AS starttime, window_end AS endtime "
           "FROM TABLE(TUMBLE(TABLE person, DESCRIPTOR(customTime), INTERVAL '10' SECOND)) GROUP BY id, name, "
           "window_start, window_end) P JOIN (SELECT seller, window_start AS starttime, window_end AS endtime FROM "
           "TABLE(TUMBLE(TABLE auction, DESCRIPTOR(customTime), INTERVAL '10' SECOND)) GROUP BY seller, window_start, "
           "window_end) A ON P.id = A.seller AND P.starttime = A.starttime AND P.endtime = A.endtime"),
    # YSB (no nexmark text): views per campaign in 10 s windows. A regular join drops the time attribute a window
    # needs, so the views are counted per ad and window first and then summed per campaign, which gives the same
    # counts as joining first.
    "ysb": ("campaign_id STRING, window_end TIMESTAMP(3), view_count BIGINT",
            "SELECT c.campaign_id, v.window_end, SUM(v.view_count) FROM (SELECT ad_id, window_start, window_end, "
            "COUNT(*) AS view_count FROM TABLE(TUMBLE(TABLE ad_views, DESCRIPTOR(customTime), INTERVAL '10' SECOND)) "
            "GROUP BY ad_id, window_start, window_end) v JOIN campaigns c ON v.ad_id = c.ad_id "
            "GROUP BY c.campaign_id, v.window_end"),
}


def _csv(path: str) -> str:
    return _with({"connector": "filesystem", "path": path, "format": "csv", "csv.null-literal": ""})


def _events(path: str, columns: Iterable[tuple[str, str]], out_of_order_ms: int) -> str:
    typed = ",\n  ".join(f"{name} {kind}" for name, kind in columns)
    return (
        f"CREATE TEMPORARY TABLE events (\n  seq BIGINT,\n  {typed},\n"
        "  customTime AS TO_TIMESTAMP_LTZ(event_time, 3),\n"
        f"  WATERMARK FOR customTime AS customTime - INTERVAL '{out_of_order_ms / 1000:.3f}' SECOND\n"
        f") WITH ({_csv(path)})"
    )


def query_job(query: str, events_csv: str, out_of_order_ms: int, records: int, steps: int = 20,
              campaigns_csv: str | None = None) -> FlinkJob:
    """Query `query` (a key of QUERIES) over the events in `events_csv`, into a blackhole, with a progress probe
    every records/steps events."""
    if query not in QUERIES:
        raise ValueError(f"unknown query {query!r}: one of {', '.join(QUERIES)}")
    if records < steps:
        raise ValueError(f"records ({records}) must be >= steps ({steps})")
    columns, select = QUERIES[query]
    if query == "ysb":
        if campaigns_csv is None:
            raise ValueError("ysb needs the campaigns table (campaigns_csv)")
        ddl = (_events(events_csv, YSB_COLUMNS, out_of_order_ms),
               f"CREATE TEMPORARY TABLE campaigns (ad_id STRING, campaign_id STRING) WITH ({_csv(campaigns_csv)})",
               "CREATE TEMPORARY VIEW ad_views AS SELECT ad_id, customTime FROM events WHERE event_type = 'view'")
    else:
        ddl = (_events(events_csv, NEXMARK_COLUMNS, out_of_order_ms), *_VIEWS)
    sink = f"CREATE TEMPORARY TABLE nexmark_{query} ({columns}) WITH ('connector' = 'blackhole')"
    probe = _print_sink("progress", "seq BIGINT, seen TIMESTAMP_LTZ(3)")
    step = records // steps
    return FlinkJob(
        ddl=(*ddl, sink, probe),
        inserts=(f"INSERT INTO nexmark_{query} {select}",
                 f"INSERT INTO progress SELECT seq, CURRENT_TIMESTAMP FROM events WHERE MOD(seq, {step}) = 0"),
    )


def progress(rows: Iterable[list[str]]) -> list[tuple[int, int]]:
    """The probe's (events read, wall time in ms) points, in order: `seq` s is the (s + 1)-th event."""
    return sorted((int(seq) + 1, epoch_ms(seen)) for seq, seen in rows)
