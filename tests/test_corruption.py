"""Damaged files, then reopen: recovery detects, truncates or rebuilds, and reports (design.md:
"corrupted files get a clear status or exception naming the cause; nothing written before is
lost, and the store keeps working").

Each test copies a template store (300 messages in topics A and B, 3 queues each, written by a
child process that then shut the store down cleanly or was killed with SIGKILL), damages
files directly, reopens it and checks, through the read path (get_message), that exactly what
was stored before the damage point is readable at its queue offsets with its body, what the
recovery report says, that new puts get the next queue offsets, and that the invariant
checker passes afterwards. Where the data after the damage cannot be kept (the CommitLog is
cut at the first bad record, as RocketMQ does) the test names what is lost; ConsumeQueues and
index files are derived data: they are rebuilt from the CommitLog, nothing is lost.
"""

from __future__ import annotations

import os
import shutil
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqstore import Message, MessageStore
from mqstore.tools.checker import check_store
from mqstore.config import StoreConfig
from mqstore.errors import ConfigError, NotAStoreError
from helpers_store import TEMPLATE_QUEUES as QUEUES, TEMPLATE_TOPICS as TOPICS, Ack, copy_store, read_queue, template_stores

UNIT = 20
CQ_UNITS = 20  # units per ConsumeQueue file: each queue has 50 units in 3 files (20, 20, 10)
FS = 16 * 1024  # CommitLog file size: the 300 messages fill three files
N = 300
BODY_POS = 88  # spec §1.2: the body of a V1 record with IPv4 hosts starts after 84 fixed bytes + BODYLEN
CFG = {"mapped_file_size_commit_log": FS, "max_message_size": 4096, "mapped_file_size_consume_queue": CQ_UNITS * UNIT,
       "message_index_enable": False}
CFG_INDEX = {**CFG, "message_index_enable": True, "max_hash_slot_num": 64, "max_index_num": 200}


@pytest.fixture(scope="module")
def templates(tmp_path_factory):
    """Template stores by (how, index): written once per module by a child process."""
    return template_stores(tmp_path_factory.mktemp("templates"), {False: CFG, True: CFG_INDEX}, N)


@pytest.fixture
def store_copy(templates, tmp_path):
    def copy(how: str = "clean", index: bool = False) -> tuple[str, list[Ack]]:
        src, acks = templates(how, index)
        root = copy_store(src, str(tmp_path / "store"))
        assert os.path.exists(os.path.join(root, "abort")) == (how == "killed")
        if how == "clean":
            # these tests are about RocketMQ's recovery scan; after a clean close mqstore's
            # clean-close record stands for it (tests/test_clean_close.py covers that path)
            os.unlink(os.path.join(root, "mqstore.clean.json"))
        return root, acks
    return copy


# -- file helpers ------------------------------------------------------------------------------

def commitlog_file(root: str, phy: int) -> tuple[str, int]:
    """(path, position) of CommitLog offset phy."""
    return os.path.join(root, "commitlog", f"{phy - phy % FS:020d}"), phy % FS


def cq_files(root: str, topic: str, qid: int) -> list[str]:
    d = os.path.join(root, "consumequeue", topic, str(qid))
    return [os.path.join(d, n) for n in sorted(os.listdir(d))]


def index_files(root: str) -> list[str]:
    d = os.path.join(root, "index")
    return [os.path.join(d, n) for n in sorted(os.listdir(d))]


def patch(path: str, pos: int, data: bytes) -> None:
    with open(path, "r+b") as fh:
        fh.seek(pos)
        fh.write(data)


def read(path: str, pos: int, n: int) -> bytes:
    with open(path, "rb") as fh:
        fh.seek(pos)
        return fh.read(n)


def flip_bit(path: str, pos: int, bit: int) -> None:
    patch(path, pos, bytes([read(path, pos, 1)[0] ^ (1 << bit)]))


def data_end(path: str) -> int:
    with open(path, "rb") as fh:
        return len(fh.read().rstrip(b"\0"))


def queue_acks(acks: list[Ack], topic: str, qid: int) -> list[Ack]:
    return sorted((a for a in acks if (a.topic, a.qid) == (topic, qid)), key=lambda a: a.qoff)


# -- the verification --------------------------------------------------------------------------

