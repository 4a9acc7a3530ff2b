"""Time -> queue-offset search (spec §3 getOffsetInQueueByTime, §15 hot/cold split, seed 003).

Real CommitLog records (mqstore.log._codec.encode_record) and ConsumeQueue units are written into
real MappedFiles; every lookup runs the Cython kernel (with and without the warm split), the
pure-Python twin (mqstore.twin.search) and its linear-scan oracle, and requires one answer.
"""

from __future__ import annotations

import random
import struct
from array import array
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mqstore.log._codec import BORNHOST_V6_FLAG, decode_record, encode_record, record_length
from mqstore.log._mapped import MappedFile
from mqstore.queue._reads import LogMap
from mqstore.queue._search import CQ_STORE_UNIT_SIZE, OS_PAGE_SIZE, WARM_BYTES_DEFAULT, offset_by_time, store_time_at
from mqstore.twin import search as twin

PAGE = 4096
UNIT = 20
CL_SIZE = 64 * 1024
CL_FILES = 4
CL_FIRST = 3 * CL_SIZE  # the CommitLog's older files are gone: file 0 starts at 3 * CL_SIZE
CQ_SIZE = 32 * 1024  # 8 pages, 1638 units
T0 = 1_700_000_000_000
V4 = ("127.0.0.1", 1)
V6 = ("::1", 1)


def name(offset: int) -> str:
    return f"{offset:020d}"


