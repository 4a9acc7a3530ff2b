"""Store recovery at start-up (spec §5.2–§5.5), its own module as Kafka's LogLoader.

1. Every ConsumeQueue recovers its last three files (spec §3): units are kept while
   ``phyOffset >= 0 and size > 0``.
2. The CommitLog is scanned record by record (CRC checked when check_crc_on_recover):
   after a clean shutdown from the third-last file (recoverNormally), after a crash from the
   newest file whose first record is older than the checkpoint (recoverAbnormally). The
   valid end is where the scan stops; what follows is truncated (later files deleted, the
   torn tail zeroed).
3. ConsumeQueue units pointing at or past the valid end are dropped (truncateDirtyLogicFiles).
4. The control block is rebuilt: positions at the valid end, the topic-queue table from the
   queues' max offsets. The caller then dispatches from ``dispatch_from`` until nothing is
   behind, which re-builds what the queues and the index lack (both ignore duplicates).

The report says what was kept and what was dropped: CommitLog bytes and files, units per
queue, and how many records the start-up dispatch replayed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from mqstore._codec import check_record
from mqstore._commitlog import scan_records
from mqstore.mapped_file_queue import MappedFileQueue

if TYPE_CHECKING:
    from mqstore._shm import ControlBlock
    from mqstore.checkpoint import StoreCheckpoint
    from mqstore.consume_queue import ConsumeQueueTable

log = logging.getLogger("mqstore.recovery")

NORMAL_RECOVERY_FILES = 3  # spec §5.4: recoverNormally starts at the third-last file
PROGRESS_LOG_EVERY_S = 2.0


@dataclass
class RecoveryReport:
    """What recovery kept and what it dropped."""

    clean_shutdown: bool
    mode: str = "normal"
    files_scanned: int = 0
    first_file_scanned: str = ""
    records: int = 0
    bytes_scanned: int = 0
    valid_end: int = 0
    stop_reason: str = "empty"
    dropped_bytes: int = 0
    deleted_files: list[str] = field(default_factory=list)
    queues: int = 0
    queue_units_dropped: dict[str, int] = field(default_factory=dict)
    queue_files_deleted: int = 0
    dispatch_from: int = 0
    redispatched_records: int = 0
    last_store_timestamp: int = -1
    elapsed_ms: float = 0.0

    @property
    def dropped_units(self) -> int:
        return sum(self.queue_units_dropped.values())

    def summary(self) -> str:
        how = "clean" if self.clean_shutdown else "abnormal (abort file present)"
        text = (f"recovery after {how} shutdown: {self.records} records in {self.files_scanned} files "
                f"checked from {self.first_file_scanned or '-'}, valid end {self.valid_end}, {self.queues} queues, "
                f"{self.redispatched_records} records dispatched from {self.dispatch_from}")
        if self.dropped_bytes or self.deleted_files:
            text += f"; dropped {self.dropped_bytes} bytes of torn tail"
            if self.deleted_files:
                text += f" and files {', '.join(self.deleted_files)}"
        if self.queue_units_dropped:
            shown = ", ".join(f"{k}: {v}" for k, v in sorted(self.queue_units_dropped.items())[:10])
            text += f"; dropped {self.dropped_units} queue units ({shown})"
        return text

    def to_dict(self) -> dict[str, object]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


def choose_abnormal_start(queue: MappedFileQueue, min_timestamp: int) -> int:
    """spec §5.5: index of the newest file whose first record is valid, has a store
    timestamp and is not newer than the checkpoint's min timestamp; 0 if none."""
    files = queue.files
    for i in range(len(files) - 1, -1, -1):
        mf = files[i]
        size, ok = check_record(mf, 0, check_crc=False, read_body=False)
        if not ok or size <= 0:
            continue
        ts = scan_records(mf, mf.file_from, 0, size, False)[3]
        if ts != 0 and ts <= min_timestamp:
            return i
    return 0


