"""A thin, dict-in dict-out client of the few Kubernetes resources the operator touches.

Dicts rather than the client's models: the manifests are built as dicts
(resources.py), and a model round trip would drop fields it does not know.
Label selectors are also applied here, on the client side: a real API server
has filtered already (a no-op then), a test emulator may not.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import kubernetes
from streamjobs_core.crd import PLURAL
from streamjobs_core.spec import API_VERSION

Body = dict[str, Any]

_PATHS = {
    "statefulsets": "/apis/apps/v1/namespaces/{ns}/statefulsets",
    "services": "/api/v1/namespaces/{ns}/services",
    "configmaps": "/api/v1/namespaces/{ns}/configmaps",
    "pods": "/api/v1/namespaces/{ns}/pods",
    "secrets": "/api/v1/namespaces/{ns}/secrets",
    PLURAL: f"/apis/{API_VERSION}/namespaces/{{ns}}/{PLURAL}",
}


class KubeError(RuntimeError):
    def __init__(self, status: int, message: str) -> None:
        self.status = status
        super().__init__(f"HTTP {status}: {message}")


def api_client() -> kubernetes.client.ApiClient:
    """In a pod: the service account; elsewhere: the current kubeconfig context (as kopf logs in)."""
    try:
        kubernetes.config.load_incluster_config()
        return kubernetes.client.ApiClient()
    except kubernetes.config.ConfigException:
        return kubernetes.config.new_client_from_config()


class Kube:
    def __init__(self, client: kubernetes.client.ApiClient | None = None) -> None:
        self.client = client or api_client()

    def _call(self, method: str, path: str, body: Any = None, query: dict | None = None,
              content_type: str = "application/json") -> tuple[int, Any]:
        serialized = self.client.param_serialize(
            method, path, query_params=list((query or {}).items()),
            header_params={"Accept": "application/json", "Content-Type": content_type},
            body=body, auth_settings=["BearerToken"],
        )
        response = self.client.call_api(*serialized[:4])
        response.read()
        data = json.loads(response.data) if response.data else None
        return response.status, data

    def _checked(self, method: str, path: str, body: Any = None, **kwargs: Any) -> Any:
        status, data = self._call(method, path, body, **kwargs)
        if status >= 300:
            raise KubeError(status, (data or {}).get("message", "") if isinstance(data, dict) else str(data))
        return data

    def get(self, kind: str, namespace: str, name: str) -> Body | None:
        status, data = self._call("GET", f"{_PATHS[kind].format(ns=namespace)}/{name}")
        if status == 404:
            return None
        if status >= 300:
            raise KubeError(status, str(data))
        return data

    def list(self, kind: str, namespace: str, labels: dict[str, str]) -> list[Body]:
        selector = ",".join(f"{k}={v}" for k, v in labels.items())
        data = self._checked("GET", _PATHS[kind].format(ns=namespace), query={"labelSelector": selector})
        items = data.get("items") or []
        return [o for o in items if labels.items() <= ((o.get("metadata") or {}).get("labels") or {}).items()]

    def ensure(self, kind: str, body: Body) -> Body:
        """Create unless an object of that name exists (handlers are retried: every step is idempotent)."""
        meta = body["metadata"]
        status, data = self._call("POST", _PATHS[kind].format(ns=meta["namespace"]), body)
        if status == 409:
            return self.get(kind, meta["namespace"], meta["name"]) or body
        if status >= 300:
            raise KubeError(status, (data or {}).get("message", "") if isinstance(data, dict) else str(data))
        return data

    def patch(self, kind: str, namespace: str, name: str, patch: Body, subresource: str = "") -> Body:
        path = f"{_PATHS[kind].format(ns=namespace)}/{name}" + (f"/{subresource}" if subresource else "")
        return self._checked("PATCH", path, patch, content_type="application/merge-patch+json")

    def patch_json(self, kind: str, namespace: str, name: str, operations: list[dict]) -> Body:
        """A JSON patch (RFC 6902): its `test` operations make it fail instead of editing the wrong item."""
        path = f"{_PATHS[kind].format(ns=namespace)}/{name}"
        return self._checked("PATCH", path, operations, content_type="application/json-patch+json")

    def delete(self, kind: str, namespace: str, name: str) -> bool:
        status, data = self._call("DELETE", f"{_PATHS[kind].format(ns=namespace)}/{name}",
                                  {"propagationPolicy": "Background"})
        if status == 404:
            return False
        if status >= 300:
            raise KubeError(status, str(data))
        return True

    def secret_value(self, namespace: str, name: str, key: str) -> str:
        secret = self.get("secrets", namespace, name)
        if secret is None:
            raise LookupError(f"Secret '{name}' not found in namespace '{namespace}'")
        value = (secret.get("data") or {}).get(key)
        if value is None:
            value = (secret.get("stringData") or {}).get(key)
            if value is None:
                raise LookupError(f"Secret '{name}' has no key '{key}'")
            return value
        return base64.b64decode(value).decode()
