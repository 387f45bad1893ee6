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


def test_a_prestaged_store_tails_the_changelog_and_restore_applies_only_the_rest(r):
    cp = checkpoint(r)
    owner = KeyGroupStore([0, 1])
    for i in range(50):
        owner.put(0, f"k{i}", (i,))
    ids = commit_changes(cp, owner)
    recovery.snapshot(r, KEYS, "op", owner, ids, [0, 1])
    owner.put(1, "x", (1,))
    ids.update(commit_changes(cp, owner))

    standby, applied = KeyGroupStore([0, 1]), {}
    assert recovery.catch_up(r, KEYS, "op", standby, applied, [0, 1]) == 1  # snapshot of 0 + one entry of 1
    assert len(dict(standby.items(0))) == 50
    owner.put(0, "k0", (100,))
    owner.delete(1, "x")
    ids.update(commit_changes(cp, owner))
    assert recovery.catch_up(r, KEYS, "op", standby, applied, [0, 1]) == 2
    owner.put(0, "late", (7,))  # the old owner's last commit before the handover
    ids.update(commit_changes(cp, owner))

    last = recovery.restore(r, KEYS, "op", standby, since=applied)
    assert last == ids
    assert dict(standby.items(0)) == dict(owner.items(0)) and dict(standby.items(1)) == {}


def test_catch_up_reloads_a_key_group_whose_snapshot_trimmed_entries_it_had_not_read(r):
    cp = checkpoint(r)
    owner = KeyGroupStore([0])
    owner.put(0, "a", (1,))
    ids = commit_changes(cp, owner)
    standby, applied = KeyGroupStore([0]), {}
    recovery.catch_up(r, KEYS, "op", standby, applied, [0])
    for i in range(3):  # changes the standby never read, then a snapshot that trims them away
        owner.put(0, f"b{i}", (i,))
        ids.update(commit_changes(cp, owner))
    recovery.snapshot(r, KEYS, "op", owner, ids, [0])
    assert r.xlen(KEYS.changelog("op", 0)) == 0
    owner.put(0, "c", (9,))
    ids.update(commit_changes(cp, owner))

    recovery.catch_up(r, KEYS, "op", standby, applied, [0])
    assert dict(standby.items(0)) == dict(owner.items(0))
    assert applied == ids


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
