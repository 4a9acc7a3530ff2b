"""The store-wide invariant checker on states a store really goes through: a torn tail after a
crash with the next files already pre-allocated, and a store being written while it runs;
then ConsumeQueues and index files checked against the log, clean and damaged."""

from __future__ import annotations

import importlib.util
import os
import struct
from datetime import datetime

import pytest

from mqstore import Message, MessageStore, StoreConfig
from mqstore.log._codec import BLANK_MAGIC_CODE, decode_record, java_string_hash
from mqstore.tools.checker import CheckReport, Problem, check_store, index_key_hash

FILE = 64 * 1024
CQ_FILE = 16 * 20  # 16 units per ConsumeQueue file: queues span several files
INDEX_GEOMETRY = {"max_hash_slot_num": 64, "max_index_num": 400}
# The index (mqstore.queue.index) may not exist yet: then stores are opened without it and the tests
# write the index file themselves, as spec §4.2 putKey does.
HAVE_INDEX = importlib.util.find_spec("mqstore.queue.index") is not None
STORE_DEFAULTS = INDEX_GEOMETRY if HAVE_INDEX else {"message_index_enable": False}
FILLER = (0, 0x7FFFFFFF, 0)


def _filled_store(root: str, n: int = 10) -> tuple[int, list[str]]:
    """A closed store whose log ends in its first file; returns (end, file paths)."""
    with MessageStore(root, mapped_file_size_commit_log=FILE, **STORE_DEFAULTS) as store:
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


# -- ConsumeQueues ----------------------------------------------------------------------------
def _config(**overrides) -> StoreConfig:
    return StoreConfig().replace(**{"mapped_file_size_commit_log": FILE, "mapped_file_size_consume_queue": CQ_FILE,
                                    **STORE_DEFAULTS, **INDEX_GEOMETRY, **overrides})


def _store(root: str, n: int = 100, queues: int = 3, body: int = 60, **overrides) -> tuple[StoreConfig, list]:
    """A closed store of n messages on topic T over `queues` queues, with tags and keys."""
    cfg = _config(**overrides)
    with MessageStore(root, cfg) as store:
        results = [store.put_message(Message("T", b"b%05d-" % i + b"x" * body, queue_id=i % queues,
                                             tags=f"Tag{i % 2}", keys=[f"k{i}", f"id-{i % 7}"] if i % 5 else None))
                   .check() for i in range(n)]
    return cfg, results


def _cq_path(root: str, topic: str, qid: int, q: int) -> tuple[str, int]:
    start = q * 20 - q * 20 % CQ_FILE
    return os.path.join(root, "consumequeue", topic, str(qid), f"{start:020d}"), q * 20 % CQ_FILE


def _read_unit(root: str, topic: str, qid: int, q: int) -> tuple[int, int, int]:
    path, pos = _cq_path(root, topic, qid, q)
    with open(path, "rb") as f:
        f.seek(pos)
        return struct.unpack(">qiq", f.read(20))


def _write_unit(root: str, topic: str, qid: int, q: int, unit: tuple[int, int, int]) -> None:
    path, pos = _cq_path(root, topic, qid, q)
    _write(path, pos, struct.pack(">qiq", *unit))


def _problems_at(report: CheckReport, where: str, offset: int) -> list[Problem]:
    return [p for p in report.problems if p.where == where and p.offset == offset]


def test_a_clean_store_has_its_queues_checked(tmp_path):
    root = str(tmp_path / "s")
    cfg, results = _store(root, 100)
    for config in (cfg, None):  # the file size inferred from the files without a config
        report = check_store(root, config=config)
        assert report.ok, report
        assert report.queues_complete_checked
        assert sorted(report.consume_queues) == [("T", 0), ("T", 1), ("T", 2)]
        s = report.consume_queues[("T", 0)]
        assert (s.min_offset, s.max_offset, s.units, s.fillers, s.gaps, s.removed) == (0, 34, 34, 0, 0, 0)
        assert s.files == 3  # 16 units per file
        assert report.consume_queues[("T", 2)].max_offset == 33


