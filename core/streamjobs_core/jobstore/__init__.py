"""The job store: where the control records of control.py live, behind one port.

`JobStore` is what the rescale controller, the handover protocol, the fleets,
the workers and the tools read and write; `RedisJobStore` keeps a job's records
in its Redis slot (layout.py) and `MemoryJobStore` in dictionaries, for unit
tests of the control logic (the way flink-autoscaler tests against its state
store). No other module spells a control key or field.

Writes that belong to a worker's commit (a key group released in the batch that
reached its marker, a source's offsets) take the commit's transaction, anything
with `hset(key, mapping=...)`: the Redis store adds them to it, so they happen
with the batch or not at all; the memory store, which has no transactions,
applies them at once.
"""

from .memory_store import MemoryJobStore
from .port import ChangeInProgress, Commit, JobStore
from .redis_store import RedisJobStore

__all__ = ["ChangeInProgress", "Commit", "JobStore", "MemoryJobStore", "RedisJobStore"]
