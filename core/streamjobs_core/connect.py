"""Redis connections from one URL: `redis://host:port[/db]`, `rediss://...` (TLS),
or either with `?cluster=1` for Redis Cluster (a job's keys share one slot)."""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis


def connect(url: str) -> redis.Redis | redis.RedisCluster:
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    cluster = query.pop("cluster", "").lower() in ("1", "true", "yes")
    plain = urlunsplit(parts._replace(query=urlencode(query)))
    if cluster:
        return redis.RedisCluster.from_url(plain)
    return redis.Redis.from_url(plain)


def redacted(url: str) -> str:
    """The URL as it may be shown: without its password."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))
