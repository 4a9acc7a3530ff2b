"""IndexFile kernel (spec §4.1-§4.3), its pure-Python twin, and IndexService (spec §4.4, §5.1).

Kernel tests map real files under tmp_path (20-digit names, as MappedFile wants); service tests
run IndexService on a store root with small files (100 slots, 400 or a few entries).
"""

from __future__ import annotations

import errno
import itertools
import os
import struct
import subprocess
import sys
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqstore.queue import index as index_mod
from mqstore.queue._index import HASH_SLOT_SIZE, INDEX_HEADER_SIZE, INDEX_SIZE, IndexFile, index_file_size, index_key_hash
from mqstore.log._mapped import MappedFile
from mqstore.log.checkpoint import StoreCheckpoint, read_checkpoint_file
from mqstore.config import StoreConfig
from mqstore.errors import NotAStoreError, StoreClosedError
from mqstore.queue.index import IndexService, QueryOffsetResult, index_file_name
from mqstore.twin import index as twin
from mqstore.twin.codec import java_string_hash

SLOTS, NUM = 100, 400
SIZE = 40 + 4 * SLOTS + 20 * NUM
T0 = 1_700_000_000_000          # a store timestamp (ms)
ALL = (0, 2**62)                # a time window that matches everything

_names = itertools.count()


def _new_mapped(directory, size: int = SIZE) -> MappedFile:
    return MappedFile.create(str(directory / f"{next(_names):020d}"), size)


@pytest.fixture
def mapped(tmp_path):
    mf = _new_mapped(tmp_path)
    yield mf
    mf.close()


def entry(mf: MappedFile, n: int, slots: int = SLOTS) -> tuple[int, int, int, int]:
    """(keyHash, phyOffset, timeDiff, prev) of entry n, read from the mapping."""
    return struct.unpack(">iqii", mf.read(40 + 4 * slots + 20 * n, 20))


def header(mf: MappedFile) -> tuple[int, ...]:
    """(beginTs, endTs, beginPhy, endPhy, hashSlotCount, indexCount) read from the mapping."""
    return struct.unpack(">qqqqii", mf.read(0, 40))


def slot_value(mf: MappedFile, key: str, slots: int = SLOTS) -> int:
    return struct.unpack(">i", mf.read(40 + 4 * (index_key_hash(key) % slots), 4))[0]


def same_slot_other_hash(prefix: str, slots: int = SLOTS) -> tuple[str, str]:
    """Two keys in the same slot whose hashes differ."""
    seen: dict[int, str] = {}
    for i in itertools.count():
        key = f"{prefix}{i}"
        h = index_key_hash(key)
        other = seen.get(h % slots)
        if other is not None and index_key_hash(other) != h:
            return other, key
        seen[h % slots] = key
    raise AssertionError("unreachable")


# -- hash (spec §4.2, Appendix B) ----------------------------------------------------------------

def test_key_hash_java_examples():
    assert java_string_hash("TopicTest#key1") == -1655984460
    assert index_key_hash("TopicTest#key1") == 1655984460
    assert index_key_hash("TopicTest#key1") % 5_000_000 == 984460
    assert java_string_hash("polygenelubricants") == -2**31
    assert index_key_hash("polygenelubricants") == 0, "Java abs(MIN_VALUE) stays negative: mapped to 0"
    assert index_key_hash("") == 0
    assert index_key_hash("a") == 97


@given(st.text(max_size=30))
def test_key_hash_matches_twin(key):
    h = index_key_hash(key)
    assert h == twin.index_key_hash(key)
    assert 0 <= h <= 2**31 - 1


def test_layout_constants():
    assert (INDEX_HEADER_SIZE, HASH_SLOT_SIZE, INDEX_SIZE) == (40, 4, 20)
    assert index_file_size(5_000_000, 20_000_000) == 420_000_040
    assert index_file_size(SLOTS, NUM) == SIZE
    assert StoreConfig(max_hash_slot_num=SLOTS, max_index_num=NUM).index_file_size == SIZE


# -- header and capacity (spec §4.1, §4.2) -------------------------------------------------------

def test_new_file_header_is_written_through(mapped):
    f = IndexFile(mapped, SLOTS, NUM, 4096, T0)
    assert (f.begin_phy_offset, f.end_phy_offset, f.begin_timestamp, f.end_timestamp) == (4096, 4096, T0, T0)
    assert (f.hash_slot_count, f.index_count, f.hash_slot_num, f.index_num) == (0, 1, SLOTS, NUM)
    assert header(mapped) == (T0, T0, 4096, 4096, 0, 1)
    assert f.mapped_file is mapped and f.file_name == mapped.file_name
    assert not f.is_write_full
    assert f.select_phy_offset("k", 10, *ALL) == [], "indexCount 1: nothing to find"


