"""Writing DataFrames into an mqstore store: the batch writer.

    df.write.format("mqstore").mode("append").save("/data/store")

The rows, columns and options, and the checks of every row before anything of its task is put,
are mqstore.spark.rows's (see its docstring); the streaming writer is mqstore.spark.sink.

Delivery of the batch writer: each task puts all its rows or none, once, however often Spark
runs it. The writer made on the driver at planning draws a ``writeId`` (pickled to the tasks)
and makes ``config/spark_writes/<writeId>/``. A task stages its rows there as an Arrow IPC
file, checked and already encoded into the put_messages calls to come (client batch bodies,
spec §1.10, a row per call), then makes those calls in order, the property
``MQSTORE_WRITE_TASK=<writeId>:<partition>`` in each call's batch properties, so on every
message. Its state file there, changed under an flock the attempt at work holds, records the
staged file, the CommitLog position before its first put, and the end. Another attempt of the
task (Spark's retry, or a duplicate) waits for the lock (the kernel frees it when an attempt
dies), then does nothing if the task is done; if an attempt died while putting, it counts the
marked messages from the recorded position and puts the rest of *that attempt's* staged calls,
so a retry is exact even when recomputing the partition gives other rows. The driver's
``commit`` and ``abort`` end the job (no attempt puts after that) and complete any task an
attempt died in while putting. So a failed job leaves the store as it was plus the rows of
whole tasks. A task stays half written only when its attempt dies while putting and neither a
retry nor the abort can complete it: the store refuses puts (disk full, its owner gone) or the
driver dies too; its messages carry the marker, and ``config/spark_writes/<writeId>/`` is left
behind (it can be deleted).

Why this and not the streaming sink's append on the driver: the tasks put in parallel
(encoding runs outside the put lock, in each task's process), the driver holds no rows, and a
staged file lives only until its task has put it, so the extra disk is what the running tasks
write, not the job. Checking and encoding while staging keeps a task's Python work running
while Spark still feeds it rows (the old writer got the same overlap by putting as rows came),
and leaves the put phase little more than the store's own put. Staging a batch that would fill
the disk past ``disk_space_warning_level_ratio`` (where the store refuses puts) fails the task
saying so.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from mqstore.layout import config_path
from mqstore.spark.options import int_option
from mqstore.spark.rows import (
    DEFAULT_QUEUE_COUNT,
    TASK_PROPERTY,
    RowLimits,
    RowStager,
    WriteError,
    WriteReport,
    _read_json,
    _refuse_overwrite,
    _root,
    _task,
    _write_json,
    append_staged,
    attach,
    count_marked,
    require_owner,
    stage_rows,
    write_columns,
)

log = logging.getLogger("mqstore.spark")


def _drain(iterator: Iterator[Any]) -> None:
    """Read the task's input to its end (the Python worker expects it read) without using it."""
    for _ in iterator:
        pass


def write_dir(root: str, write_id: str) -> str:
    return config_path(root, "spark_writes", write_id)


@dataclass
class TaskState:
    """One task of a batch write (a Spark partition), read and changed under its lock:
    ``staged`` (the staged file once its rows are all staged), ``rows``, ``start`` (the
    CommitLog position before its first put, once putting began) and ``done``."""

    path: str
    marker: str
    staged: str | None = None
    rows: int = 0
    start: int | None = None
    done: bool = False

    def load(self) -> TaskState:
        for key, value in _read_json(self.path, {}).items():
            setattr(self, key, value)
        return self

    def save(self) -> None:
        _write_json(self.path, {"staged": self.staged, "rows": self.rows, "start": self.start, "done": self.done})

    def put(self, root: str, on_chunk: Callable[[int], None] | None = None) -> int:
        """Put the staged rows, or what an interrupted attempt did not put of them; then done.
        Returns the messages put now."""
        put = 0
        if self.rows:
            assert self.staged is not None
            with attach(root) as store:
                done = 0
                if self.start is None:
                    self.start = store.max_phy_offset
                    self.save()
                else:
                    done = count_marked(store, self.start, TASK_PROPERTY, self.marker)
                    log.warning("mqstore write task %s was interrupted after %d of its %d message(s); putting the "
                                "rest", self.marker, done, self.rows)
                put = append_staged(store, [self.staged], {TASK_PROPERTY: self.marker}, done, on_chunk)
        self.done = True
        self.save()
        if self.staged is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.staged)
        return put


