"""AllocateMappedFileService (spec §6.3): pre-create the next and next-next
CommitLog files so a roll never waits for file creation; optional warm-up."""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from sortedcontainers import SortedList

from mqstore.layout import file_start_of, log_base, log_of
from mqstore.log._mapped import MappedFile
from mqstore.log.mapped_file_queue import MappedFileQueue
from mqstore.services.base import ServiceThread

logger = logging.getLogger("mqstore.allocate")


def requested_files(ctl: Any, file_size: int, log: int = 0) -> range:
    """Starts of the files writers in other processes asked for (AllocateClient raises
    ``alloc_request_upto``) that are not known to exist yet: from the file holding the write
    position, or the one after ``alloc_ready_upto``, up to the request (of CommitLog log)."""
    start = max(ctl.get("wrote", log=log), ctl.get("alloc_ready_upto", log=log) + file_size, log_base(log))
    return range(file_start_of(start, file_size), ctl.get("alloc_request_upto", log=log) + 1, file_size)


def creation_error(path: str, err: int) -> str:
    return f"cannot create CommitLog file {os.path.basename(path)}: {os.strerror(err)} (errno {err})"


def record_failure(ctl: Any, offset: int, path: str, exc: OSError, log: int = 0) -> str:
    """A file could not be created: publish it in the control block (writers waiting in any
    process see it), wake them, and return the detail for CREATE_MAPEDFILE_FAILED."""
    err = exc.errno or errno.EIO
    detail = creation_error(path, err)
    ctl.set("alloc_error_errno", err, log=log)
    ctl.set("alloc_error_offset", offset, log=log)
    ctl.advance("alloc_error_count", ctl.get("alloc_error_count", log=log) + 1, log=log)
    ctl.add_stat("alloc_errors")
    logger.error("%s", detail)
    ctl.broadcast("alloc_done", log=log)
    return detail


def record_created(ctl: Any, offset: int, t0_ns: int, log: int = 0) -> None:
    """The file at offset is ready: count it, publish ``alloc_ready_upto`` and wake waiters."""
    elapsed = time.monotonic_ns() - t0_ns
    ctl.add_stat("alloc_count")
    ctl.add_stat("alloc_ns_total", elapsed)
    ctl.max_stat("alloc_ns_max", elapsed)
    ctl.advance("alloc_ready_upto", offset, log=log)
    ctl.broadcast("alloc_done", log=log)


@dataclass
class AllocateRequest:
    offset: int
    path: str
    size: int
    done: threading.Event = field(default_factory=threading.Event)
    mapped_file: MappedFile | None = None
    error: str | None = None

    @property
    def priority(self) -> tuple[int, int]:
        """Larger files first, then smaller start offsets (spec §6.3)."""
        return (-self.size, self.offset)


