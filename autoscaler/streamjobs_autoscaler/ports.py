"""Ports: how a decision is realized, stored and reported. The local runtime and the Kubernetes
operator each provide them; tests provide recording fakes."""

from __future__ import annotations

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


class StoreDecisionLog:
    """The last `size` decisions of a job, kept by its job store next to its rescale history."""

    def __init__(self, store, size: int) -> None:
        self.store = store
        self.size = size

    def append(self, entry: dict) -> None:
        self.store.record_decision(entry, self.size)

    def entries(self) -> list[dict]:
        return self.store.decisions()


class MemoryDecisionLog:
    def __init__(self, size: int) -> None:
        self.size = size
        self._entries: list[dict] = []

    def append(self, entry: dict) -> None:
        self._entries = [*self._entries, entry][-self.size:]

    def entries(self) -> list[dict]:
        return list(self._entries)
