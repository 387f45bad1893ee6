"""Durable state and the atomic, fenced commit against a real redis-server."""

from __future__ import annotations

import pytest
from streamjobs_core.layout import JobKeys
from streamjobs_worker import recovery
from streamjobs_worker.state import KeyGroupStore
from streamjobs_worker.transaction import Checkpoint, Fenced, Transaction

KEYS = JobKeys("t")


def checkpoint(r, instance=0):
    incarnation = r.incr(KEYS.incarnation("op", instance))
    return Checkpoint(r, KEYS, "op", instance, incarnation)


def commit_changes(cp, store):
    txn = Transaction()
    txn.changelog.update(store.drain_changes())
    return cp.commit(txn)


def test_restore_from_changelog_then_snapshot_then_tail(r):
    cp = checkpoint(r)
    store = KeyGroupStore([0, 1])
    store.put(0, ("a", 1), (1, 2))
    store.put(1, "b", (3,))
    ids = commit_changes(cp, store)
    store.put(0, ("a", 1), (5, 6))
    store.delete(1, "b")
    ids.update(commit_changes(cp, store))
    recovery.snapshot(r, KEYS, "op", store, ids, [0, 1])
    assert r.xlen(KEYS.changelog("op", 0)) == 0, "a snapshot trims the changelog it covers"
    store.put(0, "c", (7,))
    ids.update(commit_changes(cp, store))

    restored = KeyGroupStore([0, 1])
    last = recovery.restore(r, KEYS, "op", restored)
    assert dict(restored.items(0)) == {("a", 1): (5, 6), "c": (7,)}
    assert dict(restored.items(1)) == {}
    assert last[0] == ids[0]


def test_commit_is_atomic_and_fenced_by_a_newer_incarnation(r):
    old = checkpoint(r)
    txn = Transaction()
    txn.xadd("sj:{t}:x", {"a": "1"})
    old.commit(txn)
    checkpoint(r)  # the instance restarted elsewhere
    txn = Transaction()
    txn.xadd("sj:{t}:x", {"a": "2"})
    txn.hset("sj:{t}:h", {"f": "v"})
    with pytest.raises(Fenced):
        old.commit(txn)
    assert r.xlen("sj:{t}:x") == 1
    assert not r.exists("sj:{t}:h")


def test_commit_is_fenced_by_a_new_assignment_epoch(r):
    r.hset(KEYS.assignment("op"), "epoch", 1)
    cp = checkpoint(r)
    cp.commit(Transaction(xadds=[("sj:{t}:x", {"a": "1"}, None)]))
    r.hset(KEYS.assignment("op"), "epoch", 2)
    with pytest.raises(Fenced):
        cp.commit(Transaction(xadds=[("sj:{t}:x", {"a": "2"}, None)]))
    assert r.xlen("sj:{t}:x") == 1
