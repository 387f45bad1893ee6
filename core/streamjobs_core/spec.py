"""The StreamJob spec model: the single source of truth for a job.

The same document is read by `streamjobs run` and, as a custom resource, by the
Kubernetes operator; the CRD schema in crds/ is generated from these classes.
Field names are camelCase, as Kubernetes users expect them in YAML.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

API_GROUP = "streamjobs.dev"
API_VERSION = f"{API_GROUP}/v1alpha1"
KIND = "StreamJob"

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_FUNCTION_REF = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class _Model(BaseModel):
    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        alias_generator=to_camel,
        populate_by_name=True,
    )


# Control events every instance answers without a spec entry (the worker's controlhandlers.py).
BUILT_IN_HANDLERS = ("load", "state")
_HANDLER_NAME = re.compile(r"^[a-z][a-z0-9_-]*$")
# A map in YAML, kept as sorted pairs: the spec is frozen and hashable.
HandlerRefs = Annotated[
    tuple[tuple[str, str], ...],
    BeforeValidator(lambda value: tuple(sorted(value.items())) if isinstance(value, dict) else value),
    PlainSerializer(dict, return_type=dict[str, str]),
    WithJsonSchema({"type": "object", "additionalProperties": {"type": "string"}}),
]


def _dns_label(value: str) -> str:
    if len(value) > 40 or not _DNS_LABEL.match(value):
        raise ValueError("must be a lowercase DNS label of at most 40 characters ([a-z0-9-])")
    return value


def _function_ref(value: str) -> str:
    if not _FUNCTION_REF.match(value):
        raise ValueError("must name an importable function as 'package.module:function'")
    return value


# --- load profiles ---------------------------------------------------------


class RateStep(_Model):
    at_s: float = Field(ge=0, description="Seconds after the job start at which this rate begins.")
    records_per_second: float = Field(gt=0)


class RateProfile(_Model):
    """Offered load of a generator source, in records per second (all partitions)."""

    profile: Literal["constant", "steps", "sine", "spike"] = "constant"
    records_per_second: float = Field(
        1000.0, gt=0, description="Constant rate; the initial rate (steps); the mean (sine); the base (spike)."
    )
    steps: tuple[RateStep, ...] = Field((), description="For profile=steps: rate changes, in time order.")
    amplitude: float = Field(0.0, ge=0, description="For profile=sine: records/s above and below the mean.")
    period_s: float = Field(60.0, gt=0, description="For profile=sine: period of the wave.")
    spike_records_per_second: float = Field(0.0, ge=0, description="For profile=spike: rate during the spike.")
    spike_at_s: float = Field(0.0, ge=0)
    spike_duration_s: float = Field(0.0, ge=0)

    @model_validator(mode="after")
    def _check_profile(self) -> RateProfile:
        if self.profile == "steps":
            if not self.steps:
                raise ValueError("profile 'steps' needs at least one entry in steps")
            times = [step.at_s for step in self.steps]
            if times != sorted(times):
                raise ValueError("steps must be in increasing atS order")
        if self.profile == "sine" and self.amplitude > self.records_per_second:
            raise ValueError("amplitude may not exceed recordsPerSecond (the rate would go negative)")
        if self.profile == "spike" and (self.spike_records_per_second <= 0 or self.spike_duration_s <= 0):
            raise ValueError("profile 'spike' needs spikeRecordsPerSecond > 0 and spikeDurationS > 0")
        return self


# --- sources ---------------------------------------------------------------


class _Operator(_Model):
    name: str = Field(description="Unique operator name (DNS label).")
    parallelism: int = Field(1, ge=1, description="Number of instances.")
    chain: bool = Field(
        True, description="Run in one worker with the operator before and after it where the edge between them "
        "is forward (same parallelism, no keyBy, one consumer, one input): no Redis hop and no second batch "
        "between them (Flink's operator chaining). false keeps this operator in its own workers.",
    )

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        return _dns_label(value)


class LoadShedding(_Model):
    """Shed at the source while its backlog is over a bound: counted in metrics, logged per batch in the
    job's shed stream and reported; off unless set."""

    max_backlog_records: int = Field(
        ge=1, description="Shed while more records than this are due at the source and not yet emitted."
    )
    fraction: float = Field(0.5, gt=0, le=1, description="Share of each batch dropped while shedding.")
    priority_field: str | None = Field(
        None, description="Drop the records with the lowest values of this column first (nulls lowest; a "
        "redis_stream source's field is read as a number, a missing or non-numeric value lowest); default: a "
        "random choice.",
    )


class _GeneratorSource(_Operator):
    seed: int = 42
    rate: RateProfile = RateProfile()
    out_of_order_ms: int = Field(
        0, ge=0, le=60_000, description="Event times lag emission by up to this bound; also the watermark delay."
    )
    total_records: int | None = Field(None, ge=1, description="Stop after this many records (all partitions).")
    load_shedding: LoadShedding | None = None

    @model_validator(mode="after")
    def _priority_column(self) -> _GeneratorSource:
        field = self.load_shedding.priority_field if self.load_shedding else None
        if field is not None:
            from .generators import schema  # generators builds on this module's source types

            if field not in schema(self).names:
                raise ValueError(f"loadShedding.priorityField: {self.type} records have no column {field!r} "
                                 f"(they have {', '.join(schema(self).names)})")
        return self


