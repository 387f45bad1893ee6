"""Redis connections from one URL: `redis://host:port[/db]`, `rediss://...` (TLS),
or either with `?cluster=1` for Redis Cluster (a job's keys share one slot).

A worker gets its URL without credentials and its user and password in variables
of their own (CREDENTIALS), which it takes out of its environment before its JVM
or any user code starts: no URL a query could read (`reflect(... getenv ...)`,
when allowed) or a log could print holds a password.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

import redis

USERNAME_ENV, PASSWORD_ENV = "STREAMJOBS_REDIS_USERNAME", "STREAMJOBS_REDIS_PASSWORD"


@dataclass(frozen=True)
class Credentials:
    username: str | None = None
    password: str | None = None

    def env(self) -> dict[str, str]:
        pairs = ((USERNAME_ENV, self.username), (PASSWORD_ENV, self.password))
        return {name: value for name, value in pairs if value is not None}

    @classmethod
    def taken_from_env(cls) -> Credentials:
        """The credentials in this process's environment, which no longer holds them (nor will its children)."""
        return cls(os.environ.pop(USERNAME_ENV, None), os.environ.pop(PASSWORD_ENV, None))


def apart(url: str) -> tuple[str, Credentials]:
    """The URL without its userinfo, and the credentials it held."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url, Credentials()
    host = parts.netloc.rpartition("@")[2]
    username = unquote(parts.username) if parts.username else None
    password = unquote(parts.password) if parts.password is not None else None
    return urlunsplit(parts._replace(netloc=host)), Credentials(username, password)


def connect(url: str, credentials: Credentials = Credentials()) -> redis.Redis | redis.RedisCluster:
    """A client of the Redis at `url`; `credentials` where the URL carries none."""
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    cluster = query.pop("cluster", "").lower() in ("1", "true", "yes")
    plain = urlunsplit(parts._replace(query=urlencode(query)))
    auth = {k: v for k, v in vars(credentials).items() if v is not None}
    if cluster:
        return redis.RedisCluster.from_url(plain, **auth)
    return redis.Redis.from_url(plain, **auth)


def redacted(url: str) -> str:
    """The URL as it may be shown: without its password."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))
