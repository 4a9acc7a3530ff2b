"""Streaming reads of an mqstore store: ``spark.readStream.format("mqstore").load(dir)``.

Offsets are the queue offsets of each (topic, queue): ``{"topic/queueId": next offset}``, the
form Spark keeps in its checkpoint, so a query restarted from its checkpoint goes on where
the last committed micro-batch ended and reads every message exactly once (a micro-batch is
a fixed range of queue offsets over files that never change). What a micro-batch can reach is
what the store has dispatched (``mqstore.queue.snapshot``); a queue that appears later is read from
its earliest offset.

Options, besides the batch reader's ``topics``, ``queues``, ``maxRowsPerPartition`` and
``batchRows``:

``startingOffsets``      where a new query starts: ``earliest`` (default), ``latest``, JSON
``startingTimestamp``    ... or the offsets the store's time lookup gives (epoch ms)
``maxRecordsPerTrigger`` messages per micro-batch at most, shared out fairly across queues
                         (default: everything available)
``failOnDataLoss``       ``true`` (default): when retention deleted offsets a micro-batch still
                         needs, the query fails naming the queue and the missing range;
                         ``false``: they are skipped and each skipped range is logged as a
                         warning and kept in the reader's ``skipped`` list
``trigger(availableNow=True)`` reads what is dispatched when the query starts, then stops.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from mqstore.queue.snapshot import QueueRange, StoreSnapshot
from mqstore.spark.source import (
    DEFAULT_MAX_ROWS_PER_PARTITION,
    DataLossError,
    int_option,
    Reading,
    select_queues,
    slices,
    starting_offsets,
)

log = logging.getLogger("mqstore.spark")


def share_rows(start: dict[str, int], latest: dict[str, int], max_rows: int) -> dict[str, int]:
    """End offsets that take at most max_rows messages past start (which names every queue of
    latest), shared out fairly: every queue with messages gets an equal share, and what a
    queue cannot use goes to the others."""
    pending = {k: max(0, latest[k] - start[k]) for k in latest}
    grant = {k: 0 for k in latest}
    left = max_rows
    open_keys = sorted(k for k, n in pending.items() if n > 0)
    while left > 0 and open_keys:
        share = max(1, left // len(open_keys))
        for k in list(open_keys):
            take = min(share, pending[k] - grant[k], left)
            grant[k] += take
            left -= take
            if grant[k] >= pending[k]:
                open_keys.remove(k)
            if left == 0:
                break
    return {k: start[k] + grant[k] for k in latest}


class MQStoreStreamReader(Reading, DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        super().__init__(options, schema)
        self.per_partition = int_option(self.options, "maxRowsPerPartition", DEFAULT_MAX_ROWS_PER_PARTITION)
        self.max_per_trigger = (int_option(self.options, "maxRecordsPerTrigger", 0)
                                if "maxrecordspertrigger" in self.options else None)
        self._target: dict[str, int] | None = None
        #: (queue key, first, end) of every range skipped because retention deleted it
        self.skipped: list[tuple[str, int, int]] = []

    # -- offsets (run in one long-lived process on the driver) -------------------------------
    def _queues(self, snap: StoreSnapshot) -> list[QueueRange]:
        return select_queues(snap.queues(), self.options)

    def initialOffset(self) -> dict[str, int]:
        with StoreSnapshot(self.root) as snap:
            return starting_offsets(self._queues(snap), self.options, snap.offset_by_time)

    def _ranges(self) -> dict[str, QueueRange]:
        with StoreSnapshot(self.root) as snap:
            return {q.key: q for q in self._queues(snap)}

    def _latest(self) -> dict[str, int]:
        return {key: q.max_offset for key, q in self._ranges().items()}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadAllAvailable() if self.max_per_trigger is None else ReadMaxRows(self.max_per_trigger)

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        ranges = self._ranges()
        latest = {k: q.max_offset for k, q in ranges.items()}
        if self._target is not None:  # availableNow: nothing past what was there at the start
            latest = {k: min(v, self._target.get(k, ranges[k].min_offset)) for k, v in latest.items()}
        # a queue the start does not know (new since) begins at its earliest offset; a queue
        # that is gone keeps its offset
        base = {k: start.get(k, ranges[k].min_offset) for k in latest}
        latest = {k: max(v, base[k]) for k, v in latest.items()}
        for key, offset in start.items():
            latest.setdefault(key, offset)
            base.setdefault(key, offset)
        if isinstance(limit, ReadMaxRows):
            return share_rows(base, latest, limit.max_rows)
        return latest

    def reportLatestOffset(self) -> dict[str, int]:
        return self._latest()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._latest()

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        out: list[InputPartition] = []
        with StoreSnapshot(self.root) as snap:
            ranges = {q.key: q for q in snap.queues()}
            for key, stop in sorted(end.items()):
                q = ranges.get(key)
                if q is None:
                    continue
                begin = start.get(key, q.min_offset)  # a queue new since the start: from its earliest
                if begin < q.min_offset:
                    lost = (begin, min(stop, q.min_offset))
                    if self.fail_on_data_loss:
                        raise DataLossError(f"queue {key}: offsets [{lost[0]}, {lost[1]}) are no longer stored "
                                            f"(retention deleted them; the earliest is {q.min_offset})")
                    self.skipped.append((key, *lost))
                    log.warning("queue %s: skipping offsets [%d, %d) that retention deleted (failOnDataLoss=false)",
                                key, *lost)
                    begin = min(stop, q.min_offset)
                if stop <= begin:
                    continue
                out += slices(q, begin, stop, self.per_partition)
        return out

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return self.read_slices(partition)

    def commit(self, end: dict[str, int]) -> None:
        """Spark's checkpoint is the source of truth; nothing to keep in the store."""