class Queue:
    """CommitLog files and one ConsumeQueue file on real MappedFiles, and the searches over them."""

    def __init__(self, root: Path, cl_files: int = CL_FILES, cl_size: int = CL_SIZE, cq_size: int = CQ_SIZE,
                 cl_first: int = CL_FIRST) -> None:
        (root / "commitlog").mkdir(parents=True)
        (root / "cq").mkdir()
        self.cl_size, self.cl_first = cl_size, cl_first
        self.cl = [MappedFile.create(str(root / "commitlog" / name(cl_first + k * cl_size)), cl_size)
                   for k in range(cl_files)]
        self.cq = MappedFile.create(str(root / "cq" / name(0)), cq_size)
        self.phys: list[int] = []
        self.stamps: list[int] = []

    def close(self) -> None:
        for f in [*self.cl, self.cq]:
            f.close()

    def fill(self, stamps: list[int], v6: list[bool] | None = None, *, start: int = 0) -> list[int]:
        """Write one record per stamp (a file takes records while 8 bytes stay free for the blank,
        spec §1.7) and its unit at CQ positions start, start + 20, ...; returns the offsets."""
        chunks = [bytearray() for _ in self.cl]
        units = bytearray()
        phys: list[int] = []
        k = 0
        for i, stamp in enumerate(stamps):
            born = V6 if v6 and v6[i] else V4
            size = record_length(0, 1, 0, BORNHOST_V6_FLAG if born is V6 else 0)
            if len(chunks[k]) + size + 8 > self.cl_size:
                k += 1
            phy = self.cl_first + k * self.cl_size + len(chunks[k])
            chunks[k] += encode_record(topic="T", body=b"", physical_offset=phy, store_timestamp=stamp,
                                       born_host=born, queue_offset=start // UNIT + i)
            units += struct.pack(">qiq", phy, size, 0)
            phys.append(phy)
        for f, chunk in zip(self.cl, chunks):
            f.write_at(0, chunk)
        self.cq.write_at(start, units)
        self.phys, self.stamps = phys, list(stamps)
        return phys

    def log_map(self, unmapped: tuple[int, ...] = ()) -> LogMap:
        return LogMap([None if k in unmapped else f for k, f in enumerate(self.cl)], self.cl_size, self.cl_first)

    def kernel(self, ts: int, low: int = 0, high: int | None = None, *, min_phy: int = 0,
               warm_bytes: int = WARM_BYTES_DEFAULT, unmapped: tuple[int, ...] = ()) -> tuple[int, int, int, int]:
        high = (len(self.phys) - 1) * UNIT if high is None else high
        return offset_by_time(self.cq, low, high, ts, min_phy, self.log_map(unmapped), warm_bytes)

    def lookup(self, ts: int, low: int = 0, high: int | None = None, *, min_phy: int = 0,
               warm_bytes: int = WARM_BYTES_DEFAULT, unmapped: tuple[int, ...] = (), linear: bool = True) -> int:
        """The kernel's position, after checking that the kernel without the split, the twin
        (same position, CQ pages and probes) and the linear oracle (unless linear=False: it reads
        every unit) all agree with it."""
        high = (len(self.phys) - 1) * UNIT if high is None else high
        pos, cq_pages, cl_pages, probes = self.kernel(ts, low, high, min_phy=min_phy, warm_bytes=warm_bytes,
                                                      unmapped=unmapped)
        plain = self.kernel(ts, low, high, min_phy=min_phy, warm_bytes=0, unmapped=unmapped)
        store_time = twin.store_time_reader([None if k in unmapped else f for k, f in enumerate(self.cl)],
                                            self.cl_first, self.cl_size)
        twin_result = twin.offset_by_time(self.cq, low, high, ts, min_phy, store_time, warm_bytes)
        expected = twin.offset_by_time_linear(self.cq, low, high, ts, min_phy, store_time) if linear else pos
        assert pos == plain[0] == expected, (pos, plain, expected)
        assert twin_result == (pos, cq_pages, probes)
        n = (high - low) // UNIT + 1
        assert probes <= max(n, 0).bit_length() + 1
        assert cl_pages <= 2 * probes and cq_pages <= 2 * probes
        return pos


@pytest.fixture
def q(tmp_path):
    queue = Queue(tmp_path)
    yield queue
    queue.close()


# -- fixed cases -------------------------------------------------------------------------------

def test_constants():
    assert (WARM_BYTES_DEFAULT, CQ_STORE_UNIT_SIZE, OS_PAGE_SIZE) == (8192, 20, 4096)
    assert (twin.WARM_BYTES_DEFAULT, twin.CQ_STORE_UNIT_SIZE, twin.OS_PAGE_SIZE) == (8192, 20, 4096)


def test_exact_match(q):
    q.fill([100, 200, 300, 400])
    assert [q.lookup(t) for t in (100, 200, 300, 400)] == [0, 20, 40, 60]


def test_earliest_of_equal_timestamps(q):
    q.fill([100, 200, 200, 200, 200, 300])
    assert q.lookup(200) == 20
    # a batch of 1200 units sharing one store time, over several CQ pages: the split's first hot
    # unit has the target time, so the answer is found in the cold part, at the batch's start
    q.fill([5] + [7] * 1200 + [9])
    assert q.lookup(7) == 20
    assert q.lookup(8) == 1200 * UNIT and q.lookup(6) == 0  # ties go left: the last 7, the first 5


def test_between_left_right_and_tie(q):
    q.fill([100, 200])
    assert q.lookup(140) == 0  # nearer the left
    assert q.lookup(160) == 20  # nearer the right
    assert q.lookup(150) == 0  # tie -> left (RocketMQ: |ts-left| > |ts-right| ? right : left)
    q.fill([100, 200, 200, 300])
    assert q.lookup(160) == 20  # the earliest of the equal right units
    assert q.lookup(260) == 60
    assert q.lookup(250) == 40  # tie between the last 200 and 300 -> left


def test_before_first_and_after_last(q):
    q.fill([100, 200, 300])
    assert q.lookup(-(2**63)) == 0
    assert q.lookup(99) == 0
    assert q.lookup(301) == 40
    assert q.lookup(2**63 - 1) == 40


def test_extreme_times_do_not_overflow(q):
    q.fill([-(2**63), 2**63 - 1])
    assert q.lookup(0) == 20  # 2**63 away on the left, 2**63 - 1 on the right
    assert q.lookup(-1) == 0  # 2**63 - 1 on the left, 2**63 on the right
    assert q.lookup(-(2**63)) == 0 and q.lookup(2**63 - 1) == 20


def test_removed_prefix_by_min_phy(q):
    phys = q.fill([100, 200, 300, 400])
    min_phy = phys[2]
    assert q.lookup(50, min_phy=min_phy) == 40
    assert q.lookup(200, min_phy=min_phy) == 40  # unit 1 has time 200 but is removed
    assert q.lookup(250, min_phy=min_phy) == 40  # the unit before r is removed -> r
    assert q.lookup(350, min_phy=min_phy) == 40  # tie with live neighbours -> left
    assert q.lookup(500, min_phy=min_phy) == 60
    assert q.lookup(200, min_phy=phys[2] - 1) == 40  # a min_phy inside a record removes it
    assert q.lookup(200, min_phy=phys[1]) == 20
    # the first probe (unit 1) is removed, the second (unit 2) is r: its left neighbour is
    # removed, so r is the answer although ts is nearer 0 than 50
    phys = q.fill([10, 20, 50])
    assert q.lookup(20, min_phy=phys[2]) == 40
    assert q.kernel(20, min_phy=phys[2])[3] == 2


def test_all_removed_returns_past_high(q):
    phys = q.fill([100, 200, 300, 400])
    gone = phys[-1] + 1
    for ts in (0, 200, 1000):
        assert q.lookup(ts, min_phy=gone) == 80
        assert q.lookup(ts, 20, 40, min_phy=gone) == 60  # high + 20 of the searched range


def test_unit_whose_commitlog_file_is_not_mapped_is_removed(q):
    stamps = [T0 + i for i in range(1000)]
    phys = q.fill(stamps)
    in_file_1 = next(i for i, p in enumerate(phys) if p >= CL_FIRST + CL_SIZE)
    assert 0 < in_file_1 < 900
    assert q.lookup(stamps[10]) == 10 * UNIT
    assert q.lookup(stamps[10], unmapped=(0,)) == in_file_1 * UNIT
    assert q.lookup(stamps[in_file_1 + 5], unmapped=(0,)) == (in_file_1 + 5) * UNIT
    assert q.lookup(stamps[10], unmapped=(0, 1, 2, 3)) == 1000 * UNIT


def test_store_time_at(q):
    phys = q.fill([111, 222, 333], v6=[False, True, False])
    log = q.log_map()
    assert [store_time_at(p, log) for p in phys] == [111, 222, 333]
    assert store_time_at(phys[1], log, min_phy=phys[1] + 1) is None
    assert store_time_at(phys[0], q.log_map(unmapped=(0,))) is None
    assert store_time_at(CL_FIRST - 1, log) is None  # before the first file
    assert store_time_at(CL_FIRST + CL_FILES * CL_SIZE, log) is None  # past the last
    assert store_time_at(CL_FIRST + CL_SIZE - 39, log) is None  # sysflag past the end
    assert store_time_at(CL_FIRST + CL_SIZE - 60, log) is None  # timestamp past the end
    assert store_time_at(CL_FIRST, LogMap([], CL_SIZE, CL_FIRST)) is None


def test_ipv6_born_host_time_is_read_at_68(q):
    stamps = [T0 + 10 * i for i in range(40)]
    v6 = [i % 3 == 0 for i in range(40)]
    phys = q.fill(stamps, v6)
    for i, p in enumerate(phys):
        rec = decode_record(q.cl[0], p - CL_FIRST)
        assert rec.store_timestamp == stamps[i] and bool(rec.sys_flag & BORNHOST_V6_FLAG) == v6[i]
        at56 = struct.unpack_from(">q", q.cl[0], p - CL_FIRST + 56)[0]
        assert (at56 == stamps[i]) != v6[i]  # with an IPv6 born host, byte 56 is inside the address
    for i in range(40):
        assert q.lookup(stamps[i]) == i * UNIT
        assert q.lookup(stamps[i] + 4) == i * UNIT
        assert q.lookup(stamps[i] + 6) == min(i + 1, 39) * UNIT


def test_single_unit(q):
    phys = q.fill([100])
    assert [q.lookup(t) for t in (0, 100, 200)] == [0, 0, 0]
    assert q.lookup(100, min_phy=phys[0] + 1) == 20
    assert q.kernel(100)[1:] == (1, 1, 1)


def test_empty_range_returns_low(q):
    q.fill([100, 200, 300])
    assert q.kernel(200, 40, 20) == (40, 0, 0, 0)
    assert q.kernel(200, 0, -20) == (0, 0, 0, 0)
    assert q.lookup(200, 40, 20) == 40
    assert twin.offset_by_time(q.cq, 40, 20, 200, 0, lambda _: 0) == (40, 0, 0)


def test_sub_range(q):
    q.fill([100, 200, 300, 400, 500])
    assert q.lookup(100, 20, 60) == 20
    assert q.lookup(600, 20, 60) == 60
    assert q.lookup(300, 40, 40) == 40


def test_bad_arguments_raise(q, tmp_path):
    log = q.log_map()
    for low, high in ((-20, 0), (10, 40), (0, 30)):
        with pytest.raises(ValueError):
            offset_by_time(q.cq, low, high, 0, 0, log)
        with pytest.raises(ValueError):
            twin.offset_by_time(bytes(64), low, high, 0, 0, lambda _: 0)
    with pytest.raises(ValueError, match="past the end"):
        offset_by_time(q.cq, 0, CQ_SIZE // UNIT * UNIT, 0, 0, log)  # that unit lies past the file
    with pytest.raises(ValueError):
        LogMap(q.cl, 0)
    with pytest.raises(ValueError):
        offset_by_time(q.cq, 0, 0, 0, 0, log, -1)
    with pytest.raises(ValueError):
        twin.offset_by_time(bytes(64), 0, 0, 0, 0, lambda _: 0, -1)
    with pytest.raises(TypeError):
        offset_by_time(4096, 0, 0, 0, 0, log)  # an address is not a file
    with pytest.raises(TypeError):
        offset_by_time(q.cq, 0, 0, 0, 0, array("q", [0]))  # nor are addresses a LogMap
    with pytest.raises(TypeError):
        LogMap([bytearray(CL_SIZE)], CL_SIZE)  # a LogMap maps MappedFiles
    gone = MappedFile.create(str(tmp_path / name(0)), CQ_SIZE)
    gone.close()
    with pytest.raises(ValueError, match="unmapped"):
        offset_by_time(gone, 0, 0, 0, 0, log)


# -- what a lookup touches -----------------------------------------------------------------------

def test_pages_of_a_straddling_unit_and_record(q):
    # a unit whose commitLogOffset bytes [pos, pos + 8) cross a CQ page boundary
    k = next(k for k in range(2048) if (k * UNIT) % PAGE == PAGE - 4)
    record = encode_record(topic="T", body=b"", physical_offset=CL_FIRST, store_timestamp=77, born_host=V4)
    q.cl[0].write_at(0, record)
    q.cq.write_at(k * UNIT, struct.pack(">qiq", CL_FIRST, len(record), 0))
    assert q.kernel(77, k * UNIT, k * UNIT) == (k * UNIT, 2, 1, 1)
    # a record whose STORETIMESTAMP (record + 56) crosses a CommitLog page: sysflag page + 2
    at = PAGE - 60
    q.cl[0].write_at(at, encode_record(topic="T", body=b"", physical_offset=CL_FIRST + at, store_timestamp=78))
    q.cq.write_at(0, struct.pack(">qiq", CL_FIRST + at, len(record), 0))
    assert q.kernel(78, 0, 0) == (0, 1, 2, 1)
    assert store_time_at(CL_FIRST + at, q.log_map()) == 78


def test_warm_section_edges(q):
    stamps = [T0 + i for i in range(300)]
    q.fill(stamps)
    # high = 4080: its last byte is on page 1, but no unit starts there -> plain search
    assert q.lookup(T0 + 1000, 0, 4080, warm_bytes=4096) == 4080
    assert q.kernel(T0 + 1000, 0, 4080, warm_bytes=4096) == q.kernel(T0 + 1000, 0, 4080, warm_bytes=0)
    # high = 4100: the only unit on the warm page is the last one -> a newer target costs 1 probe
    assert q.kernel(T0 + 1000, 0, 4100, warm_bytes=4096) == (4100, 1, 1, 1)
    assert q.lookup(stamps[205], 0, 4100, warm_bytes=4096) == 4100
    assert q.lookup(stamps[204], 0, 4100, warm_bytes=4096) == 4080
    # warm_bytes below a page still means one page; a range inside the warm section: no split
    assert q.kernel(T0 + 1000, 0, 4100, warm_bytes=1) == (4100, 1, 1, 1)
    assert q.kernel(T0 + 1000, 4100, 5000, warm_bytes=8192) == q.kernel(T0 + 1000, 4100, 5000, warm_bytes=0)
    assert q.kernel(T0 + 1000, 0, 5000, warm_bytes=8192) == q.kernel(T0 + 1000, 0, 5000, warm_bytes=0)


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """50,000 units (245 CQ pages) over 5 CommitLog files of 1 MiB; times in runs of 3 equal."""
    queue = Queue(tmp_path_factory.mktemp("big"), cl_files=5, cl_size=1 << 20, cq_size=1 << 20)
    queue.fill([T0 + i // 3 * 5 for i in range(50_000)])
    yield queue
    queue.close()


def test_recent_lookups_stay_in_the_warm_pages(big):
    n = len(big.phys)
    high = (n - 1) * UNIT
    last_page = (high + UNIT - 1) // PAGE
    assert last_page == 244
    first_hot = ((last_page - 1) * PAGE + UNIT - 1) // UNIT  # unit index: the first unit on page 243
    hot_time = big.stamps[first_hot]
    newer = [t for t in big.stamps[first_hot + 1::7] if t > hot_time] + [big.stamps[-1] + 1, big.stamps[-1] + 10**6]
    newer += [t + 1 for t in newer[:20]] + [hot_time + 1]
    assert len(newer) > 30
    for j, ts in enumerate(newer):
        pos, cq_pages, cl_pages, probes = big.kernel(ts)
        assert pos == big.lookup(ts, linear=j % 8 == 0)
        assert cq_pages <= 2, (ts, cq_pages)
        assert probes <= 1 + (n - first_hot).bit_length()
        assert 1 <= cl_pages <= 2 * probes
        assert big.kernel(ts, warm_bytes=16384)[1] <= 4
        plain = big.kernel(ts, warm_bytes=0)
        assert plain[0] == pos and plain[1] > 2  # without the split the same answer reads pages far back
    assert big.kernel(big.stamps[-1])[0] == (n - 1 - (n - 1) % 3) * UNIT
    # at the hot unit's own time Kafka's strict compare sends the lookup to the cold part
    assert big.kernel(hot_time)[1] > 2 and big.lookup(hot_time) == (first_hot - first_hot % 3) * UNIT


def test_old_lookups_read_the_cold_pages(big):
    for i in (0, 100, 12_345, 30_000):
        ts = big.stamps[i]
        pos, cq_pages, _, probes = big.kernel(ts)
        assert pos == big.lookup(ts) == (i - i % 3) * UNIT
        assert cq_pages > 2
        assert probes <= 1 + len(big.phys).bit_length()


# -- parity: kernel == twin == linear oracle ----------------------------------------------------

@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    queue = Queue(tmp_path_factory.mktemp("parity"))
    yield queue
    queue.close()


@given(
    n=st.one_of(st.integers(1, 1500), st.integers(800, 1500)),  # up to 8 CQ pages: the split matters
    seed=st.integers(0, 2**32),  # the bulk data comes from random.Random(seed): cheap to draw
    start=st.one_of(st.just(T0), st.integers(-(2**62), 2**62)),
    steps=st.sampled_from([(0, 1), (0, 0, 0, 1), (0, 1, 2, 5, 1000), (1,), (0, 0, 0, 0, 0, 0, 0, 3)]),
    v6_share=st.sampled_from([0.0, 0.3, 1.0]),
    removed=st.one_of(st.just(0), st.integers(0, 1500)),
    unmap_first=st.booleans(),
    warm_bytes=st.one_of(st.sampled_from([0, 1, 4096, 8192, 12288, 1 << 20]), st.integers(0, 40_000)),
    low_share=st.one_of(st.just(0.0), st.floats(0, 1)),
    tail_cut=st.one_of(st.just(0), st.integers(0, 1500)),
)
def test_parity_with_twin_and_linear_oracle(shared, n, seed, start, steps, v6_share, removed, unmap_first, warm_bytes,
                                            low_share, tail_cut):
    rnd = random.Random(seed)
    stamps = [start]
    for _ in range(n - 1):
        stamps.append(stamps[-1] + rnd.choice(steps))
    phys = shared.fill(stamps, [rnd.random() < v6_share for _ in range(n)])
    removed = min(removed, n)
    min_phy = phys[removed] if removed < n else phys[-1] + 1
    low_i = int(low_share * (n - 1))
    high_i = max(low_i - 1, n - 1 - tail_cut)  # low_i - 1: an empty range
    low, high = low_i * UNIT, high_i * UNIT
    inside = stamps[low_i:high_i + 1] or [start]
    targets = [inside[0] - 1, inside[-1] + 1, min(inside) - 10**6, *rnd.sample(inside, min(4, len(inside))),
               *(rnd.randint(inside[0] - 2, inside[-1] + 2) for _ in range(4)), *(t + 1 for t in inside[:2])]
    unmapped = (0,) if unmap_first else ()
    for ts in targets:
        pos = shared.lookup(ts, low, high, min_phy=min_phy, warm_bytes=warm_bytes, unmapped=unmapped)
        if high < low:
            assert pos == low
        else:
            assert low <= pos <= high + UNIT


def test_exact_lookups_return_the_earliest_unit_of_that_time(q):
    rnd = random.Random(3)
    stamps = sorted(rnd.randrange(300) for _ in range(1500))  # ~5 units per time, 8 CQ pages
    q.fill(stamps)
    for ts in set(stamps):
        assert q.lookup(ts) == stamps.index(ts) * UNIT
        assert q.lookup(ts, warm_bytes=4096) == stamps.index(ts) * UNIT