def test_existing_header_is_read_not_reinitialised(mapped):
    f = IndexFile(mapped, SLOTS, NUM)
    f.put_key("T#a", 100, T0)
    f.put_key("T#b", 200, T0 + 5000)
    again = IndexFile(mapped, SLOTS, NUM, 999, 999)   # indexCount >= 1: the end_* arguments are ignored
    loaded = IndexFile.load(mapped, SLOTS, NUM)
    for g in (again, loaded):
        assert (g.begin_phy_offset, g.end_phy_offset, g.begin_timestamp, g.end_timestamp) == (100, 200, T0, T0 + 5000)
        assert (g.hash_slot_count, g.index_count) == (f.hash_slot_count, 3)
        assert g.select_phy_offset("T#b", 10, *ALL) == [200]
    assert header(mapped) == (T0, T0 + 5000, 100, 200, f.hash_slot_count, 3)


def test_load_of_never_written_file_counts_from_one_and_writes_nothing(mapped):
    f = IndexFile.load(mapped, SLOTS, NUM)
    assert f.index_count == 1
    assert mapped.read(0, SIZE) == bytes(SIZE), "load never writes"
    assert f.put_key("T#a", 7, T0)
    assert entry(mapped, 1)[1] == 7 and entry(mapped, 0) == (0, 0, 0, 0), "entry #0 stays unused"


def test_wrong_size_or_arguments_are_refused(tmp_path):
    mf = _new_mapped(tmp_path, SIZE + 20)
    try:
        with pytest.raises(ValueError, match=f"{SIZE + 20} bytes"):
            IndexFile(mf, SLOTS, NUM)
        with pytest.raises(ValueError, match="must be >= 1"):
            IndexFile(mf, 0, NUM + 1)
        f = IndexFile(mf, SLOTS, NUM + 1)
        with pytest.raises(ValueError, match="key_hash"):
            f.put_key_hash(-1, 0, T0)
    finally:
        mf.close()


def test_capacity_is_index_num_minus_one(mapped):
    f = IndexFile(mapped, SLOTS, NUM)
    for i in range(1, NUM):
        assert not f.is_write_full
        assert f.put_key(f"T#k{i % 37}", i, T0 + i) is True
    assert f.index_count == NUM and f.is_write_full
    before = mapped.read(0, SIZE)
    assert f.put_key("T#late", 10**6, T0 + 10**6) is False
    assert mapped.read(0, SIZE) == before, "a refused put changes nothing"
    assert header(mapped)[5] == NUM and f.end_phy_offset == NUM - 1


def test_header_fields_after_puts(mapped):
    f = IndexFile(mapped, SLOTS, NUM)
    keys = ["T#a", "T#b", "T#a", "T#c", "T#b"]
    for i, key in enumerate(keys):
        f.put_key(key, 1000 + i, T0 + 1000 * i)
    assert (f.begin_phy_offset, f.end_phy_offset) == (1000, 1004)
    assert (f.begin_timestamp, f.end_timestamp) == (T0, T0 + 4000)
    assert f.index_count == 6
    assert f.hash_slot_count == len({index_key_hash(k) % SLOTS for k in keys})
    assert header(mapped) == (T0, T0 + 4000, 1000, 1004, f.hash_slot_count, 6)
    assert entry(mapped, 3) == (index_key_hash("T#a"), 1002, 2, 1), "third put chains to entry 1"
    assert slot_value(mapped, "T#a") == 3 and slot_value(mapped, "T#b") == 5


def test_stale_slot_value_is_treated_as_empty(mapped):
    # a slot pointing past indexCount (garbage, e.g. from a torn write) starts a new chain
    pos = 40 + 4 * (index_key_hash("T#a") % SLOTS)
    f = IndexFile(mapped, SLOTS, NUM)
    raw = MappedFile.open(mapped.path, SIZE)
    try:
        raw.write_at(pos, struct.pack(">i", 50))
    finally:
        raw.close()
    f.put_key("T#a", 1, T0)
    assert entry(mapped, 1)[3] == 0 and f.hash_slot_count == 1
    assert f.select_phy_offset("T#a", 10, *ALL) == [1]


# -- chain walk (spec §4.3) ----------------------------------------------------------------------

def test_chain_returns_newest_first_and_respects_max_num(mapped):
    f = IndexFile(mapped, SLOTS, NUM)
    for i in range(10):
        f.put_key("T#k", 100 * i, T0 + i)
        f.put_key(f"T#other{i}", 1, T0 + i)
    assert f.select_phy_offset("T#k", 64, *ALL) == [900, 800, 700, 600, 500, 400, 300, 200, 100, 0]
    assert f.select_phy_offset("T#k", 3, *ALL) == [900, 800, 700]
    assert f.select_phy_offset("T#k", 0, *ALL) == []
    assert f.select_phy_offset("T#absent", 64, *ALL) == []


def test_time_window_filters_and_stops_early(mapped):
    f = IndexFile(mapped, SLOTS, NUM)
    for i in range(10):   # entry i at T0 + i seconds
        f.put_key("T#k", i, T0 + 1000 * i)
    assert f.select_phy_offset("T#k", 64, T0 + 3000, T0 + 6000) == [6, 5, 4, 3]
    assert f.select_phy_offset("T#k", 64, T0 + 3001, T0 + 5999) == [5, 4]
    assert f.select_phy_offset("T#k", 64, T0 + 9001, T0 + 99_000) == []
    assert f.select_phy_offset("T#k", 64, 0, T0 - 1) == []
    assert f.select_phy_offset("T#k", 64, T0, T0) == [0]
    assert f.select_phy_offset("T#k", 2, T0 + 3000, T0 + 6000) == [6, 5]


