"""The CommitLog: every record parses and sits where it says, queue offsets are consecutive,
the files end as the next open would find them."""

from __future__ import annotations

import os
import shutil
import tempfile
from array import array
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mqstore.log._scan import scan_records
from mqstore.log._mapped import MappedFile
from mqstore.layout import file_start_of
from mqstore.log.scan import CLEAN_PAGES, is_zero, nonzero_extent, why_invalid
from mqstore.queue.files import store_config
from mqstore.tools.checker.records import TX_MASK, TX_PREPARED, TX_ROLLBACK, _Log
from mqstore.tools.checker.report import (PROGRESS_EVERY_RECORDS, CheckReport, ProblemSink, Progress,
                                          QueueSummary)

if TYPE_CHECKING:
    from mqstore.config import StoreConfig

def _commitlog_dir(root: str, config: StoreConfig | None) -> str:
    """The store's CommitLog directory: store_path_commit_log of config, else of the store's
    own saved configuration (ROOT/commitlog by default)."""
    return (config if config is not None else store_config(root)).commit_log_dir(root)


def _short_files_the_open_extends(cdir: str, file_size: int) -> dict[str, int]:
    """{name: size} of the short CommitLog files MappedFileQueue.load would extend (a cut last
    file and all-zero files after it, see MappedFileQueue.plan_load); {} if it would refuse
    the directory or extend nothing."""
    from mqstore.log.mapped_file_queue import MappedFileQueue
    from mqstore.errors import NotAStoreError
    from mqstore.queue.recovery import commitlog_file_was_cut

    try:
        plan = MappedFileQueue.plan_load(cdir, file_size, commitlog_file_was_cut)
    except (NotAStoreError, OSError):
        return {}
    return dict(plan.extend + plan.extend_empty)


def _extended_copy(path: str, directory: str, file_size: int) -> str:
    """A copy of the short file at path in directory, extended (sparse) to file_size."""
    copy = os.path.join(directory, os.path.basename(path))
    shutil.copyfile(path, copy)
    os.truncate(copy, file_size)
    return copy


@dataclass
class LogScan:
    """What the scan of the CommitLog leaves for the checks of the queues and the index: the
    files mapped (``log``), each queue's records' physical offsets in queue offset order, the
    queues whose offsets are not consecutive in the log, and where the last file ends when it
    ends with its END_OF_FILE blank. ``close()`` unmaps the files (and removes the scratch
    copies of short files)."""

    log: _Log
    queue_phys: dict[tuple[str, int], array]
    broken: set[tuple[str, int]]
    blank_end: int | None
    scratch: tempfile.TemporaryDirectory[str] | None = None

    def close(self) -> None:
        self.log.close()
        if self.scratch is not None:
            self.scratch.cleanup()


