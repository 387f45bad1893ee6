"""Deterministic NEXMark, Zipf and YSB sources with random access by record index.

Every field of record g is a pure function of (spec, t0_ms, g): randomness comes
from a counter-based hash, never from RNG state, so a worker resumes at any
offset after a crash or a rescale, and an oracle regenerates a run's exact
input. Partition p of n owns the global indices g = j*n + p, j = 0, 1, 2, ...
"""

from __future__ import annotations

import math
from enum import IntEnum
from functools import lru_cache

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from streamjobs_core.rates import RateCurve
from streamjobs_core.spec import NexmarkSource, RateProfile, YsbSource, ZipfSource
from streamjobs_core.watermarks import MAX_WATERMARK

GeneratorSource = NexmarkSource | ZipfSource | YsbSource


NEXMARK_SCHEMA = pa.schema(
    [
        pa.field("event_type", pa.int8(), nullable=False),
        pa.field("person_id", pa.int64()),
        pa.field("person_name", pa.string()),
        pa.field("person_email", pa.string()),
        pa.field("person_city", pa.string()),
        pa.field("person_state", pa.string()),
        pa.field("auction_id", pa.int64()),
        pa.field("auction_seller", pa.int64()),
        pa.field("auction_category", pa.int64()),
        pa.field("auction_initial_bid", pa.int64()),
        pa.field("auction_reserve", pa.int64()),
        pa.field("auction_expires", pa.int64()),
        pa.field("bid_auction", pa.int64()),
        pa.field("bid_bidder", pa.int64()),
        pa.field("bid_price", pa.int64()),
        pa.field("bid_channel", pa.string()),
        pa.field("event_time", pa.int64(), nullable=False),
    ]
)

ZIPF_SCHEMA = pa.schema(
    [pa.field("word", pa.string(), nullable=False), pa.field("event_time", pa.int64(), nullable=False)]
)

YSB_SCHEMA = pa.schema(
    [
        pa.field("user_id", pa.string(), nullable=False),
        pa.field("page_id", pa.string(), nullable=False),
        pa.field("ad_id", pa.string(), nullable=False),
        pa.field("ad_type", pa.string(), nullable=False),
        pa.field("event_type", pa.string(), nullable=False),
        pa.field("ip_address", pa.string(), nullable=False),
        pa.field("event_time", pa.int64(), nullable=False),
    ]
)
YSB_AD_TYPES = ("banner", "modal", "sponsored-search", "mail", "mobile")
YSB_EVENT_TYPES = ("view", "click", "purchase")
_YSB_USERS = _YSB_PAGES = 100

PERSON, AUCTION, BID = 0, 1, 2

# NEXMark's constants: of every 50 events 1 is a person, 3 are auctions, 46 bids.
_CYCLE = 50
_AUCTIONS_PER_CYCLE = 3
_FIRST_ID = 1000
_FIRST_CATEGORY, _CATEGORIES = 10, 5
# Hot auctions and bidders are the newest id that is a multiple of this, as in
# NEXMark's generator (HOT_AUCTION_RATIO, HOT_BIDDER_RATIO).
_HOT_STRIDE = 100
# NEXMark's numActivePeople: sellers and cold bidders are among the newest persons.
_ACTIVE_PERSONS = 1000

_FIRST_NAMES = ("Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah", "Deiter", "Walter")
_LAST_NAMES = ("Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones", "Noris")
_CITIES = (
    ("Phoenix", "AZ"), ("Los Angeles", "CA"), ("San Francisco", "CA"), ("Boise", "ID"), ("Portland", "OR"),
    ("Bend", "OR"), ("Redmond", "WA"), ("Seattle", "WA"), ("Kent", "WA"), ("Cheyenne", "WY"),
)  # fmt: skip
_CHANNELS = pa.array(["Google", "Facebook", "Baidu", "Apple"])
# Names and email prefixes share the index first*len(_LAST_NAMES) + last.
_NAMES = pa.array([f"{first} {last}" for first in _FIRST_NAMES for last in _LAST_NAMES])
_EMAIL_PREFIXES = pa.array([f"{first}.{last}".lower() for first in _FIRST_NAMES for last in _LAST_NAMES])
_CITY_NAMES = pa.array([city for city, _ in _CITIES])
_CITY_STATES = pa.array([state for _, state in _CITIES])


class _Salt(IntEnum):
    """One independent random stream per field. The values are part of the
    generated data: append new ones, never renumber."""

    JITTER = 1
    PERSON_NAME = 2
    PERSON_CITY = 3
    SELLER = 4
    CATEGORY = 5
    INITIAL_BID = 6
    RESERVE = 7
    HOT_AUCTION = 8
    AUCTION = 9
    HOT_BIDDER = 10
    BIDDER = 11
    PRICE = 12
    CHANNEL = 13
    WORD = 14
    USER = 15
    PAGE = 16
    AD = 17
    AD_TYPE = 18
    EVENT_TYPE = 19
    IP = 20


