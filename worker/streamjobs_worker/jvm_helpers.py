"""The worker's own JVM classes (jvm/*.java), compiled against the installed Spark into a jar the session loads.

They let a stage plan its query once and run it per batch (prepared.py): a relation over "the current
batch" as Arrow vectors (CurrentBatch) and the check that a planned query may run again (Reuse).

The jar is built once per installation (`make setup`, the worker image's build) by
`python -m streamjobs_worker.jvm_helpers`, or by the first session that finds a JDK; it is named after
what it depends on (the sources, PySpark's version and the JDK), so a stale one is never loaded. Without a
JDK and without a jar a worker plans every batch as before: slower, never different.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from .jvm_archive import _java_path

HELPERS_ENV = "STREAMJOBS_JVM_HELPERS"  # a path; empty: no helpers
SOURCES = sorted((Path(__file__).parent / "jvm").glob("*.java"))

log = logging.getLogger(__name__)


def jar_path() -> Path | None:
    """$STREAMJOBS_JVM_HELPERS, else a jar in the user's cache named after the sources, PySpark and the JDK."""
    configured = os.environ.get(HELPERS_ENV)
    if configured is not None:
        return Path(configured) if configured else None
    import pyspark

    digest = hashlib.sha256(f"{pyspark.__version__}|{_javac()}".encode())
    for source in SOURCES:
        digest.update(source.read_bytes())
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "streamjobs" / f"helpers-{digest.hexdigest()[:16]}.jar"


def _javac() -> str | None:
    javac = shutil.which("javac", path=_java_path())
    return javac and str(Path(javac).resolve())


def jar(strict: bool = False) -> Path | None:
    """The helpers' jar, built now if it is missing and a JDK is here; None when there is none to load.
    A build that fails is a warning (a worker plans every batch anew), or with `strict` the HelpersError."""
    path = jar_path()
    if path is None or path.is_file():
        return path
    try:
        return build(path)
    except HelpersError as e:
        if strict:
            raise
        log.warning("no JVM helpers, every batch is planned anew: %s", e)
        return None


def build(path: Path | None = None) -> Path | None:
    path = path or jar_path()
    if path is None:
        return None
    javac = _javac()
    if javac is None:
        raise HelpersError("no javac (a JDK 17) on JAVA_HOME or PATH")
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    with tempfile.TemporaryDirectory() as classes:
        done = subprocess.run([javac, "-nowarn", "-encoding", "UTF-8", "-cp", f"{jars}/*", "-d", classes,
                               *map(str, SOURCES)], capture_output=True, text=True)
        if done.returncode != 0:
            raise HelpersError(f"javac failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
        try:
            with zipfile.ZipFile(partial, "w") as archive:
                for file in sorted(Path(classes).rglob("*.class")):
                    archive.write(file, file.relative_to(classes).as_posix())
            os.replace(partial, path)  # sessions starting meanwhile see no jar or a whole one
        finally:
            partial.unlink(missing_ok=True)
    return path


class HelpersError(RuntimeError):
    """The helpers could not be compiled."""


if __name__ == "__main__":
    # `make setup`: nothing to compile when the jar is there (it is named after all it is built from).
    print(jar(strict=True) or f"no helpers: {HELPERS_ENV} is empty")
    sys.exit(0)
