"""Body CRC checked on read (issue 15 item 3, check_crc_on_read).

Real messages are put through the public API into a store of small CommitLog files, the store
is shut down, a bit of a body in an older file is flipped on disk (a clean open CRC-scans only
the last three files, so recovery does not see it) and the store is reopened: get_message
stops before the damaged message or answers MESSAGE_CORRUPTED naming its offsets, the look-ups
raise CorruptRecordError, query_message skips it, undamaged messages still read, and with
check_crc_on_read=false the flipped bytes come back as data. The CRC kernel
(mqstore.queue._search.crc32 / record_status / first_corrupt) and the checked getMessage are
compared with their pure-Python twin (mqstore.twin.reads) with hypothesis.
"""

from __future__ import annotations

import logging
import os
import tempfile
import zlib
from array import array
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mqstore import Message, MessageStore
from mqstore.log._codec import encode_record
from mqstore.log._mapped import MappedFile
from mqstore.queue._reads import LogMap
from mqstore.queue._search import (CRC_FOLDED, RECORD_CRC_MISMATCH, RECORD_MALFORMED, RECORD_OK, crc32, first_corrupt,
                             record_status)
from mqstore.config import DEFINITIONS, StoreConfig
from mqstore.errors import CorruptRecordError
from mqstore.queue.reads import CorruptedMessageResult
from mqstore.status import GetMessageStatus as S
from mqstore.twin import reads as twin

FILE = 64 * 1024
TOPIC = "CrcTopic"
N = 300  # ~1 KiB records: five CommitLog files of 64 KiB
CFG = {"mapped_file_size_commit_log": FILE, "max_message_size": 16 * 1024}
ON = {**CFG, "check_crc_on_read": True}  # the default, spelled out


def body_of(i: int) -> bytes:
    return (b"body-%05d|" % i) * 100  # 1000 bytes, unique per message


def make_store(root: str, n: int = N, **overrides: object) -> list[int]:
    """Put n messages (key k<i>, tags A/B alternating) and shut down; their physical offsets."""
    store = MessageStore(root, **{**CFG, **overrides})  # type: ignore[arg-type]
    phys = []
    for i in range(n):
        r = store.put_message(Message(TOPIC, body_of(i), tags="AB"[i % 2], keys=[f"k{i}"]))
        r.check()
        phys.append(r.wrote_offset)
    assert store.wait_dispatched()
    store.shutdown()
    assert len(os.listdir(os.path.join(root, "commitlog"))) >= 5
    return phys


def record_bytes(root: str, phy: int) -> tuple[str, int, bytes]:
    """(file path, position in the file, the rest of the file from phy)."""
    path = os.path.join(root, "commitlog", f"{phy - phy % FILE:020d}")
    with open(path, "rb") as f:
        f.seek(phy % FILE)
        return path, phy % FILE, f.read()


def flip(root: str, phy: int, find: bytes, delta: int = 0, bit: int = 0x01) -> None:
    """Flip a bit of the record at phy: in the first byte of find inside it, plus delta."""
    path, pos, rest = record_bytes(root, phy)
    size = int.from_bytes(rest[:4], "big")
    at = rest[:size].index(find) + delta
    with open(path, "r+b") as f:
        f.seek(pos + at)
        byte = f.read(1)[0]
        f.seek(pos + at)
        f.write(bytes([byte ^ bit]))


@pytest.fixture
def damaged(tmp_path: Path) -> tuple[str, list[int], int]:
    """A store whose message 10 (in its first CommitLog file) has a flipped body bit."""
    root = str(tmp_path / "store")
    phys = make_store(root)
    assert phys[10] < FILE  # the oldest file: a clean open does not CRC-scan it
    flip(root, phys[10], body_of(10), delta=500)
    return root, phys, 10


# -- the store through its public API --------------------------------------------------------------

