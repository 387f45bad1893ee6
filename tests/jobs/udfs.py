"""User functions of the test jobs (workers import them as tests.jobs.udfs:NAME)."""

import os

from pyspark.sql import DataFrame
from pyspark.sql import functions as F


def bids_only(df: DataFrame) -> DataFrame:
    return df.filter(F.col("event_type") == 2).select("bid_bidder", "bid_price", "event_time", "_ingest_ms")


def new_bidders(batch: DataFrame, state: DataFrame) -> tuple[DataFrame, DataFrame]:
    """Each bidder once, the first time it bids: the same result however the input is batched."""
    fresh = batch.select("bid_bidder").distinct().join(state.select("bid_bidder"), "bid_bidder", "left_anti")
    return fresh, fresh.withColumn("seen", F.lit(1).cast("long"))


@F.udf("long")
def _strict_price(price):
    if price == 13:
        raise ValueError(f"unlucky price {price}")
    return price * 100


def cents(df: DataFrame) -> DataFrame:
    """Prices in cents; a Python UDF that refuses the price 13 (a poison record)."""
    return df.select("k", _strict_price("price").alias("cents"))


def exit_on_poison(df: DataFrame) -> DataFrame:
    """Records as they are; a batch holding `v = 'poison'` ends the process on the spot, as a native crash or the
    kernel's OOM killer would: no Python error, nothing flushed."""
    if df.filter(F.col("v") == "poison").limit(1).count():
        os._exit(17)
    return df


def exit_always(df: DataFrame) -> DataFrame:
    """A function that ends the process on every batch with records: no entry is to blame."""
    if df.limit(1).count():
        os._exit(17)
    return df
