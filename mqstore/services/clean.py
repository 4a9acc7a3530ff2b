"""Retention (spec §14): RocketMQ's CleanCommitLogService and CleanConsumeQueueService.

``CleanCommitLogService`` deletes expired CommitLog files and watches the disk;
``CleanConsumeQueueService`` then deletes the ConsumeQueue and index files that only point
below the CommitLog's new min offset. ``CleanService`` runs both every
clean_resource_interval (RocketMQ ``cleanFilesPeriodically``, first run 60 s after start) and
checks the disk every 10 s in between (RocketMQ's disk check task), as a thread now and as the
node's cleaner process later: everything it needs is passed in, and what other processes must
see goes through the control block (the ``min_phy`` cell, the DISK_FULL running flag).

One run, as in RocketMQ 4.9.7:

* Commit log files are deleted when the hour is one of delete_when, or the disk is fuller
  than disk_max_used_space_ratio (clamped to 10 .. 95) or unmeasurable, or a manual request
  is pending (``execute_delete_files_manually``: the next 20 runs). Expired means the file's
  mtime is more than file_reserved_time hours old; oldest first, never the last file, at most
  delete_file_batch_max per run, delete_commit_log_files_interval between two deletions, and
  the run stops at the first file that is not expired, unless the disk is above
  disk_space_clean_forcibly_ratio and clean_file_forcibly_enable is on: then files go
  expired or not.
* Above disk_space_warning_level_ratio the DISK_FULL running flag is set, so every put in
  every process fails with SERVICE_NOT_AVAILABLE (spec §9.2); it is cleared when usage drops.
* A first file whose deletion hung (still referenced) is destroyed again every
  redelete_hanged_file_interval.
* When the CommitLog's min offset rose: each ConsumeQueue deletes its files whose last unit
  points below it (never the last file) and corrects its min offset, pausing
  delete_consume_queue_files_interval after each queue that deleted files; then the index
  deletes its files that end below it (never the last).

Decisions beyond RocketMQ (docs/retention.md):

* A disk check (every 10 s, the first 1 s after the start) that finds the disk past
  disk_space_clean_forcibly_ratio runs a clean at once. RocketMQ's check only sets the flag,
  so a broker started on a full disk refuses every put until its first clean, 60 s later.

* The CommitLog and ConsumeQueue partitions are judged together: the flag is set when either
  is above the warning ratio and cleared only when both are below it. RocketMQ checks them
  one after the other and stops after the CommitLog when it is above
  disk_max_used_space_ratio; otherwise (that ratio set above the warning ratio) a healthy
  ConsumeQueue partition clears the flag a full CommitLog partition has just set, and the
  10 s check looks at the CommitLog partition only.
* A CommitLog file is never deleted before the flush and the dispatch are past its end, even
  when cleaning forcibly: its messages would vanish without ever reaching a ConsumeQueue
  (RocketMQ's reput just jumps to the new min offset), and the flush would meet an unmapped
  file.
* A missing ConsumeQueue directory (no queue yet) is measured at the store root; RocketMQ
  creates the directory at start, so it never measures a missing path there.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mqstore.layout import log_of
from mqstore.services.base import ServiceThread

if TYPE_CHECKING:
    from mqstore.log._shm import ControlBlock
    from mqstore.config import StoreConfig
    from mqstore.queue.consume_queue import ConsumeQueueTable
    from mqstore.log.mapped_file_queue import MappedFileQueue

log = logging.getLogger("mqstore.clean")

MAX_MANUAL_DELETE_FILE_TIMES = 20   # RocketMQ CleanCommitLogService.MAX_MANUAL_DELETE_FILE_TIMES
FIRST_CLEAN_DELAY_MS = 60_000       # RocketMQ: cleanFilesPeriodically starts 60 s after the store
DISK_CHECK_INTERVAL_MS = 10_000     # RocketMQ: the disk check task (isSpaceFull) runs every 10 s
HOUR_MS = 3_600_000


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def disk_usage_ratio(path: str) -> float:
    """spec §14 (RocketMQ UtilAll.getDiskPartitionSpaceUsedPercent): the used share of the
    partition holding path, rounded up to whole percent, as a ratio (0.87); -1.0 when the
    path is missing or the partition cannot be measured. Used space is total - free; the
    share is taken of used + available to unprivileged users, as ``df`` does."""
    try:
        if not os.path.exists(path):
            return -1.0
        st = os.statvfs(path)
    except OSError:
        return -1.0
    total = st.f_blocks * st.f_frsize
    used = total - st.f_bfree * st.f_frsize
    entire = used + st.f_bavail * st.f_frsize
    if total <= 0 or entire <= 0:
        return -1.0
    return -(-used * 100 // entire) / 100


@dataclass
class DiskCheck:
    """What one look at the disk found (usage ratios, -1.0 = could not measure)."""

    commitlog_ratio: float
    consume_queue_ratio: float
    #: above disk_space_warning_level_ratio: DISK_FULL is set, puts are refused
    disk_full: bool
    #: above disk_space_clean_forcibly_ratio (or full): delete files even if not expired
    clean_immediately: bool
    #: unmeasurable or above the effective disk_max_used_space_ratio: delete at any hour
    space_to_delete: bool


@dataclass
class CleanReport:
    """What one cleaning run did."""

    disk: DiskCheck
    time_up: bool = False
    manual: bool = False
    #: the CommitLog deletion ran (time up, space to delete or a manual request)
    deleting: bool = False
    #: files were deleted even if not expired (disk above the clean-forcibly ratio)
    clean_at_once: bool = False
    commitlog_files_deleted: int = 0
    hanged_file_deleted: bool = False
    #: the CommitLog's min offset after the run (published in the control block's min_phy)
    min_offset: int = 0
    consume_queue_files_deleted: int = 0
    index_files_deleted: int = 0


class CleanCommitLogService:
    """RocketMQ DefaultMessageStore.CleanCommitLogService: expired CommitLog files, the disk
    check and the DISK_FULL flag, the manual delete request, hanged first files (spec §14)."""

    def __init__(self, ctl: ControlBlock, commitlog: MappedFileQueue, config: StoreConfig, root: str,
                 consume_queue_dir: str, *, now_ms: Callable[[], int] = wall_clock_ms,
                 disk_usage: Callable[[str], float] = disk_usage_ratio,
                 sleep_ms: Callable[[float], None] | None = None, other_log_paths: Sequence[str] = ()) -> None:
        self.ctl = ctl
        self.commitlog = commitlog
        #: the CommitLog this cleans (its flushed and dispatched cells bound what may go)
        self.log_id = log_of(commitlog.base)
        #: the other CommitLogs' directories of a store with several: the disk check measures
        #: every log's partition and judges by the fullest
        self.other_log_paths = tuple(other_log_paths)
        self.config = config
        self.root = root
        self.consume_queue_dir = consume_queue_dir
        self.now_ms = now_ms
        self.disk_usage = disk_usage
        self.sleep_ms = sleep_ms
        self.manual_delete_file_several_times = 0
        self.last_redelete_ms = 0

    def execute_delete_files_manually(self) -> None:
        """RocketMQ executeDeleteFilesManually: delete expired files at the next 20 runs,
        whatever the hour and the disk."""
        self.manual_delete_file_several_times = MAX_MANUAL_DELETE_FILE_TIMES
        log.info("executeDeleteFilesManually was invoked")

    def is_time_to_delete(self) -> bool:
        """RocketMQ isTimeToDelete: the local hour of now is one of delete_when."""
        return time.localtime(self.now_ms() / 1000).tm_hour in self.config.delete_when_hours

    def check_disk(self) -> DiskCheck:
        """RocketMQ isSpaceToDelete and isSpaceFull: measure the CommitLog and ConsumeQueue
        partitions, set or clear the DISK_FULL running flag."""
        cfg = self.config
        cq_dir = self.consume_queue_dir if os.path.isdir(self.consume_queue_dir) else self.root
        logs = [self.disk_usage(p) for p in (self.commitlog.store_path, *self.other_log_paths)]
        ratios = (-1.0 if min(logs) < 0 else max(logs), self.disk_usage(cq_dir))
        worst = max(ratios)
        warning = cfg.disk_space_warning_level_ratio / 100
        disk_full = worst > warning
        if len(logs) > 1:
            # several CommitLogs: a log whose disk is over the warning ratio while another's is
            # not is "full" alone (its queues refused, the others go on); DISK_FULL, refusing
            # every put, when the ConsumeQueues' disk or every log's is over it
            over = [r > warning for r in logs]
            disk_full = ratios[1] > warning or all(over)
            self._mark_full_logs([o and not disk_full for o in over], logs, warning)
        clean_immediately = disk_full or worst > cfg.disk_space_clean_forcibly_ratio / 100
        flagged = "DISK_FULL" in self.ctl.running_flags()
        if disk_full and not flagged:
            self.ctl.set_running_flag("DISK_FULL")
            log.error("disk maybe full soon (commitlog %.2f, consumequeue %.2f used): puts are refused "
                      "(DISK_FULL) until usage drops below %d%%", *ratios, cfg.disk_space_warning_level_ratio)
        elif not disk_full and flagged:
            self.ctl.set_running_flag("DISK_FULL", False)
            log.info("disk space OK again (commitlog %.2f, consumequeue %.2f used): DISK_FULL cleared", *ratios)
        max_used = cfg.effective_disk_max_used_space_ratio / 100
        space_to_delete = min(ratios) < 0 or worst > max_used
        return DiskCheck(ratios[0], ratios[1], disk_full, clean_immediately, space_to_delete)

    def _mark_full_logs(self, full: list[bool], ratios: list[float], warning: float) -> None:
        """Set each log's state "full" or back to "online" (an offline log stays offline)."""
        for k, is_full in enumerate(full):
            state = self.ctl.log_state(k)
            if is_full and state == "online":
                self.ctl.set_log_state(k, "full")
                log.error("CommitLog %d: its disk is %.2f used, above disk_space_warning_level_ratio %.2f: the queues "
                          "bound to it take no puts until the cleaner frees space; the other CommitLogs go on", k,
                          ratios[k], warning)
            elif not is_full and state == "full":
                self.ctl.set_log_state(k, "online")
                log.info("CommitLog %d: its disk is %.2f used: it takes puts again", k, ratios[k])

    def run(self, report: CleanReport) -> None:
        """RocketMQ CleanCommitLogService.run: deleteExpiredFiles, then redeleteHangedFile."""
        self.delete_expired_files(report)
        self.redelete_hanged_file(report)

    def delete_expired_files(self, report: CleanReport) -> None:
        cfg = self.config
        report.time_up = self.is_time_to_delete()
        report.manual = self.manual_delete_file_several_times > 0
        if not (report.time_up or report.disk.space_to_delete or report.manual):
            return
        if report.manual:
            self.manual_delete_file_several_times -= 1
        report.deleting = True
        report.clean_at_once = cfg.clean_file_forcibly_enable and report.disk.clean_immediately
        # beyond RocketMQ: never a file the flush or the dispatch has not passed
        keep_from = min(self.ctl.get("flushed", log=self.log_id), self.ctl.get("dispatched", log=self.log_id))
        deleted = self.commitlog.delete_expired_file_by_time(
            cfg.file_reserved_time * HOUR_MS, cfg.delete_commit_log_files_interval,
            cfg.destroy_maped_file_interval_forcibly, report.clean_at_once, now_ms=self.now_ms,
            sleep_ms=self.sleep_ms, max_files=cfg.delete_file_batch_max, keep_from=keep_from)
        report.commitlog_files_deleted = deleted
        if deleted:
            log.info("deleted %d expired CommitLog file(s) (time up %s, space to delete %s, manual %s, at once %s)",
                     deleted, report.time_up, report.disk.space_to_delete, report.manual, report.clean_at_once)
        elif report.disk.space_to_delete:
            log.warning("disk space will be full soon, but no CommitLog file could be deleted")

    def redelete_hanged_file(self, report: CleanReport) -> None:
        now = self.now_ms()
        if now - self.last_redelete_ms > self.config.redelete_hanged_file_interval:
            self.last_redelete_ms = now
            report.hanged_file_deleted = self.commitlog.retry_delete_first_file(
                self.config.destroy_maped_file_interval_forcibly)