def test_the_setting_is_an_mqstore_key_and_on_by_default() -> None:
    d = DEFINITIONS["check_crc_on_read"]
    assert (d.type, d.default, d.origin, d.java_name) == (bool, True, "mqstore", None)
    assert StoreConfig().check_crc_on_read is True
    assert StoreConfig(check_crc_on_read="false").check_crc_on_read is False
    assert "check_crc_on_read" in (Path(__file__).parent.parent / "docs" / "config.md").read_text()


def test_a_clean_reopen_does_not_see_the_damage_but_a_read_does(damaged, caplog) -> None:
    root, phys, bad = damaged
    with MessageStore(root, **ON) as store:  # type: ignore[arg-type]
        assert store.get_max_offset_in_queue(TOPIC, 0) == N  # recovery kept every message
        first = store.get_message("g", TOPIC, 0, 0, 32)
        assert (first.status, len(first), first.next_begin_offset) == (S.FOUND, bad, bad)
        assert first.physical_offsets == phys[:bad]
        assert [bytes(m.body) for m in first] == [body_of(i) for i in range(bad)]
        assert first.buffer_total_size == sum(m.total_size for m in first)

        with caplog.at_level(logging.ERROR, logger="mqstore.reads"):
            got = store.get_message("g", TOPIC, 0, bad, 32)
        assert isinstance(got, CorruptedMessageResult)
        assert got.status is S.MESSAGE_CORRUPTED and int(got.status) == 9
        assert len(got) == 0 and list(got) == []
        assert got.next_begin_offset == bad  # nothing is skipped silently
        assert (got.corrupt_physical_offset, got.corrupt_queue_offset) == (phys[bad], bad)
        assert f"physical offset {phys[bad]}" in got.detail and f"queue offset {bad}" in got.detail
        assert "BODYCRC" in got.detail
        assert (got.min_offset, got.max_offset) == (0, N)
        assert str(phys[bad]) in repr(got)
        assert any(str(phys[bad]) in r.getMessage() for r in caplog.records)
        # the same answer again: a consumer that retries does not lose its place
        assert store.get_message("g", TOPIC, 0, bad, 1).status is S.MESSAGE_CORRUPTED

        after = store.get_message("g", TOPIC, 0, bad + 1, 32)
        assert after.status is S.FOUND and len(after) == 32
        assert [bytes(m.body) for m in after] == [body_of(i) for i in range(bad + 1, bad + 33)]

        # the whole queue: every message but the damaged one, which is reported once
        offset, seen, corrupt = 0, [], []
        while offset < N:
            res = store.get_message("g", TOPIC, 0, offset, 32)
            if res.status is S.MESSAGE_CORRUPTED:
                corrupt.append(res.next_begin_offset)
                offset = res.next_begin_offset + 1
                continue
            seen += [m.queue_offset for m in res]
            offset = res.next_begin_offset
        assert corrupt == [bad] and seen == [q for q in range(N) if q != bad]


def test_look_ups_raise_naming_the_offset(damaged) -> None:
    root, phys, bad = damaged
    with MessageStore(root, **ON) as store:  # type: ignore[arg-type]
        with pytest.raises(CorruptRecordError, match=f"physical offset {phys[bad]}\\b.*BODYCRC"):
            store.look_message_by_offset(phys[bad])
        with pytest.raises(CorruptRecordError, match=f"physical offset {phys[bad]}\\b"):
            store.look_message_by_queue_offset(TOPIC, 0, bad)
        # their neighbours read
        assert bytes(store.look_message_by_offset(phys[bad + 1]).body) == body_of(bad + 1)
        assert bytes(store.look_message_by_queue_offset(TOPIC, 0, bad - 1).body) == body_of(bad - 1)
        # query_message (several results possible) skips it, logs it, and lists it
        res = store.query_message(TOPIC, f"k{bad}")
        assert res.messages == [] and res.corrupt_offsets == [phys[bad]]
        ok = store.query_message(TOPIC, f"k{bad + 1}")
        assert [bytes(m.body) for m in ok.messages] == [body_of(bad + 1)] and ok.corrupt_offsets == []
        # the store timestamp does not need the body
        assert store.get_message_store_timestamp(TOPIC, 0, bad) > 0


