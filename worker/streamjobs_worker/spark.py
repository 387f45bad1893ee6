"""The worker's local SparkSession: one JVM per worker, one core, no UI."""

from __future__ import annotations

import functools
import os

from pyspark.sql import SparkSession


@functools.cache
def session() -> SparkSession:
    # Small local sessions: many workers share few cores, and batches are small
    # enough that one shuffle partition beats Spark's default of 200.
    spark = (
        SparkSession.builder.master(os.environ.get("STREAMJOBS_SPARK_MASTER", "local[1]"))
        .appName("streamjobs-worker")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "1")
        .config("spark.sql.adaptive.enabled", "false")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", os.environ.get("STREAMJOBS_SPARK_MEMORY", "1g"))
        .config("spark.driver.extraJavaOptions", "-XX:+UseSerialGC -XX:TieredStopAtLevel=1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark
