"""The worker's local SparkSession (one JVM per worker, one core, no UI) and its Arrow bridge.

The bridge moves a batch into the JVM and a result back with a handful of Py4J
round trips where createDataFrame and toArrow make ~60 (each reads several
settings, converts the schema through the JVM and sets a call site): at
~0.5 ms a round trip on a busy core that was a third of a small batch's time.
The data itself goes as PySpark sends it, one Arrow IPC stream through a
temporary file in, the result's Arrow batches through a local socket back.
"""

from __future__ import annotations

import functools
import os
import sys
import tempfile
import threading
import uuid

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from . import jvm_archive, jvm_helpers

_thread = threading.local()


def session(master: str | None = None, memory: str | None = None, java_options: str | None = None) -> SparkSession:
    """This thread's own session where it has one (`own_session`), else the process's; `java_options` default to
    mapping the installation's class archive (jvm_archive.py)."""
    own = getattr(_thread, "session", None)
    return own if own is not None else _process_session(master, memory, java_options)


def own_session() -> SparkSession:
    """Give this thread a session of its own on the process's JVM, its temp views and SQL settings apart from the
    other threads': workers run in threads of one process (the in-process launcher) register their views by
    the same names."""
    _thread.session = _process_session().newSession()
    return _thread.session


@functools.cache
def _process_session(master: str | None = None, memory: str | None = None,
                     java_options: str | None = None) -> SparkSession:
    # Python UDFs run in Python workers Spark starts: with this interpreter (its packages, pyarrow
    # included), not whatever `python3` is first on the PATH.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if java_options is None:
        java_options = jvm_archive.java_options()
    # Options of the operator's choosing (Flink's env.java.opts), e.g. C1 only on small nodes that start more
    # JVMs than they run long: half the CPU to start, slower compiled code after.
    java_options = f"{java_options} {os.environ.get('STREAMJOBS_JAVA_OPTIONS', '')}".strip()
    # Small local sessions: many workers share few cores, and batches are small
    # enough that one shuffle partition beats Spark's default of 200.
    builder = (
        SparkSession.builder.master(master or os.environ.get("STREAMJOBS_SPARK_MASTER", "local[1]"))
        .appName("streamjobs-worker")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "1")
        .config("spark.sql.adaptive.enabled", "false")
        # A join of two single partitions needs no shuffle, but Spark keeps them unshuffled only while their
        # estimated sizes are at most maxSinglePartitionBytes, and a batch's relation has no estimate: it
        # counted as 8 EiB (the default size), a union of two as more. Each side of a join took a shuffle per
        # batch, and a plan with one cannot run again (prepared.py). Broadcasting, which the small default
        # size would choose, is a job of its own per batch where one partition needs none.
        .config("spark.sql.defaultSizeInBytes", str(2**20))
        .config("spark.sql.maxSinglePartitionBytes", str(2**63 - 1))
        .config("spark.sql.autoBroadcastJoinThreshold", "-1")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.sql.execution.arrow.localRelationThreshold", "0")
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", "1000000")
        .config("spark.sql.session.timeZone", "UTC")
        # ICU's case mapping (Spark's default since 4.0) builds its tables on a JVM's first
        # upper()/lower(): 1.0-1.3 s of CPU, paid inside the batch of whichever query uses it
        # first, e.g. one swapped in live. The JVM's own mapping (Spark 3's, and Flink's) costs
        # ~0.1 s; the two differ only for characters newer than the JDK's Unicode version.
        .config("spark.sql.icu.caseMappings.enabled", "false")
        # A spec's SQL reads its batch, not files: `SELECT * FROM text.`/etc/...`` would read any file
        # the worker can (its mounted secrets too).
        .config("spark.sql.runSQLOnFiles", "false")
        .config("spark.driver.memory", memory or os.environ.get("STREAMJOBS_SPARK_MEMORY", "1g"))
        .config("spark.driver.extraJavaOptions", f"-XX:+UseSerialGC {java_options or ''}".strip())
    )
    helpers = jvm_helpers.jar()
    if helpers is not None:
        # On the session's class loader, not the JVM's class path, which the class archive is checked against.
        builder = builder.config("spark.jars", str(helpers))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    _warm_up(spark)
    return spark


def _warm_up(spark: SparkSession) -> None:
    # The first Arrow round trip and aggregation take seconds (class loading,
    # JIT); pay that before the worker reports ready, not on the first batch,
    # on the path batches take.
    arrow = bridge(spark)
    table = pa.table({"k": ["a", "b", "a"], "v": [1, 2, 3]})
    arrow.table(arrow.frame(table).groupBy("k").sum("v"))
    if has_helpers(spark):  # and the first planned query's (prepared.py)
        # A slot of this call's own: workers that run as threads of one process share the session and may warm
        # it up at once (a slot per session had one free what another was about to read).
        slot = f"warm-up-{uuid.uuid4().hex}"
        arrow.load(slot, table)
        try:
            arrow.table(arrow.slot_frame(slot, table.schema).coalesce(1).groupBy("k").sum("v"))
        finally:
            arrow.free(slot)


def has_helpers(session: SparkSession) -> bool:
    """Whether the session loaded the worker's own JVM classes (jvm_helpers.py)."""
    return _loaded(session.sparkContext)