class NexmarkSource(_GeneratorSource):
    """Deterministic NEXMark events: persons, auctions and bids in the 1:3:46 proportions."""

    type: Literal["nexmark"]
    hot_auction_ratio: float = Field(0.5, ge=0, le=1, description="Share of bids that go to a few hot auctions.")
    active_auctions: int = Field(1000, ge=1, description="Bids pick among this many most recent auctions.")


class YsbSource(_GeneratorSource):
    """Deterministic ad events of the Yahoo Streaming Benchmark: views, clicks and purchases of ads."""

    # The benchmark's generator (yahoo/streaming-benchmarks): 100 campaigns of 10 ads, events spread evenly
    # over ads, ad types and the three event types; ad i belongs to campaign i // adsPerCampaign.
    type: Literal["ysb"]
    campaigns: int = Field(100, ge=1)
    ads_per_campaign: int = Field(10, ge=1)


class ZipfSource(_GeneratorSource):
    """Deterministic skewed words: column `word`, ranks drawn from a Zipf law."""

    type: Literal["zipf"]
    vocabulary: int = Field(1000, ge=1)
    exponent: float = Field(1.1, gt=0)


class InputRetention(_Model):
    """How long a redis_stream source keeps the input entries it consumed; entries not consumed yet are
    never trimmed. Trims go into the commit that consumed the entries (or a later one), fenced like it."""

    mode: Literal["time", "trim"] = Field(
        "time", description="time: keep consumed entries `ms` after the commit that consumed them (long enough for "
        "a run's verification to read its input back, and for an entry a dead letter names to be looked up); "
        "trim: remove them in that commit (least memory; such a run cannot be verified).",
    )
    ms: int | None = Field(
        None, ge=0, description="mode time: how long consumed entries are kept after their commit (default 600000, "
        "10 minutes).",
    )

    @model_validator(mode="after")
    def _ms_for_time_only(self) -> InputRetention:
        if self.mode == "trim" and self.ms is not None:
            raise ValueError("ms applies to mode 'time' only (mode 'trim' keeps nothing it consumed)")
        return self

    @property
    def keep_ms(self) -> int:
        """How long consumed entries stay after their commit; 0: trimmed in it."""
        return 0 if self.mode == "trim" else 600_000 if self.ms is None else self.ms


# Event times a record may carry: ms since the epoch that Spark's microsecond timestamps hold with room for
# window arithmetic (about +-285,000 years).
MIN_EVENT_TIME = -(2**53)
MAX_EVENT_TIME = 2**53


class InputLimits(_Model):
    """Bounds on what producers may send a redis_stream source. What passes one is dead-lettered with the bound
    named (and the entry's ID, so the original can be looked up while the retention keeps it), never read whole
    or decoded whole; the rest of the input goes on."""

    max_entry_bytes: int = Field(
        32 * 2**20, ge=1, description="An entry whose field names and values add up to more bytes is dead-lettered "
        "unread (32 MiB by default).",
    )
    max_payload_rows: int = Field(
        1_000_000, ge=1, description="format arrow: a payload of more rows is dead-lettered undecoded.",
    )
    max_payload_bytes: int = Field(
        256 * 2**20, ge=1, description="format arrow: a payload whose buffers decompress to more bytes is "
        "dead-lettered undecoded (a compression bomb never reaches memory; 256 MiB by default).",
    )
    max_future_skew_ms: int | None = Field(
        300_000, ge=0, description="eventTimeField: a record stamped more than this ahead of its entry ID's time "
        "(when it was XADDed) is dead-lettered and moves no watermark (5 minutes by default, as Kafka bounds "
        "timestamps ahead of the broker's clock); null: no bound.",
    )