class AllocateMappedFileService(ServiceThread):
    channel = "alloc"

    def __init__(self, ctl, queue: MappedFileQueue, *, warm: bool, sync_flush: bool, warm_flush_least_pages: int,
                 wait_timeout_ms: int) -> None:
        self.log_id = log_of(queue.base)
        super().__init__("allocate" if not self.log_id else f"allocate-commitlog-{self.log_id}", ctl)
        self.channel_log = self.log_id  # the log's own "alloc" and "alloc_done" channels and cells
        self.queue = queue
        self.warm = warm
        self.sync_flush = sync_flush
        self.warm_flush_least_pages = warm_flush_least_pages
        self.wait_timeout_ms = wait_timeout_ms
        self._lock = threading.Lock()
        self._table: dict[str, AllocateRequest] = {}
        self._pending: SortedList = SortedList(key=lambda r: r.priority)
        self.last_warm: dict | None = None

    # -- put side ----------------------------------------------------------------------
    def _submit(self, offset: int) -> AllocateRequest:
        path = self.queue.path_of(offset)
        with self._lock:
            req = self._table.get(path)
            if req is None:
                req = AllocateRequest(offset, path, self.queue.file_size)
                self._table[path] = req
                self._pending.add(req)
                self.ctl.advance("alloc_request_upto", offset, log=self.log_id)
            return req

    def prefetch(self, offset: int) -> None:
        """Ask for a file ahead of need (the next-next file), without waiting."""
        path = self.queue.path_of(offset)
        with self._lock:
            if path in self._table:
                return
        if self.queue.get(offset) is None and not os.path.exists(path):
            self._submit(offset)
            self.wakeup()

    def put_request_and_return_mapped_file(self, next_offset: int, next_next_offset: int | None) -> MappedFile | str:
        """Request next and next-next; wait up to the timeout for next. Returns the file or a
        detail string naming why it could not be had (spec §6.3, 5 s wait)."""
        path = self.queue.path_of(next_offset)
        with self._lock:
            req = self._table.get(path)
        if req is None:
            existing = self.queue.map_existing(next_offset)
            if existing is not None:
                if next_next_offset is not None:
                    self.prefetch(next_next_offset)
                return existing
            req = self._submit(next_offset)
        if next_next_offset is not None:
            self.prefetch(next_next_offset)
        self.wakeup()
        t0 = time.monotonic_ns()
        if not req.done.wait(self.wait_timeout_ms / 1000):
            return (f"the allocate service did not create {os.path.basename(req.path)} within "
                    f"{self.wait_timeout_ms} ms")
        waited = time.monotonic_ns() - t0
        self.ctl.add_stat("roll_waits")
        self.ctl.add_stat("roll_wait_ns_total", waited)
        self.ctl.max_stat("roll_wait_ns_max", waited)
        with self._lock:
            if self._table.get(req.path) is req:
                del self._table[req.path]
        if req.error is not None:
            return req.error
        assert req.mapped_file is not None
        mf = self.queue.add(req.mapped_file)
        if mf is not req.mapped_file:
            req.mapped_file.close()
        return mf

    # -- service side ------------------------------------------------------------------
    def run_once(self) -> None:
        with self._lock:
            req = self._pending.pop(0) if self._pending else None
        if req is None:
            if not self._serve_other_processes():
                self.wait_for_running(1000)
            return
        self._allocate(req)

    def _serve_other_processes(self) -> bool:
        """Writers attached from other processes ask through the control block (AllocateClient):
        queue the files up to alloc_request_upto that exist nowhere yet. True if any was queued."""
        queued = False
        for start in requested_files(self.ctl, self.queue.file_size, self.log_id):
            path = self.queue.path_of(start)
            with self._lock:
                known = path in self._table
            if not known and self.queue.get(start) is None and not os.path.exists(path):
                self._submit(start)
                queued = True
            elif not known:
                self.ctl.advance("alloc_ready_upto", start, log=self.log_id)
        if not queued:
            self.ctl.broadcast("alloc_done", log=self.log_id)
        return queued

    def _allocate(self, req: AllocateRequest) -> None:
        t0 = time.monotonic_ns()
        try:
            mf = self.queue.map_existing(req.offset) or MappedFile.create(req.path, req.size,
                                                                           self.queue.initial_allocation())
        except OSError as exc:
            with self._lock:
                self._table.pop(req.path, None)
            req.error = record_failure(self.ctl, req.offset, req.path, exc, self.log_id)
            req.done.set()
            return
        if self.warm:
            self.last_warm = mf.warm(self.sync_flush, self.warm_flush_least_pages)
            self.ctl.add_stat("warm_ns_total", self.last_warm["warm_ns"])
        req.mapped_file = mf
        record_created(self.ctl, req.offset, t0, self.log_id)
        req.done.set()
        if not self.warm and mf.hold():
            # after the file is handed out, so a writer that already needs it never waits for
            # this: the kernel zero-fills the pages here, not on the writer's first touch
            # (populating pages the writer has reached already is harmless)
            try:
                mf.populate(mf.allocated)
            finally:
                mf.release()

    def on_shutdown(self) -> None:
        """Destroy pre-allocated files nobody took (spec §6.3) and fail their waiters."""
        with self._lock:
            leftovers = list(self._table.values())
            self._table.clear()
            self._pending.clear()
        for req in leftovers:
            if req.mapped_file is not None and self.queue.get(req.offset) is None:
                req.mapped_file.destroy(0)  # created ahead and never taken: still empty
            req.error = req.error or "the allocate service was shut down"
            req.done.set()


