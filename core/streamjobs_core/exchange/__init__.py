"""The exchange: the record streams workers hand data to each other through, behind one port.

`Streams` is how a worker reads its kg streams (and samples them to rehearse);
`RedisStreams` keeps them as Redis streams in the job's slot, `MemoryStreams`
in this process's memory, for a job whose workers all run in one process. One
contract test (tests/integration/test_streams.py) runs against both: entry ids
that only grow, even across a trim; reads after a cursor, in order, at most
`count` per stream; a blocked read that an append from another thread wakes;
trimming by id and by length.

`Exchange` adds a batch's commit (commit.py): its appends, changelog, offsets
and counters applied at once or not at all, fenced by the writer's incarnation
and its operator's assignment generation. `RedisExchange` runs it as one
MULTI/EXEC WATCHing the fencing keys; `MemoryExchange` under the lock the
memory job store changes those under. A second contract test
(tests/integration/test_exchange.py) holds both to it.
"""

from .commit import Fence, Fenced, RowEntries, Transaction
from .memory_exchange import MemoryExchange
from .memory_streams import MemoryStreams
from .port import Entry, Exchange, Fields, Streams, entry_order, next_entry
from .redis_exchange import RedisExchange
from .redis_streams import RedisStreams

__all__ = ["Entry", "Exchange", "Fence", "Fenced", "Fields", "MemoryExchange", "MemoryStreams", "RedisExchange",
           "RedisStreams", "RowEntries", "Streams", "Transaction", "entry_order", "next_entry"]
