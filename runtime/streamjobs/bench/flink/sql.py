"""The Flink SQL of the benchmark peers, and the reading of what their print sinks write.

Text in, numbers out: nothing here needs Flink, so unit tests check it without the `bench` extra.

Rows that must be timed go to Flink's `print` connector, which writes each to the
JVM's stdout as `<PRINT_ID>[:subtask]> +I[v1, v2, ...]`. Each carries
CURRENT_TIMESTAMP, which Flink's streaming mode evaluates per row in the operator
that emits it, the sink being chained to that operator: the time the row reaches
its sink. Session time zone UTC, so window bounds (TIMESTAMP) print as UTC.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

PRINT_ID = "streamjobs"
# datagen paces at 10,000 rows/s unless told otherwise; a saturation run must not be paced.
UNPACED_ROWS_PER_S = 1_000_000_000
THROUGHPUT_WATERMARK_DELAY_MS = 200
# The rows of one event-time second in the Spark Structured Streaming peer (rowsPerBatch per 1 s).
THROUGHPUT_ROWS_PER_EVENT_S = 200_000
PROBE_WORD = "w0"
RESTART_WINDOW_MS = 60_000
RESTART_WATERMARK_DELAY_MS = 100
# Rows a restart run prints per window: enough that the earliest is the window's first output.
RESTART_PRINTED_PER_WINDOW = 1000
# NEXMark's event mix (core/streamjobs_core/generators.py): of every 50 events 1 person,
# 3 auctions (so auction ids advance at 3/50 of the rate), then 46 bids; hot auctions
# are the newest id that is a multiple of the stride; a draw in thousandths picks hot bids.
_CYCLE, _AUCTIONS_PER_CYCLE, _FIRST_BID_PHASE = 50, 3, 4
_HOT_STRIDE = 100
_FIRST_ID = 1000
_PER_MILLE = 1000
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class PacedSource:
    """`rows` rows, `rows_per_s` a second in all, each released when due (Flink's DataGeneratorSource and its
    rate limiter), as a view of one constant BOOLEAN column f0 and an event-time column computed as they flow."""

    view: str
    rows_per_s: float
    rows: int
    event_time: str  # SQL, TIMESTAMP_LTZ(3)
    watermark: str  # SQL over event_time

    def __post_init__(self) -> None:
        if self.rows_per_s <= 0 or not 1 <= self.rows < 2**31:
            raise ValueError(f"a paced source needs rows_per_s > 0 and rows in [1, 2^31), got {self.rows_per_s} "
                             f"and {self.rows}")


@dataclass(frozen=True)
class FlinkJob:
    """DDL to run one statement at a time, then INSERTs submitted together as one job (a statement set)."""

    ddl: tuple[str, ...]
    inserts: tuple[str, ...]
    paced: PacedSource | None = None  # registered before the DDL


def _with(options: dict[str, object]) -> str:
    return ", ".join(f"'{key}' = '{value}'" for key, value in options.items())


def _interval(ms: int) -> str:
    return f"INTERVAL '{ms / 1000:.3f}' SECOND"


def _print_sink(name: str, columns: str) -> str:
    return f"CREATE TEMPORARY TABLE {name} ({columns}) WITH ({_with({'connector': 'print', 'print-identifier': PRINT_ID})})"


# --- throughput ---------------------------------------------------------------


def throughput_job(records: int, vocabulary: int) -> FlinkJob:
    """`bench throughput`'s query: a keyed 1 s tumbling event-time count per word, into a blackhole.

    Row v is word 'w' || (v % vocabulary) at event time v / 200k s, as the SSS peer's
    rate-micro-batch source (200k rows per second of event time). A second sink gets
    one word's count per window with the time it fired: the job's progress, read
    from inside it. Its filter reads the count as well as the word, so the planner
    cannot push it below the aggregation: both sinks share the one aggregation.
    """
    if records < 1 or vocabulary < 1:
        raise ValueError(f"records ({records}) and vocabulary ({vocabulary}) must be >= 1")
    source = (
        "CREATE TEMPORARY TABLE words (\n"
        "  v BIGINT,\n"
        f"  word AS CONCAT('w', CAST(MOD(v, {vocabulary}) AS STRING)),\n"
        f"  event_time AS TO_TIMESTAMP_LTZ(v * 1000 / {THROUGHPUT_ROWS_PER_EVENT_S}, 3),\n"
        f"  WATERMARK FOR event_time AS event_time - {_interval(THROUGHPUT_WATERMARK_DELAY_MS)}\n"
        ") WITH (" + _with({
            "connector": "datagen", "rows-per-second": UNPACED_ROWS_PER_S,
            "fields.v.kind": "sequence", "fields.v.start": 0, "fields.v.end": records - 1,
        }) + ")"
    )
    counts = (
        "CREATE TEMPORARY VIEW counts AS\n"
        "SELECT word, window_start, window_end, COUNT(*) AS n\n"
        "FROM TABLE(TUMBLE(TABLE words, DESCRIPTOR(event_time), INTERVAL '1' SECOND))\n"
        "GROUP BY word, window_start, window_end"
    )
    sink = ("CREATE TEMPORARY TABLE counts_sink (word STRING, window_start TIMESTAMP(3), window_end TIMESTAMP(3), "
            "n BIGINT) WITH ('connector' = 'blackhole')")
    probe = _print_sink("progress", "window_end TIMESTAMP(3), fired TIMESTAMP_LTZ(3)")
    return FlinkJob(
        ddl=(source, counts, sink, probe),
        inserts=(
            "INSERT INTO counts_sink SELECT word, window_start, window_end, n FROM counts",
            "INSERT INTO progress SELECT window_end, CURRENT_TIMESTAMP FROM counts\n"
            f"WHERE CONCAT(word, '@', CAST(n AS STRING)) LIKE '{PROBE_WORD}@%'",
        ),
    )


@dataclass(frozen=True)
class SteadyRate:
    records: int
    seconds: float
    start_ms: int  # the wall time (ms since the epoch) the measured stretch begins and ends at
    end_ms: int

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds


def steady_rate(firings: Iterable[tuple[int, int]], records: int, skip_fraction: float = 0.25) -> SteadyRate:
    """Records/s between window firings (window_end_ms, fired_ms) of a throughput run, start excluded.

    Window k fires once the source has read up to ~(k+1) s of event time plus the
    watermark delay, so the event time between two firings over their wall time is
    the rate, free of the job's start (JVM, deployment, datagen filling its
    sequence). Left out: the first `skip_fraction` of windows (JIT warm-up) and the
    windows that fired at the end of input (on the final watermark, not the pace).
    """
    last_event_ms = (records - 1) * 1000 // THROUGHPUT_ROWS_PER_EVENT_S
    paced = sorted((end, fired) for end, fired in firings if end + THROUGHPUT_WATERMARK_DELAY_MS <= last_event_ms)
    kept = paced[math.floor(len(paced) * skip_fraction):]
    if len(kept) < 2 or kept[-1][1] <= kept[0][1]:
        raise ValueError(f"{len(paced)} windows fired before the end of input: too few to time; "
                         f"give more than {records} records")
    (first_end, first_fired), (last_end, last_fired) = kept[0], kept[-1]
    measured = (last_end - first_end) * THROUGHPUT_ROWS_PER_EVENT_S // 1000
    return SteadyRate(records=measured, seconds=(last_fired - first_fired) / 1000, start_ms=first_fired,
                      end_ms=last_fired)


# --- latency: NEXMark Q5 --------------------------------------------------------


def q5_job(shape, rate: float, t0_s: int, rows: int) -> FlinkJob:
    """NEXMark Q5 as examples/nexmark-q5.yaml: sliding count of bids per auction, the max per window end, and
    the counts that reach it (nexmark's q5.sql joins the counts with their maximum the same way, on `num >= maxn`;
    its maximum is a regular aggregation, whose retractions a print sink would show as rows of their own).

    `shape` is bench/sss_peer.py's Q5Shape, read from our job. `rows` events at
    `rate` a second, paced one by one (a PacedSource: datagen's SQL connector
    would release each second's rows in one burst, which alone adds up to 1 s of
    latency). An event's time is the wall clock when it is generated minus a
    uniform draw of 0..out_of_order_ms, so a result's emission time minus its window
    end is its latency. The mix approximates our nexmark generator: 46 of 50 events
    are bids; auction ids advance at 3/50 of the rate from `t0_s` (seconds since
    the epoch); a bid goes with probability `hot_auction_ratio` to the newest id
    that is a multiple of min(100, active_auctions), else uniformly to one of the
    `active_auctions` newest. Unlike ours, draws are random, not a hash of the
    record's index, and auction ids follow event time, not the record's index.
    """
    rate_int = round(rate)
    if rate_int < 1:
        raise ValueError(f"rate must be >= 1 record/s, got {rate}")
    ticks = PacedSource(
        view="ticks", rows_per_s=rate, rows=rows,
        event_time=f"CURRENT_TIMESTAMP - RAND_INTEGER({shape.out_of_order_ms + 1}) * INTERVAL '0.001' SECOND",
        watermark=f"event_time - {_interval(shape.out_of_order_ms)}",
    )
    events = (
        "CREATE TEMPORARY VIEW events AS\n"
        f"SELECT RAND_INTEGER({_CYCLE}) AS phase, RAND_INTEGER({_PER_MILLE}) AS hot, "
        f"RAND_INTEGER({shape.active_auctions}) AS pick, event_time FROM ticks"
    )
    # ms since t0: whole seconds (TIMESTAMPDIFF) plus the event's millisecond, t0 being a whole second.
    elapsed_ms = (f"(CAST(TIMESTAMPDIFF(SECOND, TO_TIMESTAMP_LTZ({t0_s}, 0), event_time) AS BIGINT) * 1000"
                  " + EXTRACT(MILLISECOND FROM event_time))")
    newest = f"{elapsed_ms} * {_AUCTIONS_PER_CYCLE * rate_int} / {_CYCLE * 1000}"
    stride = min(_HOT_STRIDE, shape.active_auctions)
    hot_share = round(shape.hot_auction_ratio * _PER_MILLE)
    bids = (
        "CREATE TEMPORARY VIEW bids AS\n"
        f"SELECT {_FIRST_ID} + CASE WHEN hot < {hot_share} THEN newest / {stride} * {stride}\n"
        "                           ELSE GREATEST(newest - pick, 0) END AS bid_auction, event_time\n"
        f"FROM (SELECT hot, pick, event_time, {newest} AS newest FROM events WHERE phase >= {_FIRST_BID_PHASE})"
    )
    per_auction = (
        "CREATE TEMPORARY VIEW bids_per_auction AS\n"
        "SELECT bid_auction, window_end AS slide_end, window_time AS slide_time, COUNT(*) AS bids\n"
        f"FROM TABLE(HOP(TABLE bids, DESCRIPTOR(event_time), {_interval(shape.slide_ms)}, {_interval(shape.size_ms)}))\n"
        "GROUP BY bid_auction, window_start, window_end, window_time"
    )
    sink = _print_sink("hot_items", "window_end TIMESTAMP(3), auction BIGINT, num BIGINT, emitted TIMESTAMP_LTZ(3)")
    # slide_time is the sliding window's end - 1 ms: the tumbling window holding it ends at that same end.
    hottest = (
        "INSERT INTO hot_items\n"
        "SELECT A.slide_end, A.bid_auction, A.bids, CURRENT_TIMESTAMP\n"
        "FROM bids_per_auction AS A JOIN (\n"
        "  SELECT window_end AS max_end, MAX(bids) AS maxn\n"
        f"  FROM TABLE(TUMBLE(TABLE bids_per_auction, DESCRIPTOR(slide_time), {_interval(shape.max_window_ms)}))\n"
        "  GROUP BY window_start, window_end) AS M\n"
        "ON A.slide_end = M.max_end AND A.bids >= M.maxn"
    )
    return FlinkJob(ddl=(events, bids, per_auction, sink), inserts=(hottest,), paced=ticks)


def q5_latencies_ms(rows: Iterable[list[str]], since_ms: int) -> list[int]:
    """Emission minus window end of the Q5 results (window_end, auction, num, emitted) whose window ends at or after
    since_ms."""
    latencies = []
    for window_end, _auction, _num, emitted in rows:
        end = epoch_ms(window_end)
        if end >= since_ms:
            latencies.append(epoch_ms(emitted) - end)
    return latencies


# --- restart: stop with a savepoint, restore at another parallelism ----------------------


def restart_job(keys: int, rows_per_s: int, fire_at_ms: int) -> FlinkJob:
    """A keyed 60 s tumbling event-time count over `keys` keys, its windows ending at fire_at_ms (mod 60 s).

    Event time is the wall clock when a row is generated, so the window open when
    the job stops holds every key seen since it opened, and fires once the restored
    job's watermark passes fire_at_ms. The print sink gets ~RESTART_PRINTED_PER_WINDOW
    rows per window; the filter reads the count, so the planner cannot push it below
    the aggregation (it would keep state for the printed keys only).
    """
    if keys < 1 or rows_per_s < 1:
        raise ValueError(f"keys ({keys}) and rows_per_s ({rows_per_s}) must be >= 1")
    offset_ms = fire_at_ms % RESTART_WINDOW_MS
    source = (
        "CREATE TEMPORARY TABLE keyed (\n"
        "  k BIGINT, event_time TIMESTAMP_LTZ(3),\n"
        f"  WATERMARK FOR event_time AS event_time - {_interval(RESTART_WATERMARK_DELAY_MS)}\n"
        ") WITH (" + _with({
            "connector": "datagen", "rows-per-second": rows_per_s,
            "fields.k.min": 0, "fields.k.max": keys - 1, "fields.event_time.max-past": "0 ms",
        }) + ")"
    )
    sink = _print_sink("window_counts", "k BIGINT, window_end TIMESTAMP(3), n BIGINT, emitted TIMESTAMP_LTZ(3)")
    every = max(1, keys // RESTART_PRINTED_PER_WINDOW)
    insert = (
        "INSERT INTO window_counts\n"
        "SELECT k, window_end, n, CURRENT_TIMESTAMP FROM (\n"
        "  SELECT k, window_start, window_end, COUNT(*) AS n\n"
        f"  FROM TABLE(TUMBLE(TABLE keyed, DESCRIPTOR(event_time), {_interval(RESTART_WINDOW_MS)}, "
        f"{_interval(offset_ms)}))\n"
        "  GROUP BY k, window_start, window_end\n"
        f") WHERE MOD(k + n, {every}) = 0"
    )
    return FlinkJob(ddl=(source, sink), inserts=(insert,))


def next_window_end_ms(window_end_ms: int, not_before_ms: int) -> int:
    """The first end of restart_job's windows (every RESTART_WINDOW_MS from window_end_ms) at or after not_before_ms."""
    behind = max(0, not_before_ms - window_end_ms)
    return window_end_ms + math.ceil(behind / RESTART_WINDOW_MS) * RESTART_WINDOW_MS


def first_output_ms(rows: Iterable[list[str]], window_end_ms: int) -> int | None:
    """The earliest emission among restart-run rows (k, window_end, n, emitted) of the window ending at window_end_ms."""
    times = [epoch_ms(emitted) for _k, end, _n, emitted in rows if epoch_ms(end) == window_end_ms]
    return min(times, default=None)


# --- print sink output ----------------------------------------------------------


def print_rows(lines: Iterable[str]) -> list[list[str]]:
    """The values of the inserted rows in our print sinks' lines; other lines (the JVM's own) are skipped."""
    rows = []
    for line in lines:
        prefix, sep, row = line.strip().partition("> ")
        if not sep or prefix.split(":")[0] != PRINT_ID:
            continue
        if not (row.startswith("+I[") and row.endswith("]")):
            raise ValueError(f"print sink line is not an insert row: {line!r}")
        rows.append(row[3:-1].split(", "))
    return rows


def epoch_ms(text: str) -> int:
    """Milliseconds since the epoch of a printed TIMESTAMP (UTC, the session's zone) or TIMESTAMP_LTZ ('...Z')."""
    moment = datetime.fromisoformat(text)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return (moment - _EPOCH) // timedelta(milliseconds=1)
