"""Operator chaining: which operators share a worker, and what the rest of the system sees of a chain."""

from __future__ import annotations

from streamjobs_autoscaler.collect import OperatorCounters, Snapshot
from streamjobs_autoscaler.topology import Topology
from streamjobs_core.loading import parse_job
from streamjobs_core.plan import JobPlan


def plan_of(sources, stages, sinks, **spec) -> JobPlan:
    return JobPlan(parse_job({"metadata": {"name": "c"}, "spec": {
        "sources": sources, "stages": stages, "sinks": sinks, **spec}}), 0)


SOURCE = {"name": "events", "type": "nexmark"}
WINDOW = {"name": "per-auction", "type": "window_aggregate", "inputs": ["events"], "keyBy": "bid_auction",
          "window": {"sizeMs": 1000}, "aggregations": [{"function": "count", "as": "bids"}]}
SQL = {"name": "by-window", "type": "sql", "inputs": ["per-auction"],
       "query": "SELECT window_end AS slide_end, bids, event_time FROM input"}
HOTTEST = {"name": "hottest", "type": "window_aggregate", "inputs": ["by-window"], "keyBy": "slide_end",
           "window": {"sizeMs": 1000}, "aggregations": [{"function": "max", "column": "bids", "as": "m"}]}
SINK = {"name": "out", "type": "redis_stream", "inputs": ["hottest"]}


def chains(plan: JobPlan) -> list[tuple[str, ...]]:
    return [chain.operators for chain in plan.chains]


def test_a_sql_stage_chains_to_its_window_and_the_sink_to_the_last_window():
    plan = plan_of([SOURCE], [WINDOW, SQL, HOTTEST], [SINK])
    assert chains(plan) == [("events",), ("per-auction", "by-window"), ("hottest", "out")]
    assert plan.vertices == ("events", "per-auction", "hottest")
    assert plan.head("out") == "hottest" and plan.chain("by-window").tail == "by-window"


def test_a_stateless_stage_and_a_sink_chain_to_a_source():
    stage = {"name": "bids", "type": "sql", "inputs": ["events"], "query": "SELECT * FROM input"}
    sink = {"name": "out", "type": "redis_stream", "inputs": ["bids"]}
    assert chains(plan_of([SOURCE], [stage], [sink])) == [("events", "bids", "out")]


def test_chain_false_keeps_an_operator_apart_from_both_neighbours():
    plan = plan_of([SOURCE], [WINDOW, {**SQL, "chain": False}, HOTTEST], [SINK])
    assert chains(plan) == [("events",), ("per-auction",), ("by-window",), ("hottest", "out")]


def test_keyed_edges_other_parallelism_and_fan_out_are_not_forward():
    keyed_sql = {**SQL, "keyBy": "bid_auction"}
    assert chains(plan_of([SOURCE], [WINDOW, keyed_sql], [{**SINK, "inputs": ["by-window"]}])) == [
        ("events",), ("per-auction",), ("by-window", "out")]
    wider = {**SINK, "inputs": ["hottest"], "parallelism": 2}
    assert chains(plan_of([SOURCE], [WINDOW, SQL, HOTTEST], [wider]))[-2:] == [("hottest",), ("out",)]
    two_sinks = [SINK, {**SINK, "name": "copy"}]  # hottest feeds two consumers: neither is chained
    assert chains(plan_of([SOURCE], [WINDOW, SQL, HOTTEST], two_sinks))[-3:] == [("hottest",), ("out",), ("copy",)]


def test_a_stage_with_two_inputs_is_not_chained():
    other = {"name": "more", "type": "zipf"}
    union = {"name": "both", "type": "sql", "inputs": ["events", "more"], "query": "SELECT 1 AS x FROM input"}
    sink = {"name": "out", "type": "redis_stream", "inputs": ["both"]}
    assert chains(plan_of([SOURCE, other], [union], [sink])) == [("events",), ("more",), ("both", "out")]


def test_a_chained_operator_has_its_heads_key_groups_and_assignment():
    source = {"name": "in", "type": "redis_stream", "partitions": 4}
    stage = {"name": "parse", "type": "sql", "inputs": ["in"], "query": "SELECT * FROM input"}
    plan = plan_of([source], [stage], [{"name": "out", "type": "redis_stream", "inputs": ["parse", "in"]}])
    assert chains(plan) == [("in",), ("parse",), ("out",)]  # `in` feeds two consumers
    plan = plan_of([source], [stage], [{"name": "out", "type": "redis_stream", "inputs": ["parse"]}])
    assert plan.key_groups("out") == plan.key_groups("parse") == 4
    assert plan.initial_assignment("out") == plan.initial_assignment("in")


def test_the_autoscaler_sizes_chains_with_their_heads_input_and_their_tails_output():
    plan = plan_of([SOURCE], [WINDOW, SQL, HOTTEST], [SINK])
    topology = Topology.of(plan)
    assert [(i.name, i.inputs, i.output) for i in topology.operators] == [
        ("events", (), None), ("per-auction", ("events",), "by-window"), ("hottest", ("per-auction",), "out")]
    snapshot = Snapshot(5, {
        "per-auction": OperatorCounters(instances=1, records_in=100, records_out=40, busy_s=2),
        "by-window": OperatorCounters(instances=1, records_in=40, records_out=30),
    })
    folded = topology.fold(snapshot).operators
    assert (folded["per-auction"].records_in, folded["per-auction"].records_out, folded["per-auction"].busy_s) == (
        100, 30, 2)