def test_off_returns_the_flipped_bytes(damaged) -> None:
    root, phys, bad = damaged
    with MessageStore(root, **CFG, check_crc_on_read=False) as store:  # type: ignore[arg-type]
        got = store.get_message("g", TOPIC, 0, bad, 4)
        assert got.status is S.FOUND and len(got) == 4
        body = bytes(got[0].body)
        assert body != body_of(bad) and len(body) == len(body_of(bad))
        assert sum(a != b for a, b in zip(body, body_of(bad))) == 1
        assert bytes(store.look_message_by_offset(phys[bad]).body) == body
        assert [bytes(m.body) for m in store.query_message(TOPIC, f"k{bad}").messages] == [body]
        # and the setting can be turned on for a running reader
        store.reader.config = store.config.replace(check_crc_on_read=True)
        assert store.get_message("g", TOPIC, 0, bad, 4).status is S.MESSAGE_CORRUPTED


def test_a_tag_filter_that_skips_the_damaged_message_reads_past_it(damaged) -> None:
    root, phys, bad = damaged  # message 10 has tag A
    with MessageStore(root, **ON) as store:  # type: ignore[arg-type]
        got = store.get_message("g", TOPIC, 0, 0, 32, tags="B")
        assert got.status is S.FOUND and len(got) == 32
        assert [m.queue_offset for m in got] == list(range(1, 64, 2))
        a = store.get_message("g", TOPIC, 0, 0, 32, tags=["A"])
        assert [m.queue_offset for m in a] == [0, 2, 4, 6, 8] and a.next_begin_offset == 9
        again = store.get_message("g", TOPIC, 0, a.next_begin_offset, 32, tags="A")
        assert again.status is S.MESSAGE_CORRUPTED and again.next_begin_offset == bad


def test_batch_caps_and_max_msg_nums_below_one(damaged) -> None:
    root, phys, bad = damaged
    with MessageStore(root, **ON) as store:  # type: ignore[arg-type]
        for n in (0, -1, 1):
            got = store.get_message("g", TOPIC, 0, bad, n)
            assert got.status is S.MESSAGE_CORRUPTED and got.next_begin_offset == bad
            one = store.get_message("g", TOPIC, 0, bad - 1, n)
            assert (one.status, len(one), one.next_begin_offset) == (S.FOUND, 1, bad)
        got = store.get_message("g", TOPIC, 0, bad - 3, 3)  # the batch ends just before it
        assert (len(got), got.next_begin_offset) == (3, bad)


def test_damage_outside_the_body_crc_does_not_crash(tmp_path: Path) -> None:
    """Topic and properties are not covered by BODYCRC: a flipped letter reads as another
    topic or key, a flipped high bit makes them undecodable, a flipped length makes the header
    unparseable. Nothing crashes; what the CRC check cannot see is returned as data, what does
    not parse is reported as damaged."""
    root = str(tmp_path / "store")
    phys = make_store(root)
    flip(root, phys[3], TOPIC.encode(), delta=1)                     # "CrcTopic" -> "CscTopic"
    flip(root, phys[4], TOPIC.encode(), delta=1, bit=0x80)           # not UTF-8 any more
    flip(root, phys[5], b"KEYS", delta=5, bit=0x80)                  # the key k5: not UTF-8
    flip(root, phys[6], b"k6")                                       # the key k6 -> j6
    flip(root, phys[7], TOPIC.encode(), delta=-1, bit=0x40)          # the topic length byte
    with MessageStore(root, **ON) as store:  # type: ignore[arg-type]
        got = store.get_message("g", TOPIC, 0, 0, 32)
        assert (got.status, len(got), got.next_begin_offset) == (S.FOUND, 7, 7)
        assert bytes(got[3].body) == body_of(3) and got[3].topic == "CscTopic"
        with pytest.raises(UnicodeDecodeError):
            got[4].topic  # noqa: B018 - the view says the bytes do not decode
        assert bytes(got[4].body) == body_of(4)
        malformed = store.get_message("g", TOPIC, 0, 7, 32)
        assert malformed.status is S.MESSAGE_CORRUPTED and "does not parse" in malformed.detail
        assert malformed.corrupt_physical_offset == phys[7]
        with pytest.raises(CorruptRecordError, match=f"physical offset {phys[7]}\\b"):
            store.look_message_by_queue_offset(TOPIC, 0, 7)
        assert store.look_message_by_offset(phys[4]) is not None  # its body is intact
        assert store.query_message(TOPIC, "k3").messages == []  # another topic now
        bad_key = store.query_message(TOPIC, "k5")
        assert bad_key.messages == [] and bad_key.corrupt_offsets == [phys[5]]
        assert store.query_message(TOPIC, "k6").messages == []
        assert store.query_message(TOPIC, "k8").messages[0].physical_offset == phys[8]
        assert store.get_message("g", TOPIC, 0, 8, 32).status is S.FOUND
    with MessageStore(root, check_crc_on_read=False, **CFG) as store:  # type: ignore[arg-type]
        assert len(store.get_message("g", TOPIC, 0, 0, 32)) == 32
        assert store.query_message(TOPIC, "k4").corrupt_offsets == [phys[4]]