class RedisStreamSource(_Operator):
    """Records that external producers XADD to `sj:{job}:in:<name>:<partition>`."""

    type: Literal["redis_stream"]
    partitions: int = Field(1, ge=1, le=4096, description="Number of input streams producers spread over.")
    format: Literal["fields", "json", "arrow"] = Field(
        "fields", description="fields: one entry field per column; json: one field (payloadField) holding a JSON "
        "object per entry; arrow: one field (payloadField) holding an Arrow IPC stream of many records.",
    )
    schema_: str | None = Field(
        None, alias="schema", description="Spark DDL of the records' columns, e.g. 'user string, amount double, ts "
        "bigint' (string, boolean, tinyint, smallint, int, bigint, float, double): the columns are typed and a "
        "record whose value does not parse is dead-lettered with its field named; a missing field is null. "
        "Required for json and arrow; without it a fields entry becomes string columns, one per field name.",
    )
    payload_field: str | None = Field(
        None, min_length=1, description="json and arrow: the entry field holding the payload (default 'data')."
    )
    event_time_field: str | None = Field(
        None, description="Field holding event time in ms (an integer column of the schema, if one is declared); "
        "default: the time in the entry's ID, i.e. when the record was XADDed (auto IDs).",
    )
    out_of_order_ms: int = Field(0, ge=0, le=60_000)
    load_shedding: LoadShedding | None = None
    retention: InputRetention = InputRetention()
    limits: InputLimits = InputLimits()

    @field_validator("schema_")
    @classmethod
    def _check_schema(cls, value: str | None) -> str | None:
        if value is not None:
            from . import ddl

            reserved = [f.name for f in ddl.parse(value) if f.name == "event_time" or f.name.startswith("_")]
            if reserved:
                raise ValueError(f"column {reserved[0]!r} is reserved (event_time and names starting with _ are "
                                 "added by the source)")
        return value

    @model_validator(mode="after")
    def _schema_covers_fields(self) -> RedisStreamSource:
        if self.format != "fields" and self.schema_ is None:
            raise ValueError(f"format {self.format!r} needs a schema")
        if self.format == "fields" and self.payload_field is not None:
            raise ValueError("payloadField applies to formats json and arrow only")
        if self.schema_ is None:
            return self
        import pyarrow as pa

        from . import ddl

        schema = ddl.parse(self.schema_)
        time_field = self.event_time_field
        if time_field is not None and (time_field not in schema.names
                                       or not pa.types.is_integer(schema.field(time_field).type)):
            raise ValueError(f"eventTimeField {time_field!r} must be an integer column of the schema (ms)")
        priority = self.load_shedding.priority_field if self.load_shedding else None
        if priority is not None and priority not in schema.names:
            raise ValueError(f"loadShedding.priorityField: the schema has no column {priority!r}")
        return self

    @property
    def payload(self) -> str:
        """The entry field holding a json or arrow payload."""
        return self.payload_field or "data"


Source = Annotated[NexmarkSource | ZipfSource | YsbSource | RedisStreamSource, Field(discriminator="type")]


# --- stages ----------------------------------------------------------------


class _Consumer(_Operator):
    """An operator that reads upstream operators' output: a stage or a sink."""

    inputs: tuple[str, ...] = Field(min_length=1, description="Names of upstream sources or stages.")
    simulated_cost_us: float = Field(
        0.0, ge=0, description="Sleep this long per record (capacity experiments on few cores)."
    )


class _Stage(_Consumer):
    key_by: str | None = Field(None, description="Column whose value routes a record to its key group.")
    where: str | None = Field(None, description="Spark SQL predicate; only matching input records reach the stage.")
    on_error: Literal["dead_letter", "fail"] = Field(
        "dead_letter", description="When the stage fails on a batch (a user function raises, Spark refuses a "
        "cast): dead_letter finds the records it fails on alone (from Spark's error in one pass, else by group "
        "testing), sends them to the job's dead-letter stream with the error and processes the rest; fail stops "
        "the worker (it restarts and fails again until the stage or its input is fixed).",
    )


class SqlStage(_Stage):
    """A Spark SQL SELECT over the micro-batch, visible as view `input` (and as each input's name)."""

    type: Literal["sql"]
    query: str = Field(min_length=1)

    @field_validator("query")
    @classmethod
    def _select_only(cls, value: str) -> str:
        if not value.lstrip().lower().startswith(("select", "with")):
            raise ValueError("must be a SELECT (or WITH ... SELECT) query")
        return value


class PySparkStage(_Stage):
    """A user function DataFrame -> DataFrame from a module importable in the worker image."""

    type: Literal["pyspark"]
    function: str

    @field_validator("function")
    @classmethod
    def _check_function(cls, value: str) -> str:
        return _function_ref(value)


class Aggregation(_Model):
    function: Literal["count", "sum", "avg", "min", "max"]
    column: str | None = Field(None, description="Input column; not used by count.")
    as_: str = Field(alias="as", description="Output column name.")

    @model_validator(mode="after")
    def _column_needed(self) -> Aggregation:
        if self.function != "count" and not self.column:
            raise ValueError(f"aggregation '{self.function}' needs a column")
        if not _IDENTIFIER.match(self.as_):
            raise ValueError("'as' must be an identifier")
        return self


class Window(_Model):
    type: Literal["tumbling", "sliding"] = "tumbling"
    size_ms: int = Field(ge=1)
    slide_ms: int | None = Field(None, ge=1, description="For sliding windows; must divide sizeMs.")

    @model_validator(mode="after")
    def _slide(self) -> Window:
        if self.type == "sliding":
            if self.slide_ms is None:
                raise ValueError("a sliding window needs slideMs")
            if self.size_ms % self.slide_ms:
                raise ValueError("slideMs must divide sizeMs")
        elif self.slide_ms is not None:
            raise ValueError("slideMs is only for sliding windows")
        return self

    @property
    def step_ms(self) -> int:
        return self.slide_ms or self.size_ms


class WindowAggregateStage(_Stage):
    """Keyed event-time windows; a window fires once its end plus the allowed lateness is under the watermark."""

    type: Literal["window_aggregate"]
    window: Window
    aggregations: tuple[Aggregation, ...] = Field(min_length=1)
    allowed_lateness_ms: int = Field(0, ge=0)

    @model_validator(mode="after")
    def _distinct_output_columns(self) -> WindowAggregateStage:
        names = [self.key_by, "window_start", "window_end", "event_time", *(a.as_ for a in self.aggregations)]
        clashes = sorted({n for n in names if n is not None and names.count(n) > 1})
        if clashes:
            raise ValueError(f"output columns clash: {', '.join(clashes)} (keyBy, window_start, window_end, "
                             "event_time and each aggregation's 'as' must differ)")
        return self