def reopen_and_verify(root: str, acks: list[Ack], *, lost: set[int] = frozenset(), cfg: dict = CFG,
                      keys: bool = False, **overrides):
    """Reopen root; every ack not in lost must be readable at its queue offset with its body
    and its physical offset, the queues must hold nothing else, new puts must get the next
    queue offsets, check_store must pass. With keys, query_message must find the key of every
    kept message and of no lost one. Returns the recovery report."""
    with MessageStore(root, **cfg, **overrides) as store:
        report = store.recovery
        for topic in TOPICS:
            for qid in range(QUEUES):
                want = [a for a in queue_acks(acks, topic, qid) if a.i not in lost]
                assert store.get_min_offset_in_queue(topic, qid) == 0
                got = [(m.queue_offset, m.physical_offset, bytes(m.body)) for m in read_queue(store, topic, qid)]
                assert got == [(a.qoff, a.phy, a.body) for a in want], f"{topic}/{qid}"
                assert [q for q, _, _ in got] == list(range(len(want)))  # lost messages are the queue's tail
        if keys:
            for a in acks:
                hits = [m.physical_offset for m in store.query_message(a.topic, f"k{a.i}").messages]
                assert hits == ([] if a.i in lost else [a.phy]), f"key k{a.i}"
        for topic in TOPICS:
            for qid in range(QUEUES):
                expect = len([a for a in queue_acks(acks, topic, qid) if a.i not in lost])
                r = store.put_message(Message(topic, b"after", queue_id=qid, keys=["after"])).check()
                assert r.queue_offset == expect, f"{topic}/{qid}"
        assert store.wait_dispatched()
        for topic in TOPICS:
            for qid in range(QUEUES):
                assert bytes(read_queue(store, topic, qid)[-1].body) == b"after"
    check_store(root, config=StoreConfig(**cfg)).raise_if_failed()
    return report


def tail_acks(acks: list[Ack], k: int) -> list[Ack]:
    """The last k messages of the log, in log order."""
    return sorted(acks, key=lambda a: a.phy)[-k:]


# -- CommitLog --------------------------------------------------------------------------------

@pytest.mark.parametrize("how", ["clean", "killed"])
def test_commitlog_tail_zeroed(store_copy, how):
    """The last records zeroed from inside a record's header: the log ends at that record; the
    units of the lost records are dropped and reported per queue."""
    root, acks = store_copy(how)
    lost = tail_acks(acks, 3)
    path, pos = commitlog_file(root, lost[0].phy)
    end = data_end(path)
    patch(path, pos + 30, bytes(end - pos - 30))
    header = len(read(path, pos, 30).rstrip(b"\0"))  # what is left of the cut record
    report = reopen_and_verify(root, acks, lost={a.i for a in lost})
    assert report.clean_shutdown == (how == "clean")
    assert report.valid_end == lost[0].phy and report.records == N - 3
    assert report.dropped_bytes == header > 0
    assert report.stop_reason == "invalid" and os.path.basename(path) in report.stop_detail
    want = {}
    for a in lost:
        want[f"{a.topic}/{a.qid}"] = want.get(f"{a.topic}/{a.qid}", 0) + 1
    assert report.queue_units_dropped == want
    assert "dropped 3 queue units" in report.summary() and report.to_dict()["valid_end"] == lost[0].phy


@pytest.mark.parametrize("how", ["clean", "killed"])
def test_commitlog_last_file_cut_short(store_copy, how):
    """The last CommitLog file shortened (cut inside a record): the cut file is extended, the
    log ends at the cut record, and the report names the short file."""
    root, acks = store_copy(how)
    lost = tail_acks(acks, 4)
    path, pos = commitlog_file(root, lost[0].phy)
    kept = len(read(path, pos, 50).rstrip(b"\0"))
    os.truncate(path, pos + 50)
    report = reopen_and_verify(root, acks, lost={a.i for a in lost})
    assert report.valid_end == lost[0].phy and report.dropped_bytes == kept > 0
    assert report.short_files == [f"{os.path.basename(path)} ({pos + 50} of {FS} bytes)"]
    assert os.path.getsize(path) == FS


