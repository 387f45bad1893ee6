"""A JVM of its own for Flink, pinned to some cores, driven over Py4J, logging to a temp dir that it removes.

The `bench` extra installs PyPI's apache-flink-libraries: Flink's runtime jars,
with no Python dependencies. PyFlink's Python package (apache-flink) is not used:
it pins pyarrow < 21, pandas < 2.3 and py4j 0.10.9.7, and through apache-beam
redis < 6, so pip cannot install it beside our runtime dependencies. Its Table API
is a thin layer over Flink's Java one, which this module calls through Py4J (here
with PySpark). Each job a TableEnvironment executes runs on a mini-cluster of its
own in this JVM, started with the job and stopped when the job ends.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from queue import Empty, Queue

from ..cpus import first_cores
from .sql import FlinkJob, PacedSource

INSTALL_HINT = "pip install 'streamjobs[bench]'"
_LOG4J = """\
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = file
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = %d{{HH:mm:ss,SSS}} %-5p %c{{1}} - %m%n
"""
_STOP_TIMEOUT_S = 20


class FlinkNotInstalled(RuntimeError):
    pass


def _pyflink_folders() -> list[str]:
    spec = importlib.util.find_spec("pyflink")
    return list(spec.submodule_search_locations or []) if spec else []


def flink_lib(folders: list[str] | None = None) -> Path:
    """The folder of Flink's jars that apache-flink-libraries installs (pyflink/lib); FlinkNotInstalled if none."""
    for folder in _pyflink_folders() if folders is None else folders:
        lib = Path(folder) / "lib"
        if any(lib.glob("flink-dist-*.jar")):
            return lib
    raise FlinkNotInstalled(f"Apache Flink is not installed (the benchmarks' Flink peer): {INSTALL_HINT}")


def installed() -> bool:
    try:
        flink_lib()
    except FlinkNotInstalled:
        return False
    return True


def _java() -> str:
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not java or not Path(java).exists():
        raise RuntimeError("the Flink peer needs Java 17+: no java on PATH (or under JAVA_HOME)")
    return java


@contextlib.contextmanager
def _pinned(cores: int) -> Iterator[None]:
    """This thread, and so every process it starts (and all their threads), on the first `cores` allowed cores."""
    allowed = os.sched_getaffinity(0)
    os.sched_setaffinity(0, first_cores(cores))
    try:
        yield
    finally:
        os.sched_setaffinity(0, allowed)


