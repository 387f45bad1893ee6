"""A job end to end against a real redis-server that accepts only TLS connections with a password.

The certificates come from a throwaway CA (trustme); the server listens on a TLS port only and
requires the password, so a worker, the runtime or the oracle that fell back to plain TCP or
forgot the password would fail the job, not pass it.
"""

from __future__ import annotations

import io
import subprocess
import time
from pathlib import Path

import pytest
import redis
import trustme
from rich.console import Console
from streamjobs.redis_server import free_port, redis_server_binary
from streamjobs.run import run_job
from streamjobs_core.connect import connect
from streamjobs_core.loading import load_job

from .conftest import ROOT, assert_exact

PASSWORD = "s3cret-for-the-test"


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory):
    files = tmp_path_factory.mktemp("tls")
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(files / "ca.pem"))
    server_cert = ca.issue_cert("127.0.0.1", "localhost")
    server_cert.cert_chain_pems[0].write_to_path(str(files / "server.pem"))
    server_cert.private_key_pem.write_to_path(str(files / "server.key"))
    port = free_port()
    server = subprocess.Popen(
        [redis_server_binary(), "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
         "--tls-cert-file", str(files / "server.pem"), "--tls-key-file", str(files / "server.key"),
         "--tls-ca-cert-file", str(files / "ca.pem"), "--tls-auth-clients", "no",
         "--requirepass", PASSWORD, "--save", "", "--appendonly", "no", "--dir", str(files)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    url = f"rediss://:{PASSWORD}@127.0.0.1:{port}/0?ssl_ca_certs={files / 'ca.pem'}&ssl_cert_reqs=required"
    client = connect(url)
    deadline = time.monotonic() + 10
    while True:
        try:
            client.ping()
            break
        except redis.ConnectionError:
            assert server.poll() is None and time.monotonic() < deadline, "redis-server with TLS did not start"
            time.sleep(0.05)
    yield port, url, files / "ca.pem"
    server.terminate()
    server.wait(10)


def test_the_server_refuses_plain_tcp_and_a_missing_password(tls_redis):
    port, _, ca = tls_redis
    with pytest.raises(redis.ConnectionError):
        redis.Redis(port=port, socket_timeout=2).ping()  # plain TCP on the TLS port
    with pytest.raises(redis.AuthenticationError):
        connect(f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={ca}&ssl_cert_reqs=required").ping()


def _children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def test_wordcount_over_tls_with_a_password_is_exact_and_shows_the_password_nowhere(tls_redis, tmp_path):
    _, url, _ = tls_redis
    command_lines: list[str] = []
    jvm_environments: list[bytes] = []

    def look_at_workers(runtime, _elapsed: float) -> None:
        for inst in [i for i in list(runtime.processes.instances.values()) if i.process.poll() is None]:
            command_lines.append(Path(f"/proc/{inst.process.pid}/cmdline").read_bytes().decode(errors="replace"))
            for child in _children(inst.process.pid):  # Spark's JVM: what SQL's getenv would read
                jvm_environments.append(Path(f"/proc/{child}/environ").read_bytes())

    screen = io.StringIO()
    report = run_job(load_job(ROOT / "examples/wordcount.yaml"), 10, redis_url=url,
                     console=Console(file=screen, force_terminal=False, width=200), log_dir=str(tmp_path / "logs"),
                     during=look_at_workers, report_path=str(tmp_path / "report.json"))
    assert_exact(report)
    assert command_lines and not any(PASSWORD in line for line in command_lines), "a worker's command line"
    assert jvm_environments and not any(PASSWORD.encode() in env for env in jvm_environments), "a JVM's environment"
    assert "starting wordcount on rediss://:***@127.0.0.1" in screen.getvalue()
    shown = {"the console": screen.getvalue(), "the report": (tmp_path / "report.json").read_text(),
             **{log.name: log.read_text(errors="replace") for log in (tmp_path / "logs").iterdir()}}
    assert [where for where, text in shown.items() if PASSWORD in text] == []


class _Secrets:
    """The one call open_redis makes of the Kubernetes client: a Secret's value."""

    def __init__(self, values: dict[tuple[str, str], str]) -> None:
        self.values = values

    def secret_value(self, namespace: str, name: str, key: str) -> str:
        return self.values[(name, key)]


def test_the_operator_connects_with_the_ca_and_password_from_secrets(tls_redis):
    from streamjobs_operator.config import Settings
    from streamjobs_operator.resources import RedisTarget
    from streamjobs_operator.store import open_redis

    port, _, ca = tls_redis
    secrets = _Secrets({("redis-auth", "password"): PASSWORD, ("redis-ca", "ca.crt"): ca.read_text()})
    target = RedisTarget(f"rediss://127.0.0.1:{port}/0", password_secret="redis-auth", ca_secret="redis-ca")
    assert open_redis(secrets, "jobs", target, Settings()).ping()
    # A CA that did not sign the server's certificate is refused.
    other = _Secrets({**secrets.values, ("redis-ca", "ca.crt"): trustme.CA().cert_pem.bytes().decode()})
    with pytest.raises(redis.ConnectionError):
        open_redis(other, "jobs", target, Settings()).ping()
