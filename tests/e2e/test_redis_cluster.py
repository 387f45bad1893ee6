"""A job on a real local Redis Cluster (3 masters on loopback): one slot per job, exact result."""

from __future__ import annotations

import contextlib
import time

import pytest
import redis
from rich.console import Console
from streamjobs.redis_server import RedisServer, free_port
from streamjobs.run import run_job
from streamjobs_core.connect import connect
from streamjobs_core.layout import JobKeys
from streamjobs_core.loading import load_job

from .conftest import ROOT, assert_exact

SLOTS = 16384


@pytest.fixture(scope="module")
def cluster():
    with contextlib.ExitStack() as stack:
        nodes = [stack.enter_context(RedisServer(free_port(below=55536),
                                                 extra=("--cluster-enabled", "yes", "--cluster-node-timeout", "2000")))
                 for _ in range(3)]
        clients = [redis.Redis(port=n.port) for n in nodes]
        for i, client in enumerate(clients):
            client.execute_command("CLUSTER ADDSLOTSRANGE", i * SLOTS // 3, (i + 1) * SLOTS // 3 - 1)
        for node in nodes[1:]:
            clients[0].execute_command("CLUSTER MEET", "127.0.0.1", node.port)
        deadline = time.monotonic() + 30
        while not all(c.cluster("info")["cluster_state"] == "ok" for c in clients):
            assert time.monotonic() < deadline, "cluster did not form"
            time.sleep(0.2)
        yield f"redis://127.0.0.1:{nodes[0].port}?cluster=1"


def test_wordcount_on_redis_cluster(cluster, tmp_path):
    r = connect(cluster)
    assert isinstance(r, redis.RedisCluster)
    report = run_job(load_job(ROOT / "examples/wordcount.yaml"), 10, redis_url=cluster,
                     console=Console(force_terminal=False), log_dir=str(tmp_path))
    assert_exact(report)
    slots = {r.keyslot(key) for key in r.scan_iter(match=JobKeys("wordcount").pattern)}
    assert len(slots) == 1, "all keys of a job share one slot"
