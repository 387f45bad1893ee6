"""A batch's writes as one value, and the fence that decides whether they may still happen.

The exchange applies a `Transaction` at once or not at all, and only while its
`Fence` holds: the writer is the instance's newest incarnation and its
operator's assignment generation is the one it started under. A replaced
worker (a restart, a revoking rescale) can then neither commit a batch nor
overwrite a newer owner's snapshot.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


class Fenced(RuntimeError):
    """A newer incarnation of this instance, or a new assignment, exists: stop without committing."""


@dataclass
class Fence:
    op: str
    instance: int
    incarnation: int
    generation: object = None  # the assignment generation of the first commit; later ones must see it again

    def check(self, incarnation: int | None, generation: object) -> None:
        """Raise Fenced unless (`incarnation`, `generation`), read where the commit applies, are still ours."""
        if incarnation != self.incarnation:
            raise Fenced(f"incarnation {self.incarnation} superseded by {incarnation!r}")
        if self.generation is None:
            self.generation = generation
        elif generation != self.generation:
            raise Fenced(f"assignment generation changed to {generation!r}: the key groups were reassigned")


@dataclass(frozen=True)
class RowEntries:
    """Records to add to a stream, an entry each, their fields named by `names`: one value list per name, a
    record's None omitted from its entry. Added by one script call per RowEntries, not a command per record:
    per record, building and sending XADDs from Python cost ~20x what Redis spends adding the entry."""

    key: str
    names: list[str]
    columns: list[list[str | None]]
    maxlen: int | None


@dataclass
class Transaction:
    xadds: list[tuple[str, dict, int | None]] = field(default_factory=list)
    rows: list[RowEntries] = field(default_factory=list)  # records added as stream entries, one per record
    hsets: dict[str, dict] = field(default_factory=dict)
    hincrs: list[tuple[str, str, int]] = field(default_factory=list)
    trims: dict[str, bytes] = field(default_factory=dict)
    changelog: dict[int, list] = field(default_factory=dict)  # per key group: its state changes (statelog)
    values: dict[str, bytes] = field(default_factory=dict)  # whole values (a key group's snapshot)
    rpushes: list[tuple[str, str]] = field(default_factory=list)
    sadds: list[tuple[str, str]] = field(default_factory=list)
    hdels: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)
    deletes: list[str] = field(default_factory=list)
    # A job store that keeps its records beside the exchange (the memory one) writes them here: they apply
    # inside the commit, after its fence check, so an offset or a release lands with its batch or not at all.
    in_commit: list[Callable[[], None]] = field(default_factory=list)
    after_commit: list[Callable[[], None]] = field(default_factory=list)

    def xadd(self, key: str, fields: dict, maxlen: int | None = None) -> None:
        self.xadds.append((key, fields, maxlen))

    def hset(self, key: str, mapping: dict) -> None:
        self.hsets.setdefault(key, {}).update(mapping)

    def hincrby(self, key: str, field_: str, amount: int) -> None:
        self.hincrs.append((key, field_, amount))

    def hdel(self, key: str, *fields: str) -> None:
        self.hdels.append((key, fields))

    def delete(self, key: str) -> None:
        self.deletes.append(key)

    def apply_in_commit(self, write: Callable[[], None]) -> None:
        self.in_commit.append(write)

    @property
    def empty(self) -> bool:
        return not (self.xadds or self.rows or self.hsets or self.hincrs or self.changelog or self.values
                    or self.rpushes or self.sadds or self.hdels or self.deletes or self.in_commit)
