"""The store-wide invariant checker (style.md: sortedcontainers' ``_check()`` after every step).

``check_store(root)`` verifies a store directory: every record parses and its CRC matches,
every record's PHYSICALOFFSET is where it sits, store timestamps never go back, every file but
the last ends with a well-formed END_OF_FILE blank, nothing but zeros follows the end of the
log (files after it may exist, pre-allocated and empty), queue offsets of each queue are consecutive, and, when a control block is present, its
positions are ordered (flushed <= committed <= wrote) and agree with the files, as does its
topic-queue table. Stress and crash tests call it after every step; ``mqstore verify`` runs it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from mqstore._codec import decode_record
from mqstore._commitlog import scan_records
from mqstore._mapped import MappedFile
from mqstore.errors import CorruptRecordError

TX_MASK = 0xC
TX_PREPARED = 0x4
TX_ROLLBACK = 0xC


@dataclass
class Problem:
    where: str
    offset: int
    message: str

    def __str__(self) -> str:
        return f"{self.where} @ {self.offset}: {self.message}"


@dataclass
class QueueSummary:
    first_offset: int
    last_offset: int
    count: int


@dataclass
class CheckReport:
    root: str
    files: int = 0
    records: int = 0
    valid_end: int = 0
    torn_tail_bytes: int = 0
    #: with quiescent=False: bytes past the wrote position read before the scan that did not
    #: parse yet (records being written while the checker ran)
    in_flight_bytes: int = 0
    queues: dict[tuple[str, int], QueueSummary] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    control_block: dict[str, int] | None = None

    @property
    def ok(self) -> bool:
        return not self.problems

    def raise_if_failed(self) -> CheckReport:
        if self.problems:
            shown = "\n  ".join(str(p) for p in self.problems[:20])
            raise AssertionError(f"store {self.root} violates {len(self.problems)} invariant(s):\n  {shown}")
        return self


def _commitlog_dir(root: str) -> str:
    return os.path.join(root, "commitlog")


def check_store(root: str, *, check_crc: bool = True, allow_torn_tail: bool = False,
                quiescent: bool = True, max_problems: int = 200) -> CheckReport:
    """Check every invariant of the store at root; see the module docstring.

    allow_torn_tail: a store that crashed and was not reopened may hold a partly written
    record after its valid end; count it in ``torn_tail_bytes`` instead of failing.
    quiescent: no writer is active, so the control block's wrote position must equal the end
    found in the files. With quiescent=False (writers may be running) the positions are read
    before the scan: the log must reach at least that wrote position, and bytes after it that
    do not parse yet are a record being written, not a problem.

    A partly written record is a torn tail (allow_torn_tail) in the last file that holds data;
    files after it that the allocate service created ahead are empty.
    """
    report = CheckReport(root=root)
    problems = report.problems

    def problem(where: str, offset: int, message: str) -> None:
        if len(problems) < max_problems:
            problems.append(Problem(where, offset, message))

    live_positions = None if quiescent else _read_positions(root)
    cdir = _commitlog_dir(root)
    names = sorted(n for n in os.listdir(cdir) if len(n) == 20 and n.isdigit()) if os.path.isdir(cdir) else []
    if not names:
        _check_control_block(root, report, problem, quiescent, live_positions)
        return report
    sizes = {os.path.getsize(os.path.join(cdir, n)) for n in names}
    if len(sizes) != 1:
        problem("commitlog", 0, f"files have different sizes {sorted(sizes)}")
        return report
    file_size = sizes.pop()
    starts = [int(n) for n in names]
    for a, b in zip(starts, starts[1:]):
        if b - a != file_size:
            problem("commitlog", b, f"file {b:020d} does not follow {a:020d} (file size {file_size})")
    if starts[0] % file_size:
        problem("commitlog", starts[0], "first file is not aligned to the file size")

    last_with_data = max((i for i, n in enumerate(names) if _starts_with_data(os.path.join(cdir, n))), default=0)
    live_wrote = live_positions["wrote"] if live_positions else None
    last_ts = [-1]
    next_q: dict[tuple[bytes, int], int] = {}
    first_q: dict[tuple[bytes, int], int] = {}
    counts: dict[tuple[bytes, int], int] = {}
    ended = False
    for index, name in enumerate(names):
        mf = MappedFile.open(os.path.join(cdir, name), file_size)
        report.files += 1
        base = mf.file_from
        try:
            if ended:
                if mf.read(0, 8) != b"\x00" * 8:
                    if live_wrote is not None and base >= live_wrote:
                        report.in_flight_bytes += _nonzero_extent(mf, 0)  # written since the scan began
                    else:
                        problem(name, base, "file follows the end of the log but holds data")
                continue

            def on_record(pos, size, topic, qid, qoff, phy, sys_flag, ts, _base=base, _name=name):
                if phy != _base + pos:
                    problem(_name, _base + pos, f"PHYSICALOFFSET field says {phy}")
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
                if expected is not None and qoff != expected:
                    kind = "duplicate" if qoff < expected else "gap before"
                    problem(_name, _base + pos, f"queue {topic.decode(errors='replace')}-{qid}: {kind} offset {qoff}, "
                                                 f"expected {expected}")
                first_q.setdefault(key, qoff)
                next_q[key] = qoff + 1
                counts[key] = counts.get(key, 0) + 1

            stop, reason, count, _ = scan_records(mf, base, 0, file_size, check_crc, None, on_record)
            report.records += count
            is_last = index == len(names) - 1
            last_data_file = index >= last_with_data
            if reason == "blank":
                blank_total = int.from_bytes(mf.read(stop, 4), "big", signed=True)
                if blank_total != file_size - stop:
                    problem(name, base + stop, f"blank record says {blank_total} bytes, {file_size - stop} remain")
                report.valid_end = base + stop if is_last else base + file_size
                if is_last:
                    ended = True
                continue
            # the log ends in this file
            report.valid_end = base + stop
            ended = True
            if reason == "invalid" and not _is_zero(mf, stop, 8):
                if live_wrote is not None and base + stop >= live_wrote:
                    report.in_flight_bytes = _nonzero_extent(mf, stop)  # a record being written right now
                    continue
                why = _why_invalid(mf, stop, check_crc)
                tail = _nonzero_extent(mf, stop)
                if not last_data_file:
                    problem(name, base + stop, f"corrupt record in a file that is not the last: {why}")
                elif allow_torn_tail:
                    report.torn_tail_bytes = tail
                else:
                    problem(name, base + stop, f"{tail} bytes after the end of the log are not zero: {why}")
        finally:
            mf.close()

    for (topic, qid), nxt in next_q.items():
        report.queues[(topic.decode("utf-8", errors="replace"), qid)] = QueueSummary(
            first_q[(topic, qid)], nxt - 1, counts[(topic, qid)])
    _check_control_block(root, report, problem, quiescent, live_positions)
    return report


def _starts_with_data(path: str) -> bool:
    with open(path, "rb") as f:
        return f.read(8) != b"\x00" * 8


def _read_positions(root: str) -> dict[str, int] | None:
    from mqstore import _shm

    path = os.path.join(root, "mqstore.shm")
    if not os.path.exists(path):
        return None
    try:
        ctl = _shm.ControlBlock.attach(path)
    except (OSError, ValueError):
        return None  # reported by _check_control_block
    try:
        return None if ctl.state == _shm.STATE_BUILDING else ctl.positions()
    finally:
        ctl.close()


def _is_zero(mf: MappedFile, pos: int, n: int) -> bool:
    n = min(n, mf.file_size - pos)
    return n <= 0 or mf.read(pos, n) == b"\x00" * n


def _nonzero_extent(mf: MappedFile, pos: int) -> int:
    """Bytes from pos to the last non-zero byte before a run of 16 zero pages."""
    end, run, page = pos, 0, 4096
    at = pos
    while at < mf.file_size and run < 16:
        chunk = mf.read(at, min(page - at % page, mf.file_size - at))
        stripped = chunk.rstrip(b"\x00")
        if stripped:
            end, run = at + len(stripped), 0
        else:
            run += 1
        at += len(chunk)
    return end - pos


def _why_invalid(mf: MappedFile, pos: int, check_crc: bool) -> str:
    view = mf.view(pos, mf.file_size - pos)
    try:
        decode_record(view, 0, check_crc=check_crc)
    except CorruptRecordError as exc:
        return str(exc.args[0]).replace("offset 0", "this offset")  # without the error's own hint
    finally:
        view.release()
    return "record runs past the end of the file or is malformed"


def _check_control_block(root: str, report: CheckReport, problem, quiescent: bool,
                         live_positions: dict[str, int] | None = None) -> None:
    from mqstore import _shm

    path = os.path.join(root, "mqstore.shm")
    if not os.path.exists(path):
        return
    try:
        ctl = _shm.ControlBlock.attach(path)
    except (OSError, ValueError) as exc:
        problem("control block", 0, f"cannot attach: {exc}")
        return
    try:
        if ctl.state == _shm.STATE_BUILDING:
            return  # being rebuilt by an owner; nothing to compare yet
        # live: the positions read before the scan (the log had reached them then)
        pos = live_positions if live_positions is not None else ctl.positions()
        report.control_block = pos
        if not pos["flushed"] <= pos["committed"] <= pos["wrote"]:
            problem("control block", pos["wrote"], f"positions out of order: {pos}")
        if quiescent and pos["wrote"] != report.valid_end:
            problem("control block", pos["wrote"], f"wrote position {pos['wrote']} but the log ends at {report.valid_end}")
        if pos["wrote"] > report.valid_end:
            problem("control block", pos["wrote"], f"wrote position is past the end of the log {report.valid_end}")
        if quiescent:
            table = {(t, q): n for t, q, n in ctl.table_items()}
            for key, summary in report.queues.items():
                if table.get(key) != summary.last_offset + 1:
                    problem("control block", 0, f"queue {key[0]}-{key[1]}: table says next offset {table.get(key)}, "
                                                f"the log's last is {summary.last_offset}")
    finally:
        ctl.close()
