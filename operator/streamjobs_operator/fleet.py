"""The rescale controller's Fleet port on Kubernetes: one StatefulSet per operator and assignment epoch.

A rescale of operator OP to epoch E creates StatefulSet `<job>-<op>-e<E>`,
whose pods start as standbys (`--await-epoch E`); once they are warm, the older
StatefulSets of OP are scaled to zero (their workers stop after their last
commit on SIGTERM) and, after the controller wrote assignment E, deleted. A
fluid or batched rescale scales OP's current StatefulSet instead: up before
its key groups move (once their workers registered), down after (the pods it removes own nothing then). The
controller owns the order and the waiting on Redis; every method here is
idempotent, so a controller that resumes after an operator restart may repeat any.
A chain a live reconfiguration adds gets its Service and StatefulSet (epoch 1)
before the sources switch; one it removes loses both once the version is complete.

A StatefulSet built with warm spares (`streamjobs.dev/spares`: S) has S pods
beyond the instances, waiting with Spark up (spares.py). A scale-out promotes
the spares at the ordinals it adds instead of waiting for new pods' JVMs, and
grows the StatefulSet by as many, whose new pods wait as the next spares; a
scale-in shrinks it by as many, and the instances it emptied below the new end
become its spares in place.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from streamjobs_core.control import Promotion
from streamjobs_core.jobstore import JobStore
from streamjobs_core.spares import pod_spare

from .kube import Kube
from .resources import LABEL_EPOCH, SPARES_ANNOTATION, Owner, labels, service, service_name, statefulset_name

# (op, epoch, replicas, standby) -> StatefulSet manifest
StatefulSetBuilder = Callable[[str, int, int, bool], dict]


class KubernetesFleet:
    def __init__(self, kube: Kube, owner: Owner, build: StatefulSetBuilder, timeout_s: float = 600.0,
                 poll_s: float = 0.5, jobs: JobStore | None = None) -> None:
        self.kube = kube
        self.owner = owner
        self.build = build
        self.timeout_s = timeout_s
        self.poll_s = poll_s
        self.jobs = jobs  # the job's Redis: spares are promoted through it

    # --- Fleet -----------------------------------------------------------------

    def start_standbys(self, op: str, parallelism: int, epoch: int) -> None:
        self.ensure(self.build(op, epoch, parallelism, True), parallelism)

    def stop_old(self, op: str, epoch: int) -> None:
        old = [s for s in self.statefulsets(op) if epoch_of(s) < epoch]
        for sts in old:
            self._scale(sts, 0)
        self.wait_gone(op, lambda pod: epoch_of(pod) < epoch)

    def adopt(self, op: str, parallelism: int, epoch: int) -> None:
        for sts in self.statefulsets(op):
            if epoch_of(sts) < epoch:
                self.kube.delete("statefulsets", self.owner.namespace, sts["metadata"]["name"])

    def discard_standbys(self, op: str, epoch: int) -> None:
        self.kube.delete("statefulsets", self.owner.namespace, statefulset_name(self.owner.name, op, epoch))
        self.wait_gone(op, lambda pod: epoch_of(pod) == epoch)

    def stop_job(self) -> None:
        for sts in self.statefulsets():
            self._scale(sts, 0)
        self.wait_gone(None, lambda pod: True)

    def start_job(self, parallelism: dict[str, int]) -> None:
        for op, n in parallelism.items():
            current = self.current(op)
            if current is None:
                # The restart baseline may follow a crash that left no StatefulSet: recreate one (not a standby).
                self.ensure(self.build(op, 1, n, False), n)
            else:
                self._scale(current, n)
        self.wait_ready(parallelism)

    def add_instances(self, op: str, parallelism: int) -> None:
        current = self.current(op)
        # Three ways: warm spares promoted; new pods whose workers must register (a pod is ready once its
        # container runs, its worker takes key groups once Spark is up: released before, they would wait out
        # the JVM's start in transit); without a Redis to read registrations from, readiness alone.
        promotes = self._promotes(current)
        registers = self.jobs is not None and not promotes
        if _instances(current) < parallelism:
            if registers:
                for ordinal in range(_instances(current), parallelism):  # no pod there: a crash's registration
                    self.jobs.unregister(op, ordinal)
            self._scale(current, parallelism)
        if promotes:
            self._promote(op, parallelism)
        elif registers:
            self._wait_roles(op, set(range(parallelism)), set())
        self.wait_ready({op: parallelism})

    def remove_instances(self, op: str, parallelism: int) -> None:
        # A StatefulSet removes its highest ordinals first: the instances a scale-in emptied (and spares).
        current = self.current(op)
        spares = spares_of(current)
        if self._promotes(current):
            self.jobs.demote_pods(op, list(range(parallelism, _replicas(current))))
        self._scale(current, parallelism)
        self.wait_gone(op, lambda pod: _ordinal(pod) >= parallelism + spares)
        if self.jobs is not None:  # gone after their last commit: no instance answers there any more
            for ordinal in range(parallelism + spares, _replicas(current)):
                self.jobs.unregister(op, ordinal)
        if self._promotes(current):  # the emptied instances that stay become spares: once they let go
            self._wait_roles(op, set(), set(range(parallelism, min(_instances(current), parallelism + spares))))

    def _promotes(self, sts: dict | None) -> bool:
        return bool(spares_of(sts)) and self.jobs is not None

    def _promote(self, op: str, parallelism: int) -> None:
        """The pods at the ordinals a scale-out adds become instances: warm spares at once, pods still starting
        once warm. Each is marked an instance before it is told, so that it stays one if it restarts."""
        assignment = self.jobs.assignment(op)
        added = [k for k in range(assignment.parallelism, parallelism)
                 if self.jobs.promoted_pod(op, k) != assignment.epoch]
        spares = {pod_spare(k) for k in added}
        self._until(lambda: spares - self.jobs.ready_spares(op), lambda cold: f"spares {sorted(cold)} of {op} not warm",
                    self.poll_s / 5)
        for ordinal in added:
            self.jobs.promote_pod(op, ordinal, assignment.epoch)
            self.jobs.promote(op, pod_spare(ordinal), Promotion(ordinal))
        self._wait_roles(op, set(added), set())

    def _wait_roles(self, op: str, instances: set[int], spares: set[int]) -> None:
        """Until these ordinals of `op` registered as instances and those let go of theirs."""
        def wrong() -> set[int]:
            registered = {i for o, i in self.jobs.registered() if o == op}
            return (instances - registered) | (spares & registered)

        self._until(wrong, lambda left: f"pods {sorted(left)} of {op} did not change role", self.poll_s / 5)

    def start_chain(self, op: str, parallelism: int) -> None:
        self.kube.ensure("services", service(self.owner, op))
        if self.current(op) is None:
            self.ensure(self.build(op, 1, parallelism, False), parallelism)
        self.wait_ready({op: parallelism})

    def stop_chain(self, op: str) -> None:
        for sts in self.statefulsets(op):
            self.kube.delete("statefulsets", self.owner.namespace, sts["metadata"]["name"])
        self.wait_gone(op, lambda pod: True)
        self.kube.delete("services", self.owner.namespace, service_name(self.owner.name, op))

    def wait_ready(self, parallelism: dict[str, int]) -> None:
        """Wait until each operator's current StatefulSet reports that many ready pods."""
        self._until(lambda: {op: n for op, n in parallelism.items() if _ready(self.current(op)) < n},
                    lambda short: f"operators not ready: {short}")

    # --- queries and helpers ---------------------------------------------------

    def statefulsets(self, op: str | None = None) -> list[dict]:
        return self.kube.list("statefulsets", self.owner.namespace, labels(self.owner.name, op))

    def current(self, op: str) -> dict | None:
        """The StatefulSet of the newest epoch: the operator's instances once a rescale is adopted."""
        found = self.statefulsets(op)
        return max(found, key=epoch_of) if found else None

    def pods(self, op: str | None = None) -> list[dict]:
        return self.kube.list("pods", self.owner.namespace, labels(self.owner.name, op))

    def scale_all(self, replicas: Callable[[str], int]) -> None:
        """Scale each operator's current StatefulSet (suspend: 0; resume: its assigned parallelism)."""
        ops = {s["metadata"]["labels"].get("streamjobs.dev/operator") for s in self.statefulsets()}
        for op in sorted(o for o in ops if o):
            current = self.current(op)
            if current is not None:
                self._scale(current, replicas(op))

    def ensure(self, manifest: dict, instances: int) -> None:
        """Create the StatefulSet unless it exists, and give it `instances` (and its spares)."""
        self._scale(self.kube.ensure("statefulsets", manifest), instances)

    def _scale(self, sts: dict, instances: int) -> None:
        """To `instances` pods, and its spares beyond them while it has any instance."""
        replicas = instances + spares_of(sts) if instances else 0
        if (sts.get("spec") or {}).get("replicas") != replicas:
            self.kube.patch("statefulsets", self.owner.namespace, sts["metadata"]["name"],
                            {"spec": {"replicas": replicas}})

    def wait_gone(self, op: str | None, which: Callable[[dict], bool]) -> None:
        """Wait until the matching pods are gone: their workers made their last commit and exited."""
        self._until(lambda: [p["metadata"]["name"] for p in self.pods(op) if which(p)],
                    lambda left: f"pods still running: {', '.join(sorted(left))}")

    def _until(self, left: Callable[[], Any], what: Callable[[Any], str], poll_s: float | None = None) -> None:
        """Poll until `left()` is empty (what the wait is still for); past timeout_s, a TimeoutError says `what`."""
        deadline = time.monotonic() + self.timeout_s
        while remaining := left():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what(remaining)} after {self.timeout_s:.0f} s")
            time.sleep(self.poll_s if poll_s is None else poll_s)


def _replicas(sts: dict) -> int:
    return int((sts.get("spec") or {}).get("replicas") or 0)


def spares_of(sts: dict | None) -> int:
    return int((((sts or {}).get("metadata") or {}).get("annotations") or {}).get(SPARES_ANNOTATION, 0))


def _instances(sts: dict) -> int:
    return max(0, _replicas(sts) - spares_of(sts))


def _ordinal(pod: dict) -> int:
    return int(pod["metadata"]["name"].rsplit("-", 1)[1])


def _ready(sts: dict | None) -> int:
    return int(((sts or {}).get("status") or {}).get("readyReplicas") or 0)


def ready_instances(sts: dict, ready_spares: int) -> int:
    """Its ready pods that run instances: a spare's pod is ready too, so those the job's Redis knows as ready
    spares are not counted (an instance pod down while its spare is up is one instance fewer), nor more than its
    instances."""
    return max(0, min(_ready(sts) - ready_spares, _instances(sts)))


def epoch_of(obj: dict) -> int:
    return int(((obj.get("metadata") or {}).get("labels") or {}).get(LABEL_EPOCH, "0"))
