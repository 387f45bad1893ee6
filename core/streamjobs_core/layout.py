"""Redis key layout of a job.

Every key of a job carries the hash tag `{<job>}`, so a job lives in one Redis
Cluster slot (one MULTI/EXEC can cover all of its keys) and many jobs spread
over a cluster.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class JobKeys:
    job: str

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