def test_attached_reader_checks_too(damaged) -> None:
    root, phys, bad = damaged
    with MessageStore(root, **ON) as owner:  # type: ignore[arg-type]
        attached = MessageStore.attach(root)
        try:
            assert attached.get_message("g", TOPIC, 0, bad, 8).status is S.MESSAGE_CORRUPTED
            with pytest.raises(CorruptRecordError):
                attached.look_message_by_offset(phys[bad])
        finally:
            attached.shutdown()
        assert owner.get_message("g", TOPIC, 0, 0, 8).status is S.FOUND


# -- the kernel against its twin -------------------------------------------------------------------

@given(data=st.binary(max_size=3000), value=st.integers(0, 2**32 - 1), skip=st.integers(0, 15))
def test_crc32_is_zlibs(data: bytes, value: int, skip: int) -> None:
    view = memoryview(data)[min(skip, len(data)):]  # unaligned starts
    assert crc32(view, value) == zlib.crc32(view, value)
    assert crc32(view, value, fold=False) == zlib.crc32(view, value)


def test_crc32_every_length_around_the_fold_sizes() -> None:
    data = os.urandom(1100)
    for n in list(range(0, 200)) + [1023, 1024, 1025, 1099]:
        assert crc32(data[:n]) == zlib.crc32(data[:n]), n
    assert isinstance(CRC_FOLDED, bool)


records = st.builds(
    lambda body, topic, props, v6born, v6store, v2, crc: encode_record(
        topic=topic, body=body, properties=props, born_host=("::1", 7) if v6born else ("10.0.0.1", 7),
        store_host=("::2", 9) if v6store else ("10.0.0.2", 9), v2=v2, body_crc=crc),
    body=st.binary(max_size=300), topic=st.text("abcXYZ_%|-", min_size=1, max_size=20),
    props=st.dictionaries(st.text("abk", min_size=1, max_size=4), st.text("xyz", min_size=1, max_size=4),
                          max_size=3),
    v6born=st.booleans(), v6store=st.booleans(), v2=st.booleans(),
    crc=st.one_of(st.none(), st.integers(0, 2**31 - 1)))


@given(record=records, flips=st.lists(st.tuples(st.integers(0, 400), st.integers(0, 7)), max_size=3),
       cut=st.integers(0, 40), extra=st.binary(max_size=8))
def test_record_status_matches_the_twin(record: bytes, flips: list[tuple[int, int]], cut: int,
                                        extra: bytes) -> None:
    buf = bytearray(record)
    for at, bit in flips:
        if at < len(buf):
            buf[at] ^= 1 << bit
    for data in (bytes(buf) + extra, bytes(buf[:len(buf) - cut])):
        assert record_status(data) == twin.record_status(data)
    if not flips and cut == 0:
        expected = RECORD_OK if zlib.crc32(body_in(record)) & 0x7FFFFFFF == int.from_bytes(record[8:12], "big") \
            else RECORD_CRC_MISMATCH
        assert record_status(record) == expected


