"""The worker's local SparkSession: one JVM per worker, one core, no UI."""

from __future__ import annotations

import functools
import os
import sys

import pyarrow as pa
from pyspark.sql import SparkSession


@functools.cache
def session(master: str | None = None, memory: str | None = None) -> SparkSession:
    # Python UDFs run in Python workers Spark starts: with this interpreter (its packages, pyarrow
    # included), not whatever `python3` is first on the PATH.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    # Small local sessions: many workers share few cores, and batches are small
    # enough that one shuffle partition beats Spark's default of 200.
    spark = (
        SparkSession.builder.master(master or os.environ.get("STREAMJOBS_SPARK_MASTER", "local[1]"))
        .appName("streamjobs-worker")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "1")
        .config("spark.sql.adaptive.enabled", "false")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.sql.execution.arrow.localRelationThreshold", "0")
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", "1000000")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", memory or os.environ.get("STREAMJOBS_SPARK_MEMORY", "1g"))
        .config("spark.driver.extraJavaOptions", "-XX:+UseSerialGC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    _warm_up(spark)
    return spark


def _warm_up(spark: SparkSession) -> None:
    # The first Arrow round trip and aggregation take seconds (class loading,
    # JIT); pay that before the worker reports ready, not on the first batch.
    table = pa.table({"k": ["a", "b", "a"], "v": [1, 2, 3]})
    spark.createDataFrame(table).groupBy("k").sum("v").toArrow()
