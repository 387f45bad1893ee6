"""The autoscaler's ports on this machine: rescales through the local runtime's rescale controller,
decisions in Redis, events on the console and in the report."""

from __future__ import annotations

import time

from rich.console import Console
from rich.markup import escape
from streamjobs_autoscaler.autoscaler import Autoscaler
from streamjobs_autoscaler.collect import EndpointCollector, PrometheusCollector
from streamjobs_autoscaler.ports import StoreDecisionLog
from streamjobs_autoscaler.topology import Topology

from .local import LocalRuntime


class LocalScaler:
    def __init__(self, runtime: LocalRuntime) -> None:
        self.runtime = runtime

    def parallelism(self) -> dict[str, int]:
        return dict(self.runtime.parallelism)

    def rescale(self, op: str, parallelism: int) -> None:
        self.runtime.rescale(op, parallelism)


class ConsoleEvents:
    def __init__(self, console: Console) -> None:
        self.console = console
        self.events: list[dict] = []

    def emit(self, reason: str, message: str, warning: bool = False) -> None:
        self.events.append({"time": time.time(), "reason": reason, "message": message, "warning": warning})
        # escape: the message names its rule in brackets ("[ds2]"), which rich would take for a style.
        self.console.print(f"[{'yellow' if warning else 'cyan'}]autoscaler {reason}[/]: {escape(message)}")


def local_autoscaler(runtime: LocalRuntime, console: Console) -> tuple[Autoscaler, ConsoleEvents]:
    settings = runtime.job.spec.autoscaler
    if settings.metrics == "prometheus":
        collector = PrometheusCollector(settings.prometheus_url, runtime.job.metadata.name)
    else:
        collector = EndpointCollector(runtime.jobs)
    events = ConsoleEvents(console)
    log = StoreDecisionLog(runtime.jobs, settings.history_size)
    return Autoscaler(Topology.of(runtime.plan), settings, collector, LocalScaler(runtime), log, events), events
