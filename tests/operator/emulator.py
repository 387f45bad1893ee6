"""kmock's KubernetesEmulator served from a thread of its own, so tests stay synchronous.

The operator (under KopfRunner, in its own thread and event loop), the kubelet
stand-in and the test itself all reach it over HTTP through a kubeconfig, the
same path `kubectl` and the operator take on a real cluster.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import uuid
from pathlib import Path

import jsonpatch
import kmock
import yaml
from kmock import KubernetesError

# The resources the operator reads or writes; discovery must list them, and the
# StreamJob resource must announce its status subresource as the CRD does.
CUSTOM = "streamjobs.dev/v1alpha1/streamjobs"


class _Versioned(kmock.KubernetesEmulator):
    """The emulator plus what kopf relies on from a real API server: a uid and a creation time on
    create, and a new resourceVersion on every write. Without the latter, kopf cannot tell a stale
    watch event from the state its own patch produced, and runs handlers again on old states."""

    _versions = itertools.count(1)

    async def _handle(self, request):
        if request.resource is not None and request.action in (kmock.action.CREATE, kmock.action.UPDATE):
            version = str(next(self._versions))
            data = request.data
            if isinstance(data, dict):
                meta = data.setdefault("metadata", {})
                meta["resourceVersion"] = version
                if request.action == kmock.action.CREATE:
                    if "name" not in meta and "generateName" in meta:  # kopf's Events
                        meta["name"] = meta["generateName"] + uuid.uuid4().hex[:8]
                    meta.setdefault("uid", str(uuid.uuid4()))
                    meta.setdefault("creationTimestamp", "2026-01-01T00:00:00Z")
            elif isinstance(data, list):  # a JSON patch: after its `test` ops
                data.append({"op": "add", "path": "/metadata/resourceVersion", "value": version})
        return await super()._handle(request)

    # A list answers with the newest version of what it lists; a watch from that version replays only
    # newer objects (kmock replays all: kopf would see each creation twice). Events that arrive while
    # the watch runs all pass, deletions included.
    async def _serve_list(self, request):
        result = await super()._serve_list(request)
        result["metadata"]["resourceVersion"] = str(max((_version(o) for o in result["items"]), default=0))
        # kubectl decodes a list only with its kind and apiVersion.
        res = request.resource
        kind = self.resources[res].kind if res in self.resources else None
        result["apiVersion"] = f"{res.group}/{res.version}" if res.group else res.version
        result["kind"] = f"{kind or 'Object'}List"
        return result

    async def _serve_watch(self, request):
        since = request.params.get("resourceVersion", "")
        since = int(since) if since.isdigit() else -1
        yield b""
        async with self._lock:
            objs = [o for o in self._KubernetesEmulator__get_objs(request, strict=False) if not o.deleted]
            replay = [{"type": "ADDED", "object": o.raw} for o in objs if _version(o.raw) > since]
        for event in replay:
            yield event
        async for event in self._buses[request.resource]:
            meta = event.get("object", {}).get("metadata", {})
            if self._KubernetesEmulator__check(request, request.resource, meta.get("namespace"), meta.get("name"),
                                               strict=False):
                yield event

    async def _render_error(self, exc: Exception):
        # A JSON patch whose `test` fails is 422 on a real server; kopf then waits for the next
        # event instead of retrying the same stale patch (kmock would answer 500).
        if isinstance(exc, jsonpatch.JsonPatchTestFailed):
            exc = KubernetesError(status=422, reason="Invalid", message=str(exc))
        return await super()._render_error(exc)


def _version(obj: dict) -> int:
    version = (obj.get("metadata") or {}).get("resourceVersion", "")
    return int(version) if version.isdigit() else 0


class Emulator:
    def __init__(self, workdir: Path) -> None:
        self.kubeconfig = workdir / "kubeconfig"
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="kmock", daemon=True)
        self._stop: asyncio.Event | None = None
        self.url = ""

    def __enter__(self) -> Emulator:
        self._thread.start()
        started = asyncio.run_coroutine_threadsafe(self._start(), self._loop)
        self.url = started.result(timeout=30)
        self.kubeconfig.write_text(yaml.safe_dump(_kubeconfig(self.url)))
        return self

    async def _start(self) -> str:
        self.handler = _Versioned()
        self.handler.resources.load_bundled()
        self.handler.resources[CUSTOM] = kmock.ResourceInfo(
            kind="StreamJob", singular="streamjob", namespaced=True, shortnames={"sj"},
            subresources={"status"}, verbs={"get", "list", "watch", "create", "update", "patch", "delete"},
        )
        await self.handler.__aenter__()
        self.server = kmock.Server(self.handler)
        await self.server.__aenter__()
        return str(self.server.url).rstrip("/")

    async def _close(self) -> None:
        await self.server.__aexit__(None, None, None)
        await self.handler.__aexit__(None, None, None)

    def __exit__(self, *exc) -> None:
        asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


def _kubeconfig(url: str) -> dict:
    return {
        "apiVersion": "v1", "kind": "Config", "current-context": "kmock",
        "clusters": [{"name": "kmock", "cluster": {"server": url}}],
        "users": [{"name": "kmock", "user": {"token": "test"}}],
        "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "kmock", "namespace": "default"}}],
    }