class CleanConsumeQueueService:
    """RocketMQ DefaultMessageStore.CleanConsumeQueueService: once the CommitLog's min offset
    rose, ConsumeQueue files and index files that only point below it (spec §14)."""

    def __init__(self, consume_queues: ConsumeQueueTable, index: Any | None, config: StoreConfig, *,
                 sleep_ms: Callable[[float], None] | None = None, log: int | None = None) -> None:
        self.consume_queues = consume_queues
        #: with several CommitLogs, the log whose queues (and index) this cleans: a queue's units
        #: are cut against its own log's min offset (None: every queue, one CommitLog)
        self.log = log
        self.index = index
        self.config = config
        self.sleep_ms = sleep_ms if sleep_ms is not None else (lambda ms: time.sleep(ms / 1000))
        self.last_physical_min_offset = 0

    def run(self, min_offset: int, report: CleanReport) -> None:
        if min_offset <= self.last_physical_min_offset:
            return
        self.last_physical_min_offset = min_offset
        interval = self.config.delete_consume_queue_files_interval
        for cq in self.consume_queues.of_log(self.log):
            deleted = cq.delete_expired_file(min_offset)
            report.consume_queue_files_deleted += deleted
            if deleted and interval > 0:
                self.sleep_ms(interval)
        if self.index is not None:
            report.index_files_deleted = self.index.delete_expired_file(min_offset)
        if report.consume_queue_files_deleted or report.index_files_deleted:
            log.info("below CommitLog offset %d: deleted %d ConsumeQueue and %d index file(s)", min_offset,
                     report.consume_queue_files_deleted, report.index_files_deleted)


