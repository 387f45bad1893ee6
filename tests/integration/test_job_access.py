"""A job's own Redis user (access.py), against a real redis-server: its keys, and nothing of another job's."""

from __future__ import annotations

import pytest
import redis
from streamjobs_core.connect import Credentials, connect
from streamjobs_core.layout import JobKeys
from streamjobs_operator import access
from streamjobs_operator.resources import JobAccess, Owner

A, B = Owner("shared", "tenant-a", "uid-a"), Owner("shared", "tenant-b", "uid-b")


@pytest.fixture
def users(redis_server):
    admin = redis.Redis.from_url(redis_server.url)
    grants = {owner: (JobAccess.of(owner), access.new_password()) for owner in (A, B)}
    for owner, (user, password) in grants.items():
        access.grant(admin, user, JobKeys(owner.job), password, tables=("tables:geo:",))
    clients = {owner: connect(redis_server.url, Credentials(user.username, password))
               for owner, (user, password) in grants.items()}
    yield admin, clients
    for client in clients.values():
        client.close()
    for user, _ in grants.values():
        access.revoke(admin, user)
    admin.delete(*admin.keys("sj:{tenant-*"), "tables:geo:fr")
    admin.close()


def test_a_jobs_user_works_on_its_keys_and_is_refused_another_jobs(users):
    admin, clients = users
    a, b = JobKeys(A.job), JobKeys(B.job)
    mine = clients[A]
    mine.set(a.snapshot("count", 3), b"state")
    mine.xadd(a.kg_stream("words", "count", 3), {"w": "x"})
    mine.hset(a.offsets("words"), "0", "12")
    assert mine.eval("return redis.call('GET', KEYS[1])", 1, a.snapshot("count", 3)) == b"state"
    with mine.pipeline(transaction=True) as txn:  # a worker's commit
        txn.hincrby(a.counts, "count:in", 5).xadd(a.output_stream("out"), {"n": "1"})
        txn.execute()

    admin.set(b.snapshot("count", 3), b"theirs")
    admin.xadd(b.input_stream("words", 0), {"w": "y"})
    refused = [
        lambda: mine.get(b.snapshot("count", 3)),
        lambda: mine.set(b.snapshot("count", 3), b"mine now"),
        lambda: mine.xrange(b.input_stream("words", 0)),
        lambda: mine.xadd(b.output_stream("out"), {"n": "1"}),
        lambda: mine.delete(b.plan),
        lambda: mine.eval("return redis.call('GET', KEYS[1])", 1, b.snapshot("count", 3)),
        lambda: mine.eval("return redis.call('GET', ARGV[1])", 0, b.snapshot("count", 3)),  # undeclared, in a script
        lambda: mine.execute_command("COPY", a.snapshot("count", 3), b.snapshot("count", 4)),
        lambda: mine.flushall(),
        lambda: mine.keys("*"),
        lambda: mine.config_get("requirepass"),
        lambda: mine.execute_command("ACL", "SETUSER", "me", "on", "~*", "+@all"),
        lambda: mine.set("tables:geo:fr", "mine"),  # a shared table is read-only
    ]
    for command in refused:  # NOPERM; in a script, Redis says it as an error of the script
        with pytest.raises(redis.exceptions.ResponseError, match="(?i)no permissions|can't access"):
            command()
    assert admin.get(b.snapshot("count", 3)) == b"theirs" and not admin.exists(b.output_stream("out"))
    admin.hset("tables:geo:fr", mapping={"name": "France"})
    assert mine.hgetall("tables:geo:fr") == {b"name": b"France"}


def test_a_revoked_user_can_no_longer_connect(users, redis_server):
    admin, clients = users
    access.revoke(admin, JobAccess.of(A))
    with pytest.raises((redis.exceptions.AuthenticationError, redis.exceptions.ConnectionError)):
        clients[A].connection_pool.disconnect()
        clients[A].ping()
    access.grant(admin, JobAccess.of(A), JobKeys(A.job), access.new_password())  # the fixture revokes it again
