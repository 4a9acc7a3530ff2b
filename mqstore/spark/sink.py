"""Writing DataFrames into an mqstore store: the streaming writer.

    (df.writeStream.format("mqstore").option("sinkId", "orders-etl")
       .option("checkpointLocation", ckpt).start("/data/store"))

The rows, columns and options, and the checks of every row, are mqstore.spark.rows's (see its
docstring); the batch writer is mqstore.spark.write.

The streaming writer is exactly-once per micro-batch: tasks stage their rows (checked and
encoded, as the batch writer's) as Arrow IPC files; the driver's ``commit(batchId)`` makes
their puts, every message marked with the property ``MQSTORE_SINK_BATCH=<sinkId>:<batchId>``,
and records the batch in ``config/spark_sinks/<sinkId>/state.json``. A replayed batch at or
below the recorded one is skipped; a batch whose append a crash interrupted (the state file
says it was begun) counts the marked messages already in the log and appends only the rest
(rows are appended in a fixed order: by task partition, then row order, so a replay that yields
the same rows completes it).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import shutil
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from mqstore.log.directory import require_store
from mqstore.layout import config_path
from mqstore.spark.options import OptionError, int_option
from mqstore.spark.rows import (
    DEFAULT_QUEUE_COUNT,
    SINK_PROPERTY,
    RowLimits,
    RowStager,
    WriteReport,
    _read_json,
    _refuse_overwrite,
    _root,
    _task,
    _write_json,
    append_staged,
    attach,
    count_marked,
    stage_rows,
    write_columns,
)

log = logging.getLogger("mqstore.spark")
_SINK_ID = re.compile(r"^[A-Za-z0-9._-]{1,128}$")


def sink_dir(root: str, sink_id: str) -> str:
    return config_path(root, "spark_sinks", sink_id)


class SinkLog:
    """The applied micro-batches of one streaming sink: ``state.json`` ({"last_batch": id,
    "pending": {"batch", "start", "rows"} or null}) under ``config/spark_sinks/<sinkId>/``,
    changed under an flock of ``lock`` there."""

    def __init__(self, root: str, sink_id: str) -> None:
        if not _SINK_ID.match(sink_id):
            raise OptionError(f"option sinkId={sink_id!r}: use 1 to 128 of A-Z a-z 0-9 . _ -")
        self.root = root
        self.sink_id = sink_id
        self.dir = sink_dir(root, sink_id)
        self.staging = os.path.join(self.dir, "staging")
        self.state_path = os.path.join(self.dir, "state.json")

    def state(self) -> dict[str, Any]:
        return _read_json(self.state_path, {"last_batch": -1, "pending": None})

    def apply(self, batch_id: int, files: list[str], on_chunk: Callable[[int], None] | None = None) -> int:
        """Append the rows of the staged files (in order) as micro-batch batch_id, once: a batch
        already applied is skipped, an interrupted one completed. Returns the messages put.
        on_chunk(n) is called after each put with the messages put so far (tests kill there)."""
        os.makedirs(self.dir, exist_ok=True)
        with open(os.path.join(self.dir, "lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            state = self.state()
            if batch_id <= state["last_batch"]:
                log.info("sink %s: micro-batch %d was applied before (last %d); skipped", self.sink_id, batch_id,
                         state["last_batch"])
                self._clear_staging()
                return 0
            marker = f"{self.sink_id}:{batch_id}"
            pending = state.get("pending")
            done = 0
            with attach(self.root) as store:
                if pending and pending["batch"] == batch_id:
                    done = count_marked(store, pending["start"], SINK_PROPERTY, marker)
                    log.warning("sink %s: micro-batch %d was interrupted after %d message(s); appending the rest",
                                self.sink_id, batch_id, done)
                else:
                    if pending:
                        log.warning("sink %s: micro-batch %d was begun and never finished; now %d is written",
                                    self.sink_id, pending["batch"], batch_id)
                    state["pending"] = {"batch": batch_id, "start": store.max_phy_offset}
                    _write_json(self.state_path, state)
                put = append_staged(store, files, {SINK_PROPERTY: marker}, done, on_chunk)
            _write_json(self.state_path, {"last_batch": batch_id, "pending": None})
            self._clear_staging()
            return put

    def _clear_staging(self) -> None:
        """Staged files are only needed until their micro-batch is applied; a micro-batch's
        tasks run after the previous one's commit, so everything staged now is done with."""
        shutil.rmtree(self.staging, ignore_errors=True)


class MQStoreStreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("mqstore").option("sinkId", ...)``: exactly-once per micro-batch."""

    def __init__(self, options: dict[str, str], schema: StructType, overwrite: bool) -> None:
        _refuse_overwrite(overwrite)
        self.options = {k.lower(): v for k, v in options.items()}
        self.root = _root(self.options)
        self.columns = write_columns(schema)  # refuses a missing, unknown or mistyped column
        self.queue_count = int_option(self.options, "queueCount", DEFAULT_QUEUE_COUNT)
        sink_id = self.options.get("sinkid")
        if not sink_id:
            raise OptionError("a streaming write needs option sinkId: a name for the sink, under which the store "
                              "records the micro-batches it applied (so a replayed one is not written twice)")
        self.sink = SinkLog(require_store(self.root), sink_id)
        self.limits = RowLimits.of_store(self.sink.root)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteReport:
        """Stage the task's rows (checked) as an Arrow IPC file; commit appends them."""
        part, _ = _task()
        os.makedirs(self.sink.staging, exist_ok=True)
        path = os.path.join(self.sink.staging, f"part-{part:05d}-{uuid.uuid4().hex}.arrow")
        marker = {SINK_PROPERTY: f"{self.sink.sink_id}:{2**63 - 1}"}  # the longest the batch id makes it
        rows = stage_rows(iterator, path, RowStager(self.columns, self.limits, marker, part, self.queue_count))
        return WriteReport(part, rows, path if rows else None)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        reports = sorted((m for m in messages if isinstance(m, WriteReport) and m.path), key=lambda m: m.partition)
        self.sink.apply(batchId, [m.path for m in reports if m.path])

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        for m in messages:
            if isinstance(m, WriteReport) and m.path:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(m.path)
        log.warning("sink %s: micro-batch %d aborted; nothing of it was written", self.sink.sink_id, batchId)
