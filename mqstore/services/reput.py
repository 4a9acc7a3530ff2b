"""ReputMessageService (spec §10.1): the service loop that keeps a Dispatcher
(mqstore.queue.dispatch) going: dispatch whatever is readable, then wait up to 1 ms (or until
woken on the "dispatch" channel); idle after a second with nothing to do; retry a pass that
failed every second with WRITE_LOGICS_QUEUE_ERROR set, and clear the flag (and an index error)
once it goes through; catch up for at most 5 s at shutdown.

With several CommitLogs (docs/parallel-commitlogs.md) and ``dispatch_logs_in_parallel`` each log
has a reput of its own (a thread, or in a node a dispatcher process per log): it waits on its
log's "dispatch" channel, sleeps idle under its own bit of the idle cell (a put into its log
wakes it, not the others), and marks only its log in WRITE_LOGICS_QUEUE_ERROR (the flag stays
while any log's dispatch fails). Without the key one loop serves every log's dispatcher in
turn, each visit dispatching at most a pass (64 MiB) of that log."""

from __future__ import annotations

import logging
import time

from collections.abc import Sequence

from mqstore.queue.dispatch import Dispatcher
from mqstore.services.base import ServiceThread

__all__ = ["ReputMessageService"]

log = logging.getLogger("mqstore.dispatch")

SHUTDOWN_CATCH_UP_MS = 5000  # spec §10.1: shutdown waits up to 5 s for dispatch to catch up
IDLE_AFTER_POLLS = 1000  # empty 1 ms polls before the reput goes idle
IDLE_SLEEP_MS = 1000.0  # idle: puts wake the reput (ControlBlock.arm_dispatch_idle); a sleep ends after this anyway
IDLE_INTERVAL_MS = 10.0  # idle where the kernel has no membarrier: slower polls
RETRY_AFTER_ERROR_MS = 1000


class ReputMessageService(ServiceThread):
    """spec §10.1: dispatch whatever is readable, then wait up to 1 ms (or until woken on
    the "dispatch" channel)."""

    channel = "dispatch"

    def __init__(self, dispatcher: Dispatcher | Sequence[Dispatcher], interval_ms: float = 1.0, *,
                 own_log: bool = False) -> None:
        """own_log: the reput of one log of several (dispatch_logs_in_parallel), on that log's
        channel and idle bit; else the one reput of every log (the store's channel)."""
        #: every log's dispatcher, served in turn; ``dispatcher`` is the first (log 0's)
        self.dispatchers = [dispatcher] if isinstance(dispatcher, Dispatcher) else list(dispatcher)
        self.dispatcher = self.dispatchers[0]
        if own_log and len(self.dispatchers) != 1:
            raise ValueError(f"a reput of its own log serves one dispatcher, not {len(self.dispatchers)}")
        #: the log whose own reput this is (None: the reput of every log)
        self.own_log = self.dispatcher.log_id if own_log else None
        self.channel_log = self.own_log or 0
        super().__init__("reput" if not self.own_log else f"reput-{self.own_log}", self.dispatcher.ctl)
        self.interval_ms = interval_ms
        self.last_error: BaseException | None = None
        failed = [d.log_id for d in self.dispatchers
                  if self.ctl.log_running_flag("WRITE_LOGICS_QUEUE_ERROR", d.log_id)]
        if failed:
            # the owner's start-up dispatch of a log failed (a full disk), or this log's reput
            # died with the flag set: this service clears its logs' part once it gets through
            self.last_error = OSError(f"the dispatch of CommitLog {failed[0]} failed")
        self._idle_polls = 0

    def run_once(self) -> None:
        done = 0
        dispatcher = self.dispatcher
        try:
            for dispatcher in self.dispatchers:
                done += dispatcher.dispatch_available(max_bytes=64 << 20)
        except (OSError, ValueError, OverflowError) as exc:
            # spec §3: a queue that cannot be written is retried (every second here) and the
            # WRITE_LOGICS_QUEUE_ERROR running flag tells operators; dispatch resumes where it
            # stopped, and what was built already is skipped as a duplicate
            log.error("dispatch failed at offset %d: %s; retrying in %d ms", dispatcher.dispatched, exc,
                      RETRY_AFTER_ERROR_MS)
            self.ctl.add_stat("dispatch_errors")
            self.ctl.set_log_running_flag("WRITE_LOGICS_QUEUE_ERROR", dispatcher.log_id)
            self.last_error = exc
            self.sleep(RETRY_AFTER_ERROR_MS)
            return
        if self.last_error is not None:
            # the pass that failed went through: RocketMQ keeps the flag until a restart (every
            # put refused meanwhile); here puts resume once the queue files can be written
            for d in self.dispatchers:
                self.ctl.set_log_running_flag("WRITE_LOGICS_QUEUE_ERROR", d.log_id, False)
            log.warning("dispatch%s resumed after: %s; WRITE_LOGICS_QUEUE_ERROR %s", self._of(), self.last_error,
                        "cleared" if "WRITE_LOGICS_QUEUE_ERROR" not in self.ctl.running_flags()
                        else "stays (another log's dispatch fails)")
            self.last_error = None
        for dispatcher in self.dispatchers:
            if dispatcher.index_error:
                dispatcher.heal_index()
        if done:
            self._idle_polls = 0
            if all(dispatcher.caught_up for dispatcher in self.dispatchers):
                # RocketMQ sleeps 1 ms between doReput passes: under a steady stream of puts a
                # pass then finds a millisecond of records, not the handful written since the
                # last one (passes back to back cost the dispatcher most of a core in per-pass
                # overhead while writers run flat out); lag stays within ~interval_ms
                self.wait_for_running(self.interval_ms)
            return
        # RocketMQ polls every 1 ms; after a second with nothing to dispatch the reput sleeps
        # until a put (or a commit of the transient store pool) wakes it, so an idle node
        # stays well under 1 % CPU and the first put after a pause is dispatched at once
        self._idle_polls += 1
        idle_bit = -1 if self.own_log is None else self.own_log
        if self._idle_polls < IDLE_AFTER_POLLS:
            self.wait_for_running(self.interval_ms)
        elif not self.ctl.arm_dispatch_idle(idle_bit):
            self.wait_for_running(IDLE_INTERVAL_MS)
        else:
            try:
                if self.behind() == 0 and self.wait_for_running(IDLE_SLEEP_MS):
                    self._idle_polls = 0  # woken: back to 1 ms polls until idle again
            finally:
                self.ctl.disarm_dispatch_idle(idle_bit)

    def on_shutdown(self) -> None:
        # spec §10.1: let dispatch catch up (at most 5 s) so a clean shutdown leaves nothing behind
        deadline = time.monotonic() + SHUTDOWN_CATCH_UP_MS / 1000
        while self.behind() > 0 and time.monotonic() < deadline:
            try:
                if sum(d.dispatch_available() for d in self.dispatchers) == 0 and self.behind() > 0:
                    time.sleep(0.01)
            except (OSError, ValueError, OverflowError) as exc:
                log.error("dispatch failed while shutting down: %s", exc)
                break
        for dispatcher in self.dispatchers:
            dispatcher.close()

    def _of(self) -> str:
        return f" of CommitLog {self.own_log}" if self.own_log else ""

    def behind(self) -> int:
        """CommitLog bytes written and not dispatched yet, over every log."""
        return sum(dispatcher.behind() for dispatcher in self.dispatchers)