# --- partitions ------------------------------------------------------------


def global_indices(partition: int, partitions: int, start: int, end: int) -> np.ndarray:
    """Global indices of partition's local indices [start, end)."""
    _check_partition(partition, partitions)
    return np.arange(start, end, dtype=np.int64) * partitions + partition


def local_count(partition: int, partitions: int, global_count: int) -> int:
    """How many of the global indices below global_count the partition owns."""
    _check_partition(partition, partitions)
    return max(0, (global_count - partition + partitions - 1) // partitions)


def local_total(spec: GeneratorSource, partition: int, partitions: int) -> int | None:
    """Records the partition emits in all; None for an unbounded source."""
    if spec.total_records is None:
        return None
    return local_count(partition, partitions, spec.total_records)


def due_count(spec: GeneratorSource, elapsed_s: float) -> int:
    """Global indices (all partitions) due elapsed_s after the start."""
    due = math.floor(_curve(spec.rate).count_at(elapsed_s))
    if spec.total_records is not None:
        due = min(due, spec.total_records)
    return due


def due_local_index(spec: GeneratorSource, partition: int, partitions: int, elapsed_s: float) -> int:
    """Local index (exclusive) up to which the partition is due elapsed_s after the start."""
    return local_count(partition, partitions, due_count(spec, elapsed_s))


def _check_partition(partition: int, partitions: int) -> None:
    if not 0 <= partition < partitions:
        raise ValueError(f"partition {partition} is not in [0, {partitions})")


# --- time ------------------------------------------------------------------


@lru_cache(maxsize=64)
def _curve(profile: RateProfile) -> RateCurve:
    # A sine curve tabulates its inverse on construction; pacing asks per poll.
    return RateCurve(profile)


def event_times(spec: GeneratorSource, t0_ms: int, g: np.ndarray) -> np.ndarray:
    """The event_time column (ms): the offered time of g, minus a bounded jitter."""
    g = _indices(g)
    jitter = _below(_uniform(spec.seed, _Salt.JITTER, g), spec.out_of_order_ms + 1)
    return t0_ms + _offered_ms(spec, g) - jitter


def watermark(spec: GeneratorSource, t0_ms: int, next_g: int) -> int:
    """No record of the partition whose next global index is next_g has an
    event time below this: time_of is monotone and the jitter bounded."""
    if spec.total_records is not None and next_g >= spec.total_records:
        return MAX_WATERMARK
    return t0_ms + int(_offered_ms(spec, np.array([next_g], dtype=np.int64))[0]) - spec.out_of_order_ms


def _offered_ms(spec: GeneratorSource, g: np.ndarray) -> np.ndarray:
    return np.floor(_curve(spec.rate).time_of(g) * 1000.0).astype(np.int64)


# --- randomness ------------------------------------------------------------

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def _splitmix(z: np.ndarray) -> np.ndarray:
    """splitmix64's output function: a bijective 64-bit avalanche mix."""
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


def _uniform(seed: int, salt: _Salt, g: np.ndarray) -> np.ndarray:
    """Floats in [0, 1), a pure function of (seed, salt, g)."""
    # The salt-th output of splitmix64 seeded with seed keys a second splitmix64
    # stream, whose g-th output is the draw: no state, so any g in any order.
    key = _splitmix(np.array([(seed + salt * int(_GOLDEN)) & (2**64 - 1)], dtype=np.uint64))
    bits = _splitmix(g.astype(np.uint64) * _GOLDEN + key)
    return (bits >> np.uint64(11)).astype(np.float64) * 2.0**-53


def _below(u: np.ndarray, n: np.ndarray | int) -> np.ndarray:
    """Integers uniform in [0, n); u*n stays below n in floating point."""
    return (u * n).astype(np.int64)


def _indices(g: np.ndarray) -> np.ndarray:
    g = np.asarray(g, dtype=np.int64)
    if g.size and g.min() < 0:
        raise ValueError("record indices must be >= 0")
    return g


# --- records ---------------------------------------------------------------


def schema(spec: GeneratorSource) -> pa.Schema:
    if isinstance(spec, NexmarkSource):
        return NEXMARK_SCHEMA
    return YSB_SCHEMA if isinstance(spec, YsbSource) else ZIPF_SCHEMA


def generate(spec: GeneratorSource, t0_ms: int, g: np.ndarray) -> pa.Table:
    """The records with global indices g, in the order of g."""
    g = _indices(g)
    if isinstance(spec, NexmarkSource):
        return _nexmark(spec, t0_ms, g)
    if isinstance(spec, YsbSource):
        return _ysb(spec, t0_ms, g)
    return _zipf(spec, t0_ms, g)


def _persons_before(g: np.ndarray) -> np.ndarray:
    return (g + _CYCLE - 1) // _CYCLE


def _auctions_before(g: np.ndarray) -> np.ndarray:
    return _AUCTIONS_PER_CYCLE * (g // _CYCLE) + np.clip(g % _CYCLE - 1, 0, _AUCTIONS_PER_CYCLE)


def _auction_index(auction: np.ndarray) -> np.ndarray:
    """Global index of the event creating the auction with base-0 id `auction`."""
    return _CYCLE * (auction // _AUCTIONS_PER_CYCLE) + 1 + auction % _AUCTIONS_PER_CYCLE


def _newest(u: np.ndarray, existing: np.ndarray, window: int) -> np.ndarray:
    """A base-0 id uniform among the newest `window` of `existing` ids."""
    return existing - 1 - _below(u, np.minimum(existing, window))


def _pick(
    spec: NexmarkSource, salts: tuple[_Salt, _Salt], g: np.ndarray, existing: np.ndarray, window: int, stride: int
) -> np.ndarray:
    """A base-0 id among `existing`: hot_auction_ratio of picks take the newest
    multiple of `stride`, the others one of the newest `window`."""
    hot = _uniform(spec.seed, salts[0], g) < spec.hot_auction_ratio
    cold = _newest(_uniform(spec.seed, salts[1], g), existing, window)
    return np.where(hot, (existing - 1) // stride * stride, cold)


def _price(u: np.ndarray) -> np.ndarray:
    # NEXMark's nextPrice: log-uniform cents from $1 to $1M, skewed to small bids.
    return np.rint(10.0 ** (u * 6.0) * 100.0).astype(np.int64)


def _nexmark(spec: NexmarkSource, t0_ms: int, g: np.ndarray) -> pa.Table:
    phase = g % _CYCLE
    is_person = phase == 0
    is_auction = (phase >= 1) & (phase <= _AUCTIONS_PER_CYCLE)
    is_bid = phase > _AUCTIONS_PER_CYCLE
    event_type = np.full(g.size, BID, dtype=np.int8)
    event_type[is_auction] = AUCTION
    event_type[is_person] = PERSON
    event_time = event_times(spec, t0_ms, g)
    # Every auction or bid follows person 0; every bid follows auctions 0..2.
    # So the "newest existing" picks below always have something to pick from.
    persons = _persons_before(g)
    auctions = _auctions_before(g)

    pg = g[is_person]
    person_id = _FIRST_ID + pg // _CYCLE
    name = _below(_uniform(spec.seed, _Salt.PERSON_NAME, pg), len(_NAMES))
    city = _below(_uniform(spec.seed, _Salt.PERSON_CITY, pg), len(_CITIES))
    email = pc.binary_join_element_wise(
        _EMAIL_PREFIXES.take(name), pc.cast(pa.array(person_id), pa.string()), "@example.com", ""
    )

    ag = g[is_auction]
    auction = auctions[is_auction]
    seller = _newest(_uniform(spec.seed, _Salt.SELLER, ag), persons[is_auction], _ACTIVE_PERSONS)
    category = _FIRST_CATEGORY + _below(_uniform(spec.seed, _Salt.CATEGORY, ag), _CATEGORIES)
    initial_bid = _price(_uniform(spec.seed, _Salt.INITIAL_BID, ag))
    # An auction closes when it leaves the window of the active_auctions newest,
    # so every bid on it is offered, and its event time falls, before it expires.
    closing = _auction_index(auction + spec.active_auctions)

    bg = g[is_bid]
    hot_stride = min(_HOT_STRIDE, spec.active_auctions)  # keeps hot auctions within the active window
    auction_salts, bidder_salts = (_Salt.HOT_AUCTION, _Salt.AUCTION), (_Salt.HOT_BIDDER, _Salt.BIDDER)
    bid_auction = _pick(spec, auction_salts, bg, auctions[is_bid], spec.active_auctions, hot_stride)
    bidder = _pick(spec, bidder_salts, bg, persons[is_bid], _ACTIVE_PERSONS, _HOT_STRIDE)
    channel = _below(_uniform(spec.seed, _Salt.CHANNEL, bg), len(_CHANNELS))

    columns = [
        pa.array(event_type),
        _sparse(is_person, person_id),
        _NAMES.take(_sparse(is_person, name)),
        pc.replace_with_mask(pa.nulls(g.size, pa.string()), pa.array(is_person), email),
        _CITY_NAMES.take(_sparse(is_person, city)),
        _CITY_STATES.take(_sparse(is_person, city)),
        _sparse(is_auction, _FIRST_ID + auction),
        _sparse(is_auction, _FIRST_ID + seller),
        _sparse(is_auction, category),
        _sparse(is_auction, initial_bid),
        _sparse(is_auction, initial_bid + _price(_uniform(spec.seed, _Salt.RESERVE, ag))),
        _sparse(is_auction, t0_ms + _offered_ms(spec, closing)),
        _sparse(is_bid, _FIRST_ID + bid_auction),
        _sparse(is_bid, _FIRST_ID + bidder),
        _sparse(is_bid, _price(_uniform(spec.seed, _Salt.PRICE, bg))),
        _CHANNELS.take(_sparse(is_bid, channel)),
        pa.array(event_time),
    ]
    return pa.Table.from_arrays(columns, schema=NEXMARK_SCHEMA)


def _sparse(mask: np.ndarray, values: np.ndarray) -> pa.Array:
    """Values where mask holds, in order; null elsewhere."""
    full = np.zeros(mask.size, dtype=values.dtype)
    full[mask] = values
    return pa.array(full, mask=~mask)


@lru_cache(maxsize=16)
def _zipf_cdf(vocabulary: int, exponent: float) -> np.ndarray:
    cdf = np.cumsum(np.arange(1, vocabulary + 1, dtype=np.float64) ** -exponent)
    cdf /= cdf[-1]  # exactly 1.0 at the end, so every u < 1 finds a rank
    cdf.flags.writeable = False
    return cdf


@lru_cache(maxsize=8)
def _zipf_words(vocabulary: int) -> pa.Array:
    """Word of each rank ("w1" for rank 1, at index 1): made once, taken per record."""
    return pc.binary_join_element_wise("w", pc.cast(pa.array(np.arange(vocabulary + 1)), pa.string()), "")


def _zipf(spec: ZipfSource, t0_ms: int, g: np.ndarray) -> pa.Table:
    u = _uniform(spec.seed, _Salt.WORD, g)
    rank = np.searchsorted(_zipf_cdf(spec.vocabulary, spec.exponent), u, side="right") + 1
    word = pc.take(_zipf_words(spec.vocabulary), pa.array(rank))
    return pa.Table.from_arrays([word, pa.array(event_times(spec, t0_ms, g))], schema=ZIPF_SCHEMA)


def ysb_ad_id(ad: np.ndarray | int):
    return f"ad-{ad}" if isinstance(ad, int) else pc.binary_join_element_wise("ad-", pc.cast(pa.array(ad), pa.string()), "")


def ysb_campaigns(spec: YsbSource) -> pa.Table:
    """The ad -> campaign table the benchmark keeps in Redis: `ad_id`, `campaign_id`."""
    ads = np.arange(spec.campaigns * spec.ads_per_campaign)
    campaign = pc.binary_join_element_wise("campaign-", pc.cast(pa.array(ads // spec.ads_per_campaign), pa.string()), "")
    return pa.table({"ad_id": ysb_ad_id(ads), "campaign_id": campaign})


def _named(prefix: str, u: np.ndarray, n: int) -> pa.Array:
    return pc.binary_join_element_wise(prefix, pc.cast(pa.array(_below(u, n)), pa.string()), "")


def _ysb(spec: YsbSource, t0_ms: int, g: np.ndarray) -> pa.Table:
    ad = _below(_uniform(spec.seed, _Salt.AD, g), spec.campaigns * spec.ads_per_campaign)
    ip = _below(_uniform(spec.seed, _Salt.IP, g), 2**32).astype(np.int64)
    octets = [pc.cast(pa.array((ip >> shift) & 255), pa.string()) for shift in (24, 16, 8, 0)]
    return pa.Table.from_arrays([
        _named("user-", _uniform(spec.seed, _Salt.USER, g), _YSB_USERS),
        _named("page-", _uniform(spec.seed, _Salt.PAGE, g), _YSB_PAGES),
        ysb_ad_id(ad),
        pa.array(YSB_AD_TYPES).take(pa.array(_below(_uniform(spec.seed, _Salt.AD_TYPE, g), len(YSB_AD_TYPES)))),
        pa.array(YSB_EVENT_TYPES).take(pa.array(_below(_uniform(spec.seed, _Salt.EVENT_TYPE, g),
                                                       len(YSB_EVENT_TYPES)))),
        pc.binary_join_element_wise(*octets, "."),
        pa.array(event_times(spec, t0_ms, g)),
    ], schema=YSB_SCHEMA)