@functools.cache
def _loaded(context) -> bool:
    from py4j.java_gateway import JavaClass

    return isinstance(context._jvm.streamjobs.jvm.Reuse, JavaClass)


@functools.lru_cache(maxsize=256)
def spark_types(schema: pa.Schema) -> tuple[pa.Schema, str, StructType]:
    """Spark's types for a table of `schema`: the Arrow schema of those types (what Spark takes in and reads
    back unchanged: timestamps in UTC, strings and binaries of Spark's width), as JSON and as a StructType.
    No JVM needed."""
    from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema

    struct = from_arrow_schema(schema, prefer_timestamp_ntz=False)
    target = to_arrow_schema(struct, error_on_duplicated_field_names_in_struct=True, timezone="UTC")
    return target, struct.json(), struct


class ArrowBridge:
    """Arrow tables into the session as DataFrames, DataFrames back as Arrow tables."""

    def __init__(self, spark: SparkSession) -> None:
        self._spark = spark
        self._utils = spark._jvm.org.apache.spark.sql.api.python.PythonSQLUtils
        self._jsession = spark._jsparkSession
        self._temp_dir = spark.sparkContext._temp_dir
        # Py4J resolves a dotted name one part at a time, each a class lookup through every jar of Spark's
        # (~10 % of a small join's JVM time when it was done per batch), and a class's method name with a round
        # trip of its own: the helpers' methods are resolved once.
        helpers = spark._jvm.streamjobs.jvm
        self._load_slot, self._free_slot = helpers.CurrentBatch.load, helpers.CurrentBatch.free
        self._to_arrow_file = helpers.LocalRun.toArrowFile
        self._large_types = spark.conf.get("spark.sql.execution.arrow.useLargeVarTypes", "false") == "true"

    def frame(self, table: pa.Table) -> DataFrame:
        """The table as one partition of a DataFrame (columnar in its task, no LocalRelation of rows)."""
        _, schema_json, struct = spark_types(table.schema)
        batches = self._through_file(table, self._utils.readArrowStreamFromFile)
        frame = DataFrame(self._utils.toDataFrame(batches, schema_json, self._jsession), self._spark)
        frame._schema = struct
        return frame

    def load(self, slot: str, table: pa.Table) -> None:
        """The table becomes what the current-batch relation `slot` holds (jvm/CurrentBatch.java)."""
        self._through_file(table, functools.partial(self._load_slot, slot))

    def free(self, slot: str) -> None:
        """The slot holds no batch any more."""
        self._free_slot(slot)

    def slot_frame(self, slot: str, schema: pa.Schema) -> DataFrame:
        """A DataFrame over the current-batch relation `slot`, whose batches have `schema`."""
        return self._spark.read.format("streamjobs.jvm.CurrentBatch").schema(spark_types(schema)[2]) \
            .option("slot", slot).load()

    def _through_file(self, table: pa.Table, read):
        """`read(path)` of the table written as one Arrow IPC batch of Spark's types; the JVM reads it eagerly."""
        target = spark_types(table.schema)[0]
        if table.schema != target:
            table = table.cast(target)
        with tempfile.NamedTemporaryFile(dir=self._temp_dir, delete=False) as file:
            path = file.name
            with pa.ipc.new_stream(file, target) as writer:
                writer.write_table(table.combine_chunks(), max_chunksize=max(1, table.num_rows))
        try:
            return read(path)
        finally:
            os.unlink(path)

    def run_here(self, frame: DataFrame) -> pa.Table:
        """Run a query over current-batch relations that Reuse let run again (one partition, no exchange) on the
        JVM's calling thread, not as a job (jvm/LocalRun.java); its result comes back through a file."""
        descriptor, path = tempfile.mkstemp(dir=self._temp_dir)
        os.close(descriptor)
        try:
            self._to_arrow_file(frame._jdf, path)
            with pa.OSFile(path) as file:
                return pa.ipc.open_stream(file).read_all()
        finally:
            os.unlink(path)

    def arrow_schema(self, frame: DataFrame) -> pa.Schema:
        """The Arrow schema of the frame's result, as toArrow() types it."""
        from pyspark.sql.pandas.types import to_arrow_schema

        return to_arrow_schema(frame.schema, error_on_duplicated_field_names_in_struct=True, timezone="UTC",
                               prefers_large_types=self._large_types)

    def table(self, frame: DataFrame) -> pa.Table:
        """Run the query and collect its result as Arrow, batches in order."""
        from pyspark.errors.exceptions.captured import unwrap_spark_exception
        from pyspark.sql.pandas.serializers import ArrowCollectSerializer
        from pyspark.util import _load_from_socket

        port, secret, server = frame._jdf.collectAsArrowToPython()
        try:
            with _load_from_socket((port, secret), ArrowCollectSerializer()) as stream:
                batches = list(stream)
        finally:
            with unwrap_spark_exception():
                server.getResult()  # the query's error, if it failed, as a PySpark exception
        if not batches:  # no batch carries the schema of an empty result (toArrow() would run the query again)
            return self.arrow_schema(frame).empty_table()
        return pa.Table.from_batches(batches)


@functools.cache
def bridge(spark: SparkSession) -> ArrowBridge:
    return ArrowBridge(spark)
