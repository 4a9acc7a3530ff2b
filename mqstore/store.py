"""MessageStore: RocketMQ's DefaultMessageStore (spec §5.2, §9, §10, §11).

Opening takes the ``lock`` file, recovers the CommitLog and the ConsumeQueues, rebuilds the
control block, dispatches whatever the queues and the index lack (blocking until nothing is
behind), creates ``abort`` and starts the services: allocate, CommitLog flush, ConsumeQueue
flush and dispatch (reput). Shutdown stops them, flushes, writes the checkpoint, and removes
``abort`` only when everything was flushed and dispatched.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from typing import Any

from mqstore import _shm
from mqstore._commitlog import Message, MessageBatch, PutMessageResult
from mqstore.checkpoint import StoreCheckpoint
from mqstore.commitlog import CommitLog
from mqstore.config import StoreConfig
from mqstore.errors import ConfigError, NotAStoreError, StoreClosedError, StoreLockedError
from mqstore.consume_queue import ConsumeQueueTable
from mqstore.dispatch import Dispatcher, ReputMessageService
from mqstore.index import IndexService
from mqstore.reads import MessageReader, QueryMessageResult, TimeLookup
from mqstore.recovery import RecoveryReport, commitlog_file_was_cut, log_report, recover_store
from mqstore.services.allocate import AllocateMappedFileService
from mqstore.services.base import ServiceThread
from mqstore.services.flush import FlushConsumeQueueService, FlushRealTimeService, GroupCommitService
from mqstore._consumequeue import GetMessageResult, MessageView

log = logging.getLogger("mqstore.store")

CONTROL_BLOCK_NAME = "mqstore.shm"
STORE_ENTRIES = frozenset({"commitlog", "consumequeue", "consumequeue_ext", "index", "checkpoint", "abort", "lock",
                           "config", CONTROL_BLOCK_NAME})


def check_store_dir(root: str) -> None:
    """Raise NotAStoreError if root exists but cannot be a store: a file, a non-empty
    directory holding none of a store's entries, or a 'commitlog' that is not a directory."""
    if os.path.exists(root) and not os.path.isdir(root):
        raise NotAStoreError(f"{root} is a file, not a store directory")
    if not os.path.isdir(root):
        return
    entries = set(os.listdir(root))
    if entries and not entries & STORE_ENTRIES:
        shown = ", ".join(sorted(entries)[:5])
        raise NotAStoreError(f"{root} is not empty and holds no store files (found: {shown})")
    commitlog = os.path.join(root, "commitlog")
    if os.path.exists(commitlog) and not os.path.isdir(commitlog):
        raise NotAStoreError(f"{commitlog} is not a directory")