class FlinkSession:
    """`with FlinkSession(cores) as flink:` a JVM with Flink's jars; jobs via `submit`, their printed rows via `lines`."""

    def __init__(self, cores: int, heap_mb: int = 2048) -> None:
        self.cores = cores
        self.heap_mb = heap_mb
        self.dir: Path | None = None
        self._proc = None
        self._gateway = None
        self._stdout: Queue[str] = Queue()
        self._stderr: Queue[str] = Queue()

    def __enter__(self) -> FlinkSession:
        lib = flink_lib()
        from py4j.java_gateway import GatewayParameters, JavaGateway, launch_gateway

        self.dir = Path(tempfile.mkdtemp(prefix="streamjobs-flink-"))
        try:
            log4j = self.dir / "log4j2.properties"
            log4j.write_text(_LOG4J.format(log=self.dir / "flink.log"))
            (self.dir / "tmp").mkdir()
            with _pinned(self.cores):
                port, self._proc = launch_gateway(
                    classpath=os.pathsep.join(str(jar) for jar in sorted(lib.glob("*.jar"))),
                    javaopts=[f"-Xmx{self.heap_mb}m", f"-Dlog4j.configurationFile={log4j}",
                              f"-Djava.io.tmpdir={self.dir / 'tmp'}"],  # blobs, spill files: removed with the dir
                    java_path=_java(), die_on_exit=True, redirect_stdout=self._stdout, redirect_stderr=self._stderr,
                    return_proc=True,
                )
            self._gateway = JavaGateway(gateway_parameters=GatewayParameters(port=port, auto_convert=True))
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        if self._gateway is not None:
            with contextlib.suppress(Exception):
                self._gateway.shutdown()
        if self._proc is not None:
            # die_on_exit: the JVM exits when its stdin closes.
            with contextlib.suppress(Exception):
                self._proc.stdin.close()
            try:
                self._proc.wait(_STOP_TIMEOUT_S)
            except Exception:
                self._proc.kill()
                self._proc.wait()
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)

    @property
    def jvm(self):
        return self._gateway.jvm

    def submit(self, job: FlinkJob, parallelism: int, settings: dict[str, str] | None = None):
        """Plan and start the job (its mini-cluster starts with it); its JobClient."""
        config = self.jvm.org.apache.flink.configuration.Configuration()
        for key, value in {
            "parallelism.default": str(parallelism),
            "table.local-time-zone": "UTC",
            "rest.bind-port": "0",  # other mini-clusters (or a Flink) may hold 8081
            **(settings or {}),
        }.items():
            config.setString(key, value)
        flink = self.jvm.org.apache.flink
        with self.errors():
            stream = flink.streaming.api.environment.StreamExecutionEnvironment.getExecutionEnvironment(config)
            env = flink.table.api.bridge.java.StreamTableEnvironment.create(
                stream, flink.table.api.EnvironmentSettings.newInstance().inStreamingMode().withConfiguration(config)
                .build())
            if job.paced is not None:
                self._register(stream, env, job.paced)
            for statement in job.ddl:
                env.executeSql(statement)
            inserts = env.createStatementSet()
            for statement in job.inserts:
                inserts.addInsertSql(statement)
            return inserts.execute().getJobClient().get()

    def _register(self, stream, env, paced: PacedSource) -> None:
        flink = self.jvm.org.apache.flink
        boolean = flink.api.common.typeinfo.Types.BOOLEAN
        # Flink ships no index -> row generator function but this one, which replays given rows: constant ones.
        rows = flink.connector.datagen.functions.FromElementsGeneratorFunction(
            boolean, stream.getConfig(), self.jvm.java.util.Collections.nCopies(paced.rows, True))
        pace = flink.api.connector.source.util.ratelimit.RateLimiterStrategy.perSecond(float(paced.rows_per_s))
        source = flink.connector.datagen.source.DataGeneratorSource(rows, paced.rows, pace, boolean)
        table = flink.table.api
        schema = (table.Schema.newBuilder().column("f0", table.DataTypes.BOOLEAN())
                  .columnByExpression("event_time", paced.event_time)
                  .watermark("event_time", paced.watermark).build())
        events = stream.fromSource(source, flink.api.common.eventtime.WatermarkStrategy.noWatermarks(), paced.view)
        env.createTemporaryView(paced.view, events, schema)

    def status(self, client) -> str:
        with self.errors():
            return client.getJobStatus().get().toString()

    def wait_status(self, client, wanted: str, timeout_s: float) -> float:
        """Poll until the job is in status `wanted`; the time.time() when it was seen."""
        deadline = time.monotonic() + timeout_s
        while (status := self.status(client)) != wanted:
            if status in ("FAILED", "CANCELED", "FINISHED") or time.monotonic() > deadline:
                raise RuntimeError(f"Flink job is {status}, waited {timeout_s:.0f} s for {wanted}{self.log_errors()}")
            time.sleep(0.02)
        return time.time()

    def result(self, future, timeout_s: float):
        """A Java CompletableFuture's value."""
        with self.errors():
            return future.get(round(timeout_s * 1000), self.jvm.java.util.concurrent.TimeUnit.MILLISECONDS)

    def lines(self) -> list[str]:
        """What the JVM printed to stdout since the last call (print sinks write there)."""
        lines = []
        with contextlib.suppress(Empty):
            while True:
                lines.append(self._stdout.get_nowait())
        return lines

    def log_errors(self, limit: int = 5) -> str:
        log = self.dir / "flink.log" if self.dir else None
        errors = [line for line in log.read_text(errors="replace").splitlines() if " ERROR " in line] if (
            log and log.exists()) else []
        stderr = []
        with contextlib.suppress(Empty):
            while True:
                stderr.append(self._stderr.get_nowait().rstrip())
        shown = errors[-limit:] + stderr[-limit:]
        return ("\n" + "\n".join(shown)) if shown else ""

    @contextlib.contextmanager
    def errors(self) -> Iterator[None]:
        """A Java exception as a RuntimeError naming its root cause, not a Py4J stack."""
        from py4j.protocol import Py4JJavaError

        try:
            yield
        except Py4JJavaError as error:
            cause = error.java_exception
            while cause.getCause() is not None:
                cause = cause.getCause()
            raise RuntimeError(f"Flink: {cause.toString()}{self.log_errors()}") from None