def test_commitlog_middle_file_cut_short_is_refused(store_copy):
    """A file that is not the last one cut short: keeping the files after it would leave a hole
    in the log, dropping them would drop a whole file of good data. The open refuses, naming
    the file, and changes nothing."""
    root, acks = store_copy("clean")

    def sizes() -> dict[str, int]:
        d = os.path.join(root, "commitlog")
        return {n: os.path.getsize(os.path.join(d, n)) for n in os.listdir(d)}

    path = os.path.join(root, "commitlog", f"{0:020d}")
    os.truncate(path, FS - 1000)
    before = sizes()
    with pytest.raises(NotAStoreError, match=os.path.basename(path)):
        MessageStore(root, **CFG)
    assert sizes() == before


@pytest.mark.parametrize("how", ["clean", "killed"])
def test_commitlog_of_a_smaller_file_size_is_refused_not_extended(store_copy, how):
    """Opened with a larger mapped_file_size_commit_log than it was written with: every file is
    short, but they end with their blank or zeros, so none is taken for a cut file; the open
    refuses and changes no file, and the right size opens the store."""
    root, acks = store_copy(how)
    d = os.path.join(root, "commitlog")
    before = {n: read(os.path.join(d, n), 0, FS) for n in os.listdir(d)}
    with pytest.raises(ConfigError, match="but the store was created with mapped_file_size_commit_log"):
        MessageStore(root, **{**CFG, "mapped_file_size_commit_log": 2 * FS})
    assert {n: read(os.path.join(d, n), 0, 2 * FS) for n in os.listdir(d)} == before
    report = reopen_and_verify(root, acks)
    assert not report.short_files