def _swap(root: str, results) -> None:
    a, b = _read_unit(root, "T", 1, 4), _read_unit(root, "T", 1, 5)
    _write_unit(root, "T", 1, 4, b)
    _write_unit(root, "T", 1, 5, a)


def _unit_of(result, tags: str, *, phy_delta: int = 0, size_delta: int = 0) -> tuple[int, int, int]:
    return result.wrote_offset + phy_delta, result.wrote_bytes + size_delta, java_string_hash(tags)


# name: (damage(root, results) to the unit of T-1 at queue offset 5, words in the problem).
# results[16] is that unit's record (tags Tag0); results[15] is a record of queue T-0.
DAMAGE = {
    "phy of a record of another queue": (
        lambda root, r: _write_unit(root, "T", 1, 5, _unit_of(r[15], "Tag1")), "belongs to queue T-0"),
    "phy inside a record": (
        lambda root, r: _write_unit(root, "T", 1, 5, _unit_of(r[16], "Tag0", phy_delta=4)), "no record starts there"),
    "wrong size": (
        lambda root, r: _write_unit(root, "T", 1, 5, _unit_of(r[16], "Tag0", size_delta=1)), "TOTALSIZE is"),
    "wrong tags": (
        lambda root, r: _write_unit(root, "T", 1, 5, _unit_of(r[16], "Tag1")),
        f"its tags code is {java_string_hash('Tag0')} (TAGS 'Tag0')"),
    "swapped units": (_swap, "is not above the previous unit's"),
}


@pytest.mark.parametrize("name", list(DAMAGE))
def test_a_damaged_unit_is_reported_with_its_queue_and_offset(tmp_path, name):
    root = str(tmp_path / "s")
    cfg, results = _store(root, 100)
    assert results[16].queue_offset == 5 and results[16].wrote_offset == _read_unit(root, "T", 1, 5)[0]
    damage, words = DAMAGE[name]
    damage(root, results)
    q = 5
    report = check_store(root, config=cfg)
    assert not report.ok
    found = _problems_at(report, "consumequeue/T/1", q)
    assert found and words in found[0].message, report
    assert f"consumequeue/T/1 @ {q}: " in str(found[0])
    if name == "swapped units":
        assert "QUEUEOFFSET is 5" in _problems_at(report, "consumequeue/T/1", 4)[0].message
    # nothing else is blamed: the log and the other queues are fine
    assert {p.where for p in report.problems} == {"consumequeue/T/1"}, report


def test_a_unit_pointing_at_a_prepared_record_is_reported(tmp_path):
    root = str(tmp_path / "s")
    cfg = _config()
    with MessageStore(root, cfg) as store:
        for i in range(6):
            store.put_message(Message("T", b"m%d" % i, tags="A")).check()
        prepared = store.put_message(Message("T", b"half", tags="A", sys_flag=0x4)).check()
    assert check_store(root, config=cfg).ok  # a PREPARED record gets no unit
    assert check_store(root).consume_queues[("T", 0)].max_offset == 6
    _write_unit(root, "T", 0, 6, (prepared.wrote_offset, prepared.wrote_bytes, java_string_hash("A")))
    report = check_store(root, config=cfg)
    found = _problems_at(report, "consumequeue/T/0", 6)
    assert found and "PREPARED transaction record" in found[0].message, report


def test_a_unit_whose_record_is_gone_is_reported(tmp_path):
    root = str(tmp_path / "s")
    cfg, results = _store(root, 30)
    last = results[-1]  # queue T-2, offset 9: cut it off the log, as if it had never been written
    path = os.path.join(root, "commitlog", "0" * 20)
    _write(path, last.wrote_offset, b"\x00" * last.wrote_bytes)
    report = check_store(root, config=cfg)
    found = _problems_at(report, "consumequeue/T/2", 9)
    assert found and f"points at {last.wrote_offset}, past the end of the log" in found[0].message, report
    # in a running store such a unit (and the record's two index entries) belong to a record
    # written after the scan
    live = check_store(root, config=cfg, quiescent=False)
    assert live.in_flight_units == (3 if HAVE_INDEX else 1) and not any(p.where.startswith("consumequeue") for p in live.problems), live


