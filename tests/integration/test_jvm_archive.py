"""The class archive a worker's JVM maps: dumped by a real JVM, mapped by a real Spark session. The archive is
this installation's (`make setup` dumps it, as a worker image's build does): dumped here only when missing, since
a dump starts a Spark session of its own."""

import subprocess
import sys

from streamjobs_worker import jvm_archive

_SESSION = """
import sys
from streamjobs_worker.spark import session
spark = session(java_options=f"-XX:SharedArchiveFile={sys.argv[1]} -Xshare:on")
print(spark.range(5).selectExpr("sum(id)").collect()[0][0])
"""


def test_the_installations_archive_is_mapped_by_a_worker_session(monkeypatch):
    monkeypatch.delenv(jvm_archive.ARCHIVE_ENV, raising=False)
    archive = jvm_archive.build()
    assert archive.stat().st_size > 10_000_000  # Spark's classes, not an empty header
    assert not list(archive.parent.glob(f"{archive.name}.*.partial"))  # no dump left a partial file beside it
    # -Xshare:on makes a JVM that cannot map the archive (another JVM build, another class path) exit at once.
    mapped = subprocess.run([sys.executable, "-c", _SESSION, str(archive)], capture_output=True, text=True)
    assert mapped.returncode == 0, mapped.stderr[-3000:]
    assert mapped.stdout.strip().splitlines()[-1] == "10"
