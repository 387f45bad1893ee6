"""Test layers by folder: unit (no services), integration (real redis-server,
real Spark, real processes), e2e (whole jobs, chaos), operator (the kopf operator
against kmock's emulated API server with real Redis and worker processes; the chart)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from tests.hang_dump import dump_jvms

_LAYERS = ("unit", "integration", "e2e", "operator")

# Tests start far more worker JVMs than they run long: on 2 cores, C2's compile threads starved the JVMs
# starting beside a running job (a rescale's new instances took 40-55 s to come up, 15-20 s with C1 only).
# Only speed differs; the benchmarks run the default JIT.
os.environ.setdefault("STREAMJOBS_JAVA_OPTIONS", "-XX:TieredStopAtLevel=1")


_SPENT: dict[str, float] = {}  # seconds per layer: setup, call and teardown of its tests


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    parts = report.nodeid.split("/")
    layer = parts[1] if len(parts) > 2 and parts[1] in _LAYERS else "other"
    _SPENT[layer] = _SPENT.get(layer, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter) -> None:
    """Where the run's time went, per layer (`make test` prints it at the end of each pytest run)."""
    if _SPENT:
        spent = ", ".join(f"{layer} {seconds:,.0f} s" for layer, seconds in _SPENT.items())
        terminalreporter.write_line(f"time per layer: {spent}")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        parts = Path(str(item.fspath)).parts
        for layer in _LAYERS:
            if layer in parts:
                item.add_marker(getattr(pytest.mark, layer))


@pytest.fixture(autouse=True)
def _jvm_dump_before_timeout(request):
    """The JVMs' threads 30 s before pytest-timeout fails a hung test (which prints the Python threads)."""
    timeout = float(request.config.getini("timeout") or 0)
    if timeout <= 30:
        yield
        return
    timer = threading.Timer(timeout - 30, dump_jvms, args=(f"{request.node.nodeid} runs {timeout - 30:.0f} s",))
    timer.daemon = True
    timer.start()
    yield
    timer.cancel()


@pytest.fixture(scope="session")
def redis_server():
    from streamjobs.redis_server import RedisServer

    with RedisServer() as server:
        yield server


@pytest.fixture
def r(redis_server):
    import redis

    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    yield client
    client.close()


@pytest.fixture(scope="session")
def spark():
    from streamjobs_worker import spark as worker_spark

    # Two task threads and room for the e2e tests whose workers run as threads of this process (one JVM).
    return worker_spark.session("local[2]", "2g")
