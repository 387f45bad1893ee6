"""Redis key layout of a job.

Every key of a job carries the hash tag `{<job id>}`, so a job lives in one
Redis Cluster slot (one MULTI/EXEC can cover all of its keys) and many jobs
spread over a cluster. The job id is `<namespace>/<name>` for a StreamJob
object, so jobs of one name in two namespaces never share a key, and the bare
name for the local runtime, which runs every job in one default namespace.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


def job_id(namespace: str | None, name: str) -> str:
    return name if namespace is None else f"{namespace}/{name}"


def namespace_of(job: str) -> str | None:
    """The namespace part of a job id; None for a job of the local runtime."""
    namespace, _, name = job.rpartition("/")
    return namespace or None


@dataclass(frozen=True)
class JobKeys:
    job: str  # the job id

    @property
    def prefix(self) -> str:
        return f"sj:{{{self.job}}}"

    @property
    def plan(self) -> str:
        return f"{self.prefix}:plan"

    @property
    def deployed_by(self) -> str:
        """The uid of the StreamJob object whose deploy wrote the plan (the operator's create handler is retried)."""
        return f"{self.prefix}:k8s-owner"

    @property
    def control(self) -> str:
        return f"{self.prefix}:ctl"

    @property
    def metrics_endpoints(self) -> str:
        return f"{self.prefix}:metrics"

    @property
    def latency_samples(self) -> str:
        return f"{self.prefix}:latency"

    @property
    def dead_letter(self) -> str:
        return f"{self.prefix}:dlq"

    @property
    def dead_letter_totals(self) -> str:
        """Per operator: records it dead-lettered, all time (the dead-letter stream is capped)."""
        return f"{self.prefix}:dlq-total"

    @property
    def counts(self) -> str:
        """Per operator, `<op>:in` and `<op>:out`: records it took and produced, as committed."""
        return f"{self.prefix}:counts"

    @property
    def shed(self) -> str:
        """One entry per batch a source shed records from (see shedding.py)."""
        return f"{self.prefix}:shed"

    @property
    def shed_totals(self) -> str:
        """Per source operator: records shed, all time (the shed stream is capped)."""
        return f"{self.prefix}:shed-total"

    def assignment(self, op: str) -> str:
        return f"{self.prefix}:assign:{op}"

    def next_assignment(self, op: str) -> str:
        """The assignment a rescale in PRESTAGE will switch to (standbys prestage its key groups)."""
        return f"{self.prefix}:assign-next:{op}"

    def standby(self, op: str) -> str:
        return f"{self.prefix}:standby:{op}"

    def standby_lag(self, op: str) -> str:
        """Per standby instance: changelog entries it applied in its last catch-up round."""
        return f"{self.prefix}:standby-lag:{op}"

    def spares(self, op: str) -> str:
        """Per warm spare of the chain headed by `op`: "ready" once its Spark is up and its chain rehearsed."""
        return f"{self.prefix}:spares:{op}"

    def promotion(self, op: str, spare: str) -> str:
        """A list the spare blocks on: the one entry pushed to it says which instance it becomes."""
        return f"{self.prefix}:promote:{op}:{spare}"

    def demotion(self, op: str, instance: int) -> str:
        """The spare name instance `instance` takes when a scale-in demotes it."""
        return f"{self.prefix}:demote:{op}:{instance}"

    def pod_roles(self, op: str) -> str:
        """Per pod ordinal of a StatefulSet with warm spares that a scale-out promoted beyond the parallelism in
        force: the assignment epoch it was promoted in (spares.py)."""
        return f"{self.prefix}:pods:{op}"

    def moved(self, op: str) -> str:
        """Per key group moved by a fluid or batched rescale in progress: its owner instance now (written in
        the old owner's releasing commit; the assignment in force says who owns the others)."""
        return f"{self.prefix}:owners:{op}"  # the name running jobs wrote

    def releases(self, op: str) -> str:
        """Per source partition or backlogged key group to move: the instance to release it to at the owner's
        next commit (a source has no stream to mark; a marker would wait behind the backlog)."""
        return f"{self.prefix}:release:{op}"

    def acquired(self, op: str) -> str:
        """Per moved key group: the instance that took it over (the controller paces its steps on it)."""
        return f"{self.prefix}:acquired:{op}"

    @property
    def rescale_requests(self) -> str:
        return f"{self.prefix}:rescale:requests"

    @property
    def rescale_current(self) -> str:
        return f"{self.prefix}:rescale:current"

    @property
    def rescale_history(self) -> str:
        return f"{self.prefix}:rescale:history"

    @property
    def plans(self) -> str:
        """Per plan version but the latest (that one is `plan`): the plan as deployed or reconfigured then. A
        worker whose key groups have not switched yet runs the version they are at; the oracle replays them all."""
        return f"{self.prefix}:plans"

    def versions(self, op: str) -> str:
        """Per key group (source partition) of a chain head: the plan version it switched to (absent: 0)."""
        return f"{self.prefix}:versions:{op}"

    def cut(self, version: int) -> str:
        """Per `<source>/<partition>`: the offset at which the partition switched to `version` (the records
        before it were processed under the version before, everywhere downstream)."""
        return f"{self.prefix}:cut:{version}"

    def aligned(self, version: int) -> str:
        """Per `<op>/<instance>`: how long the instance held its input back aligning its barriers (ms)."""
        return f"{self.prefix}:aligned:{version}"

    def reset(self, version: int, op: str) -> str:
        """Per key group of a stage whose state `version` reset: its watermark then (what fired before)."""
        return f"{self.prefix}:reset:{version}:{op}"

    @property
    def reconfigure_requests(self) -> str:
        return f"{self.prefix}:reconfigure:requests"

    @property
    def reconfigure_current(self) -> str:
        return f"{self.prefix}:reconfigure:current"

    @property
    def reconfigure_history(self) -> str:
        return f"{self.prefix}:reconfigure:history"

    def replies(self, event: str) -> str:
        """Per `<op>/<instance>`: its reply to control event `event`, committed with its switch to the event's
        plan version."""
        return f"{self.prefix}:control:replies:{event}"

    @property
    def control_requests(self) -> str:
        return f"{self.prefix}:control:requests"

    @property
    def control_history(self) -> str:
        return f"{self.prefix}:control:history"

    @property
    def autoscaler_decisions(self) -> str:
        return f"{self.prefix}:autoscaler:decisions"

    def attempts(self, op: str) -> str:
        """Per instance: its starts at its current input position (control.Attempt)."""
        return f"{self.prefix}:attempts:{op}"

    @property
    def failure(self) -> str:
        """Why the job stopped for good (control.JobFailure), once a worker said so."""
        return f"{self.prefix}:failed"

    def incarnation(self, op: str, instance: int) -> str:
        return f"{self.prefix}:inc:{op}:{instance}"

    def kg_stream(self, upstream: str, downstream: str, kg: int) -> str:
        return f"{self.prefix}:kg:{upstream}>{downstream}:{kg}"

    def produced(self, upstream: str, downstream: str) -> str:
        return f"{self.prefix}:produced:{upstream}>{downstream}"

    def consumed(self, upstream: str, downstream: str) -> str:
        return f"{self.prefix}:consumed:{upstream}>{downstream}"

    def offsets(self, op: str) -> str:
        return f"{self.prefix}:off:{op}"

    def watermarks(self, op: str) -> str:
        return f"{self.prefix}:wm:{op}"

    def changelog(self, op: str, kg: int) -> str:
        return f"{self.prefix}:cl:{op}:{kg}"

    def snapshot(self, op: str, kg: int) -> str:
        return f"{self.prefix}:snap:{op}:{kg}"

    def snapshot_ids(self, op: str) -> str:
        """Per key group: the last changelog entry its snapshot covers (read without the snapshot)."""
        return f"{self.prefix}:snap-ids:{op}"

    def done(self, op: str) -> str:
        return f"{self.prefix}:done:{op}"

    @property
    def input_prefix(self) -> str:
        return f"{self.prefix}:in:"

    def input_stream(self, source: str, partition: int) -> str:
        return f"{self.input_prefix}{source}:{partition}"

    def is_input(self, key: str | bytes) -> bool:
        """Whether a key is one of the job's input streams: producers write them; the engine never deletes one."""
        text = key.decode() if isinstance(key, bytes) else key
        return text.startswith(self.input_prefix)

    def output_stream(self, sink: str) -> str:
        return f"{self.prefix}:out:{sink}"

    def manifest(self, sink: str) -> str:
        return f"{self.prefix}:manifest:{sink}"

    @property
    def pattern(self) -> str:
        return f"{self.prefix}:*"


# What a savepoint may hold: every key of the layout a running job keeps, by its name after the job's prefix,
# with its Redis type. Left out: the plan versions (a savepoint carries them as data, checked), who deployed the
# job, requests not taken yet, a rescale or reconfiguration in progress, and the input streams.
_PARTS = {"op": r"[a-z0-9-]+", "n": r"\d+", "id": r"[A-Za-z0-9._-]+"}
_SAVED = [(pattern, kind) for kind, patterns in {
    "string": ["demote:{op}:{n}", "failed", "inc:{op}:{n}", "snap:{op}:{n}"],
    "hash": ["ctl", "metrics", "dlq-total", "counts", "shed-total", "assign:{op}", "assign-next:{op}", "standby:{op}",
             "standby-lag:{op}", "spares:{op}", "owners:{op}", "release:{op}", "acquired:{op}", "versions:{op}",
             "cut:{n}", "aligned:{n}", "reset:{n}:{op}", "control:replies:{id}", "attempts:{op}",
             "produced:{op}>{op}", "consumed:{op}>{op}", "off:{op}", "wm:{op}", "snap-ids:{op}"],
    "list": ["promote:{op}:{id}", "rescale:history", "reconfigure:history", "control:history",
             "autoscaler:decisions", "manifest:{op}"],
    "set": ["done:{op}"],
    "stream": ["latency", "dlq", "shed", "kg:{op}>{op}:{n}", "cl:{op}:{n}", "out:{op}"],
}.items() for pattern in patterns]


def _compiled(pattern: str) -> tuple[re.Pattern, tuple[str, ...]]:
    parts = tuple(re.findall(r"\{(\w+)\}", pattern))
    literal = re.split(r"\{\w+\}", pattern)
    body = "".join(re.escape(text) + (f"({_PARTS[part]})" if i < len(parts) else "")
                   for i, (text, part) in enumerate(zip(literal, (*parts, ""))))
    return re.compile(f":{body}$"), parts


_SAVED_RE = [(*_compiled(pattern), kind) for pattern, kind in _SAVED]


def saved_kind(name: str, operators: set[str]) -> str | None:
    """The Redis type a savepoint's key `name` (after the job's prefix) has in the layout; None if the layout
    has no such key for a job of these operators."""
    for regex, parts, kind in _SAVED_RE:
        match = regex.match(name)
        if match is not None:
            named = all(value in operators for part, value in zip(parts, match.groups()) if part == "op")
            return kind if named else None
    return None
