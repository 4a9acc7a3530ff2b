"""CommitLog flush services (spec §8).

FlushRealTimeService: async flush, timed (sleep flush_interval_commit_log) or real-time
(woken by puts), at least flush_commit_log_least_pages dirty pages, everything every
flush_commit_log_thorough_interval. GroupCommitService: sync flush, a 10 ms cycle woken by
waiting writers, which it wakes through the control block's "flushed" channel.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from mqstore.services.base import ServiceThread

if TYPE_CHECKING:
    from mqstore.log.commitlog import CommitLog

log = logging.getLogger("mqstore.flush")

SHUTDOWN_FLUSH_RETRIES = 10


class _FlushService(ServiceThread):
    channel = "flush"

    def __init__(self, name: str, commitlog: CommitLog) -> None:
        # one flush service per CommitLog, each woken on its log's FLUSH channel
        super().__init__(name if commitlog.log_id == 0 else f"{name}-{commitlog.log_id}", commitlog.ctl)
        self.commitlog = commitlog
        self.channel_log = commitlog.log_id

    def _flush(self, least_pages: int) -> None:
        try:
            self.commitlog.flush(least_pages)
        except OSError as exc:
            # recorded in the control block by CommitLog.flush; waiters see FLUSH_DISK_TIMEOUT
            log.error("CommitLog flush failed: %s", exc)

    def on_shutdown(self) -> None:
        for _ in range(SHUTDOWN_FLUSH_RETRIES):
            try:
                if not self.commitlog.flush(0):
                    break
            except OSError as exc:
                log.error("final CommitLog flush failed: %s", exc)
                break


class FlushRealTimeService(_FlushService):
    """spec §8.1."""

    def __init__(self, commitlog: CommitLog) -> None:
        super().__init__("flush-commitlog", commitlog)
        cfg = commitlog.config
        self.timed = cfg.flush_commit_log_timed
        self.interval_ms = cfg.flush_interval_commit_log
        self.least_pages = cfg.flush_commit_log_least_pages
        self.thorough_ms = cfg.flush_commit_log_thorough_interval
        self._last_full_ms = 0.0

    def run_once(self) -> None:
        least = self.least_pages
        now = time.monotonic() * 1000
        if now >= self._last_full_ms + self.thorough_ms:
            self._last_full_ms = now
            least = 0
        if self.timed:
            self.sleep(self.interval_ms)
        else:
            self.wait_for_running(self.interval_ms)
        self._flush(least)


class GroupCommitService(_FlushService):
    """spec §8.2: waiting writers raise flush_request_upto and notify; every cycle flushes
    everything written (a flush may span the tail of one file and the head of the next)."""

    def __init__(self, commitlog: CommitLog) -> None:
        super().__init__("group-commit", commitlog)
        self.interval_ms = commitlog.config.group_commit_interval_ms

    def run_once(self) -> None:
        self.wait_for_running(self.interval_ms)
        self._flush(0)


class CommitRealTimeService(ServiceThread):
    """spec §7: with the transient store pool, copy what writers appended to the pool's buffers
    into the CommitLog files every commit_interval_commit_log ms (woken earlier by each put),
    once commit_commit_log_least_pages pages are pending, everything at least every
    commit_commit_log_thorough_interval ms; after a commit that moved, wake the flush service.
    Shutdown commits everything (up to 10 tries, as RocketMQ)."""

    channel = "commit"

    def __init__(self, commitlog: CommitLog) -> None:
        super().__init__("commit-commitlog", commitlog.ctl)
        self.commitlog = commitlog
        self.channel_log = commitlog.log_id
        cfg = commitlog.config
        self.interval_ms = cfg.commit_interval_commit_log
        self.least_pages = cfg.commit_commit_log_least_pages
        self.thorough_ms = cfg.commit_commit_log_thorough_interval
        self._last_commit_ms = 0.0

    def run_once(self) -> None:
        least = self.least_pages
        now = time.monotonic() * 1000
        if now >= self._last_commit_ms + self.thorough_ms:
            self._last_commit_ms = now
            least = 0
        elif self.ctl.get("flush_request_upto", log=self.channel_log) > self.ctl.get("committed", log=self.channel_log):
            least = 0  # MessageStore.commit/flush asked (with the pool the flush is async only)
        if self._commit(least):
            self._last_commit_ms = time.monotonic() * 1000
            self.ctl.notify("flush", log=self.channel_log)
        self.wait_for_running(self.interval_ms)

    def _commit(self, least_pages: int) -> bool:
        try:
            return self.commitlog.commit(least_pages)
        except OSError as exc:
            log.error("CommitLog commit from the transient store pool failed: %s", exc)
            self.sleep(self.interval_ms)
            return False

    def on_shutdown(self) -> None:
        for _ in range(SHUTDOWN_FLUSH_RETRIES):
            if not self._commit(0):
                break


class FlushConsumeQueueService(ServiceThread):
    """spec §3 last bullet: flush the ConsumeQueues every flush_interval_consume_queue ms
    when at least flush_consume_queue_least_pages pages are dirty, everything every
    flush_consume_queue_thorough_interval ms; then the checkpoint.

    Stricter than RocketMQ: checkpoint.logicsMsgTimestamp is the store time of the newest
    record dispatched *before* the flush began, written only after the flush succeeded, and
    physicMsgTimestamp is the store time of the newest record the CommitLog flush covered."""

    channel = None  # timed: nothing wakes it

    def __init__(self, queues, dispatcher, checkpoint, ctl, config) -> None:  # type: ignore[no-untyped-def]
        #: the CommitLog whose queues and checkpoint this flushes (one service per log; with one
        #: CommitLog, every queue)
        self.log_id = dispatcher.log_id
        self._of_log = self.log_id if queues.log_count > 1 else None
        super().__init__("flush-consumequeue" if not self.log_id else f"flush-consumequeue-{self.log_id}", ctl)
        self.queues = queues
        self.dispatcher = dispatcher
        self.checkpoint = checkpoint
        self.interval_ms = config.flush_interval_consume_queue
        self.least_pages = config.flush_consume_queue_least_pages
        self.thorough_ms = config.flush_consume_queue_thorough_interval
        self._last_full_ms = time.monotonic() * 1000

    def run_once(self) -> None:
        self.sleep(self.interval_ms)
        now = time.monotonic() * 1000
        thorough = now >= self._last_full_ms + self.thorough_ms
        if thorough:
            self._last_full_ms = now
        self.flush(0 if thorough else self.least_pages, thorough)

    def flush(self, least_pages: int, thorough: bool) -> None:
        logics_ts = self.dispatcher.logics_store_timestamp
        try:
            self.queues.flush(least_pages, self._of_log)
        except OSError as exc:
            log.error("ConsumeQueue flush failed: %s", exc)
            return
        if thorough:
            self.write_checkpoint(logics_ts)

    def write_checkpoint(self, logics_ts: int) -> None:
        if logics_ts > 0:
            self.checkpoint.logics_msg_timestamp = logics_ts
        physic = self.ctl.get("flushed_store_timestamp", log=self.log_id)
        if physic > 0:
            self.checkpoint.physic_msg_timestamp = physic
        self.checkpoint.flush()

    def on_shutdown(self) -> None:
        for _ in range(3):  # spec: up to 3 tries with least pages 0
            try:
                logics_ts = self.dispatcher.logics_store_timestamp
                self.queues.flush(0, self._of_log)
                self.write_checkpoint(logics_ts)
                return
            except OSError as exc:
                log.error("final ConsumeQueue flush failed: %s", exc)
