"""CommitLog flush services (spec §8, seed 000).

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
    from mqstore.commitlog import CommitLog

log = logging.getLogger("mqstore.flush")

SHUTDOWN_FLUSH_RETRIES = 10


class _FlushService(ServiceThread):
    channel = "flush"

    def __init__(self, name: str, commitlog: CommitLog) -> None:
        super().__init__(name, commitlog.ctl)
        self.commitlog = commitlog

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
