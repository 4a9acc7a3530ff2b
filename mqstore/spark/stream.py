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
import time
from collections.abc import Iterator, Mapping
from typing import Any, TypeVar

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
    DataLossError,
    Reading,
    packed,
    select_queues,
    slices,
    split_for,
    starting_offsets,
)
from mqstore.spark.options import OptionError, duration_ms_option, int_option


def _bounds_for_stream(options: Mapping[str, str]) -> None:
    """Kafka refuses the ending options in a stream, and so does this source."""
    for name in ("endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp"):
        if name.lower() in options:
            raise OptionError(f"option {name} does not apply to streaming reads (a stream reads on as messages "
                              "come; trigger(availableNow=True) reads what is there and stops)")

log = logging.getLogger("mqstore.spark")
#: a queue with its readable offsets (QueueRange, or the network reader's RemoteQueue)
Q = TypeVar("Q", bound=QueueRange)


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
        super().__init__(options, schema, "stream")
        self.max_per_trigger = (int_option(self.options, "maxRecordsPerTrigger", 0)
                                if "maxrecordspertrigger" in self.options else None)
        self.min_per_trigger = (int_option(self.options, "minOffsetsPerTrigger", 1)
                                if "minoffsetspertrigger" in self.options else None)
        self.max_trigger_delay_ms = duration_ms_option(self.options, "maxTriggerDelay", 15 * 60_000)
        if "maxtriggerdelay" in self.options and self.min_per_trigger is None:
            raise OptionError("option maxTriggerDelay bounds how long minOffsetsPerTrigger waits; give that too")
        if self.min_per_trigger is not None and self.max_per_trigger is not None \
                and self.min_per_trigger > self.max_per_trigger:
            raise OptionError(f"option minOffsetsPerTrigger={self.min_per_trigger} is more than "
                              f"maxRecordsPerTrigger={self.max_per_trigger}")
        _bounds_for_stream(self.options)
        #: when the last micro-batch was let through (minOffsetsPerTrigger waits until maxTriggerDelay)
        self._last_trigger = time.monotonic()
        self._target: dict[str, int] | None = None
        #: (queue key, first, end) of every range skipped because retention deleted it
        self.skipped: list[tuple[str, int, int]] = []

    # -- offsets (run in one long-lived process on the driver) -------------------------------
    def _queues(self, snap: StoreSnapshot) -> list[QueueRange]:
        return select_queues(snap.queues(), self.options, streaming=True)

    def initialOffset(self) -> dict[str, int]:
        with StoreSnapshot(self.root) as snap:
            return starting_offsets(self._queues(snap), self.options, snap.first_offset_at, streaming=True)

    def _ranges(self) -> dict[str, QueueRange]:
        with StoreSnapshot(self.root) as snap:
            return {q.key: q for q in self._queues(snap)}

    def _latest(self) -> dict[str, int]:
        return {key: q.max_offset for key, q in self._ranges().items()}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadAllAvailable() if self.max_per_trigger is None else ReadMaxRows(self.max_per_trigger)

    def _too_few(self, base: dict[str, int], latest: dict[str, int]) -> bool:
        """minOffsetsPerTrigger: fewer new messages than asked and maxTriggerDelay not yet past
        since the last micro-batch (Kafka's rule); then the micro-batch waits."""
        if self.min_per_trigger is None or self._target is not None:
            return False
        pending = sum(max(0, latest[k] - base[k]) for k in latest)
        if pending >= self.min_per_trigger or time.monotonic() - self._last_trigger >= self.max_trigger_delay_ms / 1000:
            return False
        return True

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
        if self._too_few(base, latest):
            return dict(start)  # nothing new for Spark: no micro-batch yet
        self._last_trigger = time.monotonic()
        if isinstance(limit, ReadMaxRows):
            return share_rows(base, latest, limit.max_rows)
        return latest

    def reportLatestOffset(self) -> dict[str, int]:
        return self._latest()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._latest()

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        with StoreSnapshot(self.root) as snap:
            ranges = self.planned(start, end, {q.key: q for q in snap.queues()})
        per_partition = split_for(sum(stop - begin for _, begin, stop in ranges), self.options)
        return packed([piece for q, begin, stop in ranges for piece in slices(q, begin, stop, per_partition)],
                      self.options)

    def planned(self, start: dict[str, int], end: dict[str, int], by_key: Mapping[str, Q]) -> list[tuple[Q, int, int]]:
        """(queue, begin, stop) of each queue of end that by_key still has and a micro-batch
        [start, end) reads; offsets retention deleted fail the batch (failOnDataLoss) or are
        skipped, logged and kept in ``skipped``. The network stream reader plans with it too."""
        ranges: list[tuple[Q, int, int]] = []
        for key, stop in sorted(end.items()):
            q = by_key.get(key)
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
                begin = lost[1]
            if stop > begin:
                ranges.append((q, begin, stop))
        return ranges

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return self.read_slices(partition)

    def commit(self, end: dict[str, int]) -> None:
        """Spark's checkpoint is the source of truth; nothing to keep in the store."""