def test_same_slot_different_hash_is_not_returned(mapped):
    a, b = same_slot_other_hash("T#key")
    f = IndexFile(mapped, SLOTS, NUM)
    f.put_key(a, 1, T0)
    f.put_key(b, 2, T0)
    f.put_key(a, 3, T0)
    assert slot_value(mapped, a) == slot_value(mapped, b) == 3, "one chain"
    assert f.hash_slot_count == 1
    assert f.select_phy_offset(a, 64, *ALL) == [3, 1]
    assert f.select_phy_offset(b, 64, *ALL) == [2]


def test_same_hash_is_returned_so_callers_recheck(mapped):
    # "Aa" and "BB" have the same String.hashCode, so do "T#Aa" and "T#BB"
    assert index_key_hash("T#Aa") == index_key_hash("T#BB")
    f = IndexFile(mapped, SLOTS, NUM)
    f.put_key("T#Aa", 1, T0)
    f.put_key("T#BB", 2, T0)
    assert f.select_phy_offset("T#Aa", 64, *ALL) == [2, 1]
    assert f.select_phy_offset("T#BB", 64, *ALL) == [2, 1]


def test_min_value_hash_key_lands_in_slot_zero(mapped):
    f = IndexFile(mapped, SLOTS, NUM)
    f.put_key("polygenelubricants", 42, T0)
    assert struct.unpack(">i", mapped.read(40, 4))[0] == 1
    assert entry(mapped, 1)[0] == 0
    assert f.select_phy_offset("polygenelubricants", 64, *ALL) == [42]


def test_cyclic_chain_in_a_damaged_file_terminates(mapped):
    f = IndexFile(mapped, SLOTS, NUM)
    f.put_key("T#a", 1, T0)
    f.put_key("T#a", 2, T0)
    raw = MappedFile.open(mapped.path, SIZE)
    try:   # entry 1's prev -> 2: the chain 2 -> 1 -> 2 -> ... (RocketMQ would spin forever)
        raw.write_at(40 + 4 * SLOTS + 20 * 1 + 16, struct.pack(">i", 2))
    finally:
        raw.close()
    assert f.select_phy_offset("T#a", 64, *ALL) == [2, 1, 2], "stops after indexCount (3) steps"


# -- timeDiff (spec §4.2, Appendix B) --------------------------------------------------------------

def test_time_diff_truncates_and_clamps(mapped):
    f = IndexFile(mapped, SLOTS, NUM)
    f.put_key("T#a", 1, T0)                       # first entry: begin 0 -> timeDiff 0, then begin = T0
    f.put_key("T#a", 2, T0 + 1999)                # 1.999 s -> 1
    f.put_key("T#a", 3, T0 - 1500)                # before begin -> 0
    f.put_key("T#a", 4, T0 + 2**31 * 1000 + 5)    # above Integer.MAX_VALUE seconds -> capped
    assert [entry(mapped, n)[2] for n in range(1, 5)] == [0, 1, 0, 2**31 - 1]
    assert f.begin_timestamp == T0 and f.end_timestamp == T0 + 2**31 * 1000 + 5


@pytest.mark.parametrize("begin_ts", [0, -5])
def test_time_diff_is_zero_while_begin_is_not_positive(tmp_path, begin_ts):
    mf = _new_mapped(tmp_path)
    try:
        f = IndexFile(mf, SLOTS, NUM, 0, begin_ts)
        f.put_key("T#a", 1, T0)
        assert entry(mf, 1)[2] == 0
        assert f.begin_timestamp == T0
    finally:
        mf.close()


def test_first_entry_after_full_file_is_measured_from_previous_end(mapped):
    # QUIRK (RocketMQ 4.9.7): the first put computes timeDiff against the begin inherited from
    # the previous file's end, then sets begin to its own timestamp.
    f = IndexFile(mapped, SLOTS, NUM, 500, T0)
    f.put_key("T#a", 600, T0 + 5500)
    assert entry(mapped, 1)[2] == 5
    assert (f.begin_timestamp, f.begin_phy_offset) == (T0 + 5500, 600)
    assert f.select_phy_offset("T#a", 64, T0 + 5500, T0 + 5500) == []
    assert f.select_phy_offset("T#a", 64, T0 + 10_500, T0 + 10_500) == [600]


def test_is_time_matched(mapped):
    f = IndexFile(mapped, SLOTS, NUM)
    f.put_key("T#a", 1, 10_000)
    f.put_key("T#a", 2, 20_000)
    cases = {
        (0, 5_000): False, (25_000, 30_000): False,      # before / after
        (5_000, 30_000): True,                            # covers the file
        (12_000, 15_000): True,                           # inside
        (5_000, 10_000): True, (20_000, 30_000): True,    # touches an end
        (5_000, 12_000): True, (15_000, 30_000): True,    # overlaps one end
        (10_000, 10_000): True, (9_999, 9_999): False,
        (20_000, 5_000): True,                            # begin inside even if end < begin
    }
    for (b, e), want in cases.items():
        assert f.is_time_matched(b, e) is want, (b, e)


