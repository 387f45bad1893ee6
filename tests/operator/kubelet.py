"""A stand-in for the StatefulSet controller and the kubelet: real worker processes for emulated pods.

kmock's emulator stores objects but runs no controllers. This thread does what
the cluster would for the StatefulSets the operator creates: a Pod object per
ordinal below `spec.replicas` (labels of the template plus the pod index), a
real `python -m streamjobs_worker` process per pod with the pod's environment
resolved as the kubelet would (field refs, Secret refs, `$(VAR)` expansion),
SIGTERM on scale-down with the Pod deleted once the process exited, a restart
when a process dies, and `status.readyReplicas`.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from streamjobs_operator.kube import Kube, KubeError
from streamjobs_operator.resources import POD_INDEX_LABEL
from streamjobs_worker.parent import parent_env

NAMESPACE = "default"
_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


# Resolved before any fork: dlopen in a child forked from this threaded process can deadlock, and the
# kubelet thread would wait on that child forever (its pod never starts).
@dataclass
class _Pod:
    name: str
    namespace: str
    statefulset: str
    process: subprocess.Popen
    terminating: bool = False
    restarts: int = 0


class Kubelet:
    def __init__(self, kube: Kube, log_dir: Path, poll_s: float = 0.3, namespaces: tuple[str, ...] = (NAMESPACE,)) -> None:
        self.kube = kube
        self.log_dir = log_dir
        self.poll_s = poll_s
        self.namespaces = namespaces
        self.pods: dict[tuple[str, str], _Pod] = {}  # by (namespace, name)
        self.started: list[str] = []  # every pod name ever started, in order (tests assert on it)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="kubelet", daemon=True)
        self.errors: list[BaseException] = []

    def __enter__(self) -> Kubelet:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(30)
        for pod in self.pods.values():
            if pod.process.poll() is None:
                pod.process.kill()
                pod.process.wait()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.sync()
            except Exception as exc:  # keep running, and let the test see it
                self.errors.append(exc)
            self._stop.wait(self.poll_s)

    def sync(self) -> None:
        statefulsets = {(ns, s["metadata"]["name"]): s for ns in self.namespaces
                        for s in self.kube.list("statefulsets", ns, {})}
        wanted: dict[tuple[str, str], tuple[dict, int]] = {}
        for (ns, name), sts in statefulsets.items():
            for i in range(int(sts["spec"].get("replicas") or 0)):
                wanted[ns, f"{name}-{i}"] = (sts, i)
        for (ns, name), (sts, index) in wanted.items():
            pod = self.pods.get((ns, name))
            if pod is None:
                self._create(ns, name, sts, index)
            elif pod.process.poll() is not None and not pod.terminating:
                body = self.kube.get("pods", ns, name)
                if body is None:  # the Pod object was deleted under it: the next pass creates it anew
                    del self.pods[ns, name]
                    continue
                pod.process = self._spawn(body)  # restartPolicy: Always
                pod.restarts += 1
        for key, pod in list(self.pods.items()):
            if key not in wanted and not pod.terminating:
                pod.terminating = True
                pod.process.terminate()  # the worker stops after its last commit
            if pod.terminating and pod.process.poll() is not None:
                self.kube.delete("pods", pod.namespace, pod.name)
                del self.pods[key]
        for (ns, name), sts in statefulsets.items():
            ready = sum(1 for p in self.pods.values() if (p.namespace, p.statefulset) == (ns, name)
                        and not p.terminating and p.process.poll() is None)
            current = sts.get("status") or {}
            if current.get("readyReplicas") != ready or current.get("replicas") != ready:
                try:
                    self.kube.patch("statefulsets", ns, name, {"status": {"replicas": ready, "readyReplicas": ready}},
                                    subresource="status")
                except KubeError as exc:
                    if exc.status != 404:  # deleted since the list above, as the operator may do at any time
                        raise

    def _create(self, namespace: str, name: str, sts: dict, index: int) -> None:
        template = sts["spec"]["template"]
        labels = {**template["metadata"]["labels"], POD_INDEX_LABEL: str(index),
                  "statefulset.kubernetes.io/pod-name": name}
        owner = {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": sts["metadata"]["name"],
                 "uid": sts["metadata"].get("uid", ""), "controller": True}
        body = {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": namespace, "labels": labels, "ownerReferences": [owner]},
                "spec": template["spec"], "status": {"podIP": "127.0.0.1", "phase": "Running"}}
        pod = self.kube.ensure("pods", body)
        self.pods[namespace, name] = _Pod(name, namespace, sts["metadata"]["name"], self._spawn(pod))
        self.started.append(name)

    def _spawn(self, pod: dict) -> subprocess.Popen:
        container = pod["spec"]["containers"][0]
        env = dict(os.environ)
        for var in container.get("env", []):
            env[var["name"]] = self._value(pod, var, env)
        # Real pods each have their own network namespace; here all share one host, so any free port.
        env["STREAMJOBS_METRICS_PORT"] = "0"
        command = [sys.executable if c == "python" else c for c in container["command"]] + container.get("args", [])
        meta = pod["metadata"]
        with open(self.log_dir / f"{meta['namespace']}.{meta['name']}.log", "ab") as log:
            return subprocess.Popen(command, env={**env, **parent_env()}, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)

    def _value(self, pod: dict, var: dict, env: dict[str, str]) -> str:
        if "value" in var:
            return _VAR.sub(lambda m: env.get(m.group(1), m.group(0)), var["value"])
        source = var["valueFrom"]
        if "fieldRef" in source:
            path = source["fieldRef"]["fieldPath"]
            if path == "status.podIP":
                return "127.0.0.1"
            label = re.fullmatch(r"metadata\.labels\['(.+)'\]", path)
            if label:
                return pod["metadata"]["labels"][label.group(1)]
            raise ValueError(f"unsupported fieldRef {path}")
        ref = source["secretKeyRef"]
        return self.kube.secret_value(pod["metadata"]["namespace"], ref["name"], ref["key"])