def scan_commitlog(queue: MappedFileQueue, start_index: int, *, check_crc: bool, report: RecoveryReport,
                   progress: Callable[[int, int], None] | None = None) -> int:
    """Scan from file start_index until a record fails or the log ends; returns the valid end."""
    files = queue.files
    if not files:
        return 0
    valid_end = files[start_index].file_from
    report.first_file_scanned = files[start_index].file_name
    last_log = time.monotonic()
    todo = files[start_index:]
    for i, mf in enumerate(todo):
        stop, reason, count, last_ts = scan_records(mf, mf.file_from, 0, queue.file_size, check_crc)
        report.files_scanned += 1
        report.records += count
        report.bytes_scanned += stop
        if last_ts >= 0:
            report.last_store_timestamp = last_ts
        valid_end = mf.file_from + stop
        report.stop_reason = reason
        if progress is not None:
            progress(i + 1, len(todo))
        if time.monotonic() - last_log >= PROGRESS_LOG_EVERY_S:
            last_log = time.monotonic()
            log.info("recovery: checked %d of %d CommitLog files (%d records)", i + 1, len(todo), report.records)
        if reason == "blank" and i + 1 < len(todo):
            continue
        break
    return valid_end


def recover_store(queue: MappedFileQueue, ctl: ControlBlock, queues: ConsumeQueueTable | None,
                  checkpoint: StoreCheckpoint | None, *, check_crc: bool, clean_shutdown: bool,
                  index_safe: bool = False, progress: Callable[[int, int], None] | None = None) -> RecoveryReport:
    """Recover the CommitLog and the ConsumeQueues; rebuild the (fresh) control block.
    Sets report.dispatch_from: where the start-up dispatch must begin."""
    t0 = time.monotonic()
    report = RecoveryReport(clean_shutdown=clean_shutdown, mode="normal" if clean_shutdown else "abnormal")
    if queues is not None:
        for r in queues.recover():
            report.queue_files_deleted += r.deleted_files
    files = queue.files
    if not files:
        if queues is not None and len(queues):
            log.warning("the CommitLog is empty: destroying %d ConsumeQueues", len(queues))
            queues.destroy_all()
        report.valid_end = 0
    else:
        if clean_shutdown:
            start = max(0, len(files) - NORMAL_RECOVERY_FILES)
        else:
            min_ts = 0
            if checkpoint is not None:
                min_ts = checkpoint.min_timestamp_index if index_safe else checkpoint.min_timestamp
            start = choose_abnormal_start(queue, min_ts)
        scan_start = files[start].file_from
        valid_end = scan_commitlog(queue, start, check_crc=check_crc, report=report, progress=progress)
        report.deleted_files, report.dropped_bytes = queue.truncate_dirty_files(valid_end)
        report.valid_end = valid_end
        if queues is not None:
            for (topic, qid), n in queues.truncate_dirty(valid_end).items():
                report.queue_units_dropped[f"{topic}/{qid}"] = n
    min_phy = files[0].file_from if files else 0
    for name in ("wrote", "committed", "flushed", "confirmed"):
        ctl.set(name, report.valid_end)
    ctl.set("min_phy", min_phy)
    if report.last_store_timestamp > 0:
        ctl.set("last_store_timestamp", report.last_store_timestamp)
        ctl.set("flushed_store_timestamp", report.last_store_timestamp)
    max_phy_cq = -1
    if queues is not None:
        queues.correct_min_offsets(min_phy)
        for cq in queues:
            ctl.table_set(cq.topic, cq.queue_id, cq.max_offset_in_queue)
        max_phy_cq = queues.max_physic_offset
        report.queues = len(queues)
    if clean_shutdown or not files:
        report.dispatch_from = max(max_phy_cq, min_phy)
    else:
        report.dispatch_from = max(min(max_phy_cq, scan_start), min_phy)
    report.dispatch_from = min(report.dispatch_from, report.valid_end)
    report.elapsed_ms = (time.monotonic() - t0) * 1000
    return report


def log_report(report: RecoveryReport) -> None:
    dropped = report.dropped_bytes or report.deleted_files or report.queue_units_dropped
    log.log(logging.WARNING if dropped else logging.INFO, "%s", report.summary())