# -- lifetime ------------------------------------------------------------------------------------

def test_flush_and_destroy(tmp_path):
    mf = _new_mapped(tmp_path)
    f = IndexFile(mf, SLOTS, NUM)
    f.put_key("T#a", 1, T0)
    assert f.flush() is True
    assert f.destroy(0) is True
    assert not os.path.exists(mf.path)
    assert f.flush() is False
    assert f.select_phy_offset("T#a", 10, *ALL) == []
    with pytest.raises(ValueError, match="destroyed or closed"):
        f.put_key("T#a", 2, T0)


def test_destroy_waits_for_a_holder(tmp_path):
    mf = _new_mapped(tmp_path)
    f = IndexFile(mf, SLOTS, NUM)
    assert mf.hold()
    assert f.destroy(60_000) is False and os.path.exists(mf.path)
    mf.release()
    assert f.destroy(60_000) is True and not os.path.exists(mf.path)


# -- parity with the twin (hypothesis) -------------------------------------------------------------

KEYS = st.sampled_from(["T#a", "T#b", "T#c", "T#Aa", "T#BB", "polygenelubricants", "T#\U0001F600", ""])
LONG = st.integers(-2**63, 2**63 - 1)
EXTREME = st.sampled_from([-2**63, -2**63 + 999, 2**63 - 1, 2**63 - 2**31 * 1000])   # Java long wrap-around
TS = st.one_of(st.integers(T0 - 50_000, T0 + 50_000), st.integers(-5000, 5000), LONG, EXTREME)
PHY = st.one_of(st.integers(0, 2**40), LONG)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(slots=st.sampled_from([1, 2, 7, 100]), num=st.integers(2, 40), end_phy=PHY, end_ts=TS,
       puts=st.lists(st.tuples(KEYS, PHY, TS), max_size=50),
       queries=st.lists(st.tuples(KEYS, st.integers(0, 70), TS, TS), max_size=12))
def test_kernel_matches_twin(tmp_path, slots, num, end_phy, end_ts, puts, queries):
    size = index_file_size(slots, num)
    mf = _new_mapped(tmp_path, size)
    try:
        f = IndexFile(mf, slots, num, end_phy, end_ts)
        t = twin.IndexFile(slots, num, end_phy, end_ts)
        for key, phy, ts in puts:
            assert f.put_key(key, phy, ts) == t.put_key(key, phy, ts)
            assert f.is_write_full == t.is_write_full
        assert mf.read(0, size) == bytes(t.data)
        assert (f.begin_timestamp, f.end_timestamp, f.begin_phy_offset, f.end_phy_offset, f.hash_slot_count,
                f.index_count) == (t.begin_timestamp, t.end_timestamp, t.begin_phy_offset, t.end_phy_offset,
                                   t.hash_slot_count, t.index_count)
        for key, max_num, a, b in queries + [(k, 64, *ALL) for k, _, _ in puts]:
            assert f.select_phy_offset(key, max_num, a, b) == t.select_phy_offset(key, max_num, a, b)
            assert f.is_time_matched(a, b) == t.is_time_matched(a, b)
        loaded = twin.IndexFile.load(slots, num, bytearray(mf.read(0, size)))
        assert (loaded.index_count, loaded.end_phy_offset) == (f.index_count, f.end_phy_offset)
    finally:
        mf.destroy(0)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(num=st.integers(2, 30), end_phy=st.integers(0, 5000), start=st.integers(0, 3),
       puts=st.lists(st.tuples(KEYS, st.integers(0, 10_000), TS), max_size=50))
def test_put_key_hashes_is_put_key_hash_with_build_index_skips(tmp_path, num, end_phy, start, puts):
    """The batch put of the concurrent dispatch: keys below end_phy_offset are skipped (as
    build_index skips an indexed message), the rest go in order until the file is full."""
    size = index_file_size(7, num)
    a, b = _new_mapped(tmp_path, size), _new_mapped(tmp_path, size)
    try:
        one, batch = IndexFile(a, 7, num, end_phy, T0), IndexFile(b, 7, num, end_phy, T0)
        done = start
        for key, phy, ts in puts[start:]:
            if one.is_write_full:
                break
            if phy >= one.end_phy_offset:
                one.put_key_hash(index_key_hash(key), phy, ts)
            done += 1
        keys = b"".join(struct.pack("=qqq", phy, ts, index_key_hash(k)) for k, phy, ts in puts)
        assert batch.put_key_hashes(keys, start) == max(done, start)
        assert b.read(0, size) == a.read(0, size)
        if not batch.is_write_full:
            with pytest.raises(ValueError):
                batch.put_key_hashes(struct.pack("=qqq", 2**40, 0, -5))
    finally:
        a.destroy(0)
        b.destroy(0)


