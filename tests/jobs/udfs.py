"""User functions of the test jobs (workers import them as tests.jobs.udfs:NAME)."""

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
