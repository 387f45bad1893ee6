"""Which input columns a stage sends to Spark: those its SQL may read, every one where it cannot tell."""

from __future__ import annotations

import pytest
from streamjobs_worker.stages.base import mentioned

NAMES = ["auction", "bid_price", "event_time", "_ingest_ms", "x$y", "Bidder"]


@pytest.mark.parametrize(("sql", "kept"), [
    ("SELECT auction, bid_price * 0.908 AS eur FROM input", ["auction", "bid_price"]),  # a product, not a star
    ("SELECT `auction`, BIDDER FROM input WHERE event_time > 0", ["auction", "event_time", "Bidder"]),
    ("SELECT auction, count(*) AS n FROM input GROUP BY auction", ["auction"]),
    ("SELECT auctions, x$y FROM input", ["x$y"]),  # a longer name is not the column
    ("SELECT count( * ) FROM input", ["auction"]),  # none named: one column keeps the rows' count
    ("SELECT 'bid_price' AS label, auction FROM input", ["auction", "bid_price"]),  # a literal costs a column
])
def test_a_query_sends_the_columns_it_names(sql, kept):
    assert mentioned(NAMES, sql) == [name for name in NAMES if name in kept]


@pytest.mark.parametrize("sql", [
    "SELECT * FROM input",
    "select\n  *\nfrom input",
    "SELECT DISTINCT * FROM input",
    "SELECT i.* FROM input i",
    "SELECT to_json(struct(*)) AS doc FROM input",
    "SELECT auction FROM bids NATURAL JOIN people",
    "SELECT auction FROM bids JOIN people USING (auction)",
    "SELECT -- every column\n * FROM input",
    "SELECT /* every column */ * FROM input",
    "SELECT auction FROM input -- a comment anywhere",
])
def test_a_query_that_may_read_unnamed_columns_gets_them_all(sql):
    assert mentioned(NAMES, sql) == NAMES


def test_columns_kept_whatever_the_text_says():
    assert mentioned(NAMES, "bid_price > 10", also={"event_time"}) == ["bid_price", "event_time"]