def test_a_zero_unit_in_the_middle_ends_the_queue(tmp_path):
    root = str(tmp_path / "s")
    cfg, results = _store(root, 100)
    _write_unit(root, "T", 1, 3, (0, 0, 0))  # what recovery would take for the end of the queue
    report = check_store(root, config=cfg)
    assert report.consume_queues[("T", 1)].max_offset == 3
    assert "non-zero bytes follow the end of the queue" in _problems_at(report, "consumequeue/T/1", 3)[0].message
    assert "holds units after the end of the queue at offset 3" in _problems_at(report, "consumequeue/T/1", 16)[0].message
    assert any("queue offsets 3..32" in p.message for p in _problems_at(report, "consumequeue/T/1", 3)), report


def test_units_of_records_removed_by_retention_are_allowed(tmp_path):
    root = str(tmp_path / "s")
    cfg, results = _store(root, 1200, body=100)
    first_kept = FILE
    assert results[-1].wrote_offset > 2 * FILE  # three CommitLog files
    os.unlink(os.path.join(root, "commitlog", "0" * 20))  # retention removed the first one
    report = check_store(root, config=cfg)
    assert report.ok, report
    removed = sum(1 for r in results if r.wrote_offset < first_kept)
    assert sum(s.removed for s in report.consume_queues.values()) == removed
    s = report.consume_queues[("T", 0)]
    assert s.min_offset == report.queues[("T", 0)].first_offset > 0 and s.max_offset == 400

    # a queue that starts above 0 is pre-filled with filler units (spec §3 step 3)
    for r in results:
        if r.wrote_offset < first_kept and r.queue_offset < 16:  # its queue's first file
            qid = results.index(r) % 3
            _write_unit(root, "T", qid, r.queue_offset, FILLER)
    report = check_store(root, config=cfg)
    assert report.ok, report
    assert report.consume_queues[("T", 0)].fillers == 16 and report.consume_queues[("T", 0)].gaps == 0


def test_a_missing_tail_unit_fails_a_clean_store_only(tmp_path):
    root = str(tmp_path / "s")
    cfg, results = _store(root, 100)
    last_q = results[98].queue_offset  # the last message of T-2
    assert last_q == 32
    _write_unit(root, "T", 2, last_q, (0, 0, 0))
    report = check_store(root, config=cfg)
    found = _problems_at(report, "consumequeue/T/2", last_q)
    assert found and "no unit for the log's record of queue offset 32" in found[0].message, report
    assert "the queue ends at offset 32" in found[0].message and str(results[98].wrote_offset) in found[0].message
    assert len(report.problems) == 1

    assert check_store(root, config=cfg, check_queues_complete=False).ok  # existing units are fine
    assert check_store(root, config=cfg, quiescent=False).ok  # a running store dispatches behind the writer
    open(os.path.join(root, "abort"), "wb").close()  # crashed: the next open rebuilds the unit
    crashed = check_store(root, config=cfg)
    assert crashed.ok and not crashed.queues_complete_checked, crashed
    assert crashed.consume_queues[("T", 2)].max_offset == 32
    assert not check_store(root, config=cfg, check_queues_complete=True).ok


def test_a_filler_where_the_log_has_a_record_is_a_gap(tmp_path):
    root = str(tmp_path / "s")
    cfg, results = _store(root, 100)
    _write_unit(root, "T", 0, 7, FILLER)  # the dispatcher skipped offset 7
    report = check_store(root, config=cfg)
    found = _problems_at(report, "consumequeue/T/0", 7)
    assert found and "filler units stand there" in found[0].message, report
    assert report.consume_queues[("T", 0)].gaps == 1 and report.consume_queues[("T", 0)].units == 33
    open(os.path.join(root, "abort"), "wb").close()
    crashed = check_store(root, config=cfg)
    assert crashed.ok and crashed.consume_queues[("T", 0)].gaps == 1, crashed