@pytest.mark.parametrize("how", ["clean", "killed"])
@pytest.mark.parametrize("k", [1, 7, 40])
def test_commitlog_body_bit_flip_is_a_crc_mismatch(store_copy, k, how):
    """A bit flipped in the body of the k-th last record: with check_crc_on_recover (the
    default) the CRC does not match, the log ends there, the records after it are dropped."""
    root, acks = store_copy(how)
    lost = tail_acks(acks, k)
    path, pos = commitlog_file(root, lost[0].phy)
    assert all(a.phy // FS == lost[0].phy // FS for a in lost)  # all in the last file
    end = data_end(path)
    flip_bit(path, pos + BODY_POS + 1, 3)
    report = reopen_and_verify(root, acks, lost={a.i for a in lost})
    assert report.valid_end == lost[0].phy and report.records == N - k
    assert "CRC" in report.stop_detail
    assert report.dropped_bytes == end - pos == sum(a.size for a in lost)


def test_commitlog_body_bit_flip_without_crc_check(store_copy):
    """The same flip with check_crc_on_recover=False and check_crc_on_read=False: recovery
    keeps the record (RocketMQ does too) and get_message returns the altered body; the checker (which checks CRCs)
    reports exactly that record."""
    root, acks = store_copy("clean")
    victim = tail_acks(acks, 5)[0]
    path, pos = commitlog_file(root, victim.phy)
    flip_bit(path, pos + BODY_POS + 1, 3)
    altered = bytearray(victim.body)
    altered[1] ^= 1 << 3
    with MessageStore(root, **CFG, check_crc_on_recover=False, check_crc_on_read=False) as store:
        report = store.recovery
        assert report.records == N and report.valid_end == max(a.phy + a.size for a in acks)
        assert not report.stop_detail and not report.damaged
        got = {bytes(m.body) for m in read_queue(store, victim.topic, victim.qid)}
        assert bytes(altered) in got and victim.body not in got
    assert check_store(root, config=StoreConfig(**CFG), check_crc=False).ok
    problems = check_store(root, config=StoreConfig(**CFG)).problems
    assert problems and problems[0].offset == victim.phy and "CRC" in problems[0].message


@pytest.mark.parametrize("how", ["clean", "killed"])
@pytest.mark.parametrize("where", ["last file", "first file"])
def test_commitlog_magic_damaged_mid_file(store_copy, where, how):
    """A record's magic code damaged in the middle of a file: the log ends at that record
    (spec §5.4); the records after it are dropped, in a file that is not the last the later
    files too, and the report lists them as files that held data."""
    root, acks = store_copy(how)
    in_log = sorted(acks, key=lambda a: a.phy)
    victim = in_log[-20] if where == "last file" else in_log[10]
    path, pos = commitlog_file(root, victim.phy)
    patch(path, pos + 4, b"\x12\x34\x56\x78")
    lost = {a.i for a in acks if a.phy >= victim.phy}
    report = reopen_and_verify(root, acks, lost=lost)
    assert report.valid_end == victim.phy and "magic" in report.stop_detail and report.dropped_bytes > 0
    if where == "first file":
        assert report.deleted_data_files == [f"{FS:020d}", f"{2 * FS:020d}"]
        assert "deleted files holding data" in report.summary()
    else:
        assert report.deleted_data_files == []
    assert report.dropped_units == len(lost)


# -- ConsumeQueues ---------------------------------------------------------------------------

@pytest.mark.parametrize("how", ["clean", "killed"])
def test_consume_queue_tail_zeroed_is_rebuilt(store_copy, how):
    """The last units of a queue zeroed: the log has the records, recovery notices the queue
    lacks them and re-dispatches; nothing is lost."""
    root, acks = store_copy(how)
    path = cq_files(root, "A", 1)[-1]
    end = data_end(path)
    patch(path, end - 3 * UNIT, bytes(3 * UNIT))
    report = reopen_and_verify(root, acks)
    assert report.queue_units_missing == {"A/1": 3} and "A/1: 3" in report.summary()
    assert report.damaged == (how == "clean")  # after a crash, dispatch may simply have been behind


@pytest.mark.parametrize("how", ["clean", "killed"])
@pytest.mark.parametrize("which", ["last", "first"])
def test_consume_queue_file_cut_to_a_non_multiple_of_20(store_copy, how, which):
    """A ConsumeQueue file cut inside a unit: the whole units before the cut are kept, the
    files after it deleted, the rest rebuilt from the log; the report names the file."""
    root, acks = store_copy(how)
    files = cq_files(root, "B", 2)
    path = files[-1] if which == "last" else files[0]
    os.truncate(path, 7 * UNIT + 13)
    report = reopen_and_verify(root, acks)
    assert "B/2" in report.damaged_queues and f"was {7 * UNIT + 13} bytes" in report.damaged_queues["B/2"]
    assert report.queue_units_missing["B/2"] == 50 - (7 if which == "first" else 47)
    assert os.path.getsize(path) == CQ_UNITS * UNIT


@pytest.mark.parametrize("units", [10, 40])
def test_consume_queues_of_another_file_size_are_refused_not_repaired(store_copy, units):
    """Opening with another mapped_file_size_consume_queue is a configuration error, not
    damage: the open refuses, no file is changed, and the right size opens the store."""
    root, acks = store_copy("clean")
    before = {p: read(p, 0, CQ_UNITS * UNIT) for t in TOPICS for q in range(QUEUES) for p in cq_files(root, t, q)}
    with pytest.raises(ConfigError, match="but the store was created with mapped_file_size_consume_queue"):
        MessageStore(root, **{**CFG, "mapped_file_size_consume_queue": units * UNIT})
    assert {p: read(p, 0, CQ_UNITS * UNIT) for p in before} == before
    report = reopen_and_verify(root, acks)
    assert not report.damaged


UNIT_DAMAGE = {
    "phy past the log end (mid-queue)": (5, 0, struct.pack(">q", 1 << 40)),
    "phy past the log end (last unit)": (-1, 0, struct.pack(">q", 1 << 40)),
    "phy negative": (12, 0, struct.pack(">q", -5)),
    "phy pointing backwards": (30, 0, struct.pack(">q", 0)),
    "size zero": (8, 8, struct.pack(">i", 0)),
    "size negative": (25, 8, struct.pack(">i", -1)),
    "size too big (last unit)": (-1, 8, struct.pack(">i", 4000)),
    "size overlapping the next record": (3, 8, struct.pack(">i", 3000)),
}


@pytest.mark.parametrize("damage", sorted(UNIT_DAMAGE))
@pytest.mark.parametrize("how", ["clean", "killed"])
def test_damaged_consume_queue_unit_is_cut_and_rebuilt(store_copy, damage, how):
    """One unit of queue A/0 damaged: recovery cuts the queue before it (units must have
    phyOffset >= 0, size > 0, follow each other in the log, and the last must match its
    record), reports the queue as damaged or lacking units, and the dispatch rebuilds it."""
    root, acks = store_copy(how)
    q, field, data = UNIT_DAMAGE[damage]
    q = q % 50
    files = cq_files(root, "A", 0)
    patch(files[q // CQ_UNITS], (q % CQ_UNITS) * UNIT + field, data)
    report = reopen_and_verify(root, acks)
    assert "A/0" in report.damaged_queues or "A/0" in report.queue_units_dropped
    assert report.queue_units_missing.get("A/0", 0) >= 1
    assert set(report.damaged_queues) <= {"A/0"} and set(report.queue_units_missing) == {"A/0"}


@pytest.mark.parametrize("how", ["clean", "killed"])
@pytest.mark.parametrize("which", ["last", "middle"])
def test_consume_queue_file_deleted(store_copy, which, how):
    """A ConsumeQueue file deleted: the last one (the queue is shorter than the log says), or
    one in the middle (the files after the gap are deleted); both are rebuilt."""
    root, acks = store_copy(how)
    files = cq_files(root, "A", 2)
    os.unlink(files[-1] if which == "last" else files[1])
    report = reopen_and_verify(root, acks)
    assert report.queue_units_missing == {"A/2": 10 if which == "last" else 30}
    if which == "middle":
        assert "missing" in report.damaged_queues["A/2"]
    assert len(cq_files(root, "A", 2)) == 3


def test_first_consume_queue_file_deleted(store_copy):
    """The first file of a queue deleted while the CommitLog still starts at 0 (retention did
    not remove it): the queue is rebuilt from the log's start."""
    root, acks = store_copy("clean")
    os.unlink(cq_files(root, "B", 0)[0])
    report = reopen_and_verify(root, acks)
    assert "files before it are missing" in report.damaged_queues["B/0"]
    assert report.rebuild_from == 0


@pytest.mark.parametrize("how", ["clean", "killed"])
@pytest.mark.parametrize("what", ["queue", "topic"])
def test_consume_queue_directory_deleted(store_copy, how, what):
    """A queue's directory, or a whole topic's, deleted: its records are in the log, so the
    queues are rebuilt by re-dispatching from the log's start, and the topic-queue table is
    raised from the log (a queue offset is never handed out twice)."""
    root, acks = store_copy(how)
    shutil.rmtree(os.path.join(root, "consumequeue", "A", *(["1"] if what == "queue" else [])))
    report = reopen_and_verify(root, acks)
    gone = {"A/1"} if what == "queue" else {f"A/{q}" for q in range(QUEUES)}
    assert set(report.queue_units_missing) == gone and all(v == 50 for v in report.queue_units_missing.values())
    assert report.dispatch_from == 0


# -- index files (derived from the log: rebuilt) ---------------------------------------------------

def test_commitlog_tail_zeroed_drops_index_entries(store_copy):
    root, acks = store_copy("clean", index=True)
    lost = tail_acks(acks, 3)
    path, pos = commitlog_file(root, lost[0].phy)
    patch(path, pos, bytes(data_end(path) - pos))
    report = reopen_and_verify(root, acks, lost={a.i for a in lost}, cfg=CFG_INDEX, keys=True)
    assert report.index_entries_dropped >= 3


@pytest.mark.parametrize("damage", ["newest truncated", "newest zeroed", "newest header zeroed", "oldest zeroed"])
def test_damaged_index_file_is_rebuilt(store_copy, damage):
    root, acks = store_copy("clean", index=True)
    files = index_files(root)
    assert len(files) >= 2
    path = files[0] if damage == "oldest zeroed" else files[-1]
    size = os.path.getsize(path)
    if damage == "newest truncated":
        os.truncate(path, size // 2)
    else:
        patch(path, 0, bytes(40 if damage == "newest header zeroed" else size))
    report = reopen_and_verify(root, acks, cfg=CFG_INDEX, keys=True)
    assert report.index_damage and report.rebuild_from >= 0
    if damage != "newest zeroed":
        assert os.path.basename(path) in report.index_files_deleted


def test_index_files_all_of_another_size_are_refused(store_copy):
    """Every index file of one other size is a geometry change (max_hash_slot_num /
    max_index_num), not damage: the open refuses, naming the file."""
    root, _ = store_copy("clean", index=True)
    for path in index_files(root):
        os.truncate(path, 1000)
    with pytest.raises(NotAStoreError, match="1000 bytes"):
        MessageStore(root, **CFG_INDEX)


# -- checkpoint and abort file ----------------------------------------------------------------------

@pytest.mark.parametrize("how", ["clean", "killed"])
@pytest.mark.parametrize("damage", ["truncated", "zeroed", "missing", "future"])
def test_damaged_checkpoint(store_copy, how, damage):
    """A damaged checkpoint is reset to 0 and reported: an abnormal recovery then scans the
    whole CommitLog (a checkpoint in the future would make it start too late)."""
    root, acks = store_copy(how)
    path = os.path.join(root, "checkpoint")
    if damage == "truncated":
        os.truncate(path, 12)
    elif damage == "zeroed":
        patch(path, 0, bytes(4096))
    elif damage == "missing":
        os.unlink(path)
    else:
        patch(path, 0, struct.pack(">qq", 1 << 60, 1 << 60))
    report = reopen_and_verify(root, acks)
    assert bool(report.checkpoint_damage) == (damage != "zeroed")
    if how == "killed":
        assert report.first_file_scanned == f"{0:020d}" and report.records == N
    assert os.path.getsize(path) == 4096


def test_abort_file_with_a_clean_log(store_copy):
    """An abort file left beside a cleanly written log: abnormal recovery finds nothing to drop."""
    root, acks = store_copy("clean")
    open(os.path.join(root, "abort"), "wb").close()
    report = reopen_and_verify(root, acks)
    assert not report.clean_shutdown and report.records == N and not report.damaged
    assert report.dropped_bytes == 0 and not report.queue_units_dropped


# -- properties ---------------------------------------------------------------------------------------

FIELDS = {"TOTALSIZE": (0, 4), "MAGIC": (4, 4), "BODYCRC": (8, 4), "BODY": (BODY_POS, None)}


@settings(max_examples=12, deadline=None)
@given(data=st.data())
def test_any_detected_record_damage_cuts_the_log_there(store_copy, data):
    """A bit flipped in a checked field (TOTALSIZE, MAGIC, BODYCRC, the body) of any record of
    the last file: the log ends at that record, everything before it is readable."""
    root, acks = store_copy("clean")
    last_file = max(a.phy for a in acks) // FS * FS
    victims = sorted((a for a in acks if a.phy >= last_file), key=lambda a: a.phy)
    victim = data.draw(st.sampled_from(victims))
    name = data.draw(st.sampled_from(sorted(FIELDS)))
    start, length = FIELDS[name]
    length = len(victim.body) if length is None else length
    pos = victim.phy % FS + start + data.draw(st.integers(0, length - 1))
    path, _ = commitlog_file(root, victim.phy)
    flip_bit(path, pos, data.draw(st.integers(0, 7)))
    report = reopen_and_verify(root, acks, lost={a.i for a in acks if a.phy >= victim.phy})
    assert report.valid_end == victim.phy and report.stop_detail


@settings(max_examples=12, deadline=None)
@given(data=st.data())
def test_any_out_of_range_unit_damage_is_rebuilt(store_copy, data):
    """A high bit flipped in a unit's phyOffset (pointing past the log or negative) or size
    (negative, or running into the next record of the queue) of any queue: the queue is cut
    there and rebuilt."""
    root, acks = store_copy("clean")
    topic, qid = data.draw(st.sampled_from(TOPICS)), data.draw(st.integers(0, QUEUES - 1))
    q = data.draw(st.integers(0, 49))
    field = data.draw(st.sampled_from(["phy", "size"]))
    bit = data.draw(st.integers(20, 63) if field == "phy" else st.integers(16, 31))
    path = cq_files(root, topic, qid)[q // CQ_UNITS]
    width = 8 if field == "phy" else 4
    at = (q % CQ_UNITS) * UNIT + (0 if field == "phy" else 8) + width - 1 - bit // 8
    flip_bit(path, at, bit % 8)
    report = reopen_and_verify(root, acks)
    assert set(report.queue_units_missing) == {f"{topic}/{qid}"}
