"""How mqstore's tasks set up the Python worker they run in (Spark's, reused task after task)."""

from __future__ import annotations

import gc

from mqstore.queue._arrow import keep_freed_memory

_settled = False


def settle_worker() -> None:
    """Once per Python worker process, at its first mqstore task:

    - malloc keeps and reuses the memory of freed batches (``keep_freed_memory``): a task
      decodes batch after batch into fresh buffers of tens of MB;
    - the objects alive then (the modules of pyspark, pyarrow and mqstore: ~40,000) are frozen
      out of the cyclic garbage collector (``gc.freeze``). PySpark's daemon runs
      ``gc.collect()`` after every task of a reused worker, and walking those objects costs
      ~28 ms of CPU each time: 0.45 s of a 16-partition count() of 3M rows. Objects made
      later are collected as before; the frozen ones live as long as the process anyway (a
      collection first, so that no garbage of before is frozen with them).

    Planning runs in Python workers too (PySpark's data source and planner workers, reused
    query after query): MQStoreDataSource settles those as well."""
    global _settled
    if _settled:
        return
    _settled = True
    keep_freed_memory()
    gc.collect()
    gc.freeze()
