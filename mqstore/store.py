"""MessageStore: RocketMQ's DefaultMessageStore (spec §5.2, §9, §10, §11).

Opening takes the ``lock`` file, recovers the CommitLog and the ConsumeQueues, rebuilds the
control block, dispatches whatever the queues and the index lack (blocking until nothing is
behind), creates ``abort`` and starts the services: allocate, CommitLog flush, ConsumeQueue
flush and dispatch (reput). Shutdown stops them, flushes, writes the checkpoint, and removes
``abort`` only when everything was flushed and dispatched.
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Self

from mqstore.layout import CONFIG_NAME, CONTROL_BLOCK_NAME, FENCE_NAME, abort_path, fence_text, log_of
from mqstore.log import _shm
from mqstore.log._commitlog import CommitLogAppender, LogRouter
from mqstore.log._message import Message, MessageBatch, PutMessageResult
from mqstore.log.commitlog import CommitLog
from mqstore.config import StoreConfig
from mqstore.errors import ConfigError, NotAStoreError, StoreClosedError, StoreLockedError
from mqstore.log.directory import check_store_dir, release_store_lock, replace_file, take_store_lock
from mqstore.log.mapped_file_queue import mapped_file_names
from mqstore.parts import StoreParts, open_parts
from mqstore.geometry import adopt_commit_log_path, adopt_store_sizes, check_root_dir
from mqstore.procs import stopped
from mqstore.progress import LogProgress
from mqstore.queue.consume_queue import ConsumeQueueTable
from mqstore.queue.dispatch import Dispatcher
from mqstore.queue.index import IndexService
from mqstore.queue.reads import (MessageReader, QueryMessageResult, TimeLookup, argument_error, check_arguments,
                           tags_expression)
from mqstore.queue.recovery import RecoveryReport, log_report, recover_store, truncate_store
from mqstore.ha import TRUNCATE_EXIT, TRUNCATE_FILE, read_truncation_request, record_truncation
from mqstore.node import Supervisor, read_config, write_config
from mqstore.log import pool as transient_pool
from mqstore.log import clean_close as clean_close_record
from mqstore.log.clean_close import CleanClose
from mqstore.queue.follow import NOT_FOLLOWING, Follower, NotFollowing
from mqstore.roles import BrokerRole
from mqstore.services import service_kinds, service_processes
from mqstore.services.allocate import AllocateClient
from mqstore.services.base import ServiceThread
from mqstore.services.clean import CleanService
from mqstore.services.registry import build_services
from mqstore.services.reput import ReputMessageService
from mqstore.queue._reads import GetMessageResult, MessageView

log = logging.getLogger("mqstore.store")

#: how long wait_for_messages holds by default with long polling (a push consumer's suspend time)
LONG_POLLING_SUSPEND_MS = 15_000


#: how long a put lock holder that is stopped (SIGSTOP, a debugger) may keep the lock from a
#: store that fences or shuts down, and how long one that runs (stuck I/O) may
STOPPED_HOLDER_WAIT_S = 5.0
RUNNING_HOLDER_WAIT_S = 30.0


def _lock_holder_pid(ctl: _shm.ControlBlock, log: int = 0) -> int:
    holder = ctl.log_lock_holder(log)  # the spin kind records it in the lock word
    return holder[0] if holder is not None else ctl.get("lock_owner_pid", log=log)


def _stop_writers(ctl: _shm.ControlBlock) -> None:
    """Refuse puts from every process (attached writers get SERVICE_NOT_AVAILABLE), then wait
    for a put inside the lock to finish by taking the lock once; every CommitLog's lock, in
    a store with several.

    A holder that does not let go (stopped by SIGSTOP or a debugger for STOPPED_HOLDER_WAIT_S,
    or running but stuck for RUNNING_HOLDER_WAIT_S) is killed, so it can never resume and
    write into files its store no longer owns, and the lock is taken over from the dead
    holder; the log names it."""
    ctl.set_running_flag("NOT_WRITEABLE")
    for k in range(ctl.log_count):
        started = time.monotonic()
        while not ctl.try_acquire_put_lock(log=k):
            pid = _lock_holder_pid(ctl, k)
            waited = time.monotonic() - started
            frozen = pid > 0 and stopped(pid)
            if pid > 0 and pid != os.getpid() and waited > (STOPPED_HOLDER_WAIT_S if frozen else RUNNING_HOLDER_WAIT_S):
                log.error("the put lock's holder, pid %d, has kept it for %.0f s while %s; killing it to break the lock",
                          pid, waited, "stopped (SIGSTOP or a debugger)" if frozen else "not letting go")
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                started = time.monotonic()
            time.sleep(0.002)
        ctl.release_put_lock(log=k)


def fence_control_block(path: str) -> None:
    """Before a new owner replaces the control block: processes still attached to the old one
    (writers of a previous owner that died) must stop writing into the files the new owner
    recovers. The old block is marked not writable and closed; a put in flight finishes first."""
    if not os.path.exists(path):
        return
    try:
        old = _shm.ControlBlock.attach(path)
    except (OSError, ValueError):
        return
    try:
        _stop_writers(old)
        old.mark_closed()
    finally:
        old.close()


class StoreBase:
    """What every open store offers, whoever owns it: puts through the compiled put path, the
    reads of spec §11, long polling, positions and counters. ``MessageStore`` (this process
    owns the store) and ``AttachedStore`` (another process does) open the parts and decide how
    reads catch up with what other processes build (``self.follower``, mqstore.queue.follow); nothing
    here depends on which of them this is.
    """

    root: str
    config: StoreConfig
    ctl: _shm.ControlBlock
    commitlog: CommitLog
    consume_queues: ConsumeQueueTable
    index: IndexService | None
    dispatcher: Dispatcher
    reader: MessageReader
    pool: _shm.TransientStorePool | None
    #: with the transient store pool: every CommitLog's own pool, by log id (``pool`` is log 0's)
    pools: list[_shm.TransientStorePool]
    cleaner: CleanService | None
    follower: NotFollowing
    _closed: bool
    #: every CommitLog, by log id (one unless commit_log_count > 1), their dispatchers, and the
    #: router that sends each put to its queue's log (None with one CommitLog)
    commitlogs: list[CommitLog]
    dispatchers: list[Dispatcher]
    _router: LogRouter | None = None

    @property
    def attached(self) -> bool:
        """True when another process owns the store (AttachedStore), False for its owner."""
        raise NotImplementedError

    def flush(self) -> bool:
        """Flush everything written so far; see MessageStore.flush and AttachedStore.flush."""
        raise NotImplementedError

    def shutdown(self) -> None:
        """Close the store in this process; see MessageStore.shutdown and AttachedStore.shutdown."""
        raise NotImplementedError

    def close(self) -> None:
        """The same as shutdown(): "close" for contextlib.closing and Python habit."""
        self.shutdown()

    def commit(self, timeout_ms: float = 5000) -> bool:
        """With the transient store pool: have everything written so far committed to the
        CommitLog files (readable, flushable) by the commit service of the process that runs
        it, woken here; waits up to timeout_ms. True when the committed position reached the
        write position read first (at once without the pool), in every CommitLog."""
        self._check_open()
        if self.pool is None:
            return True
        logs = range(len(self.commitlogs))
        targets = [self.ctl.get("wrote", log=k) for k in logs]
        for k in logs:
            # the request makes the log's commit service commit whatever the least-pages setting says
            self.ctl.advance("flush_request_upto", targets[k], log=k)
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            behind = [k for k in logs if self.ctl.get("committed", log=k) < targets[k]]
            if not behind or time.monotonic() >= deadline:
                return not behind
            for k in behind:
                self.ctl.notify("commit", log=k)
            time.sleep(0.001)

    # -- puts ----------------------------------------------------------------------------
    def put_message(self, msg: Message) -> PutMessageResult:
        """Put one message; the result's status names any failure (spec §9). StoreClosedError
        after shutdown()."""
        return self._putter.put_message(msg)

    def put_messages(self, batch: MessageBatch | Iterable[Message]) -> PutMessageResult:
        """Put a batch of one topic and queue (spec §9.4): a MessageBatch (a client batch
        body) or a list of Messages. StoreClosedError after shutdown()."""
        return self._putter.put_messages(batch)

    def put_bodies(self, topic: str, bodies: Iterable[bytes], queue_id: int = 0, *, tags: str | None = None,
                   properties: dict[str, str] | None = None, flag: int = 0) -> PutMessageResult:
        """Put many bodies of one topic and queue as one batch without building a Message each:
        the same properties (and TAGS=tags) and flag on every record; otherwise put_messages."""
        return self._putter.put_bodies(topic, bodies, queue_id, tags=tags, properties=properties, flag=flag)

    def put(self, topic: str, body: bytes = b"", **fields: Any) -> PutMessageResult:
        """Convenience: build a Message from keyword fields and put it."""
        return self._putter.put_message(Message(topic, body, **fields))

    def _bind_puts(self) -> None:
        """The hot path: put_message, put_messages and put_bodies go straight to the compiled
        appender (or, with several CommitLogs, the router over every log's), without a Python
        frame of this class in between (the methods above document the API)."""
        if len(self.commitlogs) > 1:
            self._router = LogRouter([cl.appender for cl in self.commitlogs])
        putter = self._putter
        self.put_message = putter.put_message  # type: ignore[method-assign]
        self.put_messages = putter.put_messages  # type: ignore[method-assign]
        self.put_bodies = putter.put_bodies  # type: ignore[method-assign]

    @property
    def _putter(self) -> CommitLogAppender | LogRouter:
        """The put path: the CommitLog's appender, or the router over every log's."""
        return self.commitlog.appender if self._router is None else self._router

    # -- state ---------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        """True once shutdown() ran (every other method then raises StoreClosedError)."""
        return self._closed

    @property
    def max_phy_offset(self) -> int:
        """Same as get_max_phy_offset(), as a property."""
        return self.get_max_phy_offset()

    @property
    def min_phy_offset(self) -> int:
        """Same as get_min_phy_offset(), as a property."""
        return self.get_min_phy_offset()

    def next_queue_offset(self, topic: str, queue_id: int) -> int:
        """The queue offset the next message of topic/queue_id will get."""
        self._check_open()
        if type(topic) is not str or type(queue_id) is not int:
            check_arguments("next_queue_offset", topic=topic, queue_id=queue_id)
        value = self.ctl.table_get(topic, queue_id)
        return 0 if value is None else value

    def positions(self) -> dict[str, int]:
        """The shared positions: wrote, committed, flushed, dispatched, confirmed, min_phy, ...
        (byte offsets in the CommitLog; docs/node.md)."""
        self._check_open()
        return self.ctl.positions()

    def stats(self) -> dict[str, int]:
        """The control block's counters (puts, bytes, flushes, lock times, ...) and positions:
        what ``mqstore stats`` shows, as numbers."""
        self._check_open()
        return {**self.ctl.stats(), **self.ctl.positions()}

    def _follow(self, follower: NotFollowing) -> None:
        """Reads in this process follow what other processes build, through `follower`."""
        self.follower = follower
        self.reader.follow_with(follower)

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"store {self.root} is shut down")

    # -- reads (spec §11) --------------------------------------------------------------------
    def get_message(self, group: str, topic: str, queue_id: int, offset: int, max_msg_nums: int = 32,
                    tags: str | Iterable[str] | None = None) -> GetMessageResult:
        """Up to max_msg_nums messages of a queue from offset, filtered by a tags expression
        ("*", "TagA", "TagA || TagB", or a list of tags); the status and next_begin_offset
        follow spec §11.

        With check_crc_on_read every message returned has passed its body CRC check: the
        messages before a damaged one are returned as usual (the batch ends before it); when
        the damaged one comes first, the status is MESSAGE_CORRUPTED, the result (a
        mqstore.queue.reads.CorruptedMessageResult) holds no message, its ``detail`` names the
        physical and queue offsets, and next_begin_offset stays at the damaged message."""
        return self._get(group, topic, queue_id, offset, max_msg_nums, tags, capped=True)

    def read_messages(self, topic: str, queue_id: int, offset: int, max_msg_nums: int = 1024,
                      tags: str | Iterable[str] | None = None) -> GetMessageResult:
        """get_message for a reader in this process: up to max_msg_nums messages in one call,
        not held to the transfer caps RocketMQ sets for a network pull (32 messages, 256 KiB
        from memory); statuses, tags filter and the body CRC check as get_message.
        ``result.bodies()`` gives the bodies as bytes in one call."""
        return self._get("", topic, queue_id, offset, max_msg_nums, tags, capped=False)

    def _get(self, group: str, topic: str, queue_id: int, offset: int, max_msg_nums: int,
             tags: str | Iterable[str] | None, *, capped: bool) -> GetMessageResult:
        """get_message (capped) or read_messages (not capped)."""
        self._check_open()
        self.follower.queue(topic, queue_id)
        reader = self.reader
        try:
            result = reader.get_message(group, topic, queue_id, offset, max_msg_nums, tags, capped)  # type: ignore[arg-type]
        except (TypeError, OverflowError) as exc:
            if tags is None or isinstance(tags, str):
                named = dict(group=group) if capped else {}
                raise argument_error("get_message" if capped else "read_messages", exc, **named, topic=topic,
                                     queue_id=queue_id, offset=offset, max_msg_nums=max_msg_nums, tags=tags) from None
            tags = tags_expression(tags)
            result = reader.get_message(group, topic, queue_id, offset, max_msg_nums, tags, capped)
        if reader.check_crc_on_read:
            return reader.verified(result, group, topic, queue_id, offset, max_msg_nums, tags, capped)  # type: ignore[arg-type]
        return result

    def look_message_by_offset(self, phy_offset: int) -> MessageView | None:
        """The message whose record starts at phy_offset in the CommitLog, or None (spec §11
        lookMessageByOffset). With check_crc_on_read, CorruptRecordError naming phy_offset
        when the record's body fails its CRC (or its header does not parse)."""
        self._check_open()
        try:  # the reader calls the follower when the file is not mapped yet (follow_with)
            return self.reader.look_message_by_offset(phy_offset)
        except (TypeError, OverflowError) as exc:
            raise argument_error("look_message_by_offset", exc, phy_offset=phy_offset) from None

    def look_message_by_queue_offset(self, topic: str, queue_id: int, queue_offset: int) -> MessageView | None:
        """The message at a queue offset (through its ConsumeQueue unit), or None. With
        check_crc_on_read, CorruptRecordError naming the physical offset when the record's
        body fails its CRC (or its header does not parse)."""
        if self._closed:  # _check_open() inline: this is the per-message look-up
            self._check_open()
        if type(queue_offset) is not int:
            check_arguments("look_message_by_queue_offset", topic=topic, queue_id=queue_id, queue_offset=queue_offset)
        try:  # the reader calls the follower when what it needs is not there yet (follow_with)
            return self.reader.look_message_by_queue_offset(topic, queue_id, queue_offset)
        except (TypeError, OverflowError) as exc:
            raise argument_error("look_message_by_queue_offset", exc, topic=topic, queue_id=queue_id,
                                 queue_offset=queue_offset) from None

    def get_message_store_timestamp(self, topic: str, queue_id: int, queue_offset: int) -> int:
        """The store timestamp (ms) of the message at a queue offset, or -1 (spec §11)."""
        self._check_open()
        self.follower.queue(topic, queue_id)
        try:
            return self.reader.get_message_store_timestamp(topic, queue_id, queue_offset)
        except (TypeError, OverflowError) as exc:
            raise argument_error("get_message_store_timestamp", exc, topic=topic, queue_id=queue_id,
                                 queue_offset=queue_offset) from None

    def get_offset_in_queue_by_time(self, topic: str, queue_id: int, timestamp: int) -> int:
        """The queue offset of the first message stored at or after timestamp (ms since the
        epoch), RocketMQ's getOffsetInQueueByTime (spec §3)."""
        self._check_open()
        self.follower.queue(topic, queue_id)
        try:
            return self.reader.get_offset_in_queue_by_time(topic, queue_id, timestamp)
        except (TypeError, OverflowError) as exc:
            raise argument_error("get_offset_in_queue_by_time", exc, topic=topic, queue_id=queue_id,
                                 timestamp=timestamp) from None

    def offset_in_queue_by_time(self, topic: str, queue_id: int, timestamp: int,
                                warm_bytes: int | None = None) -> TimeLookup:
        """get_offset_in_queue_by_time with the pages and probes the search touched."""
        self._check_open()
        self.follower.queue(topic, queue_id)
        try:
            return self.reader.offset_in_queue_by_time(topic, queue_id, timestamp, warm_bytes)
        except (TypeError, OverflowError) as exc:
            raise argument_error("offset_in_queue_by_time", exc, topic=topic, queue_id=queue_id,
                                 timestamp=timestamp) from None

    def get_max_offset_in_queue(self, topic: str, queue_id: int) -> int:
        """The queue offset after the queue's last message (0 for a queue never put to)."""
        self._check_open()
        if type(topic) is not str or type(queue_id) is not int:
            check_arguments("get_max_offset_in_queue", topic=topic, queue_id=queue_id)
        self.follower.queue(topic, queue_id)
        try:
            return self.reader.get_max_offset_in_queue(topic, queue_id)
        except (TypeError, OverflowError) as exc:
            raise argument_error("get_max_offset_in_queue", exc, topic=topic, queue_id=queue_id) from None

    def get_min_offset_in_queue(self, topic: str, queue_id: int) -> int:
        """The queue offset of the queue's first message still stored (retention moves it)."""
        self._check_open()
        if type(topic) is not str or type(queue_id) is not int:
            check_arguments("get_min_offset_in_queue", topic=topic, queue_id=queue_id)
        self.follower.queue(topic, queue_id)
        try:
            return self.reader.get_min_offset_in_queue(topic, queue_id)
        except (TypeError, OverflowError) as exc:
            raise argument_error("get_min_offset_in_queue", exc, topic=topic, queue_id=queue_id) from None

    def get_max_phy_offset(self, log: int = 0) -> int:
        """The CommitLog position after the last readable byte (RocketMQ getMaxPhyOffset); of
        CommitLog ``log`` of a store with several (an encoded offset, docs/parallel-commitlogs.md)."""
        self._check_open()
        return self._commitlog_of(log).max_offset

    def get_min_phy_offset(self, log: int = 0) -> int:
        """The CommitLog position of the first byte still stored (RocketMQ getMinPhyOffset); of
        CommitLog ``log`` of a store with several."""
        self._check_open()
        self.follower.log()  # a node's owner: the files its other processes created or deleted
        return self._commitlog_of(log).min_offset

    def logs(self) -> list[tuple[int, int, int]]:
        """(log id, min offset, max offset) of every CommitLog (one unless commit_log_count > 1)."""
        self._check_open()
        self.follower.log()
        return [(cl.log_id, cl.min_offset, cl.max_offset) for cl in self.commitlogs]

    def _commitlog_of(self, log: int) -> CommitLog:
        if type(log) is not int or not 0 <= log < len(self.commitlogs):
            raise ValueError(f"log must be a CommitLog id 0 .. {len(self.commitlogs) - 1}, got {log!r}")
        return self.commitlogs[log]

    def get_earliest_message_time(self, topic: str | None = None, queue_id: int = 0) -> int:
        """The store timestamp (ms) of the oldest message still stored: of the whole store, or
        of one queue when topic is given; -1 when there is none."""
        self._check_open()
        if (topic is not None and type(topic) is not str) or type(queue_id) is not int:
            check_arguments("get_earliest_message_time", topic=topic if topic is not None else "", queue_id=queue_id)
        return self.reader.get_earliest_message_time(topic, queue_id)

    def query_message(self, topic: str, key: str, max_num: int | None = None, begin: int = 0,
                      end: int = 2**63 - 1) -> QueryMessageResult:
        """Messages whose KEYS or UNIQ_KEY is key (spec §4.4), each checked against its key;
        at most max_num (default: the default_query_max_num setting), stored between begin
        and end (ms since the epoch). A damaged record (its body CRC fails, with
        check_crc_on_read, or its topic or properties do not decode) is skipped with an error
        logged, and its physical offset listed in the result's ``corrupt_offsets``."""
        self._check_open()
        if max_num is None:
            max_num = self.config.default_query_max_num
        if type(topic) is not str or type(key) is not str or type(max_num) is not int:
            check_arguments("query_message", topic=topic, key=key, max_num=max_num, begin=begin, end=end)
        self.follower.index()
        try:
            return self.reader.query_message(topic, key, max_num, begin, end)
        except (TypeError, OverflowError) as exc:
            raise argument_error("query_message", exc, topic=topic, key=key, max_num=max_num, begin=begin,
                                 end=end) from None

    def execute_delete_files_manually(self) -> None:
        """RocketMQ executeDeleteFilesManually: the next 20 cleaning runs delete expired files
        whatever the hour, the first one now. In a node or an attached process the request
        goes to the cleaner process through the control block."""
        self._check_open()
        if self.cleaner is not None:
            self.cleaner.execute_delete_files_manually()
        else:
            self.ctl.advance("manual_delete_request", time.time_ns() // 1_000_000)
            self.ctl.notify("clean")

    # -- dispatch ------------------------------------------------------------------------
    @property
    def dispatch_behind_bytes(self) -> int:
        """CommitLog bytes written but not yet dispatched into the ConsumeQueues."""
        self._check_open()
        return sum(d.behind() for d in self.dispatchers)

    @property
    def dispatch_lag_ms(self) -> int:
        """How old the oldest written-but-not-dispatched message is, in ms (0 when none)."""
        self._check_open()
        return max(d.lag_ms() for d in self.dispatchers)

    def wait_for_messages(self, topic: str, queue_id: int, offset: int, timeout_ms: float | None = None) -> bool:
        """Long polling for a reader in any process (spec §12): block until the queue has a
        message at ``offset`` or later (its max offset passed offset), or timeout_ms passes;
        True when there is one.

        With ``long_polling_enable`` the reader sleeps in a futex wait on the queue's slot of
        the control block, and the dispatcher (a thread, or the node's dispatcher process)
        wakes it when it publishes a unit of that queue: RocketMQ's notifyMessageArriving per
        queue, and only queues somebody waits for cost the dispatcher a wake-up. With it off
        (short polling) nothing is registered: the reader waits on the "dispatched" channel,
        which the dispatcher broadcasts only when it has caught up. Default timeout: 15 s (a
        push consumer's suspend time) with long polling, ``short_polling_time_mills`` without."""
        self._check_open()
        check_arguments("wait_for_messages", topic=topic, queue_id=queue_id, offset=offset)
        long_polling = self.config.long_polling_enable
        if timeout_ms is None:
            timeout_ms = LONG_POLLING_SUSPEND_MS if long_polling else self.config.short_polling_time_mills
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            seen = self.ctl.channel_seq("dispatched")  # before the check: no wake-up is missed
            if self.get_max_offset_in_queue(topic, queue_id) > offset:
                return True
            left_ms = (deadline - time.monotonic()) * 1000
            if left_ms <= 0:
                return False
            units = self.ctl.wait_queue_units(topic, queue_id, offset, left_ms) if long_polling else None
            if units is None:
                # short polling, or a queue nobody has put to yet (no slot to wait on)
                self.ctl.wait_seq_change("dispatched", seen, left_ms if not long_polling else min(left_ms, 50))

    def wait_dispatched(self, offset: int | None = None, timeout_ms: float = 5000) -> bool:
        """Wait until everything written (or up to offset) is dispatched; True when it is."""
        self._check_open()
        if offset is not None:
            log_id = log_of(offset)
            return self.ctl.wait_position("dispatched", offset, "dispatched", timeout_ms,
                                          log=log_id if log_id < len(self.commitlogs) else 0)
        deadline = time.monotonic() + timeout_ms / 1000
        for cl in self.commitlogs:  # every log, each to what was written when it is looked at
            left_ms = max(0.0, (deadline - time.monotonic()) * 1000)
            if not self.ctl.wait_position("dispatched", self.ctl.get("committed", log=cl.log_id), "dispatched",
                                          left_ms, log=cl.log_id):
                return False
        return True

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()



class MessageStore(StoreBase):
    """A store directory opened for writing by this process.

    >>> with MessageStore("/tmp/store", mapped_file_size_commit_log=1 << 20) as store:  # doctest: +SKIP
    ...     store.put("TopicTest", b"hello").check()
    """

    def __init__(self, root: str | os.PathLike[str], config: StoreConfig | None = None, **overrides: Any) -> None:
        self.root = os.path.abspath(os.fspath(root))
        cfg = config if config is not None else StoreConfig()
        if overrides:
            cfg = cfg.replace(**overrides)
        check_root_dir(self.root, cfg)
        self.config = adopt_store_sizes(self.root, adopt_commit_log_path(self.root, cfg)).validate()
        self._closed = True
        self._lock_fd = -1
        self.pool: _shm.TransientStorePool | None = None
        self.pools: list[_shm.TransientStorePool] = []
        self._services: list[ServiceThread] = []
        self.follower: NotFollowing = NOT_FOLLOWING  # a node's owner follows its service processes
        self.supervisor: Supervisor | None = None
        self.cleaner: CleanService | None = None
        #: the replication service of a threads-mode store: HAService (a master serving slaves)
        #: or HAClient (a slave); None when it does not replicate, and in a node (a process does)
        self.ha: Any = None
        self.abort_path = abort_path(self.root)
        self._abort_created = False
        check_store_dir(self.root)
        if os.path.isdir(commit_dir := self.config.commit_log_dir(self.root)):
            # a file name no store of this code writes (the fence of a store with several
            # CommitLogs, docs/parallel-commitlogs.md, opened as a store with one) refuses the
            # store before anything in it changes: the lock file, the clean-close record, the
            # control block
            mapped_file_names(commit_dir, fenced=self.config.commit_log_count > 1)
        os.makedirs(self.root, exist_ok=True)
        self._take_lock()
        try:
            self._open()
        except BaseException:
            self._abandon_open()
            raise
        self._closed = False

    def _abandon_open(self) -> None:
        """The open failed or was interrupted (KeyboardInterrupt, a service process that did
        not start). Once the store was open enough to create ``abort``, it is shut down the
        normal way (services that started are stopped, everything flushed, the checkpoint
        written, ``abort`` removed), so an interrupted start leaves what a clean stop leaves
        and the next open recovers nothing; before that, only the lock is released."""
        if self._abort_created:
            self._closed = False
            try:
                self.shutdown()
            except BaseException as exc:  # noqa: BLE001 - the original error is what the caller sees
                log.error("shutting down the store whose open failed: %r", exc)
        self._closed = True
        self._release_lock()

    @classmethod
    def open(cls, root: str | os.PathLike[str], config: StoreConfig | None = None, **overrides: Any) -> StoreBase:
        """Open root as its owner, or, when another running process owns it (a node, or any
        process that opened it with MessageStore(...)), attach to it: puts and reads go
        through the shared control block and the mapped files, with the owner's
        configuration, and no services are started here (see AttachedStore)."""
        try:
            return cls(root, config, **overrides)
        except StoreLockedError:
            return AttachedStore(root, config, **overrides)

    @classmethod
    def attach(cls, root: str | os.PathLike[str], config: StoreConfig | None = None,
               **overrides: Any) -> AttachedStore:
        """Attach to the store another running process owns, never becoming its owner: a
        producer or consumer process of a node. Waits up to a minute for an owner that is
        still opening it; NotAStoreError when no owner ever published a control block,
        StoreClosedError when the owner shut it down."""
        return AttachedStore(root, config, **overrides)

    # -- opening -------------------------------------------------------------------------
    def _take_lock(self) -> None:
        self._lock_fd = take_store_lock(self.root)

    def _release_lock(self) -> None:
        if self._lock_fd >= 0:
            release_store_lock(self._lock_fd)
            self._lock_fd = -1

    def _open(self) -> None:
        cfg = self.config
        self.last_exit_ok = not os.path.exists(self.abort_path)
        if cfg.commit_log_count > 1:
            clean_logs, why = clean_close_record.read_logs(self.root, cfg.commit_log_count)
            clean_close = None
        else:
            clean_close, why = clean_close_record.read(self.root)
            clean_logs = {0: clean_close} if clean_close is not None else {}
        if why:
            log.warning("recovery: %s; scanning the last files", why)
        clean_close_record.remove(self.root)  # it describes the files only until they change
        ctl_path = os.path.join(self.root, CONTROL_BLOCK_NAME)
        fence_control_block(ctl_path)
        # bytes a dead owner's writers appended to its transient store pool go into the files
        # before they are recovered
        self.pool_replayed_bytes = transient_pool.replay(self.root, ctl_path, cfg)
        if cfg.commit_log_count > 1:
            _write_fence(cfg.commit_log_dir(self.root), cfg.commit_log_count)
        self.ctl = _shm.ControlBlock.create(
            ctl_path,
            table_slots=cfg.topic_queue_table_slots,
            file_size=cfg.mapped_file_size_commit_log,
            lock_kind=cfg.put_lock_kind,
            sync_flush=cfg.is_sync_flush,
            pool_buffers=cfg.transient_store_pool_size if cfg.transient_store_pool_enable else 0,
            log_count=cfg.commit_log_count,
        )
        if self.ctl.reused:
            log.warning("%s: no room for a new control block (the disk is full): the old one was laid out "
                        "again in place", self.root)
        # a pool per CommitLog, each on its own committed position and commit service
        self.pools = transient_pool.create_pools(self.root, self.ctl, cfg) if cfg.transient_store_pool_enable else []
        self.pool = self.pools[0] if self.pools else None
        self._parts = parts = open_parts(self.root, cfg, self.ctl, "owner", pool=self.pools, clean=self.last_exit_ok)
        assert parts.checkpoint is not None and parts.commitlog is not None and parts.consume_queues is not None
        self.checkpoint, self.commitlog = parts.checkpoint, parts.commitlog
        self.consume_queues, self.index = parts.consume_queues, parts.index
        self.commitlogs = parts.commitlogs
        several = len(self.commitlogs) > 1
        #: each log's recovery report (``recovery`` is log 0's), each log trusting its own entry
        #: of the clean-close record when it agrees with its files
        self.recoveries: list[RecoveryReport]
        def recover(k: int) -> RecoveryReport:
            return recover_store(
                self.commitlogs[k].queue, self.ctl, self.consume_queues, parts.checkpoints[k],
                check_crc=cfg.check_crc_on_recover, clean_shutdown=self.last_exit_ok,
                index_safe=cfg.message_index_enable and cfg.message_index_safe, index=parts.indexes[k],
                clean_close=clean_logs.get(k) if self.last_exit_ok else None, log_id=k)

        threads = min(len(self.commitlogs), cfg.commit_log_recovery_threads or os.cpu_count() or 1)
        if threads > 1:  # the logs' scans let go of the GIL: each log in a thread of its own
            with ThreadPoolExecutor(threads, thread_name_prefix="mqstore-recover") as pool:
                self.recoveries = list(pool.map(recover, range(len(self.commitlogs))))
        else:
            self.recoveries = [recover(k) for k in range(len(self.commitlogs))]
        self.recovery: RecoveryReport = self.recoveries[0]
        for cl in self.commitlogs:
            cl.prepare_for_writes()
        self.consume_queues.publish_to(self.ctl)  # readers in other processes follow the queues
        parts.dispatchers = self.dispatchers = [
            Dispatcher.from_config(cl, self.consume_queues, parts.indexes[k], self.ctl, cfg)
            for k, cl in enumerate(self.commitlogs)]
        self.dispatcher = self.dispatchers[0]
        for dispatcher, report in zip(self.dispatchers, self.recoveries):
            self._start_up_dispatch(dispatcher, report)
        self.reader = MessageReader(self.commitlogs if several else self.commitlog, self.consume_queues,
                                    parts.indexes if several else self.index, cfg)
        self.ctl.mark_ready()
        with open(self.abort_path, "wb"):
            pass
        self._abort_created = True
        self._bind_puts()
        self._truncate_as_requested()  # a slave's truncation its HA client asked for before it stopped
        self._start_services()

    def _start_up_dispatch(self, dispatcher: Dispatcher, report: RecoveryReport) -> None:
        """spec §5.2 step 4: dispatch a log until nothing is behind before serving."""
        dispatcher.reset(report.dispatch_from)
        name = "start-up dispatch" if dispatcher.log_id == 0 else f"start-up dispatch of CommitLog {dispatcher.log_id}"
        logged = LogProgress(logging.getLogger("mqstore.recovery"), name)
        try:
            report.redispatched_records = dispatcher.dispatch_available(raise_table=True, progress=logged)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            # a full disk must not keep the store from opening (its cleaner frees space): the
            # reput service retries, and WRITE_LOGICS_QUEUE_ERROR refuses puts until it gets through
            log.error("start-up dispatch stopped at offset %d: %s; the store opens with "
                      "WRITE_LOGICS_QUEUE_ERROR and dispatch resumes when there is room",
                      dispatcher.dispatched, exc)
            self.ctl.add_stat("dispatch_errors")
            self.ctl.set_log_running_flag("WRITE_LOGICS_QUEUE_ERROR", dispatcher.log_id)
        logged.finish(f"{report.redispatched_records:,} records")
        log_report(report)

    def _start_services(self) -> None:
        cfg = self.config
        write_config(self.root, cfg)
        if cfg.service_mode == "processes":
            self._start_service_processes()
            return
        # the services are built over the parts open_parts mapped, with what the open added
        self._parts.dispatcher, self._parts.truncate = self.dispatcher, self._truncate_live
        self.ha = None
        self._ha_services: list[ServiceThread] = []
        self._build_services(service_kinds(cfg))

    def _build_services(self, kinds: tuple[str, ...]) -> None:
        """Build and start the service threads of ``kinds`` (all of them at open; all but the HA
        client after a slave's truncation, which runs in the HA client's thread)."""
        built = {kind: build_services(kind, self._parts, own_process=False) for kind in kinds}
        for cl, allocator in zip(self.commitlogs, built["allocator"], strict=True):
            cl.allocator = allocator  # type: ignore[assignment]
        #: the reput services (one, or one per log with dispatch_logs_in_parallel); ``reput``
        #: is the first (log 0's)
        self.reputs = [s for s in built["dispatcher"] if isinstance(s, ReputMessageService)]
        self.cq_flusher, self.reput = built["dispatcher"][0], self.reputs[0]
        self.cleaner = built["cleaner"][0]  # type: ignore[assignment]
        # shutdown runs in reverse: the cleaner stops, dispatch catches up, then queues and the
        # log are flushed (the pool's commit service before the flusher, whose final flush
        # covers what the last commit moved)
        services = [service for kind in kinds for service in built[kind]]
        if built.get("ha"):
            # HAService (master) or HAClient (slave; one per CommitLog of a store with several)
            self._ha_services = built["ha"]
            self.ha = self._ha_services[0]
        self._services = services if "ha" in kinds else services + self._ha_services
        for service in services:
            service.start()

    def _truncate_live(self) -> None:
        """A slave's HA client (a thread of this store) asks for its log to be cut back to its
        master's end: stop the other services (dispatch catches up, flushes finish), truncate,
        start them again."""
        for service in reversed(self._services):
            if service not in self._ha_services:
                service.shutdown()
        try:
            self._truncate_as_requested()
        finally:
            self._build_services(tuple(k for k in service_kinds(self.config) if k != "ha"))

    def _on_service_exit(self, kind: str, code: int) -> None:
        """The supervisor saw a service process exit: a slave's HA process asking for a
        truncation gets it with every other service process stopped."""
        if kind == "ha" and code == TRUNCATE_EXIT and self.supervisor is not None:
            self.supervisor.restart_around(self._truncate_as_requested)

    def _truncate_as_requested(self) -> None:
        """Carry out a slave's pending truncation request (mqstore.ha.request_truncation) while
        nothing appends or dispatches: at open, or with the services stopped."""
        req = read_truncation_request(self.root)
        if req is None:
            return
        if self.config.broker_role is not BrokerRole.SLAVE:
            log.error("ignoring %s: only a slave truncates its log to its master's", TRUNCATE_FILE)
            os.unlink(os.path.join(self.root, TRUNCATE_FILE))
            return
        if isinstance(self.follower, Follower):  # a node: bring this process's queues up to the dispatcher's
            for topic, qid, _ in self.ctl.table_items():
                self.follower.queue(topic, qid)
            self.follower.index()
        k = log_of(req["offset"])  # the CommitLog the request names (several: only that one is cut)
        if not 0 <= k < len(self.commitlogs):
            log.error("ignoring %s: it names CommitLog %d, and the store has %d", TRUNCATE_FILE, k,
                      len(self.commitlogs))
            os.unlink(os.path.join(self.root, TRUNCATE_FILE))
            return
        done = truncate_store(req["offset"], self.commitlogs[k].queue, self.ctl, self.consume_queues,
                              self._parts.indexes[k])
        self.dispatchers[k].reset(self.ctl.get("dispatched", log=k))
        record_truncation(self.root, {**done.as_dict(), "master": req.get("master", ""),
                                      "time_ms": time.time_ns() // 1_000_000})
        log.warning("slave truncated to its master's end (%s): %s", req.get("master", ""), done.summary())

    def _start_service_processes(self) -> None:
        """The node: allocate, flush and dispatch (with the ConsumeQueue flush) run as supervised
        processes (mqstore.node); this process keeps writing and reading, following the
        queues the dispatcher process builds."""
        cfg = self.config
        for cl in self.commitlogs:
            cl.allocator = AllocateClient(self.ctl, cl.queue, wait_timeout_ms=cfg.allocate_wait_timeout_ms)
        self.consume_queues.flush()
        indexes = self._parts.indexes
        for index in indexes:
            if index is not None:
                index.flush()
        self._follow(Follower(self.commitlogs, self.consume_queues, self.ctl, indexes))
        self.supervisor = Supervisor(self.root, service_processes(cfg))
        self.supervisor.on_exit = self._on_service_exit
        try:
            self.supervisor.start()
        except BaseException:
            self.supervisor.stop()
            raise

    @property
    def attached(self) -> bool:
        """False: this process owns the store (an AttachedStore, opened by MessageStore.open
        while another process owns it, says True)."""
        return False

    def flush(self) -> bool:
        """Flush everything written so far (with the transient store pool: committed first);
        raises OSError if the disk refuses."""
        self._check_open()
        if self.pool is not None:
            self.commit()
        return all([cl.flush(0) for cl in self.commitlogs])

    def commit(self, timeout_ms: float = 5000) -> bool:
        """With the transient store pool: have everything written so far committed to the
        CommitLog files (readable, flushable). In threads mode this process commits; in a
        node the flusher process is the only committer, so this wakes it and waits up to
        timeout_ms (an attached process too). True when the committed position reached the
        write position read first."""
        if self.supervisor is not None or self.pool is None:
            return super().commit(timeout_ms)
        self._check_open()
        done = True
        for cl in self.commitlogs:  # this process runs each log's commit service
            target = self.ctl.get("wrote", log=cl.log_id)
            cl.commit(0)
            done = done and self.ctl.get("committed", log=cl.log_id) >= target
        return done

    # -- closing -------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Stop puts, stop services (dispatch catches up, final flushes), write the checkpoint,
        and remove `abort` only when everything was flushed and dispatched (spec §5.2)."""
        if self._closed:
            return
        self._closed = True
        for cl in self.commitlogs:
            cl.appender.closed = True
        _stop_writers(self.ctl)
        if self.pool is not None:
            # no writer can append any more: commit everything here (the commit service of
            # the flusher process may be copying the same bytes: the same bytes to the same place)
            for cl in self.commitlogs:
                try:
                    cl.commit(0)
                except OSError as exc:
                    log.error("final commit of CommitLog %d from the transient store pool failed: %s", cl.log_id, exc)
        for service in reversed(self._services):
            service.shutdown()
        errors: list[Any] = [s.error for s in self._services if s.error is not None]
        if self.supervisor is not None:
            codes = self.supervisor.stop()
            errors += [f"the {kind} process exited with {code}" for kind, code in codes.items() if code != 0]
        logs = [cl.log_id for cl in self.commitlogs]
        flushed_all = all(self.ctl.get("flushed", log=k) >= self.ctl.get("wrote", log=k) for k in logs)
        behind = sum(d.behind() for d in self.dispatchers)
        # what the clean-close record needs, read while the control block and files are open:
        # each log's end (a log whose tail cannot be read is left out: the next open scans it)
        closing: dict[int, CleanClose] = {}
        for cl in self.commitlogs:
            wrote = self.ctl.get("wrote", log=cl.log_id)
            crc = clean_close_record.tail_crc(cl.queue, wrote)
            if crc is not None:
                closing[cl.log_id] = CleanClose(wrote, crc, self.ctl.get("last_store_timestamp", log=cl.log_id))
        table = [(t, q, n) for t, q, n in self.ctl.table_items() if n > 0]
        for k, checkpoint in zip(logs, self._parts.checkpoints):
            ts = self.ctl.get("flushed_store_timestamp", log=k)
            if ts > 0:
                checkpoint.physic_msg_timestamp = ts
        for index in self._parts.indexes:
            if index is not None:
                index.close()
        self.consume_queues.close()
        for checkpoint in self._parts.checkpoints:
            checkpoint.close()
        self.reader = None  # type: ignore[assignment]
        for cl in self.commitlogs:
            cl.close()
        for pool in self.pools:
            pool.close()
        if self.pools and flushed_all:
            transient_pool.remove_pools(self.root, len(self.pools))  # else the next owner replays them
        self.ctl.mark_closed()
        self.ctl.close()
        if flushed_all and not errors and behind == 0:
            if len(logs) > 1:
                clean_close_record.write_logs(self.root, closing, table)
            elif closing:
                closing[0].table = table
                clean_close_record.write(self.root, closing[0])
            os.unlink(self.abort_path)
        else:
            why = "unflushed data" if not flushed_all else (f"{behind} bytes not dispatched" if behind else errors[0])
            log.warning("leaving %s: the store did not shut down cleanly (%s)", self.abort_path, why)
        self._release_lock()

    close = shutdown  # the same method: "close" for contextlib.closing and Python habit

    def __del__(self) -> None:
        if getattr(self, "_closed", True) is False and self._lock_fd >= 0:
            log.warning("MessageStore(%s) was garbage-collected without shutdown()", self.root)

def _write_fence(commit_dir: str, log_count: int) -> None:
    """The fence of a store with several CommitLogs (layout.FENCE_NAME in log 0's directory):
    an mqstore that reads one CommitLog refuses the store rather than recover log 0 alone and
    cut the other logs' ConsumeQueue units. Written (and made durable) before anything else."""
    path = os.path.join(commit_dir, FENCE_NAME)
    if os.path.exists(path):
        return
    os.makedirs(commit_dir, exist_ok=True)
    replace_file(path, fence_text(log_count), fsync=True)


ATTACH_WAIT_S = 60.0


class AttachedStore(StoreBase):
    """A store that another running process owns (a node, or a process that opened it with
    MessageStore(...)), opened from this process by MessageStore.open.

    Puts go through the same compiled put path and the shared put lock as the owner's;
    a new CommitLog file is asked of the owner's allocator through the control block; with
    SYNC_FLUSH a put waits for the owner's flusher. Reads follow what the owner's dispatcher
    publishes and read zero-copy from this process's mappings. The configuration is the
    owner's (``mqstore.config.json``); nothing is recovered, flushed or dispatched here, and
    shutdown only unmaps. When the owner shuts down, puts return SERVICE_NOT_AVAILABLE."""

    def __init__(self, root: str | os.PathLike[str], config: StoreConfig | None = None, **overrides: Any) -> None:
        self.root = os.path.abspath(os.fspath(root))
        self._closed = True
        self._lock_fd = -1
        self.cleaner = None
        self.ctl = self._attach_control_block()
        self.pool = None
        self.pools = []
        opened: StoreParts | None = None
        try:
            self.config = self._owner_config(config, overrides)
            cfg = self.config
            self.last_exit_ok = True
            self.checkpoint = None  # type: ignore[assignment]
            parts = open_parts(self.root, cfg, self.ctl, "attached")
            opened = parts
            assert parts.commitlog is not None and parts.consume_queues is not None and parts.dispatcher is not None
            self.pool, self.pools, self.commitlog = parts.pool, parts.pools, parts.commitlog
            self.consume_queues, self.index, self.dispatcher = parts.consume_queues, parts.index, parts.dispatcher
            self.commitlogs, self.dispatchers = parts.commitlogs, parts.dispatchers
            self._indexes = parts.indexes
            several = len(self.commitlogs) > 1
            for cl in self.commitlogs:
                cl.allocator = AllocateClient(self.ctl, cl.queue, wait_timeout_ms=cfg.allocate_wait_timeout_ms)
                cl.prepare_for_writes()
            self.reader = MessageReader(self.commitlogs if several else self.commitlog, self.consume_queues,
                                        parts.indexes if several else self.index, cfg)
            self._follow(Follower(self.commitlogs, self.consume_queues, self.ctl, parts.indexes))
        except BaseException:
            if opened is not None:
                opened.close()
            self.ctl.close()
            raise
        self._bind_puts()
        self._closed = False

    def _attach_control_block(self) -> _shm.ControlBlock:
        path = os.path.join(self.root, CONTROL_BLOCK_NAME)
        deadline = time.monotonic() + ATTACH_WAIT_S
        while True:
            try:
                ctl = _shm.ControlBlock.attach(path)
            except (OSError, ValueError) as exc:
                if time.monotonic() > deadline:
                    raise NotAStoreError(f"cannot attach to {self.root}: {exc}") from exc
                time.sleep(0.05)
                continue
            if ctl.state == _shm.STATE_READY and os.path.exists(os.path.join(self.root, CONFIG_NAME)):
                return ctl
            state = ctl.state
            ctl.close()
            if state == _shm.STATE_CLOSED:
                raise StoreClosedError(f"{self.root}: its owner shut it down (or died) while this process attached")
            if time.monotonic() > deadline:
                raise StoreLockedError(f"{self.root}: the owner did not finish opening it within {ATTACH_WAIT_S:.0f} s")
            time.sleep(0.05)  # the owner is recovering

    def _owner_config(self, config: StoreConfig | None, overrides: dict[str, Any]) -> StoreConfig:
        owner = read_config(self.root)
        asked = (config if config is not None else StoreConfig()).replace(**overrides) if overrides else config
        if asked is not None:
            # every setting the caller chose, even one equal to its default, must be the owner's
            mine, theirs = asked.to_dict(), owner.to_dict()
            differ = sorted(k for k in asked.explicit_keys if mine[k] != theirs[k])
            if differ:
                raise ConfigError(f"{self.root} is owned by pid {self.ctl.owner_pid}, whose configuration differs in "
                                  f"{', '.join(differ)}; an attached store uses the owner's configuration",
                                  hint="open it without those settings")
        return owner

    @property
    def attached(self) -> bool:
        """True: another process owns this store (MessageStore.attached is False)."""
        return True

    def flush(self) -> bool:
        self._check_open()
        return False  # the owner's flusher flushes; sync puts wait for it

    def shutdown(self) -> None:
        """Unmap; the owner keeps running (nothing is flushed or checkpointed here)."""
        if self._closed:
            return
        self._closed = True
        for cl in self.commitlogs:
            cl.appender.closed = True
        self.reader = None  # type: ignore[assignment]
        for index in self._indexes:
            if index is not None:
                index.close()
        self.consume_queues.close()
        for cl in self.commitlogs:
            cl.close()
        for pool in self.pools:
            pool.close()
        self.ctl.close()

    close = shutdown

    def __del__(self) -> None:
        pass
