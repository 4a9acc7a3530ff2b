"""CommitLog recovery at start-up (spec §5.4, §5.5), its own module as Kafka's LogLoader.

Scans the CommitLog from its first file, checking every record (CRC included when
check_crc_on_recover), finds the valid end, truncates what follows (later files deleted, the
torn tail zeroed), and rebuilds the control block from what it found: positions and the
topic-queue offset table. The read-path issue narrows the scan to the last files once
ConsumeQueues carry the queue offsets.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from mqstore._commitlog import scan_records
from mqstore.mapped_file_queue import MappedFileQueue

log = logging.getLogger("mqstore.recovery")


@dataclass
class RecoveryReport:
    """What recovery kept and what it dropped."""

    clean_shutdown: bool
    files_scanned: int = 0
    records: int = 0
    valid_end: int = 0
    stop_reason: str = "empty"
    dropped_bytes: int = 0
    deleted_files: list[str] = field(default_factory=list)
    queues: int = 0
    last_store_timestamp: int = -1
    elapsed_ms: float = 0.0

    def summary(self) -> str:
        how = "clean" if self.clean_shutdown else "abnormal (abort file present)"
        text = (f"recovery after {how} shutdown: {self.records} records in {self.files_scanned} files, "
                f"valid end {self.valid_end}, {self.queues} queues")
        if self.dropped_bytes or self.deleted_files:
            text += f"; dropped {self.dropped_bytes} bytes of torn tail"
            if self.deleted_files:
                text += f" and files {', '.join(self.deleted_files)}"
        return text


def recover_commitlog(queue: MappedFileQueue, ctl, *, check_crc: bool, clean_shutdown: bool,
                      progress: Callable[[int, int], None] | None = None) -> RecoveryReport:
    """Scan, truncate and rebuild the control block (which must be freshly created)."""
    t0 = time.monotonic()
    report = RecoveryReport(clean_shutdown=clean_shutdown)
    files = queue.files
    valid_end = files[0].file_from if files else 0
    for i, mf in enumerate(files):
        stop, reason, count, last_ts = scan_records(mf, mf.file_from, 0, queue.file_size, check_crc, ctl)
        report.files_scanned += 1
        report.records += count
        if last_ts >= 0:
            report.last_store_timestamp = last_ts
        valid_end = mf.file_from + stop
        report.stop_reason = reason
        if progress is not None:
            progress(i + 1, len(files))
        if reason == "blank" and i + 1 < len(files):
            continue
        break
    if files:
        report.deleted_files, report.dropped_bytes = queue.truncate_dirty_files(valid_end)
    report.valid_end = valid_end
    for name in ("wrote", "committed", "flushed", "confirmed"):
        ctl.set(name, valid_end)
    ctl.set("min_phy", files[0].file_from if files else 0)
    if report.last_store_timestamp > 0:
        ctl.set("last_store_timestamp", report.last_store_timestamp)
        ctl.set("flushed_store_timestamp", report.last_store_timestamp)
    report.queues = len(ctl.table_items())
    report.elapsed_ms = (time.monotonic() - t0) * 1000
    level = logging.WARNING if report.dropped_bytes or report.deleted_files else logging.INFO
    log.log(level, "%s", report.summary())
    return report