def test_queue_files_must_have_one_size_and_follow_each_other(tmp_path):
    root = str(tmp_path / "s")
    cfg, _ = _store(root, 100)
    qdir = os.path.join(root, "consumequeue", "T", "1")
    os.makedirs(os.path.join(root, "consumequeue", "T", "not-a-queue"))  # ignored, like the loader does
    with open(os.path.join(root, "consumequeue", "T", "not-a-queue", "x"), "wb") as f:
        f.write(b"junk")
    assert check_store(root, config=cfg).ok

    os.unlink(os.path.join(qdir, f"{CQ_FILE:020d}"))  # the middle file of three
    report = check_store(root, config=cfg)
    assert _problems_at(report, "consumequeue/T/1", 32) and "does not follow" in str(report), report
    missing = _problems_at(report, "consumequeue/T/1", 16)
    assert missing and "offsets 16..31" in missing[0].message and "no ConsumeQueue file holds them" in str(report)

    with open(os.path.join(qdir, f"{2 * CQ_FILE:020d}"), "ab") as f:
        f.write(b"\x00" * 20)
    report = check_store(root)  # inferred: the other queues' files are CQ_FILE bytes
    assert f"is {CQ_FILE + 20} bytes; the size of the other ConsumeQueue files is {CQ_FILE}" in str(report), report
    report = check_store(root, config=cfg)
    assert f"is {CQ_FILE + 20} bytes; the configured size is {CQ_FILE}" in str(report), report


def test_a_missing_queue_directory_is_reported(tmp_path):
    root = str(tmp_path / "s")
    cfg, _ = _store(root, 30)
    qdir = os.path.join(root, "consumequeue", "T", "1")
    for name in os.listdir(qdir):
        os.unlink(os.path.join(qdir, name))
    os.rmdir(qdir)
    report = check_store(root, config=cfg)
    found = _problems_at(report, "consumequeue/T/1", 0)
    assert found and "no ConsumeQueue for the log's 10 record(s) of offsets 0..9" in found[0].message, report


def test_delayed_messages_carry_their_delivery_time(tmp_path):
    root = str(tmp_path / "s")
    cfg = _config()
    with MessageStore(root, cfg) as store:
        r = store.put_message(Message("T", b"later", tags="TagA", properties={"DELAY": "2"})).check()
        store.put_message(Message("T", b"now", tags="TagA")).check()
    report = check_store(root, config=cfg)
    assert report.ok, report
    assert ("SCHEDULE_TOPIC_XXXX", 1) in report.consume_queues  # level 2 -> queue 1
    phy, size, tags = _read_unit(root, "SCHEDULE_TOPIC_XXXX", 1, 0)
    assert phy == r.wrote_offset and tags >= r.store_timestamp and tags != java_string_hash("TagA")
    _write_unit(root, "SCHEDULE_TOPIC_XXXX", 1, 0, (phy, size, r.store_timestamp - 1))
    report = check_store(root, config=cfg)
    found = _problems_at(report, "consumequeue/SCHEDULE_TOPIC_XXXX/1", 0)
    assert found and "is not a delivery time" in found[0].message, report


# -- index files ------------------------------------------------------------------------------
def _records(root: str):
    """Every record of the log in order (decoded)."""
    cdir = os.path.join(root, "commitlog")
    for name in sorted(os.listdir(cdir)):
        data = open(os.path.join(cdir, name), "rb").read()
        pos = 0
        while pos + 8 <= len(data):
            size, magic = struct.unpack_from(">ii", data, pos)
            if size <= 0 or magic == BLANK_MAGIC_CODE:
                break
            yield decode_record(data, pos, read_body=False)
            pos += size