# -- IndexService (spec §4.4) ----------------------------------------------------------------------

@pytest.fixture
def root(tmp_path):
    path = tmp_path / "store"
    path.mkdir()
    return str(path)


@pytest.fixture
def checkpoint(root):
    cp = StoreCheckpoint(os.path.join(root, "checkpoint"))
    yield cp
    cp.close()


@pytest.fixture
def make_service(root, checkpoint):
    """make_service(**config) -> a loaded IndexService on root; every one is closed at the end."""
    made: list[IndexService] = []

    def factory(last_exit_ok: bool = True, **overrides) -> IndexService:
        cfg = StoreConfig(**{"max_hash_slot_num": SLOTS, "max_index_num": NUM, **overrides})
        service = IndexService(root, cfg, checkpoint)
        service.load(last_exit_ok)
        made.append(service)
        return service

    yield factory
    for service in made:
        service.close()


def index_names(root: str) -> list[str]:
    return sorted(os.listdir(os.path.join(root, "index")))


def fill(service: IndexService, messages: int, key: str = "K", first_phy: int = 0, step_ms: int = 1000) -> list[int]:
    """messages messages with one key each at phy first_phy + 100 i, T0 + i * step_ms; their phys."""
    phys = [first_phy + 100 * i for i in range(messages)]
    for i, phy in enumerate(phys):
        assert service.build_index("T", key, None, phy, T0 + (first_phy // 100 + i) * step_ms, 0)
    return phys


def test_message_keys_and_uniq_key_are_indexed(make_service):
    s = make_service()
    assert s.files == []
    assert s.build_index("T", "k1 k2  k3 ", "U1", 100, T0, 0) is True
    (f,) = s.files
    assert f.index_count == 1 + 4, "UNIQ_KEY and the three non-empty words of KEYS"
    for key in ("U1", "k1", "k2", "k3"):
        assert s.query_offset("T", key, 32, *ALL).phy_offsets == [100], key
    assert s.query_offset("T", "", 32, *ALL).phy_offsets == []
    assert s.query_offset("T2", "k1", 32, *ALL).phy_offsets == []
    assert s.build_index("T", None, None, 200, T0, 0) is True and f.index_count == 5
    assert s.build_index("T", "", "", 300, T0, 0) is True and f.index_count == 5


@pytest.mark.parametrize("sys_flag,indexed", [(0x0, True), (0x4, True), (0x8, True), (0xC, False), (0xC | 0x13, False)])
def test_transaction_types(make_service, sys_flag, indexed):
    s = make_service()
    assert s.build_index("T", "k", None, 100, T0, sys_flag) is True
    assert s.query_offset("T", "k", 32, *ALL).phy_offsets == ([100] if indexed else [])


def test_redispatch_below_end_phy_offset_is_skipped(make_service):
    s = make_service()
    s.build_index("T", "a b", None, 500, T0, 0)
    (f,) = s.files
    s.build_index("T", "a", None, 400, T0, 0)
    assert f.index_count == 3 and f.end_phy_offset == 500, "already indexed: skipped"
    # RocketMQ skips only offsets *below* the end: the newest message itself is indexed again
    s.build_index("T", "a", None, 500, T0, 0)
    assert f.index_count == 4
    assert s.query_offset("T", "a", 32, *ALL).phy_offsets == [500, 500]


def test_new_file_when_full_starts_at_previous_end(make_service):
    s = make_service(max_index_num=4)           # 3 keys per file
    s.build_index("T", "a b c", None, 300, T0 + 3000, 0)
    (first,) = s.files
    assert first.is_write_full
    # the next dispatch finds the file full, starts a new one at the previous end, then skips
    # this message (it is below that end)
    assert s.build_index("T", "d", None, 200, T0 + 9000, 0) is True
    old, new = s.files
    assert old is first
    assert (new.begin_phy_offset, new.end_phy_offset, new.begin_timestamp, new.end_timestamp) == \
        (300, 300, T0 + 3000, T0 + 3000)
    assert new.index_count == 1
    assert s.build_index("T", "d", None, 400, T0 + 4000, 0) is True
    assert (new.begin_phy_offset, new.begin_timestamp, new.index_count) == (400, T0 + 4000, 2)
    assert s.query_offset("T", "d", 32, *ALL).phy_offsets == [400]


def test_file_names_are_17_digits_and_strictly_increasing(make_service, monkeypatch, root):
    frozen = T0 + 999                                  # every file created in the same millisecond
    monkeypatch.setattr(index_mod, "_now_ms", lambda: frozen)
    s = make_service(max_index_num=2)                  # 1 key per file
    fill(s, 4)
    names = [f.file_name for f in s.files]
    assert names[0] == index_file_name(frozen)
    assert all(len(n) == 17 and n.isdigit() for n in names)
    assert names == sorted(set(names)) and len(names) == 4
    assert names[1] == index_file_name(frozen + 1) and names[3] == index_file_name(frozen + 3)
    assert index_names(root) == names, "only the index files are left in index/"


def test_index_file_name_format():
    ms = T0 + 42
    assert index_file_name(ms) == time.strftime("%Y%m%d%H%M%S", time.localtime(T0 // 1000)) + "042"
    assert index_mod._name_after("20231231235959999") == "20240101000000000"
    assert index_mod._name_after("20240230000000000") == "20240230000000001", "not a date: plain + 1"


def test_query_offset_walks_files_newest_first_with_max_num(make_service):
    s = make_service(max_index_num=4)
    phys = fill(s, 8)                                   # 3 files: 3 + 3 + 2 keys
    assert len(s.files) == 3
    newest_first = phys[::-1]
    result = s.query_offset("T", "K", 64, *ALL)
    assert isinstance(result, QueryOffsetResult)
    assert result.phy_offsets == newest_first
    assert (result.index_last_update_phy_offset, result.index_last_update_timestamp) == (700, T0 + 7000)
    assert s.query_offset("T", "K", 5, *ALL).phy_offsets == newest_first[:5]
    assert s.query_offset("T", "K", 0, *ALL).phy_offsets == []
    # a window inside the middle file; the walk stops at the first file that begins before it
    assert s.query_offset("T", "K", 64, T0 + 3000, T0 + 4000).phy_offsets == [400, 300]
    # QUIRK (see test_first_entry_after_full_file_is_measured_from_previous_end): the first
    # key of the middle file (300, stored at T0 + 3000) reads back as T0 + 4000
    assert s.query_offset("T", "K", 64, T0 + 2000, T0 + 3000).phy_offsets == [200]


def test_query_offset_is_capped_by_max_msgs_num_batch(make_service):
    s = make_service(max_index_num=4, max_msgs_num_batch=4)
    fill(s, 8)
    assert s.query_offset("T", "K", 64, *ALL).phy_offsets == [700, 600, 500, 400]


def test_query_on_empty_service(make_service):
    assert make_service().query_offset("T", "K", 64, *ALL) == QueryOffsetResult([], 0, 0)


def test_checkpoint_gets_end_of_full_file_after_its_flush(make_service, checkpoint, root):
    s = make_service(max_index_num=4)
    fill(s, 3)
    assert checkpoint.index_msg_timestamp == 0, "nothing flushed yet"
    fill(s, 4, first_phy=300)                          # the first file is full, the second fills up too
    first, second, _ = s.files
    s.close()                                          # waits for the background flushes
    assert first.end_timestamp == T0 + 2000 and second.end_timestamp == T0 + 5000
    assert checkpoint.index_msg_timestamp == T0 + 5000
    assert read_checkpoint_file(os.path.join(root, "checkpoint"))["index_msg_timestamp"] == T0 + 5000


def test_load_after_abnormal_exit_drops_files_newer_than_checkpoint(make_service, checkpoint, root):
    s = make_service(max_index_num=4)
    fill(s, 8)
    s.close()
    names = index_names(root)
    assert len(names) == 3 and checkpoint.index_msg_timestamp == T0 + 5000
    checkpoint.index_msg_timestamp = T0 + 2000          # as if the second file's flush had not finished
    s2 = make_service(last_exit_ok=False, max_index_num=4)
    assert [f.file_name for f in s2.files] == names[:1]
    assert index_names(root) == names[:1], "destroyed files are deleted"
    assert s2.query_offset("T", "K", 64, *ALL).phy_offsets == [200, 100, 0]
    # dispatch resumes behind the kept file: new keys go to a new file
    assert s2.build_index("T", "K", None, 300, T0 + 3000, 0)
    assert [f.end_phy_offset for f in s2.files] == [200, 300]


def test_load_after_clean_exit_keeps_every_file(make_service, checkpoint, root):
    s = make_service(max_index_num=4)
    fill(s, 8)
    s.close()
    checkpoint.index_msg_timestamp = 0
    s2 = make_service(last_exit_ok=True, max_index_num=4)
    assert [f.file_name for f in s2.files] == index_names(root) and len(s2.files) == 3
    assert s2.query_offset("T", "K", 64, *ALL).phy_offsets == [700, 600, 500, 400, 300, 200, 100, 0]
    assert s2.files[-1].index_count == 3
    s2.build_index("T", "K", None, 800, T0 + 8000, 0)   # the partly filled last file takes more keys
    assert len(s2.files) == 3 and s2.files[-1].is_write_full


def test_load_ignores_other_names_and_removes_staging_leftovers(make_service, root):
    s = make_service()
    fill(s, 1)
    s.close()
    (name,) = index_names(root)
    index_dir = os.path.join(root, "index")
    for junk in ("README", "123", "000" + name + ".alloc77"):
        with open(os.path.join(index_dir, junk), "wb") as fh:
            fh.write(b"x")
    os.link(os.path.join(index_dir, name), os.path.join(index_dir, "000" + name))
    os.mkdir(os.path.join(index_dir, "20000101000000000"))
    s2 = make_service()
    assert [f.file_name for f in s2.files] == [name]
    assert index_names(root) == sorted(["123", "20000101000000000", "README", name])
    assert s2.query_offset("T", "K", 64, *ALL).phy_offsets == [0]


def test_load_leaves_a_live_processs_index_creation_alone(make_service, root):
    """``<name>.alloc<pid>`` is MappedFile.create's temporary name: a dead pid's is a leftover,
    a running pid's is another process of the node creating that index file right now."""
    s = make_service()
    fill(s, 1)
    s.close()
    (name,) = index_names(root)
    index_dir = os.path.join(root, "index")
    proc = subprocess.Popen(["true"])
    proc.wait()
    later = str(int(name) + 1)
    dead, live = f"{later}.alloc{proc.pid}", f"{later}.alloc{os.getpid()}"
    for junk in (dead, live):
        with open(os.path.join(index_dir, junk), "wb") as fh:
            fh.write(b"x")
    make_service()
    assert index_names(root) == sorted([name, live])


def test_two_processes_open_one_index_file_at_once(make_service, root):
    """Every process of a node maps the index files; opening one is no longer a shared hard
    link, which two processes opening the same file at once collided on (FileExistsError)."""
    s = make_service()
    fill(s, 3)
    s.close()
    code = ("import os, sys; from mqstore.queue.index import _IndexMapping; p, size = sys.argv[1], int(sys.argv[2]); "
            "[_IndexMapping.open(p, size).close() for _ in range(300)]")
    (name,) = index_names(root)
    path = os.path.join(root, "index", name)
    procs = [subprocess.Popen([sys.executable, "-c", code, path, str(os.path.getsize(path))], stderr=subprocess.PIPE)
             for _ in range(3)]
    for proc in procs:
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err.decode()[-2000:]
    assert index_names(root) == [name]


def test_wrong_size_file_is_refused_by_name(make_service, root):
    index_dir = os.path.join(root, "index")
    os.makedirs(index_dir)
    bad = os.path.join(index_dir, "20240101120000000")
    with open(bad, "wb") as fh:
        fh.write(bytes(SIZE - 20))
    with pytest.raises(NotAStoreError) as ei:
        make_service()
    assert bad in str(ei.value) and str(SIZE - 20) in str(ei.value) and str(SIZE) in str(ei.value)


def test_delete_expired_file_never_deletes_the_last(make_service, root):
    s = make_service(max_index_num=4)
    fill(s, 8)                                          # ends: 200, 500, 700
    names = index_names(root)
    assert s.delete_expired_file(200) == 0, "the first file ends at 200: not below"
    assert s.delete_expired_file(201) == 1
    assert index_names(root) == names[1:]
    assert s.delete_expired_file(10**9) == 1, "everything is expired, but the last file stays"
    assert [f.file_name for f in s.files] == names[2:] == index_names(root)
    assert s.delete_expired_file(10**9) == 0
    assert s.query_offset("T", "K", 64, *ALL).phy_offsets == [700, 600]


def test_delete_expired_file_stops_at_a_file_in_use(make_service):
    s = make_service(max_index_num=4)
    fill(s, 8)
    first = s.files[0]
    assert first.mapped_file.hold()
    try:
        assert s.delete_expired_file(10**9) == 0
        assert len(s.files) == 3
    finally:
        first.mapped_file.release()


def test_failing_file_creation_is_retried_at_intervals_without_sleeping(make_service, monkeypatch):
    calls = []
    real_create = index_mod._IndexMapping.create
    space = {"left": False}

    def create(path, size, allocate=-1):
        calls.append(path)
        if not space["left"]:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_create(path, size, allocate)

    clock = {"now": 1000.0}
    monkeypatch.setattr(index_mod.time, "monotonic", lambda: clock["now"])
    monkeypatch.setattr(index_mod._IndexMapping, "create", staticmethod(create))
    s = make_service()
    t0 = time.perf_counter()
    assert s.build_index("T", "K", None, 0, T0, 0) is False
    assert s.build_index("T", "K", None, 100, T0, 0) is False  # within the interval: not tried again
    assert s.writable() is False
    assert len(calls) == 1 and s.files == []
    clock["now"] += index_mod.CREATE_RETRY_INTERVAL_S
    assert s.writable() is False and len(calls) == 2  # tried again after the interval
    space["left"] = True
    assert s.build_index("T", "K", None, 200, T0, 0) is False  # still within the interval
    clock["now"] += index_mod.CREATE_RETRY_INTERVAL_S
    assert s.writable() is True
    assert s.build_index("T", "K", None, 300, T0, 0) is True
    assert s.query_offset("T", "K", 64, *ALL).phy_offsets == [300]
    assert time.perf_counter() - t0 < 1.0  # no sleeping in the dispatcher


def test_entries_are_allocated_in_steps(make_service, monkeypatch):
    monkeypatch.setattr(index_mod, "ALLOCATE_STEP", 4096)
    s = make_service(max_hash_slot_num=64, max_index_num=1000)
    fill(s, 1)
    f = s.files[0]
    mapped = f.mapped_file.mapped
    entries_at = index_mod.HEADER_SIZE + 64 * index_mod.SLOT_SIZE
    assert mapped.allocated == entries_at + 4096
    assert os.stat(f.mapped_file.path).st_blocks * 512 < s.file_size  # the rest is sparse
    n = 4096 // index_mod.ENTRY_SIZE + 10
    for i in range(n):
        assert s.build_index("T", f"K{i}", None, 100 + i, T0, 0)
    assert mapped.allocated >= entries_at + (n + 1) * index_mod.ENTRY_SIZE
    assert s.query_offset("T", f"K{n - 1}", 64, *ALL).phy_offsets == [100 + n - 1]


def test_a_failed_allocation_step_indexes_nothing_until_space_returns(make_service, monkeypatch):
    monkeypatch.setattr(index_mod, "ALLOCATE_STEP", 4096)
    clock = {"now": 1000.0}
    monkeypatch.setattr(index_mod.time, "monotonic", lambda: clock["now"])
    s = make_service(max_hash_slot_num=64, max_index_num=1000)
    fill(s, 1)
    mapped = s.files[0].mapped_file.mapped
    real = type(mapped).allocate_to
    full = {"on": True}

    class Failing:
        def __getattr__(self, name):
            return getattr(mapped, name)

        def allocate_to(self, end):
            if full["on"]:
                raise OSError(errno.ENOSPC, "No space left on device")
            return real(mapped, end)

    s.files[0].mapped_file.mapped = Failing()
    per_step = 4096 // index_mod.ENTRY_SIZE
    results = [s.build_index("T", f"K{i}", None, 100 + i, T0, 0) for i in range(per_step + 5)]
    ok = results.index(False)
    assert per_step - 5 <= ok < per_step and not any(results[ok:])  # the step filled up, then nothing
    assert not s.writable()
    full["on"] = False
    clock["now"] += index_mod.CREATE_RETRY_INTERVAL_S
    assert s.writable()
    assert s.build_index("T", "late", None, 9000, T0, 0)
    assert s.query_offset("T", "late", 64, *ALL).phy_offsets == [9000]


def test_flush_destroy_and_close(make_service, root):
    s = make_service(max_index_num=4)
    fill(s, 5)
    s.flush()
    s.destroy()
    assert s.files == [] and index_names(root) == []
    s.close()
    with pytest.raises(StoreClosedError):
        s.build_index("T", "K", None, 0, T0, 0)
    assert s.query_offset("T", "K", 64, *ALL).phy_offsets == []


def test_close_unmaps_and_reopen_sees_everything(make_service):
    s = make_service(max_index_num=4)
    fill(s, 5)
    files = s.files
    s.close()
    s.close()
    assert all(not f.mapped_file.mapped.is_available for f in files)
    assert make_service(max_index_num=4).query_offset("T", "K", 64, *ALL).phy_offsets == [400, 300, 200, 100, 0]


def test_queries_while_the_dispatcher_builds_and_cleans(make_service):
    s = make_service(max_index_num=8)                   # 7 keys per file: many new files
    errors: list[BaseException] = []
    done = threading.Event()

    def query() -> None:
        try:
            while not done.is_set():
                got = s.query_offset("T", "K", 64, *ALL).phy_offsets
                assert got == sorted(got, reverse=True) and all(p % 100 == 0 for p in got)
        except BaseException as e:   # reported below
            errors.append(e)

    threads = [threading.Thread(target=query) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        for i in range(300):
            assert s.build_index("T", "K", None, 100 * i, T0 + 1000 * i, 0)
            if i % 50 == 49:
                s.delete_expired_file(100 * (i - 20))
    finally:
        done.set()
        for t in threads:
            t.join()
    assert errors == []
    assert s.query_offset("T", "K", 64, *ALL).phy_offsets[:3] == [29900, 29800, 29700]


# -- through the store ---------------------------------------------------------------------------

def test_store_indexes_keys_and_finds_them_after_reopen(open_store, store_dir):
    from mqstore import Message

    def bodies(store, key: str) -> list[bytes]:
        return [bytes(m.body) for m in store.query_message("T", key).messages]

    cfg = {"max_hash_slot_num": 7, "max_index_num": 6}      # 5 keys per file: several files
    store = open_store(**cfg)
    for i in range(12):
        store.put_message(Message("T", b"m%d" % i, keys=[f"k{i % 3}", "Aa" if i % 2 else "BB"],
                                  properties={"UNIQ_KEY": f"u{i}"}))
    assert store.wait_dispatched()
    assert len(os.listdir(os.path.join(store_dir, "index"))) == 8     # 36 keys, 5 per file
    assert bodies(store, "k1") == [b"m1", b"m4", b"m7", b"m10"]
    assert bodies(store, "u5") == [b"m5"]
    # "Aa" and "BB" share a hash: the index returns both, the reader keeps the real matches
    assert bodies(store, "Aa") == [b"m1", b"m3", b"m5", b"m7", b"m9", b"m11"]
    store.shutdown()
    again = open_store(**cfg)
    assert bodies(again, "k2") == [b"m2", b"m5", b"m8", b"m11"]
    assert bodies(again, "BB") == [b"m0", b"m2", b"m4", b"m6", b"m8", b"m10"]
