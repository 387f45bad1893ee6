"""The autoscaler reads the same numbers from a real Prometheus server as from the workers' /metrics."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.request

import pytest
from streamjobs.local import LocalRuntime
from streamjobs.redis_server import free_port
from streamjobs_autoscaler.collect import EndpointCollector, PrometheusCollector
from streamjobs_core.loading import parse_job

# No stage: no JVM; the source and the sink are real worker processes.
JOB = {
    "apiVersion": "streamjobs.dev/v1alpha1", "kind": "StreamJob", "metadata": {"name": "prom"},
    "spec": {
        "sources": [{"name": "words", "type": "zipf", "parallelism": 2, "rate": {"recordsPerSecond": 2000}}],
        "sinks": [{"name": "out", "type": "redis_stream", "inputs": ["words"]}],
    },
}


@pytest.fixture
def prometheus(tmp_path):
    def start(targets: list[str]):
        binary = shutil.which("prometheus")
        assert binary, "prometheus is installed by `make setup` (Debian package)"
        port = free_port()
        config = tmp_path / "prometheus.yml"
        # honor_labels: the workers' own `job` label (the StreamJob) wins over the scrape job's name.
        config.write_text(json.dumps({
            "global": {"scrape_interval": "1s"},
            "scrape_configs": [{"job_name": "streamjobs", "honor_labels": True,
                                "static_configs": [{"targets": targets}]}],
        }))
        process = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        started.append(process)
        return f"http://127.0.0.1:{port}"

    started: list[subprocess.Popen] = []
    yield start
    for process in started:
        process.terminate()
        process.wait(10)


def _up(url: str, targets: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/api/v1/query?query=up", timeout=2) as response:
                result = json.load(response)["data"]["result"]
            if len(result) == targets and all(row["value"][1] == "1" for row in result):
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise TimeoutError("Prometheus did not scrape every worker")


def _scraped_records(url: str, timeout_s: float = 60) -> None:
    """Wait until Prometheus scraped records through both operators."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        operators = PrometheusCollector(url, "prom").collect(0).operators
        if {"words", "out"} <= set(operators) and all(operators[op].records_in > 0 for op in ("words", "out")):
            return
        time.sleep(0.5)
    raise TimeoutError("Prometheus scraped no records of both operators")


def test_prometheus_and_endpoints_agree(redis_server, r, prometheus, tmp_path):
    runtime = LocalRuntime(parse_job(JOB), redis_server.url, tmp_path / "logs")
    try:
        runtime.start()
        targets = sorted(runtime.jobs.registered().values())
        url = prometheus(targets)
        _up(url, len(targets))
        _scraped_records(url)
        # Prometheus may scrape between two reads, so its value is bracketed by a read before and one after.
        before = EndpointCollector(runtime.jobs).collect(0)
        through = PrometheusCollector(url, "prom").collect(0)
        after = EndpointCollector(runtime.jobs).collect(0)
    finally:
        runtime.shutdown()
    assert set(through.operators) == {"words", "out"}
    for op in ("words", "out"):
        assert through.operators[op].instances == before.operators[op].instances == (2 if op == "words" else 1)
        # Its scrape is at most one interval (1 s) older than the query: at 2,000 rec/s they differ by little.
        assert 0 < through.operators[op].records_in <= after.operators[op].records_in
        assert before.operators[op].records_in - through.operators[op].records_in < 2000 * 2.5
    assert through.operators["words"].busy_s > 0
    assert PrometheusCollector(url, "no-such-job").collect(0).operators == {}



def _serving(body: bytes):
    """An HTTP server on a free local port answering every GET with `body`."""
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_the_endpoint_collector_scrapes_only_the_jobs_hosts_and_drops_a_flood():
    """Workers say where they are, and run user code: an address elsewhere is not scraped, a reply past the
    bound is dropped."""
    from streamjobs_core.control import InstanceAddress
    from streamjobs_core.jobstore import MemoryJobStore

    line = b'streamjobs_records_in_total{job="j",operator="op",instance="0"} 5\n'
    servers = [_serving(line), _serving(line * 200_000)]  # the second: ~13 MB
    try:
        store = MemoryJobStore()
        for i, server in enumerate(servers):
            store.register(InstanceAddress("op", i, f"127.0.0.1:{server.server_address[1]}"))
        counted = EndpointCollector(store).collect(0).operators["op"]
        assert (counted.instances, counted.records_in) == (1, 5)  # the flood is dropped
        assert EndpointCollector(store, hosts=lambda: {"10.0.0.7"}).collect(0).operators == {}
        assert EndpointCollector(store, hosts=lambda: {"127.0.0.1"}).collect(0).operators["op"].records_in == 5
    finally:
        for server in servers:
            server.shutdown()