def _write_index(root: str, cfg: StoreConfig) -> str:
    """Build the index file of the log as spec §4.2 putKey does; returns its path."""
    slots, num = cfg.max_hash_slot_num, cfg.max_index_num
    buf = bytearray(40 + 4 * slots + 20 * num)
    begin_ts = end_ts = begin_phy = end_phy = slot_count = 0
    count = 1
    for rec in _records(root):
        if rec.transaction_type == 0xC:
            continue
        keys = ([f"{rec.topic}#{rec.uniq_key}"] if rec.uniq_key else []) + [f"{rec.topic}#{k}" for k in rec.keys]
        for key in keys:
            assert count < num
            key_hash = index_key_hash(key)
            slot = key_hash % slots
            prev = struct.unpack_from(">i", buf, 40 + 4 * slot)[0]
            prev = 0 if prev <= 0 or prev > count else prev
            diff = 0 if begin_ts <= 0 else max(0, min((rec.store_timestamp - begin_ts) // 1000, 2**31 - 1))
            struct.pack_into(">iqii", buf, 40 + 4 * slots + 20 * count, key_hash, rec.physical_offset, diff, prev)
            struct.pack_into(">i", buf, 40 + 4 * slot, count)
            if count <= 1:
                begin_phy, begin_ts = rec.physical_offset, rec.store_timestamp
            slot_count += prev == 0
            count += 1
            end_phy, end_ts = rec.physical_offset, rec.store_timestamp
    struct.pack_into(">qqqqii", buf, 0, begin_ts, end_ts, begin_phy, end_phy, slot_count, count)
    os.makedirs(os.path.join(root, "index"), exist_ok=True)
    path = os.path.join(root, "index", datetime.now().strftime("%Y%m%d%H%M%S%f")[:17])
    with open(path, "wb") as f:
        f.write(buf)
    return path


def _indexed_store(root: str) -> tuple[StoreConfig, str, int]:
    """A closed store with keys and its index file: (config, index file path, keys indexed)."""
    cfg, results = _store(root, 60)
    keys = sum(len(r.keys) + (r.uniq_key is not None) for r in _records(root))
    if HAVE_INDEX:
        names = os.listdir(os.path.join(root, "index"))
        assert len(names) == 1, names
        path = os.path.join(root, "index", names[0])
    else:
        path = _write_index(root, cfg)
    return cfg, path, keys


def _entry_pos(cfg: StoreConfig, n: int) -> int:
    return 40 + 4 * cfg.max_hash_slot_num + 20 * n


def test_index_entries_are_checked_against_their_records(tmp_path):
    root = str(tmp_path / "s")
    cfg, path, keys = _indexed_store(root)
    assert keys > 60
    report = check_store(root, config=cfg)
    assert report.ok, report
    assert report.index_entries == keys and len(report.index_files) == 1
    summary = report.index_files[0]
    assert summary.entries_checked and summary.index_count == keys + 1 and summary.name == os.path.basename(path)

    plain = check_store(root)  # default geometry: 420000040-byte files; this one is small
    assert plain.ok and plain.index_entries == 0 and not plain.index_files[0].entries_checked
    assert any("only its header was checked" in note for note in plain.notes), plain.notes


def test_a_corrupted_index_entry_is_reported(tmp_path):
    root = str(tmp_path / "s")
    cfg, path, _ = _indexed_store(root)
    name = f"index/{os.path.basename(path)}"
    with open(path, "rb") as f:
        f.seek(_entry_pos(cfg, 7))
        key_hash = struct.unpack(">i", f.read(4))[0]
    _write(path, _entry_pos(cfg, 7), struct.pack(">i", key_hash ^ 0x100))
    report = check_store(root, config=cfg)
    found = _problems_at(report, name, 7)
    assert found and f"keyHash {key_hash ^ 0x100} is the hash of none of the keys" in found[0].message, report
    assert "'T#k" in found[0].message  # names the record's keys

    _write(path, _entry_pos(cfg, 7), struct.pack(">i", key_hash))
    assert check_store(root, config=cfg).ok
    _write(path, _entry_pos(cfg, 9) + 16, struct.pack(">i", 9))  # entry 9 chained to itself
    report = check_store(root, config=cfg)
    found = _problems_at(report, name, 9)
    assert found and "previous entry 9 is not an older entry" in found[0].message, report

    _write(path, 36, struct.pack(">i", -3))  # index_count
    report = check_store(root, config=cfg)
    assert _problems_at(report, name, 0) and "index_count -3" in str(report), report


def test_an_index_file_of_the_wrong_size_for_the_config_is_reported(tmp_path):
    root = str(tmp_path / "s")
    cfg, path, _ = _indexed_store(root)
    other = cfg.replace(max_hash_slot_num=65)
    report = check_store(root, config=other)
    assert not report.ok and "max_hash_slot_num=65 and max_index_num=400 make" in str(report), report