class CleanService(ServiceThread):
    """The cleaner: RocketMQ cleanFilesPeriodically (CleanCommitLogService then
    CleanConsumeQueueService) every clean_resource_interval, and the disk check every 10 s.

    ``clean_once()`` is one run (tests and tools call it directly); ``start()`` runs it on a
    thread. ``now_ms`` (wall clock, ms) decides the delete_when hour, file expiry and the
    hanged-file retry; ``disk_usage(path)`` measures a partition (ratio, -1.0 = unknown).
    Both default to the real ones.
    """

    channel = "clean"

    def __init__(self, ctl: ControlBlock, commitlog: MappedFileQueue, consume_queues: ConsumeQueueTable,
                 index: Any | None, config: StoreConfig, root: str, *,
                 now_ms: Callable[[], int] = wall_clock_ms, disk_usage: Callable[[str], float] = disk_usage_ratio,
                 initial_delay_ms: int = FIRST_CLEAN_DELAY_MS, follow: bool = False,
                 more_logs: Sequence[tuple[MappedFileQueue, Any]] = ()) -> None:
        super().__init__("clean", ctl)
        self.config = config
        self.commitlog = commitlog
        self.consume_queues = consume_queues
        self.index = index
        #: the cleaner process of a node: files and queues are created by other processes
        self.follow = follow
        self.commitlog_cleaner = CleanCommitLogService(
            ctl, commitlog, config, root, consume_queues.root, now_ms=now_ms, disk_usage=disk_usage,
            sleep_ms=self.sleep, other_log_paths=[files.store_path for files, _ in more_logs])
        self.consume_queue_cleaner = CleanConsumeQueueService(consume_queues, index, config, sleep_ms=self.sleep,
                                                              log=0 if more_logs else None)
        #: the other CommitLogs of a store with several (docs/parallel-commitlogs.md), each cleaned
        #: as log 0 is, its queues and index against its own min offset: (files, its CommitLog
        #: cleaner, its ConsumeQueue cleaner)
        self.more_logs = [(files, CleanCommitLogService(ctl, files, config, root, consume_queues.root, now_ms=now_ms,
                                                        disk_usage=disk_usage, sleep_ms=self.sleep),
                           CleanConsumeQueueService(consume_queues, log_index, config, sleep_ms=self.sleep,
                                                    log=log_of(files.base)))
                          for files, log_index in more_logs]
        start = time.monotonic() * 1000
        self._next_clean_ms = start + initial_delay_ms
        self._next_disk_check_ms = start + min(1000, initial_delay_ms)
        self._clean_lock = threading.Lock()
        # executeDeleteFilesManually from another process (a node's owner, an attached store):
        # the wall ms of the newest request, in the control block
        self._manual_seen = ctl.get("manual_delete_request")
        self.runs = 0
        self.last_report: CleanReport | None = None
        self.last_error: BaseException | None = None

    def execute_delete_files_manually(self) -> None:
        """Delete expired files at the next 20 runs whatever the hour and the disk; the next
        run starts now."""
        for cleaner in self._commitlog_cleaners():
            cleaner.execute_delete_files_manually()
        self.wakeup()

    def _commitlog_cleaners(self) -> list[CleanCommitLogService]:
        return [self.commitlog_cleaner] + [cleaner for _, cleaner, _ in self.more_logs]

    def check_disk_space(self) -> DiskCheck:
        """The 10 s disk check alone: set or clear DISK_FULL."""
        return self.commitlog_cleaner.check_disk()

    def clean_once(self) -> CleanReport:
        """One run: CommitLog files, the min offset published in the control block, then
        ConsumeQueue and index files below it. One run at a time."""
        with self._clean_lock:
            if self.follow:
                self._follow()
            report = CleanReport(self.commitlog_cleaner.check_disk())
            self.commitlog_cleaner.run(report)
            report.min_offset = self.commitlog.min_available_offset()
            self.ctl.advance("min_phy", report.min_offset)
            self.consume_queue_cleaner.run(report.min_offset, report)
            for files, commitlog_cleaner, consume_queue_cleaner in self.more_logs:
                self._clean_log(files, commitlog_cleaner, consume_queue_cleaner, report)
            self.runs += 1
            self.last_report = report
            return report

    def _clean_log(self, files: MappedFileQueue, commitlog_cleaner: CleanCommitLogService,
                   consume_queue_cleaner: CleanConsumeQueueService, report: CleanReport) -> None:
        """One run over CommitLog k >= 1 of a store with several, under the disk check of the
        run; what it deleted is added to report (whose min_offset stays log 0's)."""
        done = CleanReport(report.disk)
        commitlog_cleaner.run(done)
        done.min_offset = files.min_available_offset()
        self.ctl.advance("min_phy", done.min_offset, log=commitlog_cleaner.log_id)
        consume_queue_cleaner.run(done.min_offset, done)
        report.deleting |= done.deleting
        report.hanged_file_deleted |= done.hanged_file_deleted
        report.commitlog_files_deleted += done.commitlog_files_deleted
        report.consume_queue_files_deleted += done.consume_queue_files_deleted
        report.index_files_deleted += done.index_files_deleted

    def _clean_and_recheck(self) -> None:
        """clean_once, then, if it deleted files, the disk check again: DISK_FULL clears as soon
        as the clean freed the space, not 10 s later."""
        report = self.clean_once()
        if report.commitlog_files_deleted and report.disk.disk_full:
            self.check_disk_space()

    def _follow(self) -> None:
        """Map what the allocator and the dispatcher processes created since the last run: new
        CommitLog files, new queues and their files (up to the published unit counts), new
        index files; else they would never be cleaned."""
        self.commitlog.map_new_files()
        for files, _, _ in self.more_logs:
            files.map_new_files()
        for topic, queue_id, _ in self.ctl.table_items():
            units = self.ctl.table_get_dispatched(topic, queue_id)
            if not units:
                continue
            cq = self.consume_queues.get(topic, queue_id) or self.consume_queues.open_existing(topic, queue_id)
            if cq is not None:
                cq.follow(units)
        for index in [self.index] + [cleaner.index for _, _, cleaner in self.more_logs]:
            if index is not None:
                index.follow()

    def run_once(self) -> None:
        now = time.monotonic() * 1000
        wait = min(self._next_clean_ms, self._next_disk_check_ms) - now
        woken = self.wait_for_running(wait) if wait > 0 else False
        if self.is_stopped:
            return
        requested = self.ctl.get("manual_delete_request")
        if requested > self._manual_seen:
            self._manual_seen = requested
            for cleaner in self._commitlog_cleaners():
                cleaner.execute_delete_files_manually()
            woken = True
        now = time.monotonic() * 1000
        try:
            if woken or now >= self._next_clean_ms:
                self._clean_and_recheck()
                self._next_clean_ms = now + self.config.clean_resource_interval
                self._next_disk_check_ms = now + DISK_CHECK_INTERVAL_MS
            elif now >= self._next_disk_check_ms:
                self._next_disk_check_ms = now + DISK_CHECK_INTERVAL_MS
                if self.check_disk_space().clean_immediately:
                    # past disk_space_clean_forcibly_ratio: clean now, not at the next period
                    # (RocketMQ's disk check only sets the flag, so a broker started on a full
                    # disk refuses puts until its first clean, 60 s after the start)
                    self._clean_and_recheck()
                    self._next_clean_ms = now + self.config.clean_resource_interval
        except (OSError, ValueError) as exc:
            # RocketMQ logs and carries on at the next period; so does this loop
            log.error("cleaning failed: %s", exc)
            self.last_error = exc
            self._next_clean_ms = now + self.config.clean_resource_interval
            self._next_disk_check_ms = now + DISK_CHECK_INTERVAL_MS
