"""A savepoint file from anywhere: any bytes, any change to a real one, is refused with a reason or read whole."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from streamjobs_core.savepoint import MAGIC, Savepoint, SavepointError

from ..jobs.control import control_plan

# DUMP payloads as Redis 7 writes them: a string, and the RDB version and CRC after it (not checked here).
_STRING = b"\x00\x05hello\x0b\x00" + bytes(8)
SAVEPOINT = Savepoint("ctl", 1, control_plan(), ((":snap:agg:3", 0, _STRING), (":failed", 0, _STRING)), "7.0.15")
ENCODED = SAVEPOINT.encode(b"key")


def _decoded_or_refused(data: bytes) -> Savepoint | None:
    try:
        return Savepoint.decode(data, signing_key=b"key")
    except SavepointError:
        return None


def test_a_savepoint_reads_back_whole():
    assert Savepoint.decode(ENCODED, signing_key=b"key") == SAVEPOINT


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=512))
def test_any_bytes_are_refused_with_a_reason(data):
    assert _decoded_or_refused(data) is None
    assert _decoded_or_refused(MAGIC + data) is None


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, len(ENCODED) - 1), st.integers(1, 255), st.integers(0, len(ENCODED)))
def test_a_changed_or_cut_savepoint_is_refused(at, flip, cut):
    changed = bytearray(ENCODED)
    changed[at] ^= flip
    assert _decoded_or_refused(bytes(changed)) in (None, SAVEPOINT)  # a byte of the envelope's framing may not matter
    if cut < len(ENCODED):
        assert _decoded_or_refused(ENCODED[:cut]) is None


def test_a_plan_in_a_savepoint_that_reaches_the_jvm_is_named():
    from streamjobs_core.loading import parse_job
    from streamjobs_core.plan import JobPlan

    job = parse_job({"apiVersion": "streamjobs.dev/v1alpha1", "kind": "StreamJob", "metadata": {"name": "ctl"}, "spec": {
        "sources": [{"name": "words", "type": "zipf"}],
        "stages": [{"name": "tag", "type": "sql", "inputs": ["words"],
                    "query": "SELECT reflect('java.lang.System', 'getenv', 'HOME') AS h, event_time FROM input"}],
        "sinks": [{"name": "out", "type": "redis_stream", "inputs": ["tag"]}]}})
    crafted = Savepoint("ctl", 1, JobPlan(job, 0, version=2), (), "7.0.15", (control_plan(),))
    ((where, message),) = crafted.jvm_calls()
    assert where == "plan version 2: spec.stages[0].query" and "reflect()" in message
    assert SAVEPOINT.jvm_calls() == []
