"""The exchange: the record streams workers hand data to each other through, behind one port.

`Streams` is how a worker reads its kg streams (and samples them to rehearse);
`RedisStreams` keeps them as Redis streams in the job's slot, `MemoryStreams`
in this process's memory, for a job whose workers all run in one process. One
contract test (tests/integration/test_streams.py) runs against both: entry ids
that only grow, even across a trim; reads after a cursor, in order, at most
`count` per stream; a blocked read that an append from another thread wakes;
trimming by id and by length.

The commit of a batch (transaction.py: its appends, offsets and changelog in
one fenced MULTI/EXEC) still speaks Redis; it joins this port next.
"""

from .memory_streams import MemoryStreams
from .port import Entry, Fields, Streams, entry_order, next_entry
from .redis_streams import RedisStreams

__all__ = ["Entry", "Fields", "MemoryStreams", "RedisStreams", "Streams", "entry_order", "next_entry"]
