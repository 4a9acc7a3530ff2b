"""The clean-close record (mqstore.log.clean_close): a clean shutdown writes down the write
position, the CRC of the bytes before it and every queue's next offset, and the next open takes
them instead of scanning the last CommitLog files; a record that disagrees with the files, or
an abort file, gives RocketMQ's scan."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap

import pytest

from mqstore import Message, MessageStore
from mqstore.errors import CorruptRecordError
from mqstore.log import clean_close
from mqstore.status import GetMessageStatus
from mqstore.tools.checker import check_store

from helpers_store import REPO, read_queue

SMALL = {"mapped_file_size_commit_log": 64 * 1024, "mapped_file_size_consume_queue": 20 * 100}
RECORD = "mqstore.clean.json"


def fill(root: str, n: int = 600) -> None:
    """n messages over 2 topics x 3 queues, some keyed (several CommitLog files)."""
    with MessageStore(root, **SMALL) as store:
        for i in range(n):
            store.put_message(Message("AB"[i % 2], b"m%d-" % i + b"x" * (i % 90), queue_id=i % 3,
                                      keys=f"k{i}" if i % 5 == 0 else None)).check()


def state(store: MessageStore) -> dict[str, object]:
    """What an open restored: positions, every queue's offsets and contents, the table."""
    queues = {f"{t}/{q}": (store.get_min_offset_in_queue(t, q), store.get_max_offset_in_queue(t, q),
                           store.next_queue_offset(t, q), [bytes(m.body) for m in read_queue(store, t, q)])
              for t in "AB" for q in range(3)}
    pos = store.positions()
    return {"queues": queues, "max_phy": store.max_phy_offset, "min_phy": store.min_phy_offset,
            "last_store_timestamp": store.ctl.get("last_store_timestamp"), "wrote": pos["wrote"]}


@pytest.fixture
def closed(tmp_path):
    root = str(tmp_path / "store")
    fill(root)
    assert os.path.exists(os.path.join(root, RECORD)) and not os.path.exists(os.path.join(root, "abort"))
    return root


def _scanned_copy(root: str, dst: str) -> str:
    shutil.copytree(root, dst)
    os.unlink(os.path.join(dst, RECORD))
    return dst


def test_a_clean_reopen_takes_the_record_and_restores_what_a_scan_restores(closed, tmp_path):
    scanned = _scanned_copy(closed, str(tmp_path / "scanned"))
    with MessageStore(closed, **SMALL) as store:
        r = store.recovery
        assert (r.stop_reason, r.records, r.files_scanned, r.clean_close_problem) == ("clean-close record", 0, 0, "")
        assert "valid end from the clean-close record (no scan)" in r.summary() and not r.damaged
        assert not os.path.exists(os.path.join(closed, RECORD)), "removed before anything is written"
        with_record = state(store)
        assert [bytes(m.body) for m in store.query_message("A", "k10", 10, 0, 2**62).messages] == [b"m10-" + b"x" * 10]
    with MessageStore(scanned, **SMALL) as store:
        assert store.recovery.stop_reason != "clean-close record" and store.recovery.records > 0
        assert state(store) == with_record
    check_store(closed).raise_if_failed()


def test_the_record_names_the_table_and_the_tail(closed):
    record, why = clean_close.read(closed)
    assert record is not None and why == ""
    with MessageStore(closed, **SMALL) as store:
        assert record.wrote == store.max_phy_offset
        assert sorted(record.table) == sorted((t, q, store.next_queue_offset(t, q)) for t in "AB" for q in range(3))
        assert record.last_store_timestamp == store.ctl.get("last_store_timestamp") > 0
        assert clean_close.tail_crc(store.commitlog.queue, record.wrote) == record.tail_crc


def test_puts_after_a_reopen_continue_the_queues(closed):
    with MessageStore(closed, **SMALL) as store:
        before = store.next_queue_offset("A", 0)
        assert store.put_message(Message("A", b"after", queue_id=0)).check().queue_offset == before
    with MessageStore(closed, **SMALL) as store:  # a second record, written by this session
        assert store.recovery.stop_reason == "clean-close record"
        assert bytes(store.look_message_by_queue_offset("A", 0, before).body) == b"after"


def _edit_record(root: str, **fields: object) -> None:
    path = os.path.join(root, RECORD)
    with open(path) as fh:
        data = json.load(fh)
    data.update(fields)
    with open(path, "w") as fh:
        json.dump(data, fh)


def _last_file(root: str) -> str:
    d = os.path.join(root, "commitlog")
    return os.path.join(d, sorted(os.listdir(d))[-1])