class WriteJob:
    """The state of one batch write, under ``config/spark_writes/<writeId>/``: ``active`` while
    the job runs (made on the driver at planning, removed when commit or abort ends the job),
    and per Spark partition p ``part-<p>.lock`` (flocked by the attempt at work on it),
    ``part-<p>.json`` (its TaskState) and ``part-<p>-a<attempt>.arrow`` (its staged rows)."""

    def __init__(self, root: str, write_id: str) -> None:
        self.root = root
        self.write_id = write_id
        self.dir = write_dir(root, write_id)
        self.active = os.path.join(self.dir, "active")

    def begin(self) -> None:
        os.makedirs(self.dir)
        _write_json(self.active, {"write_id": self.write_id})

    def staged_path(self, partition: int, attempt: int) -> str:
        return os.path.join(self.dir, f"part-{partition:05d}-a{attempt}.arrow")

    def require_active(self) -> None:
        if not os.path.exists(self.active):
            raise WriteError(f"write {self.write_id} into {self.root} has ended (committed or aborted) before this "
                             "task attempt put its rows; it puts nothing")

    @contextlib.contextmanager
    def task(self, partition: int) -> Iterator[TaskState]:
        """The task's state, under its lock (waits while another attempt works on it)."""
        try:
            lock = open(os.path.join(self.dir, f"part-{partition:05d}.lock"), "a")
        except FileNotFoundError:
            raise WriteError(f"write {self.write_id} into {self.root} has ended: {self.dir} is gone") from None
        with lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield TaskState(os.path.join(self.dir, f"part-{partition:05d}.json"),
                            f"{self.write_id}:{partition}").load()

    def finish(self) -> tuple[int, int]:
        """End the job: no task attempt puts after this. A task an attempt died in while putting
        is completed from its staged rows. Returns (tasks done, messages put now)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.active)
        done = completed = 0
        try:
            names = sorted(os.listdir(self.dir))
        except FileNotFoundError:
            return 0, 0
        for name in names:
            if name.startswith("part-") and name.endswith(".lock"):
                with self.task(int(name[5:-5])) as task:
                    if task.start is not None and not task.done:
                        completed += task.put(self.root)
                    done += task.done
        shutil.rmtree(self.dir, ignore_errors=True)
        return done, completed


class MQStoreBatchWriter(DataSourceArrowWriter):
    """``df.write.format("mqstore").mode("append").save(dir)``: each task puts all its rows or
    none, once (see the module docstring)."""

    def __init__(self, options: dict[str, str], schema: StructType, overwrite: bool) -> None:
        _refuse_overwrite(overwrite)
        self.options = {k.lower(): v for k, v in options.items()}
        self.columns = write_columns(schema)  # refuses a missing, unknown or mistyped column
        self.queue_count = int_option(self.options, "queueCount", DEFAULT_QUEUE_COUNT)
        self.root = require_owner(_root(self.options))  # fail at planning, not in every task
        self.limits = RowLimits.of_store(self.root)
        self.write_id = uuid.uuid4().hex[:16]
        WriteJob(self.root, self.write_id).begin()

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteReport:
        part, attempt = _task()
        job = WriteJob(self.root, self.write_id)
        with job.task(part) as task:
            if task.done:
                _drain(iterator)
                log.info("mqstore write task %s was done by an earlier attempt", task.marker)
                return WriteReport(part, task.rows)
            job.require_active()  # no use staging for a job that ended
            if task.staged is None:
                path = job.staged_path(part, attempt)
                task.rows = stage_rows(iterator, path, RowStager(self.columns, self.limits, {TASK_PROPERTY: task.marker},
                                                                 part, self.queue_count))
                task.staged = path
                task.save()
            else:  # an earlier attempt staged every row: those are put, whatever this input holds
                _drain(iterator)
            job.require_active()  # abort, if it runs now, waits for this lock: then nothing is put
            task.put(self.root, lambda n: self.on_put(part, attempt, n))
        return WriteReport(part, task.rows)

    def on_put(self, partition: int, attempt: int, put: int) -> None:
        """Called in the task after each put with the task's messages put so far (a point for
        fault-injection tests to kill a task at)."""

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        WriteJob(self.root, self.write_id).finish()
        total = sum(m.messages for m in messages if isinstance(m, WriteReport))
        log.info("mqstore write %s into %s: %d message(s) from %d task(s)", self.write_id, self.root, total,
                 len(messages))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        try:
            done, completed = WriteJob(self.root, self.write_id).finish()
        except Exception as exc:
            log.error("mqstore write %s into %s failed, and completing the tasks it interrupted failed too (%s); "
                      "messages marked %s=%s:<partition> of an unfinished task are in the store",
                      self.write_id, self.root, exc, TASK_PROPERTY, self.write_id)
            raise
        log.warning("mqstore write %s into %s failed: %d task(s) put all their rows (%d message(s) put now to "
                    "complete interrupted ones), the other tasks put nothing", self.write_id, self.root, done,
                    completed)