def scan_commitlog(cdir: str, names: list[str], report: CheckReport, problem: ProblemSink, *, check_crc: bool,
                   allow_torn_tail: bool, deep: bool, config: StoreConfig | None,
                   live_positions: dict[str, int] | None, progress: Progress | None) -> LogScan | None:
    """Scan the CommitLog files ``names`` of cdir (see the package docstring), filling the
    report's files, records, valid end, torn tail and queues. None when the files differ in
    size in a way no open would repair (the report says so; nothing else can be checked)."""
    sizes = {os.path.getsize(os.path.join(cdir, n)) for n in names}
    short: dict[str, int] = {}  # short files the next open extends (a cut last file, empty ones after it)
    if len(sizes) != 1:
        short = _short_files_the_open_extends(cdir, config.mapped_file_size_commit_log if config else max(sizes))
        if not short:
            problem("commitlog", 0, f"files have different sizes {sorted(sizes)}")
            report.notes.append("ConsumeQueues and index files not checked: the CommitLog files differ in size")
            return None
        sizes = {config.mapped_file_size_commit_log if config else max(sizes)}
        for name, size in short.items():
            what = (f"file {name} is cut short ({size} of {max(sizes)} bytes); the next open extends it with "
                    f"zeros and ends the log at the cut")
            if allow_torn_tail:
                report.notes.append(what)
            else:
                problem(name, int(name) + size, what)
    file_size = sizes.pop()
    scratch = tempfile.TemporaryDirectory(prefix="mqstore-check-") if short else None
    starts = [int(n) for n in names]
    for a, b in zip(starts, starts[1:]):
        if b - a != file_size:
            problem("commitlog", b, f"file {b:020d} does not follow {a:020d} (file size {file_size})")
    if file_start_of(starts[0], file_size) != starts[0]:
        problem("commitlog", starts[0], "first file is not aligned to the file size")

    last_with_data = max((i for i, n in enumerate(names) if not is_zero(os.path.join(cdir, n), 0, 8)), default=0)
    scan_total = (last_with_data + 1) * file_size  # the bytes the scan walks (files past the end are only peeked)
    seen = [0]
    # live: the end of what the files may hold when the scan began; past it bytes may be
    # arriving (the committed position: with a transient store pool the bytes between it and
    # the wrote position are still in the write buffers, without one the two move together)
    live_wrote = live_positions["committed"] if live_positions else None
    last_ts = [-1]
    next_q: dict[tuple[bytes, int], int] = {}
    first_q: dict[tuple[bytes, int], int] = {}
    counts: dict[tuple[bytes, int], int] = {}
    # physical offsets of each queue's records in queue offset order (ConsumeQueue checks)
    phys: dict[tuple[bytes, int], array] = {}
    broken: set[tuple[bytes, int]] = set()  # queues whose offsets are not consecutive in the log
    ended = False
    blank_end: int | None = None
    log = _Log(file_size)
    log.min_offset = starts[0]
    try:
        for index, name in enumerate(names):
            path = os.path.join(cdir, name)
            if scratch is not None and name in short:  # checked as the open extends it, in a copy
                path = _extended_copy(path, scratch.name, file_size)
            mf = MappedFile.open(path, file_size, readonly=True)
            report.files += 1
            base = mf.file_from
            if ended:
                if not is_zero(mf, 0, None if deep else 8):
                    if live_wrote is not None and base >= live_wrote:  # written since the scan began
                        report.in_flight_bytes += nonzero_extent(mf, 0, clean_pages=CLEAN_PAGES)
                    else:
                        problem(name, base, "file follows the end of the log but holds data")
                mf.close()
                continue
            log.add(mf)

            def on_record(pos, size, topic, qid, qoff, phy, sys_flag, ts, _base=base, _name=name):
                seen[0] += 1
                if progress is not None and seen[0] % PROGRESS_EVERY_RECORDS == 0:
                    progress("CommitLog", min(_base - starts[0] + pos, scan_total), scan_total)
                if phy != _base + pos:
                    problem(_name, _base + pos, f"PHYSICALOFFSET field says {phy} (the next open ends the log here)")
                if qid < 0:
                    problem(_name, _base + pos, f"QUEUEID {qid} is negative (the next open ends the log here)")
                if ts < last_ts[0]:
                    problem(_name, _base + pos, f"store timestamp {ts} is older than the previous record's {last_ts[0]}")
                last_ts[0] = ts
                tx = sys_flag & TX_MASK
                if tx in (TX_PREPARED, TX_ROLLBACK):
                    if qoff != 0:
                        problem(_name, _base + pos, f"prepared/rollback record carries queue offset {qoff}, not 0")
                    return
                key = (topic, qid)
                expected = next_q.get(key)
                if expected is None:
                    phys[key] = array("q", (_base + pos,))
                else:
                    if qoff != expected:
                        kind = "duplicate" if qoff < expected else "gap before"
                        problem(_name, _base + pos, f"queue {topic.decode(errors='replace')}-{qid}: {kind} offset "
                                                     f"{qoff}, expected {expected}")
                        broken.add(key)
                    phys[key].append(_base + pos)
                first_q.setdefault(key, qoff)
                next_q[key] = qoff + 1
                counts[key] = counts.get(key, 0) + 1

            stop, reason, count, _ = scan_records(mf, base, 0, file_size, check_crc, None, on_record)
            report.records += count
            if progress is not None:
                progress("CommitLog", min(base - starts[0] + file_size, scan_total), scan_total)
            is_last = index == len(names) - 1
            last_data_file = index >= last_with_data
            if reason == "blank":
                blank_total = int.from_bytes(mf.read(stop, 4), "big", signed=True)
                if blank_total != file_size - stop:
                    problem(name, base + stop, f"blank record says {blank_total} bytes, {file_size - stop} remain")
                report.valid_end = base + stop if is_last else base + file_size
                if is_last:
                    ended = True
                    blank_end = base + file_size
                continue
            # the log ends in this file
            report.valid_end = base + stop
            ended = True
            dirty = not is_zero(mf, stop, stop + 8)
            if reason == "invalid" and (dirty or (deep and not is_zero(mf, stop))):
                if live_wrote is not None and base + stop >= live_wrote:
                    report.in_flight_bytes = nonzero_extent(mf, stop, clean_pages=CLEAN_PAGES)  # being written now
                    continue
                why = why_invalid(mf, stop, check_crc) if dirty else "zeros, then non-zero bytes further on"
                tail = nonzero_extent(mf, stop, clean_pages=None if deep else CLEAN_PAGES)
                if not last_data_file:
                    problem(name, base + stop, f"corrupt record in a file that is not the last: {why}")
                elif allow_torn_tail:
                    report.torn_tail_bytes = tail
                else:
                    problem(name, base + stop, f"{tail} bytes after the end of the log are not zero: {why}")

        queue_phys: dict[tuple[str, int], array] = {}
        broken_names: set[tuple[str, int]] = set()
        for (topic, qid), nxt in next_q.items():
            key = (topic.decode("utf-8", errors="replace"), qid)
            report.queues[key] = QueueSummary(first_q[(topic, qid)], nxt - 1, counts[(topic, qid)])
            queue_phys[key] = phys[(topic, qid)]
            if (topic, qid) in broken:
                broken_names.add(key)
    except BaseException:
        log.close()
        if scratch is not None:
            scratch.cleanup()
        raise
    return LogScan(log, queue_phys, broken_names, blank_end, scratch)
