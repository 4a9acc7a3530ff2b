"""ConsumeQueues (spec §3): files, units against their records, completeness."""

from __future__ import annotations

import mmap
import os
import struct
from array import array
from collections import Counter
from typing import TYPE_CHECKING

from mqstore.queue._consumequeue import scan_units
from mqstore.layout import CQ_STORE_UNIT_SIZE, FILLER_SIZE, consumequeue_dir
from mqstore.log.scan import is_zero
from mqstore.queue.consume_queue import queue_problem
from mqstore.tools.checker.records import TX_MASK, TX_PREPARED, TX_ROLLBACK, _Log, _Logs, _Record
from mqstore.tools.checker.report import CheckReport, ConsumeQueueSummary, ProblemSink, Progress, QueueSummary

if TYPE_CHECKING:
    from mqstore.log.record import DecodedRecord

SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
CQ_TAIL_CHECK_BYTES = 16 * 4096  # zeros checked after a queue's end (what truncation zeroes)
MISSING_RUNS_SHOWN = 10  # completeness problems reported per queue

_UNIT = struct.Struct(">qiq")  # commitLogOffset, size, tagsCode



def _check_consume_queues(root: str, report: CheckReport, problem: ProblemSink, log: _Log | _Logs,
                          queue_phys: dict[tuple[str, int], array], broken: set[tuple[str, int]], *,
                          file_size: int | None, live: bool, stable: bool, complete: bool,
                          progress: Progress | None = None, deep: bool = False) -> None:
    cq_root = consumequeue_dir(root)
    if not os.path.isdir(cq_root):
        if complete and report.queues:
            report.notes.append("no consumequeue directory: the next open rebuilds every ConsumeQueue")
        return
    queues: list[tuple[str, int, str, list[tuple[int, str, int]]]] = []
    for topic in sorted(os.listdir(cq_root)):
        topic_dir = os.path.join(cq_root, topic)
        if not os.path.isdir(topic_dir):
            continue
        for qname in sorted(os.listdir(topic_dir)):
            qdir = os.path.join(topic_dir, qname)
            if not qname.isdigit() or not os.path.isdir(qdir):
                continue  # like the loader: only <topic>/<int queueId> directories are queues
            files = []
            for name in os.listdir(qdir):
                if len(name) == 20 and name.isdigit():
                    try:
                        files.append((int(name), name, os.path.getsize(os.path.join(qdir, name))))
                    except FileNotFoundError:
                        continue  # deleted by retention while we looked
            files.sort()
            queues.append((topic, int(qname), qdir, files))

    sizes = Counter(size for *_, files in queues for _, _, size in files)
    if file_size is not None:
        expected, source = file_size, "the configured size"
    elif sizes:
        expected = max(sizes, key=lambda s: (sizes[s], s))
        source = "the size of the other ConsumeQueue files"
    else:
        expected, source = CQ_STORE_UNIT_SIZE, ""
    if expected <= 0 or expected % CQ_STORE_UNIT_SIZE:
        problem("consumequeue", 0, f"ConsumeQueue files are {expected} bytes, not a multiple of the {CQ_STORE_UNIT_SIZE}-byte unit")
        return
    report.queues_complete_checked = complete

    for done, (topic, qid, qdir, files) in enumerate(queues):
        if progress is not None:
            progress("ConsumeQueues", done, len(queues))
        where = f"consumequeue/{topic}/{qid}"
        key = (topic, qid)
        wrong = [(start, name, size) for start, name, size in files if size != expected]
        for start, name, size in wrong:
            problem(where, start // CQ_STORE_UNIT_SIZE, f"file {name} is {size} bytes; {source} is {expected}")
        if wrong:
            q0 = files[0][0] // CQ_STORE_UNIT_SIZE
            report.consume_queues[key] = ConsumeQueueSummary(q0, q0, files=len(files))
            continue  # units not read (and no completeness verdict): the file size is reported
        for (a, an, _), (b, bn, _) in zip(files, files[1:]):
            if b - a != expected:
                problem(where, b // CQ_STORE_UNIT_SIZE, f"file {bn} does not follow {an} (file size {expected})")
        if files and files[0][0] % expected:
            problem(where, files[0][0] // CQ_STORE_UNIT_SIZE, f"first file {files[0][1]} is not at a multiple of the file "
                                                    f"size {expected}")
        summary = _check_queue(report, problem, log, where, topic, qid, qdir, files, expected,
                               report.queues.get(key), None if key in broken else queue_phys.get(key),
                               live=live, stable=stable, complete=complete, deep=deep)
        report.consume_queues[key] = summary

    if complete:
        for (topic, qid), s in sorted(report.queues.items()):
            if (topic, qid) not in report.consume_queues and queue_problem(topic, qid) is not None:
                # puts refuse such a record; dispatch skips it (dispatch_skipped_records)
                report.notes.append(f"the log holds {s.count} record(s) of topic {topic!r}, queue {qid}, offsets "
                                    f"{s.first_offset}..{s.last_offset}, which cannot have a ConsumeQueue "
                                    f"({queue_problem(topic, qid)}): left out of the queues")
            elif (topic, qid) not in report.consume_queues:
                problem(f"consumequeue/{topic}/{qid}", s.first_offset,
                        f"no ConsumeQueue for the log's {s.count} record(s) of offsets {s.first_offset}.."
                        f"{s.last_offset}")


def _check_queue(report: CheckReport, problem: ProblemSink, log: _Log | _Logs, where: str, topic: str, qid: int,
                 qdir: str, files: list[tuple[int, str, int]], file_size: int, in_log: QueueSummary | None,
                 phys: array | None, *, live: bool, stable: bool, complete: bool,
                 deep: bool = False) -> ConsumeQueueSummary:
    """Check the units of one queue; returns its summary. Reports missing units when complete."""
    first = in_log.first_offset if in_log is not None else 0
    last = in_log.last_offset if in_log is not None else -1
    units = fillers = gaps = removed = nfiles = 0
    first_in_log = -1
    last_phy = -1
    max_offset = files[0][0] // CQ_STORE_UNIT_SIZE if files else 0
    ended_at = -1  # queue offset where the queue ended (a file that is not full), -1: not yet
    covered: list[tuple[int, int]] = []  # [from, to) queue offset ranges of units read
    filler_offsets: list[int] = []  # fillers standing where the log has a record
    # a problem found on the unit read last, reported when another unit follows it or, at the
    # end of the queue of a store that may be writing, if the unit still reads the same:
    # (queue offset, message, position, file path, the 20 bytes read)
    pending: tuple[int, str, int, str, bytes] | None = None
    bounds = log.bounds
    for start, name, _ in files:
        q0 = start // CQ_STORE_UNIT_SIZE
        path = os.path.join(qdir, name)
        try:
            fh = open(path, "rb")
        except FileNotFoundError:
            continue  # deleted by retention while we looked
        with fh:
            mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            if ended_at >= 0:
                phy, size, _ = _UNIT.unpack_from(mm, 0)
                if phy >= 0 and size > 0 and not live:
                    problem(where, q0, f"file {name} holds units after the end of the queue at offset {ended_at}")
                elif deep and stable and not is_zero(mm):
                    problem(where, q0, f"file {name} follows the end of the queue at offset {ended_at} but is not "
                                       f"all zeros")
                continue
            nfiles += 1
            end = scan_units(mm, 0, file_size)[0]
            with memoryview(mm) as whole, whole[:end] as view:
                for i, (phy, size, tags) in enumerate(_UNIT.iter_unpack(view)):
                    q = q0 + i
                    if pending is not None:
                        problem(where, pending[0], pending[1])
                        pending = None
                    if size == FILLER_SIZE and phy == 0:
                        if units:
                            gaps += 1
                        else:
                            fillers += 1
                        if first <= q <= last:
                            filler_offsets.append(q)
                        continue
                    units += 1
                    msgs = []
                    if phy <= last_phy:
                        msgs.append(f"phyOffset {phy} is not above the previous unit's {last_phy}")
                    last_phy = phy
                    log_min, log_end = bounds(phy)
                    if phy < log_min:
                        removed += 1  # below the log's first file: removed by retention
                        if first <= q <= last:
                            at = f" (at {phys[q - first]})" if phys is not None else ""
                            msgs.append(f"points at {phy}, below the CommitLog's first file {log_min}, but the log "
                                        f"still holds the record of queue offset {q}{at}")
                    elif phy >= log_end:
                        if live:
                            report.in_flight_units += 1  # its record was written after the scan
                            continue
                        msgs.append(f"points at {phy}, past the end of the log at {log_end}")
                    else:
                        if first_in_log < 0:
                            first_in_log = q
                        rec = log.record(phy)
                        if isinstance(rec, str):
                            msgs.append(f"points at {phy}: {rec}")
                        else:
                            why = unit_mismatch(rec, size, tags, topic, qid, q)
                            if phys is not None and first <= q <= last and phys[q - first] != phy:
                                why.append(f"the log's record of queue offset {q} is at {phys[q - first]}")
                            if why:
                                msgs.append(f"unit (phy {phy}, size {size}, tags {tags}) does not match the record "
                                            f"there: " + "; ".join(why))
                    if msgs:
                        pos = i * CQ_STORE_UNIT_SIZE
                        pending = (q, "; ".join(msgs), pos, path, bytes(view[pos:pos + CQ_STORE_UNIT_SIZE]))
            covered.append((q0, q0 + end // CQ_STORE_UNIT_SIZE))
            max_offset = q0 + end // CQ_STORE_UNIT_SIZE
            if end < file_size:
                ended_at = max_offset
                if stable:
                    if not is_zero(mm, end, None if deep else end + CQ_TAIL_CHECK_BYTES):
                        phy, size, tags = _UNIT.unpack_from(mm, end) if end + CQ_STORE_UNIT_SIZE <= file_size else (0, 0, 0)
                        problem(where, max_offset, f"non-zero bytes follow the end of the queue (the unit there "
                                                   f"reads phy {phy}, size {size}, tags {tags})")
        finally:
            mm.close()
    if pending is not None:
        q, msg, pos, path, seen = pending
        if stable or _read_unit(path, pos) == seen:
            problem(where, q, msg)
    summary = ConsumeQueueSummary(first_in_log if first_in_log >= 0 else max_offset, max_offset, units, fillers,
                                  gaps, removed, nfiles)
    if complete and in_log is not None:
        _report_missing_units(problem, where, summary, first, last, phys, covered, filler_offsets)
    return summary


def unit_mismatch(rec: _Record | DecodedRecord, size: int, tags: int, topic: str, qid: int, q: int) -> list[str]:
    """How the ConsumeQueue unit (size, tags) at queue offset q of topic-qid disagrees with the
    record it points at (none: []): TOTALSIZE, topic and queue id, QUEUEOFFSET, a transaction
    type that gets no unit (PREPARED, ROLLBACK), the tags code (a delivery time not before the
    store timestamp for a delayed SCHEDULE_TOPIC_XXXX record). ``verify`` reports these as
    problems, ``dump`` shows them in the unit's note."""
    why = []
    if rec.total_size != size:
        why.append(f"its TOTALSIZE is {rec.total_size}")
    if rec.topic != topic or rec.queue_id != qid:
        why.append(f"it belongs to queue {rec.topic}-{rec.queue_id}")
    if rec.queue_offset != q:
        why.append(f"its QUEUEOFFSET is {rec.queue_offset}")
    tx = rec.sys_flag & TX_MASK
    if tx == TX_PREPARED or tx == TX_ROLLBACK:
        why.append(f"it is a {'PREPARED' if tx == TX_PREPARED else 'ROLLBACK'} transaction record (only NOT and "
                   f"COMMIT records get units)")
    if tags != rec.tags_code:
        delayed = rec.topic == SCHEDULE_TOPIC and "DELAY" in rec.properties
        if not (delayed and tags >= rec.store_timestamp):
            if delayed:
                why.append(f"tags code {tags} is not a delivery time (the record was stored at "
                           f"{rec.store_timestamp})")
            else:
                why.append(f"its tags code is {rec.tags_code} (TAGS {rec.properties.get('TAGS')!r})")
    return why


def _read_unit(path: str, pos: int) -> bytes | None:
    """The unit at pos of path read again (a running store may have been writing it when the
    check read it: a torn unit), None if the file is gone."""
    try:
        with open(path, "rb") as fh:
            return os.pread(fh.fileno(), CQ_STORE_UNIT_SIZE, pos)
    except OSError:
        return None


def _report_missing_units(problem: ProblemSink, where: str, summary: ConsumeQueueSummary, first: int, last: int,
                          phys: array | None, covered: list[tuple[int, int]], filler_offsets: list[int]) -> None:
    """Every record of the log in queue offsets [first, last] needs a unit. Offsets whose unit
    points at another record were reported with that unit; here: offsets no unit covers and
    offsets where a filler stands."""
    runs: list[tuple[int, int, str | None]] = []  # [lo, hi] inclusive, why (None: not covered)
    at = first
    for lo, hi in covered:
        if lo > at and at <= last:
            runs.append((at, min(lo, last + 1) - 1, None))
        at = max(at, hi)
    if at <= last:
        runs.append((at, last, None))
    run_start = prev = -2
    for q in filler_offsets + [-2]:
        if q != prev + 1:
            if run_start >= 0:
                runs.append((run_start, prev, "filler units stand there"))
            run_start = q
        prev = q
    runs.sort(key=lambda run: run[0])
    start = covered[0][0] if covered else summary.max_offset
    for lo, hi, why in runs[:MISSING_RUNS_SHOWN]:
        if why is None:
            why = (f"the queue ends at offset {summary.max_offset}" if lo >= summary.max_offset else
                   f"the queue starts at offset {start}" if hi < start else "no ConsumeQueue file holds them")
        n = hi - lo + 1
        span = f"offset {lo}" if n == 1 else f"offsets {lo}..{hi}"
        at_phy = "" if phys is None else f" ({'at' if n == 1 else 'the first at'} {phys[lo - first]})"
        problem(where, lo, f"no unit for the log's record{'s' if n > 1 else ''} of queue {span}{at_phy}: {why}")
    if len(runs) > MISSING_RUNS_SHOWN:
        problem(where, runs[MISSING_RUNS_SHOWN][0], f"... and {len(runs) - MISSING_RUNS_SHOWN} more runs of records "
                                                    f"without units")
