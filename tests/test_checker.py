"""The store-wide invariant checker on states a store really goes through: a torn tail after a
crash with the next files already pre-allocated, and a store being written while it runs."""

from __future__ import annotations

import os

from mqstore import Message, MessageStore
from mqstore.checker import check_store

FILE = 64 * 1024


def _filled_store(root: str, n: int = 10) -> tuple[int, list[str]]:
    """A closed store whose log ends in its first file; returns (end, file paths)."""
    with MessageStore(root, mapped_file_size_commit_log=FILE) as store:
        for i in range(n):
            store.put_message(Message("T", b"m%03d" % i)).check()
        end = store.commitlog.max_offset
    cdir = os.path.join(root, "commitlog")
    return end, sorted(os.path.join(cdir, f) for f in os.listdir(cdir))


def _write(path: str, pos: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(pos)
        f.write(data)


def test_torn_tail_before_empty_preallocated_files_is_a_torn_tail(tmp_path):
    root = str(tmp_path / "s")
    end, files = _filled_store(root)
    # the allocate service had created the next files ahead (all zero) when the writer died
    for k in (1, 2):
        with open(os.path.join(root, "commitlog", f"{k * FILE:020d}"), "wb") as f:
            f.truncate(FILE)
    torn = b"\x00\x00\x00\x80\xda\xa3\x20\xa7" + b"\x55" * 40  # a record header and part of its body
    _write(files[0], end, torn)
    report = check_store(root, allow_torn_tail=True)
    assert report.ok, report
    assert report.torn_tail_bytes == len(torn) and report.valid_end == end
    strict = check_store(root)
    assert not strict.ok and "not zero" in str(strict), strict


def test_live_check_ignores_bytes_past_the_wrote_position_read_before_the_scan(tmp_path):
    root = str(tmp_path / "s")
    end, files = _filled_store(root)
    half = b"\x00\x00\x00\x80\xda\xa3\x20\xa7\x01\x02"  # a record being copied in right now
    _write(files[0], end, half)
    live = check_store(root, quiescent=False)
    assert live.ok, live
    assert live.in_flight_bytes == len(half) and live.torn_tail_bytes == 0
    assert live.control_block is not None and live.control_block["wrote"] == end
    assert not check_store(root).ok  # a quiescent store must not have them


def test_live_check_still_reports_damage_below_the_wrote_position(tmp_path):
    root = str(tmp_path / "s")
    end, files = _filled_store(root)
    _write(files[0], 89, b"\xff")  # inside the first record's body (it starts at byte 88)
    report = check_store(root, quiescent=False)
    assert not report.ok
    assert "CRC" in str(report) and "hint:" not in str(report), str(report)
