"""MappedFileQueue (spec §2, §6.2): load, offset lookup, last-file creation, truncation, expiry."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from mqstore.log._mapped import MappedFile
from mqstore.errors import NotAStoreError
from mqstore.log.mapped_file_queue import DELETE_FILES_BATCH_MAX, MappedFileQueue

FS = 4096


def name(offset: int) -> str:
    return f"{offset:020d}"


def make_files(directory, starts, size=FS, fill=None):
    os.makedirs(directory, exist_ok=True)
    for start in starts:
        f = MappedFile.create(os.path.join(directory, name(start)), size)
        if fill is not None:
            f.write_at(0, fill(start))
        f.close()


@pytest.fixture
def qdir(tmp_path):
    return str(tmp_path / "commitlog")


@pytest.fixture
def queues():
    opened = []
    yield opened
    for q in opened:
        q.close()


def loaded(qdir, queues, size=FS):
    q = MappedFileQueue(qdir, size)
    queues.append(q)
    q.load()
    return q


# -- load --------------------------------------------------------------------------------------

def test_load_sorted_with_full_positions(qdir, queues):
    make_files(qdir, [3 * FS, FS, 2 * FS])  # created out of order
    with open(os.path.join(qdir, "README"), "w") as fh:  # not a mapped file name: ignored
        fh.write("x")
    q = loaded(qdir, queues)
    assert [f.file_from for f in q.files] == [FS, 2 * FS, 3 * FS]
    assert [f.file_name for f in q] == [name(FS), name(2 * FS), name(3 * FS)]
    assert len(q) == 3
    assert q.min_offset == FS
    assert q.first().file_from == FS and q.last().file_from == 3 * FS
    for f in q.files:
        assert (f.wrote_position, f.committed_position, f.flushed_position) == (FS, FS, FS)
    assert os.path.exists(os.path.join(qdir, "README"))


def test_load_empty_and_missing_directory(tmp_path, queues):
    q = loaded(str(tmp_path / "a" / "b"), queues)
    assert os.path.isdir(tmp_path / "a" / "b")
    assert len(q) == 0 and q.first() is None and q.last() is None
    assert q.min_offset == -1


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_load_removes_allocation_leftovers_of_dead_processes_only(qdir, queues):
    """A dead pid's ``.alloc`` file is a leftover; a running pid's is another process of the
    node allocating that file right now (removing it would fail that allocation)."""
    make_files(qdir, [0, FS])
    leftovers = [name(2 * FS) + f".alloc{dead_pid()}", name(3 * FS) + f".alloc{dead_pid()}"]
    under_way = name(2 * FS) + f".alloc{os.getpid()}"
    for n in leftovers + [under_way]:
        with open(os.path.join(qdir, n), "wb") as fh:
            fh.write(b"\0" * 100)
    q = loaded(qdir, queues)
    assert sorted(os.listdir(qdir)) == [name(0), name(FS), under_way]
    assert [f.file_from for f in q] == [0, FS]


def test_load_wrong_size_is_not_a_store(qdir, queues):
    make_files(qdir, [0])
    make_files(qdir, [FS], size=2 * FS)
    q = MappedFileQueue(qdir, FS)
    with pytest.raises(NotAStoreError) as ei:
        q.load()
    assert name(FS) in str(ei.value) and str(2 * FS) in str(ei.value)
    assert ei.value.hint


def test_load_non_contiguous_is_not_a_store(qdir, queues):
    make_files(qdir, [0, FS, 3 * FS])
    q = MappedFileQueue(qdir, FS)
    with pytest.raises(NotAStoreError, match="not contiguous") as ei:
        q.load()
    assert name(FS) in str(ei.value) and name(3 * FS) in str(ei.value)
    q.close()


def test_load_unaligned_first_file_is_not_a_store(qdir, queues):
    make_files(qdir, [100])
    q = MappedFileQueue(qdir, FS)
    with pytest.raises(NotAStoreError, match="not aligned"):
        q.load()
    q.close()


# -- find_mapped_file_by_offset (spec §2) -------------------------------------------------------

def test_find_mapped_file_by_offset_edges(qdir, queues):
    make_files(qdir, [2 * FS, 3 * FS, 4 * FS])
    q = loaded(qdir, queues)
    first = q.first()
    cases = {2 * FS: 2 * FS, 2 * FS + 1: 2 * FS, 3 * FS - 1: 2 * FS, 3 * FS: 3 * FS, 4 * FS + 17: 4 * FS,
             5 * FS - 1: 4 * FS}
    for offset, start in cases.items():
        assert q.find_mapped_file_by_offset(offset).file_from == start, offset
        assert q.find_mapped_file_by_offset(offset, True).file_from == start, offset
    for outside in (0, 2 * FS - 1, 5 * FS, 6 * FS + 3, -1, -FS):
        assert q.find_mapped_file_by_offset(outside) is None, outside
        assert q.find_mapped_file_by_offset(outside, return_first_on_not_found=True) is first, outside


def test_find_mapped_file_by_offset_empty(qdir, queues):
    q = loaded(qdir, queues)
    assert q.find_mapped_file_by_offset(0) is None
    assert q.find_mapped_file_by_offset(0, True) is None


def test_find_mapped_file_by_offset_single_file(qdir, queues):
    make_files(qdir, [0])
    q = loaded(qdir, queues)
    assert q.find_mapped_file_by_offset(0).file_from == 0
    assert q.find_mapped_file_by_offset(FS - 1).file_from == 0
    assert q.find_mapped_file_by_offset(FS) is None


# -- get_last_mapped_file (spec §6.2) ------------------------------------------------------------

def test_get_last_mapped_file_creates_first_at_aligned_start(qdir, queues):
    q = loaded(qdir, queues)
    assert q.get_last_mapped_file(5000, create=False) is None
    assert os.listdir(qdir) == []
    f = q.get_last_mapped_file(5000)
    assert f.file_from == FS, "startOffset - startOffset % fileSize"
    assert os.listdir(qdir) == [name(FS)]
    assert os.path.getsize(os.path.join(qdir, name(FS))) == FS
    assert q.last() is f and len(q) == 1


def test_get_last_mapped_file_returns_last_until_full(qdir, queues):
    q = loaded(qdir, queues)
    f = q.get_last_mapped_file(0)
    assert f.file_from == 0
    f.append(b"x" * (FS - 1))
    assert q.get_last_mapped_file(0) is f
    assert q.get_last_mapped_file(10 * FS) is f, "startOffset only matters when there is no file"
    f.append(b"x")
    assert f.is_full
    assert q.get_last_mapped_file(0, create=False) is f, "no creation: the full last file"
    g = q.get_last_mapped_file(0)
    assert g.file_from == FS and g is not f
    assert q.get_last_mapped_file(0) is g
    assert sorted(os.listdir(qdir)) == [name(0), name(FS)]


def test_get_last_mapped_file_after_load(qdir, queues):
    make_files(qdir, [0, FS])
    q = loaded(qdir, queues)  # loaded files are full
    g = q.get_last_mapped_file(0)
    assert g.file_from == 2 * FS
    assert len(q) == 3


# -- truncate_dirty_files ------------------------------------------------------------------------

def _fill(start):
    return bytes([1 + start // FS]) * 3000


def test_truncate_dirty_files_inside_a_file(qdir, queues):
    make_files(qdir, [0, FS, 2 * FS], fill=_fill)
    q = loaded(qdir, queues)
    removed, dropped = q.truncate_dirty_files(1000)
    assert removed == [name(FS), name(2 * FS)]
    assert dropped == 2000, "bytes [1000, 3000) of garbage were zeroed"
    assert sorted(os.listdir(qdir)) == [name(0)]
    assert [f.file_from for f in q] == [0]
    kept = q.first()
    assert (kept.wrote_position, kept.committed_position, kept.flushed_position) == (1000, 1000, 1000)
    with open(os.path.join(qdir, name(0)), "rb") as fh:
        data = fh.read()
    assert data[:1000] == b"\x01" * 1000
    assert data[1000:] == bytes(FS - 1000)


def test_truncate_dirty_files_at_file_boundary(qdir, queues):
    make_files(qdir, [0, FS, 2 * FS], fill=_fill)
    q = loaded(qdir, queues)
    removed, dropped = q.truncate_dirty_files(FS)
    assert removed == [name(2 * FS)]
    assert dropped == 3000, "the file starting at offset keeps nothing"
    first, second = q.files
    assert first.wrote_position == FS and first.read(0, 3000) == b"\x01" * 3000, "earlier files untouched"
    assert second.wrote_position == 0 and second.read(0, FS) == bytes(FS)
    assert sorted(os.listdir(qdir)) == [name(0), name(FS)]


def test_truncate_dirty_files_clean_tail_and_nothing_to_do(qdir, queues):
    make_files(qdir, [0, FS], fill=_fill)
    q = loaded(qdir, queues)
    assert q.truncate_dirty_files(2 * FS) == ([], 0), "offset at the end: nothing removed"
    removed, dropped = q.truncate_dirty_files(FS + 3500)
    assert removed == [] and dropped == 0, "the tail beyond offset is already zero"
    assert q.last().wrote_position == 3500
    assert q.last().read(0, 3000) == b"\x02" * 3000


def test_truncate_dirty_files_before_first_file_removes_all(qdir, queues):
    make_files(qdir, [2 * FS, 3 * FS], fill=_fill)
    q = loaded(qdir, queues)
    removed, dropped = q.truncate_dirty_files(0)
    assert removed == [name(2 * FS), name(3 * FS)] and dropped == 0
    assert len(q) == 0 and os.listdir(qdir) == []


# -- delete_expired_file_by_time (spec §6.2) -----------------------------------------------------

def _age(q, starts, seconds):
    t = time.time() - seconds
    for start in starts:
        os.utime(q.path_of(start), (t, t))


def test_delete_expired_stops_at_first_unexpired(qdir, queues):
    make_files(qdir, [i * FS for i in range(5)])
    q = loaded(qdir, queues)
    _age(q, [0, FS, 3 * FS, 4 * FS], 3600)
    assert q.delete_expired_file_by_time(60_000, 0, 1000, False) == 2
    assert [f.file_from for f in q] == [2 * FS, 3 * FS, 4 * FS]
    assert sorted(os.listdir(qdir)) == [name(2 * FS), name(3 * FS), name(4 * FS)]
    assert q.delete_expired_file_by_time(60_000, 0, 1000, False) == 0, "no holes: file 2 is young"


def test_delete_expired_never_deletes_the_last_file(qdir, queues):
    make_files(qdir, [0, FS, 2 * FS])
    q = loaded(qdir, queues)
    _age(q, [0, FS, 2 * FS], 3600)
    assert q.delete_expired_file_by_time(60_000, 0, 1000, False) == 2
    assert [f.file_from for f in q] == [2 * FS]
    assert q.delete_expired_file_by_time(60_000, 0, 1000, True) == 0
    assert os.listdir(qdir) == [name(2 * FS)]


def test_delete_expired_at_most_ten_per_call(qdir, queues):
    n = DELETE_FILES_BATCH_MAX + 3
    assert DELETE_FILES_BATCH_MAX == 10
    make_files(qdir, [i * FS for i in range(n)])
    q = loaded(qdir, queues)
    # young files, but clean_immediately
    assert q.delete_expired_file_by_time(60_000, 0, 1000, True) == 10
    assert [f.file_from for f in q] == [10 * FS, 11 * FS, 12 * FS]
    assert q.delete_expired_file_by_time(60_000, 0, 1000, True) == 2
    assert [f.file_from for f in q] == [12 * FS]
    assert os.listdir(qdir) == [name(12 * FS)]


def test_delete_expired_young_files_are_kept(qdir, queues):
    make_files(qdir, [0, FS, 2 * FS])
    q = loaded(qdir, queues)
    assert q.delete_expired_file_by_time(60_000, 0, 1000, False) == 0
    assert len(q) == 3


def test_delete_expired_stops_at_a_held_file(qdir, queues):
    make_files(qdir, [0, FS, 2 * FS])
    q = loaded(qdir, queues)
    _age(q, [0, FS], 3600)
    first = q.first()
    assert first.hold()
    assert q.delete_expired_file_by_time(60_000, 0, 60_000, False) == 0, "destroy of a held file fails"
    assert len(q) == 3 and os.path.exists(first.path)
    first.release()
    assert q.delete_expired_file_by_time(60_000, 0, 60_000, False) == 2
    assert os.listdir(qdir) == [name(2 * FS)]


def test_delete_expired_sleeps_between_deletions(qdir, queues):
    make_files(qdir, [0, FS, 2 * FS, 3 * FS])
    q = loaded(qdir, queues)
    t0 = time.monotonic()
    assert q.delete_expired_file_by_time(60_000, 50, 1000, True) == 3
    # sleeps between the three deletions (not after the last one): about 100 ms
    assert 0.09 <= time.monotonic() - t0 < 5