@pytest.mark.parametrize("damage, problem", [
    ("tail byte", "bytes before"),
    ("wrote past the log", "outside the CommitLog files"),
    ("wrote earlier", "bytes before"),
    ("crc", "bytes before"),
    ("bytes after the end", "bytes follow"),
    ("file gone", "outside the CommitLog files"),
])
def test_a_record_that_disagrees_with_the_files_gives_the_scan(closed, damage, problem):
    record, _ = clean_close.read(closed)
    assert record is not None
    fs = SMALL["mapped_file_size_commit_log"]
    path = os.path.join(closed, "commitlog", f"{record.wrote - record.wrote % fs:020d}")
    if damage == "tail byte":
        with open(path, "r+b") as fh:  # the last record's last body byte
            fh.seek(record.wrote % fs - 1)
            fh.write(b"\xff")
    elif damage == "wrote past the log":
        _edit_record(closed, wrote=record.wrote + 10 * fs)
    elif damage == "wrote earlier":
        _edit_record(closed, wrote=record.wrote - 1)
    elif damage == "crc":
        _edit_record(closed, tail_crc=record.tail_crc ^ 1)
    elif damage == "bytes after the end":
        with open(path, "r+b") as fh:
            fh.seek(record.wrote % fs)
            fh.write(b"\x00\x00\x00\x60\xda\xa3\x20\xa7")  # the start of a record no put acknowledged
    else:
        os.unlink(_last_file(closed))
    with MessageStore(closed, **SMALL) as store:
        r = store.recovery
        assert problem in r.clean_close_problem and r.stop_reason != "clean-close record" and r.records > 0
        assert "the clean-close record was not used" in r.summary()
    check_store(closed).raise_if_failed()


@pytest.mark.parametrize("text", ["{", '{"version": 2, "wrote": 0, "tail_crc": 0, "last_store_timestamp": 0, "table": []}',
                                  '{"version": 1}', '{"version": 1, "wrote": -5, "tail_crc": 0, '
                                  '"last_store_timestamp": 0, "table": []}'])
def test_an_unreadable_record_gives_the_scan(closed, text, caplog):
    with open(os.path.join(closed, RECORD), "w") as fh:
        fh.write(text)
    with MessageStore(closed, **SMALL) as store:
        assert store.recovery.stop_reason != "clean-close record" and store.recovery.records > 0
        assert sum(store.get_max_offset_in_queue(t, q) for t in "AB" for q in range(3)) == 600
    assert any(RECORD in rec.getMessage() for rec in caplog.records)


def test_after_a_crash_the_record_is_ignored(tmp_path):
    """A writer killed after a clean reopen: abort is there, the record was removed at open."""
    root = str(tmp_path / "store")
    fill(root, 200)
    code = textwrap.dedent(f"""
        import os, signal
        from mqstore import Message, MessageStore
        s = MessageStore({root!r}, **{SMALL!r})
        for i in range(50):
            s.put_message(Message("A", b"late-%d" % i, queue_id=0)).check()
        s.wait_dispatched()
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    assert os.path.exists(os.path.join(root, "abort")) and not os.path.exists(os.path.join(root, RECORD))
    with MessageStore(root, **SMALL) as store:
        assert not store.last_exit_ok and store.recovery.stop_reason != "clean-close record"
        assert store.get_max_offset_in_queue("A", 0) == 34 + 50  # 200 messages: 34 in A/0, then the 50


def test_damage_older_than_the_tail_is_found_by_reads_not_by_the_open(closed):
    """The decision (docs/format.md): with the record, the open does not re-read older records;
    a body damaged after a clean close keeps every later message, and a read refuses it."""
    with MessageStore(closed, **SMALL) as store:
        victim = store.look_message_by_queue_offset("A", 0, 3)
        phy, offset = victim.physical_offset, 3
    fs = SMALL["mapped_file_size_commit_log"]
    with open(os.path.join(closed, "commitlog", f"{phy - phy % fs:020d}"), "r+b") as fh:
        fh.seek(phy % fs + victim.total_size - 1)  # the body's last byte (no properties)
        byte = fh.read(1)
        fh.seek(-1, os.SEEK_CUR)
        fh.write(bytes([byte[0] ^ 0x01]))
    with MessageStore(closed, **SMALL) as store:
        assert store.recovery.stop_reason == "clean-close record"
        assert sum(store.get_max_offset_in_queue(t, q) for t in "AB" for q in range(3)) == 600
        r = store.get_message("g", "A", 0, offset, 4)
        assert r.status == GetMessageStatus.MESSAGE_CORRUPTED
        with pytest.raises(CorruptRecordError):
            store.look_message_by_queue_offset("A", 0, offset)
        assert bytes(store.look_message_by_queue_offset("A", 0, offset + 1).body).startswith(b"m")
    report = check_store(closed)
    assert not report.ok and any(str(phy) in str(p) for p in report.problems)
