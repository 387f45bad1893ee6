"""A class-data-sharing archive of the classes a worker's JVM loads, so that a new worker starts sooner.

Most of a worker's JVM start is loading and verifying Spark's classes: on this
project's 2-core machine (idle) a session took 5.1-6.0 s to start and its first
query 2.5 s more; with an archive dumped from the same workload
(`-XX:ArchiveClassesAtExit`) the JVM maps them instead, 2.9-3.0 s and 1.2-1.5 s.
Every JVM start waits on that: an added instance in a scale-out (the rescale's
own duration, and how soon an autoscaler's decision takes effect), a restarted
worker, a job's start.

The archive is built once per installation (`make setup`, the worker image's
build) by `python -m streamjobs_worker.jvm_archive`; workers use it when it
exists. The JVM checks it against its own build and each class path jar's size
and modification time, and ignores one that does not match with a one-line
warning: a stale archive costs its speed-up, never a wrong class. So the
archive is named after those too: a reinstall at the same path (a CI's clean
clone, a rebuilt image) gets an archive of its own, where it kept mapping none.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ARCHIVE_ENV = "STREAMJOBS_JVM_ARCHIVE"  # a path; empty: no archive
_NAME = re.compile(r"spark-([0-9a-f]{16})-[0-9a-f]{16}\.jsa")  # the default's: installation, checked files


def archive_path() -> Path | None:
    """Where this installation's archive is (or goes): $STREAMJOBS_JVM_ARCHIVE, else a file in the user's cache
    named after the installation (PySpark's place and the java binary) and what the JVM checks the archive
    against (the JDK's files, each of PySpark's jars' size and modification time)."""
    configured = os.environ.get(ARCHIVE_ENV)
    if configured is not None:
        return Path(configured) if configured else None
    import pyspark

    spark_home = Path(pyspark.__file__).parent
    java = shutil.which("java", path=_java_path())
    java = java and Path(java).resolve()
    installation = _digest(f"{pyspark.__version__}|{spark_home}|{java}")
    jdk = [java, java.parent.parent / "lib" / "modules", java.parent.parent / "lib" / "server" / "libjvm.so"] \
        if java else []
    checked = "|".join(f"{f.name}:{st.st_size}:{st.st_mtime_ns}"
                       for f in [*jdk, *sorted((spark_home / "jars").glob("*.jar"))] if (st := _stat(f)))
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "streamjobs" / f"spark-{installation}-{_digest(checked)}.jsa"


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _stat(path: Path) -> os.stat_result | None:
    try:
        return path.stat()
    except OSError:
        return None


def java_options() -> str:
    """The JVM option that maps the archive, when there is one."""
    path = archive_path()
    return f"-XX:SharedArchiveFile={path}" if path is not None and path.is_file() else ""


def build(path: Path | None = None, force: bool = False) -> Path | None:
    """Dump the archive from a session running a worker's kind of work (in a child process: the JVM writes it
    as it exits); returns its path, or None when archives are turned off."""
    path = path or archive_path()
    if path is None or (path.is_file() and not force):
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    env = {**os.environ, ARCHIVE_ENV: ""}  # the dumping JVM must not map an older archive
    try:
        dump = subprocess.run([sys.executable, "-m", "streamjobs_worker.jvm_archive", "--dump", str(partial)],
                              env=env, capture_output=True, text=True)
        if dump.returncode != 0 or not partial.is_file():
            raise ArchiveError(f"the JVM wrote no class archive to {partial} (exit {dump.returncode}):\n"
                               f"{dump.stderr[-4000:]}")
        os.replace(partial, path)  # workers starting meanwhile see no archive or a whole one
    finally:
        partial.unlink(missing_ok=True)
    _remove_stale(path)
    return path


def _remove_stale(path: Path) -> None:
    """This installation's earlier archives, which its JVMs no longer map (~170 MB each). A JVM mapping one
    keeps its pages; unlinking it frees the disk when that JVM exits."""
    named = _NAME.fullmatch(path.name)
    if named is None:
        return  # a configured path: not ours to clean beside
    for stale in path.parent.glob(f"spark-{named[1]}-*.jsa"):
        if stale != path and _NAME.fullmatch(stale.name):
            stale.unlink(missing_ok=True)


class ArchiveError(RuntimeError):
    """The class archive could not be dumped."""


def _dump(partial: str) -> None:
    import pyarrow as pa
    from pyspark import SparkContext

    from .spark import bridge, session

    spark = session(java_options=f"-XX:ArchiveClassesAtExit={partial} -Xlog:cds=off,cds+dynamic=off")
    arrow = bridge(spark)
    table = pa.table({"k": ["a", "b", "a"], "v": [1.5, 2.0, 3.0], "t": [1000, 2000, 3000]})
    arrow.frame(table).createOrReplaceTempView("input")
    for query in ("SELECT k, window(timestamp_millis(t), '1 second') AS w, count(*) AS n, sum(v) AS s "
                  "FROM input GROUP BY k, window(timestamp_millis(t), '1 second')",
                  "SELECT k, CAST(v AS STRING) AS v, to_json(struct(k, v)) AS j FROM input WHERE v > 1"):
        arrow.table(spark.sql(query))
    spark.stop()
    # The archive is written as the JVM exits: it exits when its stdin closes; wait for it.
    gateway = SparkContext._gateway
    gateway.shutdown()
    gateway.proc.stdin.close()
    gateway.proc.wait(timeout=120)


def _java_path() -> str | None:
    home = os.environ.get("JAVA_HOME")
    return os.pathsep.join(filter(None, [home and str(Path(home) / "bin"), os.environ.get("PATH")])) or None


if __name__ == "__main__":
    if sys.argv[1:2] == ["--dump"]:
        _dump(sys.argv[2])
    else:
        print(build(force="--force" in sys.argv[1:]) or f"no archive: {ARCHIVE_ENV} is empty")