class MessageStore:
    """A store directory opened for writing by this process.

    >>> with MessageStore("/tmp/store", mapped_file_size_commit_log=1 << 20) as store:  # doctest: +SKIP
    ...     store.put("TopicTest", b"hello").check()
    """

    def __init__(self, root: str | os.PathLike[str], config: StoreConfig | None = None, **overrides: Any) -> None:
        self.root = os.path.abspath(os.fspath(root))
        cfg = config if config is not None else StoreConfig()
        if overrides:
            cfg = cfg.replace(**overrides)
        self.config = cfg.validate()
        if self.config.transient_store_pool_enable:
            raise ConfigError("transient_store_pool_enable=true is not implemented yet (the transient store pool "
                              "and commit service come with the multi-process node); refusing rather than "
                              "silently writing through the mapped files",
                              hint="open the store with transient_store_pool_enable=false")
        if self.config.enable_consume_queue_ext:
            raise ConfigError("enable_consume_queue_ext=true is not implemented (ConsumeQueueExt units and "
                              "bitmap filters); refusing rather than building queues without it",
                              hint="open the store with enable_consume_queue_ext=false")
        self._closed = True
        self._lock_fd = -1
        self._services: list[ServiceThread] = []
        check_store_dir(self.root)
        os.makedirs(self.root, exist_ok=True)
        self._take_lock()
        try:
            self._open()
        except BaseException:
            self._release_lock()
            raise
        self._closed = False

    @classmethod
    def open(cls, root: str | os.PathLike[str], config: StoreConfig | None = None, **overrides: Any) -> MessageStore:
        return cls(root, config, **overrides)

    # -- opening -------------------------------------------------------------------------
    def _take_lock(self) -> None:
        path = os.path.join(self.root, "lock")
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        if not _shm.ofd_lock(fd):
            os.close(fd)
            owner = ""
            try:
                owner = f" (pid {_shm.ControlBlock.attach(os.path.join(self.root, CONTROL_BLOCK_NAME)).owner_pid})"
            except (OSError, ValueError):
                pass
            raise StoreLockedError(f"{self.root} is owned by another running store{owner}")
        os.pwrite(fd, b"lock", 0)
        self._lock_fd = fd

    def _release_lock(self) -> None:
        if self._lock_fd >= 0:
            _shm.ofd_unlock(self._lock_fd)
            os.close(self._lock_fd)
            self._lock_fd = -1

    def _open(self) -> None:
        cfg = self.config
        self.abort_path = os.path.join(self.root, "abort")
        self.last_exit_ok = not os.path.exists(self.abort_path)
        self.ctl = _shm.ControlBlock.create(
            os.path.join(self.root, CONTROL_BLOCK_NAME),
            table_slots=cfg.topic_queue_table_slots,
            file_size=cfg.mapped_file_size_commit_log,
            lock_kind=cfg.put_lock_kind,
            sync_flush=cfg.is_sync_flush,
        )
        self.checkpoint = StoreCheckpoint(os.path.join(self.root, "checkpoint"))
        self.commitlog = CommitLog(self.root, cfg, self.ctl)
        self.commitlog.queue.load(commitlog_file_was_cut)
        self.consume_queues = ConsumeQueueTable(os.path.join(self.root, "consumequeue"),
                                                cfg.mapped_file_size_consume_queue)
        self.consume_queues.load()
        self.index = None
        if cfg.message_index_enable:
            self.index = IndexService(self.root, cfg, self.checkpoint)
            self.index.load(self.last_exit_ok)
        self.recovery: RecoveryReport = recover_store(
            self.commitlog.queue, self.ctl, self.consume_queues, self.checkpoint,
            check_crc=cfg.check_crc_on_recover, clean_shutdown=self.last_exit_ok,
            index_safe=cfg.message_index_enable and cfg.message_index_safe, index=self.index)
        self.commitlog.prepare_for_writes()
        self.dispatcher = Dispatcher.from_config(self.commitlog, self.consume_queues, self.index, self.ctl, cfg)
        # spec §5.2 step 4: dispatch until nothing is behind before serving
        self.dispatcher.reset(self.recovery.dispatch_from)
        self.recovery.redispatched_records = self.dispatcher.dispatch_available(raise_table=True)
        log_report(self.recovery)
        self.reader = MessageReader(self.commitlog, self.consume_queues, self.index, cfg)
        self.ctl.mark_ready()
        with open(self.abort_path, "wb"):
            pass
        # the hot path: put_message/put_messages go straight to the compiled appender, without
        # a Python frame of this class in between (the methods below document the API)
        appender = self.commitlog.appender
        self.put_message = appender.put_message  # type: ignore[method-assign]
        self.put_messages = appender.put_messages  # type: ignore[method-assign]
        self._start_services()

    def _start_services(self) -> None:
        cfg = self.config
        allocator = AllocateMappedFileService(
            self.ctl, self.commitlog.queue, warm=cfg.warm_maped_file_enable, sync_flush=cfg.is_sync_flush,
            warm_flush_least_pages=cfg.flush_least_pages_when_warm_maped_file,
            wait_timeout_ms=cfg.allocate_wait_timeout_ms)
        self.commitlog.allocator = allocator
        flusher: ServiceThread = (GroupCommitService(self.commitlog) if cfg.is_sync_flush
                                  else FlushRealTimeService(self.commitlog))
        self.reput = ReputMessageService(self.dispatcher)
        self.cq_flusher = FlushConsumeQueueService(self.consume_queues, self.dispatcher, self.checkpoint, self.ctl,
                                                   cfg)
        # shutdown runs in reverse: dispatch catches up, then queues and the log are flushed
        self._services = [allocator, flusher, self.cq_flusher, self.reput]
        for service in self._services:
            service.start()

    # -- puts ----------------------------------------------------------------------------
    def put_message(self, msg: Message) -> PutMessageResult:
        """Put one message; the result's status names any failure (spec §9)."""
        return self.commitlog.appender.put_message(msg)

    def put_messages(self, batch: MessageBatch | Iterable[Message]) -> PutMessageResult:
        """Put a batch of one topic and queue (spec §9.4)."""
        return self.commitlog.appender.put_messages(batch)

    def put(self, topic: str, body: bytes = b"", **fields: Any) -> PutMessageResult:
        """Convenience: build a Message from keyword fields and put it."""
        return self.commitlog.appender.put_message(Message(topic, body, **fields))

    # -- state ---------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def max_phy_offset(self) -> int:
        return self.commitlog.max_offset

    @property
    def min_phy_offset(self) -> int:
        return self.commitlog.min_offset

    def next_queue_offset(self, topic: str, queue_id: int) -> int:
        """The queue offset the next message of topic/queue_id will get."""
        value = self.ctl.table_get(topic, queue_id)
        return 0 if value is None else value

    def positions(self) -> dict[str, int]:
        return self.ctl.positions()

    def stats(self) -> dict[str, int]:
        return {**self.ctl.stats(), **self.ctl.positions()}

    def flush(self) -> bool:
        """Flush everything written so far; raises OSError if the disk refuses."""
        self._check_open()
        return self.commitlog.flush(0)

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"store {self.root} is shut down")

    # -- reads (spec §11) --------------------------------------------------------------------
    def get_message(self, group: str, topic: str, queue_id: int, offset: int, max_msg_nums: int = 32,
                    tags: str | None = None) -> GetMessageResult:
        """Up to max_msg_nums messages of a queue from offset, filtered by a tags expression
        ("*", "TagA", "TagA || TagB"); the status and next_begin_offset follow spec §11."""
        self._check_open()
        return self.reader.get_message(group, topic, queue_id, offset, max_msg_nums, tags)

    def look_message_by_offset(self, phy_offset: int) -> MessageView | None:
        self._check_open()
        return self.reader.look_message_by_offset(phy_offset)

    def look_message_by_queue_offset(self, topic: str, queue_id: int, queue_offset: int) -> MessageView | None:
        """The message at a queue offset (through its ConsumeQueue unit), or None."""
        self._check_open()
        return self.reader.look_message_by_queue_offset(topic, queue_id, queue_offset)

    def get_message_store_timestamp(self, topic: str, queue_id: int, queue_offset: int) -> int:
        self._check_open()
        return self.reader.get_message_store_timestamp(topic, queue_id, queue_offset)

    def get_offset_in_queue_by_time(self, topic: str, queue_id: int, timestamp: int) -> int:
        self._check_open()
        return self.reader.get_offset_in_queue_by_time(topic, queue_id, timestamp)

    def offset_in_queue_by_time(self, topic: str, queue_id: int, timestamp: int,
                                warm_bytes: int | None = None) -> TimeLookup:
        """get_offset_in_queue_by_time with the pages and probes the search touched."""
        self._check_open()
        return self.reader.offset_in_queue_by_time(topic, queue_id, timestamp, warm_bytes)

    def get_max_offset_in_queue(self, topic: str, queue_id: int) -> int:
        return self.reader.get_max_offset_in_queue(topic, queue_id)

    def get_min_offset_in_queue(self, topic: str, queue_id: int) -> int:
        return self.reader.get_min_offset_in_queue(topic, queue_id)

    def get_max_phy_offset(self) -> int:
        return self.commitlog.max_offset

    def get_min_phy_offset(self) -> int:
        return self.commitlog.min_offset

    def get_earliest_message_time(self, topic: str | None = None, queue_id: int = 0) -> int:
        self._check_open()
        return self.reader.get_earliest_message_time(topic, queue_id)

    def query_message(self, topic: str, key: str, max_num: int = 32, begin: int = 0,
                      end: int = 2**63 - 1) -> QueryMessageResult:
        """Messages whose KEYS or UNIQ_KEY is key (spec §4.4), each checked against its key."""
        self._check_open()
        return self.reader.query_message(topic, key, max_num, begin, end)

    # -- dispatch ------------------------------------------------------------------------
    @property
    def dispatch_behind_bytes(self) -> int:
        return self.dispatcher.behind()

    @property
    def dispatch_lag_ms(self) -> int:
        return self.dispatcher.lag_ms()

    def wait_dispatched(self, offset: int | None = None, timeout_ms: float = 5000) -> bool:
        """Wait until everything written (or up to offset) is dispatched."""
        target = self.ctl.get("committed") if offset is None else offset
        return self.ctl.wait_position("dispatched", target, "dispatched", timeout_ms)

    # -- closing -------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Stop puts, stop services (dispatch catches up, final flushes), write the checkpoint,
        and remove `abort` only when everything was flushed and dispatched (spec §5.2)."""
        if self._closed:
            return
        self._closed = True
        self.commitlog.appender.closed = True
        for service in reversed(self._services):
            service.shutdown()
        errors = [s.error for s in self._services if s.error is not None]
        flushed_all = self.ctl.get("flushed") >= self.ctl.get("wrote")
        behind = self.dispatcher.behind()
        ts = self.ctl.get("flushed_store_timestamp")
        if ts > 0:
            self.checkpoint.physic_msg_timestamp = ts
        if self.index is not None:
            self.index.close()
        self.consume_queues.close()
        self.checkpoint.close()
        self.reader = None  # type: ignore[assignment]
        self.commitlog.close()
        self.ctl.mark_closed()
        self.ctl.close()
        if flushed_all and not errors and behind == 0:
            os.unlink(self.abort_path)
        else:
            why = "unflushed data" if not flushed_all else (f"{behind} bytes not dispatched" if behind else errors[0])
            log.warning("leaving %s: the store did not shut down cleanly (%s)", self.abort_path, why)
        self._release_lock()

    close = shutdown

    def __enter__(self) -> MessageStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def __del__(self) -> None:
        if getattr(self, "_closed", True) is False and self._lock_fd >= 0:
            log.warning("MessageStore(%s) was garbage-collected without shutdown()", self.root)
