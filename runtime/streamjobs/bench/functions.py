"""User functions of the benchmark jobs (workers import them as streamjobs.bench.functions:NAME)."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F


def letters(df: DataFrame) -> DataFrame:
    """A pyspark stage: each word with its length."""
    return df.select("word", F.length("word").alias("letters"), "event_time", "_ingest_ms")


def running_count(batch: DataFrame, state: DataFrame) -> tuple[DataFrame, DataFrame]:
    """A stateful stage: how often each word was seen so far, emitted and kept as its state."""
    counts = batch.groupBy("word").agg(F.count(F.lit(1)).alias("n"))
    seen = (counts.join(state, "word", "left")
            .select("word", (F.coalesce(F.col("seen"), F.lit(0)) + F.col("n")).alias("seen")))
    return seen, seen
