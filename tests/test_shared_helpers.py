"""Helpers that had twins, each now one implementation every caller shares:

- the zero scans (mqstore.log.scan.is_zero / nonzero_extent), for loading, recovery, the checker
  and the read-only tools: what MappedFile.zero_dirty_tail zeroes, from a path or a mapping;
- why a record does not parse (mqstore.log.scan.why_invalid): ``verify`` and recovery say the same;
- how a ConsumeQueue unit disagrees with its record (mqstore.tools.checker.unit_mismatch): ``dump``
  notes what ``verify`` reports, transaction type and delivery time included;
- the index writer: ``IndexService.build_index`` (the serial dispatch) is
  ``put_key_hashes(index_key_triples(...))``, so it writes the files a parsed batch writes.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqstore import Message, MessageStore, StoreConfig
from mqstore.queue import index as index_mod
from mqstore.log._codec import decode_record, encode_record, java_string_hash
from mqstore.queue._index import index_key_hash
from mqstore.log._mapped import OS_PAGE_SIZE, MappedFile
from mqstore.queue._reput import BatchParser
from mqstore.tools.checker import check_store
from mqstore.log.checkpoint import StoreCheckpoint
from mqstore.tools.cli import main
from mqstore.queue.index import IndexService, index_key_triples
from mqstore.tools.inspection import plan_recovery
from mqstore.log.scan import CLEAN_PAGES, is_zero, nonzero_extent, why_invalid

FILE = 64 * 1024
CQ_FILE = 16 * 20
T0 = 1_700_000_000_000
_names = itertools.count()


# -- zero scans ---------------------------------------------------------------------------------
PAGES = 24


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(marks=st.lists(st.tuples(st.integers(0, PAGES * OS_PAGE_SIZE - 1), st.integers(1, 255)), max_size=6),
       start=st.integers(0, PAGES * OS_PAGE_SIZE), span=st.integers(0, PAGES * OS_PAGE_SIZE),
       clean_pages=st.sampled_from([1, 2, 5, CLEAN_PAGES]))
def test_zero_scans_agree_on_paths_buffers_and_mappings_and_with_zero_dirty_tail(tmp_path, marks, start, span,
                                                                                  clean_pages):
    size = PAGES * OS_PAGE_SIZE
    data = bytearray(size)
    for pos, value in marks:
        data[pos] = value
    mf = MappedFile.create(str(tmp_path / f"{next(_names):020d}"), size)
    try:
        mf.write_at(0, bytes(data))
        end = min(size, start + span)
        for src in (mf.path, bytes(data), mf):
            assert is_zero(src, start, end) == (data[start:end].count(0) == end - start)
            assert is_zero(src, start) == (data[start:].count(0) == size - start)
            assert nonzero_extent(src, start, end) == len(data[start:end].rstrip(b"\x00"))
            assert nonzero_extent(src, start) == len(data[start:].rstrip(b"\x00"))
        paged = [nonzero_extent(src, start, None, clean_pages) for src in (mf.path, bytes(data), mf)]
        assert paged == [mf.zero_dirty_tail(start, clean_pages) - start] * 3  # what recovery drops
    finally:
        mf.destroy(0)


def test_zero_scans_treat_bytes_past_the_end_as_zeros(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"\x00" * 10 + b"\x07")
    assert nonzero_extent(str(path), 0, 1 << 30) == 11 and nonzero_extent(str(path), 20) == 0
    assert is_zero(str(path), 11, 1 << 30) and not is_zero(str(path), 5, 1 << 30)
    assert is_zero(b"", 0, 8) and is_zero(str(path), 0, 0)


# -- why a record does not parse ----------------------------------------------------------------
def test_verify_and_recovery_name_the_same_reason_for_a_corrupt_record(tmp_path):
    root = str(tmp_path / "s")
    with MessageStore(root, mapped_file_size_commit_log=FILE, message_index_enable=False) as store:
        acks = [store.put_message(Message("T", b"m%03d" % i)).check() for i in range(5)]
    path = os.path.join(root, "commitlog", "0" * 20)
    victim = acks[3]
    with open(path, "r+b") as f:  # a byte of its body: the CRC no longer matches
        body_at = f.read().index(b"m003", victim.wrote_offset)
        f.seek(body_at)
        f.write(b"M")
    mf = MappedFile.open(path, FILE, readonly=True)
    try:
        reason = why_invalid(mf, victim.wrote_offset, True)
        assert "CRC" in reason and "this offset" in reason, reason
    finally:
        mf.close()
    report = check_store(root)
    assert not report.ok and any(reason in p.message for p in report.problems), report
    plan = plan_recovery(root, check_crc=True)
    assert plan.report.valid_end == victim.wrote_offset
    assert plan.report.stop_detail == (f"corrupt record in {'0' * 20} at {victim.wrote_offset}: "
                                       + reason.replace("this offset", "its start"))


# -- how a unit disagrees with its record ----------------------------------------------------------
def _write_unit(root: str, topic: str, qid: int, q: int, unit: tuple[int, int, int]) -> None:
    start = q * 20 - q * 20 % CQ_FILE
    with open(os.path.join(root, "consumequeue", topic, str(qid), f"{start:020d}"), "r+b") as f:
        f.seek(q * 20 % CQ_FILE)
        f.write(struct.pack(">qiq", *unit))


def _prepared_unit(root: str) -> tuple[str, int, int, str]:
    with MessageStore(root, mapped_file_size_commit_log=FILE, mapped_file_size_consume_queue=CQ_FILE,
                      message_index_enable=False) as store:
        for i in range(3):
            store.put_message(Message("T", b"m%d" % i, tags="A")).check()
        prepared = store.put_message(Message("T", b"half", tags="A", sys_flag=0x4)).check()
    _write_unit(root, "T", 0, 3, (prepared.wrote_offset, prepared.wrote_bytes, java_string_hash("A")))
    return "T", 0, 3, "it is a PREPARED transaction record"


def _early_delivery_time(root: str) -> tuple[str, int, int, str]:
    with MessageStore(root, mapped_file_size_commit_log=FILE, mapped_file_size_consume_queue=CQ_FILE,
                      message_index_enable=False) as store:
        later = store.put_message(Message("T", b"later", tags="A", properties={"DELAY": "2"})).check()
    _write_unit(root, "SCHEDULE_TOPIC_XXXX", 1, 0, (later.wrote_offset, later.wrote_bytes, later.store_timestamp - 1))
    return "SCHEDULE_TOPIC_XXXX", 1, 0, "is not a delivery time"


@pytest.mark.parametrize("damage", [_prepared_unit, _early_delivery_time])
def test_dump_notes_the_unit_mismatches_verify_reports(tmp_path, capsys, damage):
    root = str(tmp_path / "s")
    topic, qid, q, words = damage(root)
    found = [p for p in check_store(root).problems if p.where == f"consumequeue/{topic}/{qid}" and p.offset == q]
    assert found and words in found[0].message, found
    why = found[0].message.split("does not match the record there: ", 1)[1]
    assert main(["dump", root, "--topic", topic, "--queue", str(qid), "--from", str(q), "--json"]) == 0
    (entry,) = json.loads(capsys.readouterr().out)["records"]
    assert entry["note"] == f"the unit does not match the record: {why}"


# -- one index writer ------------------------------------------------------------------------------
SLOTS, NUM = 16, 9  # 8 keys per file: messages roll over files, some in the middle of their keys
WORDS = ["a", "k1", "ключ", "u😀", "", " ", "x y", "  p  q "]


def _service(root: str) -> IndexService:
    os.makedirs(root, exist_ok=True)
    service = IndexService(root, StoreConfig(max_hash_slot_num=SLOTS, max_index_num=NUM),
                           StoreCheckpoint(os.path.join(root, "checkpoint")))
    service.load(True)
    return service


def _index_files(root: str) -> dict[str, bytes]:
    directory = Path(root, "index")
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())} if directory.is_dir() else {}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(messages=st.lists(st.tuples(st.sampled_from(["T", "Töpic"]), st.sampled_from(WORDS + [None]),
                                   st.sampled_from(WORDS + [None]), st.sampled_from([0, 0x4, 0x8, 0xC])),
                         max_size=14),
       redispatch=st.integers(0, 14))
def test_build_index_and_put_key_hashes_write_identical_files(tmp_path, monkeypatch, messages, redispatch):
    """The serial dispatch (build_index per message) and the concurrent one (put_key_hashes of
    a parsed batch) index the same log into byte-identical files, re-dispatch included."""
    monkeypatch.setattr(index_mod, "_now_ms", lambda: T0)  # the same file names on both sides
    log = bytearray()
    for i, (topic, keys, uniq, sys_flag) in enumerate(messages):
        props = {**({"KEYS": keys} if keys is not None else {}), **({"UNIQ_KEY": uniq} if uniq is not None else {})}
        log += encode_record(topic=topic, body=b"m%d" % i, queue_offset=i, physical_offset=len(log),
                             sys_flag=sys_flag, store_timestamp=T0 + 1000 * i, properties=props or None)
    log = bytes(log)
    records = []
    at = 0
    while at < len(log):
        rec = decode_record(log, at, read_body=False)
        records.append(rec)
        at += rec.total_size
    batch = BatchParser().parse(log, 0, 0, len(log))
    again = sum(r.total_size for r in records[:redispatch])  # a re-dispatch from a record boundary
    base = str(tmp_path / f"run{next(_names)}")
    serial, batched = _service(base + "-serial"), _service(base + "-batch")
    try:
        for start in (0, again):
            for rec in records:
                if rec.physical_offset >= start:
                    assert serial.build_index(rec.topic, rec.properties.get("KEYS"), rec.properties.get("UNIQ_KEY"),
                                              rec.physical_offset, rec.store_timestamp, rec.sys_flag)
            keys = BatchParser().parse(log, 0, start, len(log)).index_keys if start else batch.index_keys
            assert batched.put_key_hashes(keys)
        assert _index_files(base + "-serial") == _index_files(base + "-batch")
    finally:
        serial.close()
        batched.close()
    expected = b"".join(index_key_triples(r.topic, r.properties.get("KEYS"), r.properties.get("UNIQ_KEY"),
                                          r.physical_offset, r.store_timestamp, r.sys_flag) for r in records)
    assert expected == batch.index_keys  # the same hashes, in the same order, ROLLBACK left out


def test_index_key_triples_follow_build_index_semantics():
    triple = struct.Struct("=qqq")
    assert index_key_triples("T", " k1  k2 ", "U", 100, T0, 0x8) == b"".join(
        triple.pack(100, T0, index_key_hash(k)) for k in ("T#U", "T#k1", "T#k2"))
    assert index_key_triples("T", "k1", "U", 100, T0, 0xC) == b""  # ROLLBACK
    assert index_key_triples("T", "", None, 100, T0, 0) == index_key_triples("T", None, "", 100, T0, 0) == b""


def test_serial_and_concurrent_dispatch_build_the_same_index(tmp_path):
    """One log dispatched from scratch by each mode: the same index files (names aside, they
    are the local time of creation)."""
    source = str(tmp_path / "source")
    small = {"mapped_file_size_commit_log": FILE, "mapped_file_size_consume_queue": CQ_FILE,
             "max_hash_slot_num": SLOTS, "max_index_num": 40}
    with MessageStore(source, **small) as store:
        for i in range(60):
            store.put_message(Message("T", b"m%d" % i, keys=[f"k{i}", f"g{i % 3}"] if i % 4 else None,
                                      sys_flag=0xC if i % 9 == 0 else 0)).check()
    built = {}
    for concurrently in (False, True):
        root = str(tmp_path / f"concurrent-{concurrently}")
        os.makedirs(root)
        shutil.copytree(os.path.join(source, "commitlog"), os.path.join(root, "commitlog"))
        with MessageStore(root, enable_build_consume_queue_concurrently=concurrently, **small) as store:
            store.wait_dispatched()
        built[concurrently] = list(_index_files(root).values())
    assert len(built[False]) > 1 and built[False] == built[True]