class StatefulStage(_Stage):
    """A user function over the batch and the state of its keys, returning output and new state."""

    type: Literal["stateful"]
    function: str
    state_schema: str = Field(min_length=1, description="Spark DDL of the state columns, e.g. 'seen long'.")
    outputs: Literal["per_batch", "per_record"] = Field(
        "per_batch", description="per_record: the rows the function emits for a record do not depend on which "
        "other records share its batch (e.g. one row per record, or per key first seen), so a run's output can be "
        "checked against the function run once over all input; per_batch: they may (e.g. one row per key and "
        "batch), and a run's verification checks the final state per key instead.",
    )

    @field_validator("function")
    @classmethod
    def _check_function(cls, value: str) -> str:
        return _function_ref(value)


class OverStage(_Stage):
    """Each record with aggregates over the last `rows` records of its key (itself included), in event time."""

    # SQL's ROWS BETWEEN rows - 1 PRECEDING AND CURRENT ROW (Flink's bounded OVER aggregation): records wait
    # until the watermark passes them, then go out in (orderBy) order, so the result does not depend on
    # arrival order; a record behind the watermark is late, dropped and counted.
    type: Literal["over"]
    rows: int = Field(ge=1, description="How many records, the current one included, each aggregate covers.")
    order_by: tuple[str, ...] = Field(
        ("event_time",), min_length=1, description="The order of a key's records: event_time first, then "
        "columns that break its ties (records tied on all of them come in no fixed order).")
    aggregations: tuple[Aggregation, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _ordered_by_time(self) -> OverStage:
        if self.order_by[0] != "event_time":
            raise ValueError(f"orderBy: records are ordered by event_time first, not {self.order_by[0]!r}")
        bad = [c for c in self.order_by if not _IDENTIFIER.match(c)]
        if bad:
            raise ValueError(f"orderBy: not an identifier: {', '.join(bad)}")
        return self


class LookupTable(_Model):
    """Where a lookup stage's table lives: a Redis hash per row, or a Parquet file or directory."""

    redis_key_prefix: str | None = Field(
        None, description="Rows are the Redis hashes named this prefix plus the row's key (in the job's Redis); "
        "their fields are the table's columns. Users may change them while the job runs (see refreshMs).")
    parquet_path: str | None = Field(None, description="A Parquet file or directory readable by every worker.")
    key: str = Field(description="The table's key column (for Redis: the name given to the part of the hash's "
                     "name after the prefix).")
    schema_: str | None = Field(
        None, alias="schema", description="Spark DDL of the columns taken from Redis hashes, e.g. 'campaign_id "
        "string, budget double' (hash fields are strings, cast to these types; default: all strings). Parquet "
        "files carry their own.")
    refresh_ms: int = Field(
        0, ge=0, description="Load the table again when it is older than this at a batch (0: once, when the "
        "worker starts). Each record is enriched with the table as loaded when its batch ran.")

    @model_validator(mode="after")
    def _one_place(self) -> LookupTable:
        if (self.redis_key_prefix is None) == (self.parquet_path is None):
            raise ValueError("set exactly one of redisKeyPrefix and parquetPath")
        if not _IDENTIFIER.match(self.key):
            raise ValueError(f"key: '{self.key}' is not an identifier")
        return self


class LookupStage(_Stage):
    """Stream-static enrichment: each record joined with the table's row whose key equals its `by` column."""

    type: Literal["lookup"]
    # Not `on`: YAML 1.1 readers (PyYAML, kubectl's) turn the key `on` into the boolean true.
    by: str = Field(description="The input column matched against the table's key.")
    table: LookupTable
    columns: tuple[str, ...] | None = Field(None, description="Table columns to add (default: all but the key).")
    how: Literal["inner", "left"] = Field(
        "inner", description="inner drops records without a row in the table; left keeps them with nulls.")

    @model_validator(mode="after")
    def _one_input(self) -> LookupStage:
        if len(self.inputs) != 1:
            raise ValueError(f"inputs: a lookup enriches one input, got {len(self.inputs)}")
        bad = [c for c in (self.by, *(self.columns or ())) if not _IDENTIFIER.match(c)]
        if bad:
            raise ValueError(f"not an identifier: {', '.join(bad)}")
        return self


class JoinKeys(_Model):
    left: tuple[str, ...] = Field(min_length=1, description="Key columns of the first input.")
    right: tuple[str, ...] = Field(min_length=1, description="Key columns of the second input, in the same order.")

    @model_validator(mode="after")
    def _pairs(self) -> JoinKeys:
        if len(self.left) != len(self.right):
            raise ValueError(f"left names {len(self.left)} key columns, right {len(self.right)}: they pair up")
        bad = [c for c in (*self.left, *self.right) if not _IDENTIFIER.match(c)]
        if bad:
            raise ValueError(f"not an identifier: {', '.join(bad)}")
        return self


class JoinStage(_Stage):
    """Two keyed inputs (left, right) joined in event time: window, interval or regular (with a state TTL)."""

    # window is Flink's window join: a pair is emitted once per window holding both rows, when the window's end
    # passes the watermark. interval is Flink's interval join, regular its unbounded join bounded by an
    # event-time TTL: a pair is emitted as soon as its later row arrives. Buffered rows are keyed state, moved
    # per key group like any stage's.

    type: Literal["join"]
    kind: Literal["window", "interval", "regular"] = Field(
        "window", description="window: rows meet within a tumbling or sliding window, each pair once per window "
        "holding both, when it fires. interval: a right row meets the left rows it follows by lowerMs to upperMs "
        "(r.event_time - l.event_time in [lowerMs, upperMs]), at once. regular: any two rows at most ttlMs apart "
        "in event time meet, at once.")
    # `on` as Flink's and SQL's joins spell it. PyYAML reads it as written here (loading.py); kubectl's
    # YAML 1.1 reader turns an unquoted `on:` into `true:`, so manifests quote it ("on":).
    on: JoinKeys = Field(description="Equi-join keys: {left: [seller], right: [id]}.")
    window: Window | None = Field(None, description="kind window: the windows rows meet in.")
    lower_ms: int | None = Field(None, description="kind interval: the least r.event_time - l.event_time that meets.")
    upper_ms: int | None = Field(None, description="kind interval: the most r.event_time - l.event_time that meets.")
    ttl_ms: int | None = Field(
        None, ge=1, description="kind regular: how long a row waits for partners, in event time: rows meet when "
        "at most this far apart, and leave state once the watermark is this far past them.")
    how: Literal["inner", "left"] = Field(
        "inner", description="inner: matched pairs only; left: also every left row that met no right row, with "
        "the right side null, once no partner can come (its window fired, its interval or TTL passed).")
    select: tuple[str, ...] | None = Field(
        None, description="Spark SQL expressions over the matched rows `l` and `r`, e.g. 'l.person_id AS id' "
        "(default: every column of each side, prefixed l_ and r_). event_time is added (window: the window's "
        "last instant, with window_start and window_end; interval and regular: the later row's, or for an "
        "unmatched left row the end of its wait).")

    @model_validator(mode="after")
    def _shape(self) -> JoinStage:
        if len(self.inputs) != 2:
            raise ValueError(f"inputs: a join reads two inputs (left, right), got {len(self.inputs)}")
        if self.key_by is not None:
            raise ValueError("keyBy: a join is keyed by `on`, per input")
        if any(not item.strip() for item in self.select or ()):
            raise ValueError("select: an expression is empty")
        wanted = {"window": ("window",), "interval": ("lower_ms", "upper_ms"), "regular": ("ttl_ms",)}
        for kind, names in wanted.items():
            for name in names:
                if (getattr(self, name) is None) == (kind == self.kind):
                    field = to_camel(name)
                    article = "an" if self.kind == "interval" else "a"
                    raise ValueError(f"{field}: {article} {self.kind} join "
                                     f"{'needs' if kind == self.kind else 'takes no'} {field}")
        if self.kind == "interval" and self.lower_ms > self.upper_ms:
            raise ValueError(f"lowerMs: {self.lower_ms} is above upperMs {self.upper_ms}")
        return self

    def routing_key(self, upstream: str) -> tuple[str, ...]:
        return self.on.left if upstream == self.inputs[0] else self.on.right

    @property
    def bounds_ms(self) -> tuple[int, int]:
        """interval and regular: the least and the most r.event_time - l.event_time that meet."""
        if self.kind == "regular":
            return -self.ttl_ms, self.ttl_ms
        return self.lower_ms, self.upper_ms


STATEFUL_TYPES = ("window_aggregate", "stateful", "join", "over")  # stages with keyed state, restored and moved per key group

Stage = Annotated[
    SqlStage | PySparkStage | WindowAggregateStage | StatefulStage | OverStage | LookupStage | JoinStage,
    Field(discriminator="type"),
]


# --- sinks -----------------------------------------------------------------


class RedisStreamSink(_Consumer):
    """Committed output in `sj:{job}:out:<name>`; written in the same transaction as the input offsets."""

    type: Literal["redis_stream"]
    max_length: int | None = Field(None, ge=1, description="Approximate cap on the output stream length.")


class ParquetSink(_Consumer):
    """A folder per batch holding one Parquet file of Spark's types; a Redis manifest lists the committed ones."""

    type: Literal["parquet"]
    path: str = Field(min_length=1, description=(
        "A folder every worker can write (a shared volume on Kubernetes) or a URI Arrow opens (file://, s3://, "
        "gs://, hdfs://); the files go under PATH/<job id>/<sink name>/."))


class ConsoleSink(_Consumer):
    type: Literal["console"]


Sink = Annotated[RedisStreamSink | ParquetSink | ConsoleSink, Field(discriminator="type")]


# --- job-wide settings -----------------------------------------------------


class StateSettings(_Model):
    backend: Literal["memory", "rocksdb"] = Field(
        "memory", description="Working copy of keyed state: in-process dicts, or RocksDB for state beyond memory."
    )
    snapshot_every_batches: int = Field(50, ge=1, description="Snapshot a changed key group this often.")
    directory: str | None = Field(None, description="Local directory of the rocksdb backend (default: temp dir).")


class BatchingSettings(_Model):
    min_records: int = Field(1, ge=1, description="Smallest batch under no load.")
    max_records: int = Field(200_000, ge=1, description="Largest batch under backlog.")
    max_wait_ms: int = Field(100, ge=0, description="How long an idle instance blocks on its input streams "
                             "before it looks at handovers and control requests again (it wakes at once when "
                             "input arrives).")
    min_interval_ms: int = Field(
        500, ge=0, description="Without backlog, the longest a record waits for its batch where running it at "
        "once would lower no latency (a window not due yet) or would spend more than half of the time on "
        "Spark's fixed cost per batch (pacing.py); batches that lower latency run at once.",
    )
    target_batch_ms: int = Field(
        1000, ge=50, description="Batch duration the adaptive sizing aims for under backlog."
    )
    max_lag_records: int = Field(
        1_000_000, ge=1, description="Backpressure: a producer pauses while an output edge holds more unconsumed records."
    )
    max_bytes: int = Field(
        64 * 2**20, ge=1024, description="Largest batch in bytes read: a redis_stream source reads no entry past it "
        "(an entry alone may be larger, up to the source's limits.maxEntryBytes); an instance reading kg streams "
        "shrinks its read to stay under it.",
    )

    @model_validator(mode="after")
    def _bounds(self) -> BatchingSettings:
        if self.min_records > self.max_records:
            raise ValueError("minRecords may not exceed maxRecords")
        return self


class AutoscalerSettings(_Model):
    """Every autoscaler option, typed, defaulted and documented here (the CRD and docs are generated from it)."""

    policy: Literal["ds2", "reactive", "off"] = Field(
        "off", description="ds2: one-step parallelism from true processing rates; reactive: one instance up or "
        "down on lag thresholds (KEDA-like baseline); off: never rescale.",
    )
    metrics: Literal["endpoints", "prometheus"] = Field(
        "endpoints", description="Read the workers' /metrics directly, or a Prometheus server's HTTP API."
    )
    prometheus_url: str | None = Field(None, description="Prometheus base URL when metrics is 'prometheus'.")
    interval_s: float = Field(10.0, gt=0, description="How often metrics are collected and a decision considered.")
    metrics_window_s: float = Field(30.0, gt=0, description="Rates are averaged over this sliding window.")
    target_utilization: float = Field(
        0.7, gt=0, le=1, description="Busy share each instance should run at (headroom for bursts)."
    )
    utilization_boundary: float = Field(
        0.2, ge=0, lt=1, description="ds2 keeps an operator whose busy share at the target rate stays within "
        "targetUtilization +- this (Flink's utilization boundary): no rescale for small swings of load.",
    )
    catch_up_seconds: float = Field(
        60.0, gt=0, description="Backlog (source pending + kg lag) is caught up within this: by the steady "
        "instances' headroom, or by instances ds2 adds for the catch-up alone and takes back once it is done.",
    )
    expected_rescale_s: float = Field(
        20.0, ge=0, description="How long a rescale takes: the input the old instances cannot carry meanwhile (all "
        "of it for the restart strategy) piles up and is caught up too; part of a rescale decided anyway, never "
        "a reason for one.",
    )
    stabilization_s: float = Field(
        30.0, ge=0, description="After a rescale, no decision on metrics that include it or this long after it."
    )
    scale_down_delay_s: float = Field(
        120.0, ge=0, description="A scale-down waits this long and applies the largest recommendation seen meanwhile "
        "(of the metrics windows wholly after it was first asked, once there is one: earlier ones still hold the load "
        "that fell)."
    )
    max_scale_factor: float = Field(4.0, ge=1, description="One step changes parallelism by at most this factor.")
    activation_intervals: int = Field(
        2, ge=1, description="DS2's activation: scale up only after this many consecutive intervals asked for it "
        "(a decision on a load change caught mid-interval would undershoot).",
    )
    min_parallelism: int = Field(1, ge=1, description="Lower bound for every operator.")
    max_parallelism: int | None = Field(None, ge=1, description="Upper bound for every operator (default: its key groups).")
    ineffective_threshold: float = Field(
        0.1, ge=0, le=1, description="A scale-up that achieved less than this share of its predicted throughput gain "
        "is ineffective: further scale-ups of that operator are blocked and an alert is raised.",
    )
    scale_down_history_horizon_s: float = Field(
        0.0, ge=0, description="Skip a scale-down to a parallelism that a scale-up left within this horizon (0: off).",
    )
    lag_high_records: int = Field(
        20_000, ge=1, description="reactive: add an instance when the backlog per instance exceeds this."
    )
    lag_low_records: int = Field(
        1_000, ge=0, description="reactive: remove an instance when the backlog per instance is under this and "
        "instances are less than half busy.",
    )
    history_size: int = Field(50, ge=1, description="Decisions kept (with predicted and achieved rates).")

    @model_validator(mode="after")
    def _prometheus(self) -> AutoscalerSettings:
        if self.metrics == "prometheus" and not self.prometheus_url:
            raise ValueError("metrics 'prometheus' needs prometheusUrl")
        return self


class RescaleSettings(_Model):
    strategy: Literal["all_at_once", "fluid", "batched", "restart"] = Field(
        "all_at_once",
        description="all_at_once: standby instances warm up, then every key group switches at the old owners' "
        "last commit while the rest of the job runs; fluid: key groups move one at a time at in-band markers, "
        "no instance stops; batched: the same, batchKeyGroups at a time; restart: Flink's stop-and-restart "
        "of the whole job.",
    )
    batch_key_groups: int = Field(8, ge=1, description="batched: key groups moved per step.")
    assignment: Literal["ranges", "consistent_hashing"] = Field(
        "ranges", description="Key group -> instance map: Flink's contiguous ranges, or a ring that moves fewer."
    )
    prestage_max_lag: int = Field(
        1000, ge=0, description="all_at_once: the handover starts once every standby's last catch-up round "
        "applied at most this many changelog entries (its prestaged state is nearly current).",
    )
    marker_max_lag_records: int = Field(
        5000, ge=0, description="fluid / batched: when the old owner of a moved key group has more input records "
        "waiting than this, the key group is released at that owner's next commit and its backlog moves with "
        "it, instead of at an in-band marker the owner would reach only after working through that backlog.",
    )
    spare_instances: int = Field(
        0, ge=0, le=16, description="Warm spares per chain that runs Spark: processes started with the job, "
        "Spark up and the chain rehearsed, waiting. A scale-out, an all_at_once standby or the restart of a dead "
        "instance promotes one instead of starting a JVM on cores the job is using (as Flink keeps redundant "
        "task managers, slotmanager.redundant-taskmanager-num); a scale-in demotes the instances it removes back "
        "into the pool. Each costs one idle JVM. On Kubernetes: pods beyond the instances of the operator's "
        "StatefulSet, for the fluid and batched strategies.",
    )


class RestartSettings(_Model):
    """What happens when a worker dies: it restarts from its last commit, after a delay that doubles with every
    death that follows soon after a start (as Flink's exponential-delay restart strategy); an input position a
    worker keeps dying at is quarantined; past maxAttempts the job fails, naming the operator, cause and position."""

    initial_backoff_ms: int = Field(1000, ge=0, description="Delay before the first restart of a worker.")
    max_backoff_ms: int = Field(60_000, ge=0, description="The longest delay between two restarts.")
    backoff_multiplier: float = Field(2.0, ge=1, description="Each further restart waits this much longer.")
    reset_backoff_threshold_ms: int = Field(
        60_000, ge=0, description="A worker that ran this long before dying starts the count (and delay) afresh.",
    )
    max_attempts: int = Field(
        10, ge=1, description="Restarts of one worker in a row (each dying before resetBackoffThresholdMs) after "
        "which the job fails.",
    )
    quarantine_after: int = Field(
        3, ge=1, description="Starts at the same input position after which that position's entries are "
        "processed one at a time and an entry a worker then dies on is dead-lettered with the cause.",
    )


class RedisSettings(_Model):
    url: str | None = Field(None, description="redis:// or rediss:// URL; default: the runtime's own Redis.")
    password_secret: str | None = Field(None, description="Kubernetes Secret holding key 'password'.")
    ca_secret: str | None = Field(
        None, description="Kubernetes Secret holding key 'ca.crt': the CA that signed a rediss:// server's "
        "certificate; mounted into the workers, who then verify the server against it.",
    )
    cluster: bool = False


class StreamJobSpec(_Model):
    max_parallelism: int = Field(
        120, ge=1, le=32768, description="Number of key groups; 120 splits evenly for 1-6, 8, 10, 12, ... instances."
    )
    sources: tuple[Source, ...] = Field(min_length=1)
    stages: tuple[Stage, ...] = ()
    sinks: tuple[Sink, ...] = Field(min_length=1)
    state: StateSettings = StateSettings()
    batching: BatchingSettings = BatchingSettings()
    autoscaler: AutoscalerSettings = AutoscalerSettings()
    rescale: RescaleSettings = RescaleSettings()
    restarts: RestartSettings = RestartSettings()
    redis: RedisSettings = RedisSettings()
    control_handlers: HandlerRefs = Field(
        (),
        description="Control events the job answers (`streamjobs control --event NAME`): NAME -> "
                    "'package.module:function', called on every instance of the operator at the event's sync "
                    f"point. Built in: {', '.join(BUILT_IN_HANDLERS)}.",
    )
    suspend: bool = False
    restore_from: str | None = Field(
        None, description="A savepoint file (`streamjobs savepoint`) to start from: the job goes on from its state, "
        "offsets, watermarks and outputs, with this spec's changes applied live. Read only when the job starts "
        "with nothing of it in its Redis; on Kubernetes, a path in the operator's pod.",
    )

    @field_validator("control_handlers")
    @classmethod
    def _check_handlers(cls, value: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
        for name, ref in value:
            if not _HANDLER_NAME.match(name):
                raise ValueError(f"'{name}': a handler's name must match [a-z][a-z0-9_-]*")
            if name in BUILT_IN_HANDLERS:
                raise ValueError(f"'{name}' is a built-in handler")
            try:
                _function_ref(ref)
            except ValueError as exc:
                raise ValueError(f"'{name}': {exc}") from None
        return value

    @property
    def handlers(self) -> dict[str, str]:
        """spec.controlHandlers: event name -> 'package.module:function'."""
        return dict(self.control_handlers)

    @model_validator(mode="after")
    def _check_graph(self) -> StreamJobSpec:
        errors = graph_errors(self)
        if errors:
            raise PydanticCustomError("graph", "{summary}", {"summary": "; ".join(m for _, m in errors), "errors": errors})
        return self

    @property
    def operators(self) -> tuple[Any, ...]:
        return (*self.sources, *self.stages, *self.sinks)

    def operator(self, name: str) -> Any:
        for op in self.operators:
            if op.name == name:
                return op
        raise KeyError(name)

    def consumers(self, name: str) -> tuple[Any, ...]:
        return tuple(op for op in (*self.stages, *self.sinks) if name in op.inputs)

    def topological_order(self) -> tuple[str, ...]:
        order: list[str] = []
        placed: set[str] = set()
        pending = list(self.operators)
        while pending:
            ready = [op for op in pending if set(getattr(op, "inputs", ())) <= placed]
            order.extend(op.name for op in ready)
            placed.update(op.name for op in ready)
            pending = [op for op in pending if op.name not in placed]
        return tuple(order)


class Metadata(BaseModel):
    model_config = ConfigDict(frozen=True, extra="allow")
    name: str
    namespace: str | None = None

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        return _dns_label(value)

    @field_validator("namespace")
    @classmethod
    def _check_namespace(cls, value: str | None) -> str | None:
        # Part of the job's Redis keys (layout.job_id): Kubernetes' own rule, a DNS label of at most 63.
        if value is not None and (len(value) > 63 or not _DNS_LABEL.match(value)):
            raise ValueError("must be a lowercase DNS label of at most 63 characters ([a-z0-9-])")
        return value


class StreamJob(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)
    api_version: Literal["streamjobs.dev/v1alpha1"] = Field(API_VERSION, alias="apiVersion")
    kind: Literal["StreamJob"] = KIND
    metadata: Metadata
    spec: StreamJobSpec


def graph_errors(spec: StreamJobSpec) -> list[tuple[str, str]]:
    """Cross-field rules of the dataflow graph, each with the path of the field at fault."""
    errors: list[tuple[str, str]] = []
    seen: dict[str, str] = {}
    groups = (("sources", spec.sources), ("stages", spec.stages), ("sinks", spec.sinks))
    for group, ops in groups:
        for i, op in enumerate(ops):
            path = f"spec.{group}[{i}]"
            if op.name in seen:
                errors.append((f"{path}.name", f"duplicate operator name '{op.name}' (also {seen[op.name]})"))
            seen.setdefault(op.name, path)
            if op.parallelism > spec.max_parallelism:
                errors.append(
                    (f"{path}.parallelism", f"{op.parallelism} exceeds maxParallelism {spec.max_parallelism}")
                )
    sink_names = {s.name for s in spec.sinks}
    for group, ops in groups[1:]:
        for i, op in enumerate(ops):
            for j, upstream in enumerate(op.inputs):
                path = f"spec.{group}[{i}].inputs[{j}]"
                if upstream not in seen:
                    errors.append((path, f"unknown operator '{upstream}'"))
                elif upstream in sink_names:
                    errors.append((path, f"'{upstream}' is a sink and has no output"))
                elif upstream == op.name:
                    errors.append((path, "an operator cannot read its own output"))
            if len(set(op.inputs)) != len(op.inputs):
                errors.append((f"spec.{group}[{i}].inputs", "lists an input twice"))
    for i, stage in enumerate(spec.stages):
        if stage.type in ("window_aggregate", "stateful", "over") and not stage.key_by:
            article = "an" if stage.type == "over" else "a"
            errors.append((f"spec.stages[{i}].keyBy", f"{article} {stage.type} stage needs keyBy"))
    if not errors:
        errors.extend(_cycle_errors(spec))
    consumed = {name for op in (*spec.stages, *spec.sinks) for name in op.inputs}
    for group, ops in groups[:2]:
        for i, op in enumerate(ops):
            if op.name not in consumed:
                errors.append((f"spec.{group}[{i}].name", f"output of '{op.name}' reaches no sink"))
    return errors


def _cycle_errors(spec: StreamJobSpec) -> list[tuple[str, str]]:
    inputs = {op.name: set(getattr(op, "inputs", ())) for op in spec.operators}
    placed: set[str] = set()
    while True:
        ready = {name for name, ins in inputs.items() if name not in placed and ins <= placed}
        if not ready:
            break
        placed |= ready
    cyclic = sorted(set(inputs) - placed)
    if not cyclic:
        return []
    return [("spec.stages", f"the graph has a cycle through {', '.join(cyclic)}")]