# -- across processes (the node) -------------------------------------------------------------
class AllocateClient:
    """The put path's side of the allocator when the allocator is another process (the node):
    requests go through the control block (``alloc_request_upto``: the start of the furthest
    file wanted; a notify on channel "alloc"), and the allocator answers by raising
    ``alloc_ready_upto`` (the start of the furthest file created, files are created in order)
    and broadcasting "alloc_done". The file is then mapped from its path."""

    def __init__(self, ctl: Any, queue: MappedFileQueue, *, wait_timeout_ms: int) -> None:
        self.ctl = ctl
        self.queue = queue
        self.wait_timeout_ms = wait_timeout_ms
        #: the CommitLog whose files it asks for (that log's cells and channels)
        self.log_id = log_of(queue.base)

    def prefetch(self, offset: int) -> None:
        k = self.log_id
        if self.ctl.get("alloc_request_upto", log=k) < offset and not os.path.exists(self.queue.path_of(offset)):
            self.ctl.advance("alloc_request_upto", offset, log=k)
            self.ctl.notify("alloc", log=k)

    def put_request_and_return_mapped_file(self, next_offset: int, next_next_offset: int | None) -> MappedFile | str:
        mf = self.queue.map_existing(next_offset)
        if mf is not None:
            if next_next_offset is not None:
                self.prefetch(next_next_offset)
            return mf
        ctl, k = self.ctl, self.log_id
        errors = ctl.get("alloc_error_count", log=k)
        ctl.advance("alloc_request_upto", next_offset if next_next_offset is None else next_next_offset, log=k)
        ctl.notify("alloc", log=k)
        t0 = time.monotonic_ns()
        deadline = t0 + self.wait_timeout_ms * 1_000_000
        name = os.path.basename(self.queue.path_of(next_offset))
        while True:
            seq = ctl.channel_seq("alloc_done", log=k)
            if ctl.get("alloc_ready_upto", log=k) >= next_offset:
                mf = self.queue.map_existing(next_offset)
                if mf is not None:
                    break
            if ctl.get("alloc_error_count", log=k) != errors and ctl.get("alloc_error_offset", log=k) == next_offset:
                return creation_error(self.queue.path_of(next_offset), ctl.get("alloc_error_errno", log=k))
            left_ms = (deadline - time.monotonic_ns()) / 1e6
            if left_ms <= 0:
                return f"the allocate process did not create {name} within {self.wait_timeout_ms} ms"
            ctl.wait_seq_change("alloc_done", seq, min(left_ms, 100.0), log=k)
        waited = time.monotonic_ns() - t0
        ctl.add_stat("roll_waits")
        ctl.add_stat("roll_wait_ns_total", waited)
        ctl.max_stat("roll_wait_ns_max", waited)
        return mf


class ProcessAllocateService(ServiceThread):
    """AllocateMappedFileService as the node's allocator process: creates (and warms) every
    missing CommitLog file from the one holding the write position up to
    ``alloc_request_upto``, in order, then publishes ``alloc_ready_upto``. Its own mapping of
    a created file is dropped: writers map the file from its path."""

    channel = "alloc"
    RETRY_AFTER_ERROR_MS = 1000

    def __init__(self, ctl: Any, queue: MappedFileQueue, *, warm: bool, sync_flush: bool,
                 warm_flush_least_pages: int) -> None:
        self.log_id = log_of(queue.base)
        super().__init__("allocate" if not self.log_id else f"allocate-commitlog-{self.log_id}", ctl)
        self.channel_log = self.log_id  # the log's own "alloc" and "alloc_done" channels and cells
        self.queue = queue
        self.warm = warm
        self.sync_flush = sync_flush
        self.warm_flush_least_pages = warm_flush_least_pages

    def next_missing(self) -> int | None:
        """The start of the first file to create, or None when every requested file exists."""
        for start in requested_files(self.ctl, self.queue.file_size, self.log_id):
            if not os.path.exists(self.queue.path_of(start)):
                return start
            self.ctl.advance("alloc_ready_upto", start, log=self.log_id)
        return None

    def run_once(self) -> None:
        start = self.next_missing()
        if start is None:
            self.ctl.broadcast("alloc_done", log=self.log_id)
            self.wait_for_running(1000)
            return
        t0 = time.monotonic_ns()
        try:
            mf = MappedFile.create(self.queue.path_of(start), self.queue.file_size, self.queue.initial_allocation())
        except FileExistsError:
            return
        except OSError as exc:
            record_failure(self.ctl, start, self.queue.path_of(start), exc, self.log_id)
            self.sleep(self.RETRY_AFTER_ERROR_MS)
            return
        try:
            if self.warm:
                self.ctl.add_stat("warm_ns_total", mf.warm(self.sync_flush, self.warm_flush_least_pages)["warm_ns"])
            elif mf.hold():
                try:
                    mf.populate(mf.allocated)
                finally:
                    mf.release()
        finally:
            mf.close()
        record_created(self.ctl, start, t0, self.log_id)