def body_in(record: bytes) -> bytes:
    from mqstore.log._codec import decode_record
    return decode_record(record, 0, check_crc=False).body


@given(chosen=st.lists(st.tuples(records, st.integers(-1, 300), st.booleans()), min_size=1, max_size=8),
       first_file=st.integers(0, 3), unmapped=st.integers(-1, 2))
def test_first_corrupt_matches_the_twin(chosen: list[tuple[bytes, int, bool]], first_file: int,
                                        unmapped: int) -> None:
    """Records laid out in 2 KiB files (one record each, at a varying position); flipped bits;
    one file optionally not mapped (left out of the LogMap)."""
    size = 2048
    with tempfile.TemporaryDirectory() as root:
        files = [MappedFile.create(os.path.join(root, f"{(first_file + k) * size:020d}"), size)
                 for k in range(len(chosen))]
        try:
            _check_first_corrupt(chosen, files, first_file, unmapped)
        finally:
            for f in files:
                f.close()


def _check_first_corrupt(chosen: list[tuple[bytes, int, bool]], files: list[MappedFile], first_file: int,
                         unmapped: int) -> None:
    size = files[0].file_size
    phys, rests = [], []
    for k, (record, flip_at, at_end) in enumerate(chosen):
        rec = bytearray(record)
        if 0 <= flip_at < len(rec):
            rec[flip_at] ^= 0x04
        pos = size - len(rec) + 5 if at_end else 16 * k  # at_end: it runs 5 bytes past the file
        piece = rec[:size - pos]
        files[k].write_at(pos, bytes(piece))
        phys.append((first_file + k) * size + pos)
        rests.append(None if k == unmapped else files[k].read(pos, size - pos))
    log = LogMap([None if k == unmapped else f for k, f in enumerate(files)], size, first_file * size)
    assert first_corrupt(phys, log) == twin.first_corrupt(rests)
    # offsets before the first file or past the last are skipped like unmapped files
    assert first_corrupt([0 if first_file else -5, (first_file + len(files)) * size], log) == (-1, RECORD_OK)


def test_first_corrupt_takes_a_log_map() -> None:
    with pytest.raises(TypeError):
        first_corrupt([], array("q"))  # addresses are not a LogMap
    assert first_corrupt([], LogMap([], 1024)) == (-1, RECORD_OK)
    assert record_status(b"") == RECORD_MALFORMED == twin.record_status(b"")


# -- the checked getMessage against its twin (mqstore.twin.reads.get_message_checked) --------------

CQ_FILE_UNITS = 64
TWIN_TAGS = [None, "A", "B", "A || B", "Z"]


@pytest.fixture(scope="module")
def damaged_twin_store(tmp_path_factory):
    """Two queues over several ConsumeQueue files; bodies damaged in the older CommitLog
    files; the first CommitLog file deleted."""
    root = str(tmp_path_factory.mktemp("crc-twin") / "store")
    cfg = {**ON, "mapped_file_size_commit_log": 16 * 1024,
           "mapped_file_size_consume_queue": CQ_FILE_UNITS * 20}
    store = MessageStore(root, **cfg)  # type: ignore[arg-type]
    phys = []
    for i in range(1000):
        body = b"x" * (i % 200) + b"-%d" % i
        r = store.put_message(Message(TOPIC, body, queue_id=i % 2, tags="AB"[i // 2 % 2]))
        r.check()
        phys.append(r.wrote_offset)
    assert store.wait_dispatched()
    store.shutdown()
    last_files = 3 * 16 * 1024
    end = max(phys)
    bad = {p for i, p in enumerate(phys) if i % 7 in (3, 4) and p < end - last_files - 16 * 1024}
    for p in bad:
        _flip_body(root, p, 16 * 1024)
    store = MessageStore(root, **cfg)  # type: ignore[arg-type]
    assert store.commitlog.queue.delete_expired_file_by_time(0, 0, 0, True, max_files=1) == 1
    yield store, bad
    store.shutdown()


def _flip_body(root: str, phy: int, file_size: int) -> None:
    path = os.path.join(root, "commitlog", f"{phy - phy % file_size:020d}")
    with open(path, "r+b") as f:
        f.seek(phy % file_size)
        head = f.read(100)
        at = phy % file_size + 88  # IPv4 hosts: the body starts at 88
        assert int.from_bytes(head[84:88], "big") > 0
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ 0x10]))


