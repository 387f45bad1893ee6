"""Ports: how a decision is realized, stored and reported. The local runtime and the Kubernetes
operator each provide them; tests provide recording fakes."""

from __future__ import annotations

import json
from typing import Protocol


class Scaler(Protocol):
    def parallelism(self) -> dict[str, int]:
        """Parallelism in force per operator."""

    def rescale(self, op: str, parallelism: int) -> None:
        """Rescale one operator live (the rescale controller); return once it took effect."""


class DecisionLog(Protocol):
    def append(self, entry: dict) -> None: ...

    def entries(self) -> list[dict]: ...


class Events(Protocol):
    def emit(self, reason: str, message: str, warning: bool = False) -> None: ...


class RedisDecisionLog:
    """The last `size` decisions of a job in a Redis list, next to its rescale history."""

    def __init__(self, r, key: str, size: int) -> None:
        self.r = r
        self.key = key
        self.size = size

    def append(self, entry: dict) -> None:
        pipe = self.r.pipeline()
        pipe.rpush(self.key, json.dumps(entry))
        pipe.ltrim(self.key, -self.size, -1)
        pipe.execute()

    def entries(self) -> list[dict]:
        return [json.loads(x) for x in self.r.lrange(self.key, 0, -1)]


class MemoryDecisionLog:
    def __init__(self, size: int) -> None:
        self.size = size
        self._entries: list[dict] = []

    def append(self, entry: dict) -> None:
        self._entries = [*self._entries, entry][-self.size:]

    def entries(self) -> list[dict]:
        return list(self._entries)