def compare_with_twin(store, bad, queue_id, offset, max_msg_nums, tags, count_memory=32,
                      bytes_memory=256 * 1024, in_memory=1 << 40) -> S:
    reader = store.reader
    reader.config = store.config.replace(max_transfer_count_on_message_in_memory=count_memory,
                                         max_transfer_bytes_on_message_in_memory=bytes_memory)
    reader.in_memory_limit = in_memory
    cq = store.consume_queues.get(TOPIC, queue_id)
    lm = reader.log_map()
    units = [cq.unit(q) for q in range(cq.max_offset_in_queue)]
    cfg = reader.config
    limits = twin.Limits(min_phy=store.get_min_phy_offset(), max_phy=store.get_max_phy_offset(),
                         log_file_size=cfg.mapped_file_size_commit_log, in_memory=in_memory,
                         max_bytes_memory=bytes_memory, max_count_memory=count_memory,
                         max_bytes_disk=cfg.max_transfer_bytes_on_message_in_disk,
                         max_count_disk=cfg.max_transfer_count_on_message_in_disk)
    want = twin.get_message_checked(units, cq.min_offset_in_queue, cq.max_offset_in_queue, CQ_FILE_UNITS, offset,
                                    max_msg_nums, reader.tag_codes(tags), limits,
                                    lambda phy, size: lm.file_of(phy) is not None and phy >= lm.first_from,
                                    bad.__contains__)
    got = store.get_message("g", TOPIC, queue_id, offset, max_msg_nums, tags=tags)
    assert (got.status, got.next_begin_offset, got.physical_offsets, got.buffer_total_size) == \
        (want.status, want.next_begin_offset, want.physical_offsets, want.buffer_total_size)
    assert got.suggest_pulling_from_slave == want.suggest_pulling_from_slave
    if want.status is S.MESSAGE_CORRUPTED:
        assert got.corrupt_physical_offset == want.corrupt_physical_offset
    assert not set(got.physical_offsets) & bad
    return got.status


@given(queue_id=st.sampled_from([0, 1]), offset=st.integers(-2, 505), max_msg_nums=st.integers(-1, 40),
       tags=st.sampled_from(TWIN_TAGS), count_memory=st.integers(1, 40), bytes_memory=st.integers(100, 6000),
       in_memory=st.sampled_from([0, 30_000, 1 << 40]))
def test_checked_get_message_matches_the_twin(damaged_twin_store, queue_id, offset, max_msg_nums, tags,
                                              count_memory, bytes_memory, in_memory) -> None:
    store, bad = damaged_twin_store
    compare_with_twin(store, bad, queue_id, offset, max_msg_nums, tags, count_memory, bytes_memory, in_memory)


def test_checked_get_message_matches_the_twin_over_every_offset(damaged_twin_store) -> None:
    """A sweep next to the sampled test above, so the damaged messages are certainly met."""
    store, bad = damaged_twin_store
    assert len(bad) >= 20
    statuses = set()
    for queue_id in (0, 1):
        for offset in range(-1, 300, 2):
            for max_msg_nums, tags, in_memory in ((1, None, 1 << 40), (16, None, 1 << 40), (16, "A", 0),
                                                  (5, "B || Z", 30_000)):
                statuses.add(compare_with_twin(store, bad, queue_id, offset, max_msg_nums, tags,
                                               in_memory=in_memory))
    assert {S.MESSAGE_CORRUPTED, S.FOUND} <= statuses, statuses
