"""MappedFile (spec §6.1, §8): creation, access, flush, reference counting, warm-up, full disk."""

from __future__ import annotations

import errno
import io
import os
import subprocess
import sys
import textwrap
import time

import pytest

from helpers_fs import REPO, run_in_tmpfs, tmpfs_supported
from helpers_mem import mapping_kb
from mqstore.log import _mapped
from mqstore.log._mapped import OS_PAGE_SIZE, MappedFile, file_name

PAGE = 4096
FS = 64 * 1024  # 16 pages


def name(offset: int) -> str:
    return f"{offset:020d}"


@pytest.fixture(autouse=True)
def _no_leftover_injection():
    yield
    _mapped.inject_flush_failure(0, 0)  # a failing test must not poison the next one


@pytest.fixture
def mf(tmp_path):
    f = MappedFile.create(str(tmp_path / name(0)), FS)
    yield f
    f.close()


# -- creation and opening --------------------------------------------------------------------

def test_file_name_is_20_digit_offset():
    assert OS_PAGE_SIZE == PAGE
    assert file_name(0) == "00000000000000000000"
    assert file_name(1073741824) == "00000000001073741824"
    assert len(file_name(2**62)) == 20


def test_create_allocates_exact_size(tmp_path):
    size = 3 * FS
    path = str(tmp_path / name(2 * size))
    f = MappedFile.create(path, size)
    try:
        st = os.stat(path)
        assert st.st_size == size
        assert st.st_blocks * 512 >= size, "posix_fallocate must back every byte (no holes)"
        assert f.file_name == name(2 * size)
        assert f.file_from == 2 * size
        assert f.file_size == size
        assert (f.wrote_position, f.committed_position, f.flushed_position) == (0, 0, 0)
        assert f.ref_count_value == 1 and f.is_available and not f.is_full
        assert f.read(0, size) == bytes(size)
        assert os.listdir(tmp_path) == [name(2 * size)], "no temporary file may remain"
    finally:
        f.close()


def test_create_refuses_existing_file(tmp_path):
    path = tmp_path / name(0)
    path.write_bytes(b"keep me")
    with pytest.raises(FileExistsError):
        MappedFile.create(str(path), FS)
    assert path.read_bytes() == b"keep me"
    assert os.listdir(tmp_path) == [name(0)]


def test_create_with_bad_name_leaves_nothing_behind(tmp_path):
    # A name that is not a 20-digit offset can never be opened: create must refuse it
    # without leaving an allocated file (or its temporary) on disk.
    with pytest.raises(ValueError, match="20-digit"):
        MappedFile.create(str(tmp_path / "not-an-offset"), FS)
    assert os.listdir(tmp_path) == []


def test_open_existing_file_shares_bytes(tmp_path, mf):
    mf.append(b"hello")
    other = MappedFile.open(mf.path, FS)
    try:
        assert other.read(0, 5) == b"hello"
        assert other.wrote_position == 0, "positions are per object; recovery sets them"
        mf.write_at(1, b"E")
        assert other.read(0, 5) == b"hEllo", "both objects map the same page cache (MAP_SHARED)"
    finally:
        other.close()


def test_open_wrong_size_is_a_clear_error(tmp_path, mf):
    with pytest.raises(ValueError) as ei:
        MappedFile.open(mf.path, FS * 2)
    msg = str(ei.value)
    assert str(FS) in msg and str(FS * 2) in msg and mf.path in msg


@pytest.mark.parametrize("bad", ["123", "0000000000000000000a", "000000000000000000000", "x" * 20])
def test_open_wrong_name_is_a_clear_error(tmp_path, bad):
    p = tmp_path / bad
    p.write_bytes(bytes(FS))
    with pytest.raises(ValueError, match="20-digit"):
        MappedFile.open(str(p), FS)


def test_open_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        MappedFile.open(str(tmp_path / name(0)), FS)


# -- append / read / view / write_at ------------------------------------------------------------

def test_append_read_and_full(mf):
    assert mf.append(b"abc") is True
    assert mf.append(memoryview(b"defg")) is True
    assert mf.append(bytearray(b"")) is True
    assert mf.wrote_position == 7
    assert mf.read(0, 7) == b"abcdefg"
    assert mf.read_position == 7
    # the rest of the file fits exactly; one more byte does not and changes nothing
    assert mf.append(b"z" * (FS - 8)) is True
    assert mf.append(b"12") is False
    assert mf.wrote_position == FS - 1
    assert mf.read(FS - 1, 1) == b"\0"
    assert mf.append(b"!") is True
    assert mf.is_full and mf.wrote_position == FS
    assert mf.append(b"x") is False
    assert mf.append(b"") is True and mf.wrote_position == FS


@pytest.mark.parametrize("pos,size", [(-1, 1), (0, -1), (FS, 1), (FS - 3, 4), (FS + 1, 0)])
def test_read_out_of_range(mf, pos, size):
    with pytest.raises(IndexError):
        mf.read(pos, size)
    with pytest.raises(IndexError):
        mf.view(pos, size)


def test_read_edges(mf):
    assert mf.read(FS, 0) == b""
    assert mf.read(FS - 4, 4) == bytes(4)
    assert len(mf.view(FS - 1, 1)) == 1


def test_write_at_keeps_positions(mf):
    mf.write_at(100, b"xyz")
    mf.write_at(FS - 2, b"zz")
    mf.write_at(5, b"")
    assert (mf.wrote_position, mf.committed_position, mf.flushed_position) == (0, 0, 0)
    assert mf.read(99, 5) == b"\0xyz\0"
    assert mf.read(FS - 2, 2) == b"zz"
    with pytest.raises(IndexError):
        mf.write_at(FS - 1, b"ab")
    with pytest.raises(IndexError):
        mf.write_at(-1, b"a")
    assert mf.read(FS - 2, 2) == b"zz"


def test_view_is_zero_copy_and_read_only(mf):
    mf.append(b"0123456789")
    v = mf.view(2, 5)
    assert isinstance(v, memoryview)
    assert v.readonly and v.nbytes == 5 and bytes(v) == b"23456"
    mf.write_at(3, b"X")
    assert bytes(v) == b"2X456", "a view must see later writes: it maps the file, it is not a copy"
    with pytest.raises(TypeError):
        v[0] = 0
    whole = memoryview(mf)
    assert whole.readonly and whole.nbytes == FS and whole.format == "B"
    v.release()
    whole.release()


def test_writable_buffer_request_is_refused(mf):
    mf.append(b"abcd")
    # readinto asks the target for a writable buffer (PyBUF_WRITABLE)
    with pytest.raises((BufferError, TypeError)):
        io.BytesIO(b"ZZZZ").readinto(mf)
    import struct
    with pytest.raises((BufferError, TypeError)):
        struct.pack_into("B", mf, 0, 0x5A)
    assert mf.read(0, 4) == b"abcd"
    # the refused requests did not count as exported buffers: the mapping can be released now
    mf.close()
    assert mf.is_cleanup_over
    with pytest.raises(ValueError, match="unmapped"):
        mf.read(0, 1)


def test_view_outlives_destroy_without_crashing(tmp_path):
    f = MappedFile.create(str(tmp_path / name(0)), FS)
    f.append(b"still here")
    v = f.view(0, 10)
    assert f.destroy(0) is True
    assert not os.path.exists(f.path)
    # the mapping stays valid while a view points into it
    assert bytes(v) == b"still here"
    v.release()


# -- flush ------------------------------------------------------------------------------------

def test_flush_range_and_flush(mf):
    mf.append(b"a" * 5000)
    mf.flush_range(0, 5000)
    mf.flush_range(4000, 100)  # empty range: no-op
    mf.flush_range(FS - 1, FS)
    with pytest.raises(IndexError):
        mf.flush_range(0, FS + 1)
    assert mf.flush() == 5000
    assert mf.flushed_position == 5000
    assert mf.ref_count_value == 1, "flush must release the reference it held"
    assert mf.flush() == 5000, "nothing new: no flush"


def test_flush_drops_the_flushed_whole_pages_from_the_mapping_and_keeps_every_byte(tmp_path):
    """flush_range unmaps (MADV_DONTNEED) the whole pages it flushes, so cleaning them costs
    no TLB shootdown per page; the bytes stay in the page cache and on disk, the partial
    last page stays mapped and writable."""
    f = MappedFile.create(str(tmp_path / name(0)), FS)
    try:
        data = os.urandom(3 * PAGE + 100)
        f.append(data)
        assert mapping_kb(f.path)["Rss"] >= 16
        f.flush_range(0, len(data))
        assert mapping_kb(f.path)["Rss"] <= 4, "the three whole flushed pages are still mapped"
        assert f.read(0, len(data)) == data  # faulted back in from the page cache
        f.append(b"tail")  # the partial page is written again after the flush
        f.flush_range(len(data), len(data) + 4)
    finally:
        f.close()
    with open(tmp_path / name(0), "rb") as raw:
        assert raw.read(len(data) + 4) == data + b"tail"


def test_populate_maps_every_page_without_dirtying_any(tmp_path):
    f = MappedFile.create(str(tmp_path / name(0)), FS)
    try:
        f.append(b"kept")
        f.flush_range(0, 4)
        got = f.populate()
        assert got["ok"] and got["errno"] == 0 and got["populate_ns"] > 0
        pages = mapping_kb(f.path)
        assert pages["Rss"] == FS // 1024, pages
        assert pages["Shared_Dirty"] == pages["Private_Dirty"] == 0, pages
        assert f.read(0, 4) == b"kept" and f.read(4, FS - 4) == bytes(FS - 4)
    finally:
        f.close()


def test_injected_flush_failure_raises_and_keeps_positions(mf):
    mf.append(b"b" * 9000)
    _mapped.inject_flush_failure(errno.EIO)
    with pytest.raises(OSError) as ei:
        mf.flush_range(0, 100)
    assert ei.value.errno == errno.EIO
    mf.flush_range(0, 100)  # count=1: the next one succeeds

    _mapped.inject_flush_failure(errno.EIO)
    with pytest.raises(OSError) as ei:
        mf.flush()
    assert ei.value.errno == errno.EIO
    assert mf.flushed_position == 0, "a failed flush must never be reported as success"
    assert mf.ref_count_value == 1, "the hold taken for the flush is released on failure"
    assert mf.flush() == 9000

    mf.append(b"c" * 10)
    _mapped.inject_flush_failure(errno.ENOSPC, 2)
    for _ in range(2):
        with pytest.raises(OSError) as ei:
            mf.flush()
        assert ei.value.errno == errno.ENOSPC
        assert mf.flushed_position == 9000
    assert mf.flush() == 9010


def test_is_able_to_flush_rules(mf):
    # spec §6.1: full -> yes; leastPages > 0 -> read/4096 - flushed/4096 >= leastPages; else read > flushed
    assert not mf.is_able_to_flush(0)
    mf.wrote_position = 1
    assert mf.is_able_to_flush(0)
    assert not mf.is_able_to_flush(1), "one byte is not a whole page"
    mf.wrote_position = 4 * PAGE
    assert mf.is_able_to_flush(4) and not mf.is_able_to_flush(5)
    mf.flushed_position = 2 * PAGE - 1  # page 1
    assert mf.is_able_to_flush(3) and not mf.is_able_to_flush(4)
    mf.wrote_position = 6 * PAGE + 100
    mf.flushed_position = 2 * PAGE + 4000  # page 6 - page 2 = 4
    assert mf.is_able_to_flush(4) and not mf.is_able_to_flush(5)
    mf.flushed_position = mf.wrote_position
    assert not mf.is_able_to_flush(0) and not mf.is_able_to_flush(1)
    mf.wrote_position = mf.flushed_position = FS  # full: always able, whatever leastPages
    assert mf.is_able_to_flush(0) and mf.is_able_to_flush(1000)


def test_flush_least_pages_does_not_flush_too_little(mf):
    mf.append(b"d" * (PAGE + 10))
    # if flush() tried to msync, the injected failure would surface
    _mapped.inject_flush_failure(errno.EIO)
    assert mf.flush(2) == 0
    _mapped.inject_flush_failure(0, 0)
    assert mf.flush(1) == PAGE + 10
    mf.append(b"e" * (FS - mf.wrote_position))
    assert mf.is_full
    assert mf.flush(1000) == FS, "a full file is flushed whatever leastPages says"


def test_flush_of_a_shut_down_file_does_not_touch_the_mapping(mf):
    mf.append(b"f" * 100)
    mf.shutdown(0)
    assert mf.is_cleanup_over
    mf.flush(0)  # hold fails: must not msync an unmapped region (no crash, no exception)


# -- reference counting ---------------------------------------------------------------------

def test_hold_release(mf):
    assert mf.ref_count_value == 1
    assert mf.hold() and mf.hold()
    assert mf.ref_count_value == 3
    mf.release()
    mf.release()
    assert mf.ref_count_value == 1 and mf.is_available and not mf.is_cleanup_over


def test_shutdown_without_holders_cleans_up(mf):
    mf.append(b"x")
    mf.shutdown(60_000)
    assert not mf.is_available
    assert mf.ref_count_value == 0 and mf.is_cleanup_over
    assert not mf.hold(), "hold fails once unavailable"
    for use in (lambda: mf.read(0, 1), lambda: mf.view(0, 1), lambda: mf.append(b"y"),
                lambda: mf.write_at(0, b"y"), lambda: mf.flush_range(0, 1), lambda: mf.warm(False, 0)):
        with pytest.raises(ValueError, match="unmapped"):
            use()
    assert os.path.exists(mf.path), "shutdown does not delete"


def test_shutdown_waits_for_holders_then_release_cleans_up(mf):
    assert mf.hold()
    mf.shutdown(60_000)
    assert not mf.is_available and mf.ref_count_value == 1 and not mf.is_cleanup_over
    assert not mf.hold()
    assert mf.read(0, 1) == b"\0", "still mapped for the holder"
    mf.shutdown(60_000)  # again, before the interval: nothing is forced
    assert mf.ref_count_value == 1 and not mf.is_cleanup_over
    assert mf.destroy(60_000) is False
    assert os.path.exists(mf.path)
    mf.release()
    assert mf.ref_count_value == 0 and mf.is_cleanup_over
    assert mf.destroy(60_000) is True
    assert not os.path.exists(mf.path)


def test_shutdown_forces_release_after_interval(mf):
    assert mf.hold() and mf.hold()  # two readers never release
    mf.shutdown(50)
    assert mf.ref_count_value == 2
    mf.shutdown(50)
    assert mf.ref_count_value == 2, "not forced before the interval"
    time.sleep(0.08)
    mf.shutdown(50)
    # spec §6.1: refCount = -1000 - ref, then release -> -1003
    assert mf.ref_count_value == -1000 - 2 - 1
    assert mf.is_cleanup_over
    mf.release()  # a late reader's release must be harmless
    assert mf.is_cleanup_over


def test_destroy_forces_after_interval(mf):
    path = mf.path
    assert mf.hold()
    assert mf.destroy(50) is False
    assert os.path.exists(path)
    time.sleep(0.08)
    assert mf.destroy(50) is True
    assert not os.path.exists(path)
    assert mf.is_cleanup_over


def test_destroy_unheld_deletes_immediately(tmp_path):
    f = MappedFile.create(str(tmp_path / name(FS)), FS)
    assert f.destroy(0) is True
    assert os.listdir(tmp_path) == []
    assert f.destroy(0) is True, "destroying twice is harmless"


# -- zero_dirty_tail --------------------------------------------------------------------------

def test_zero_dirty_tail_drops_garbage_after_start(tmp_path):
    size = 64 * PAGE
    f = MappedFile.create(str(tmp_path / name(0)), size)
    try:
        f.write_at(0, b"\x01" * 1100)  # valid data [0, 1050), torn tail [1050, 1100)
        f.write_at(3 * PAGE + 5, b"\x02" * 5)  # stale bytes three pages further
        end = f.zero_dirty_tail(1050)
        assert end == 3 * PAGE + 10, "the end of the last non-zero byte"
        assert f.read(0, 1050) == b"\x01" * 1050, "bytes before start are kept"
        assert f.read(1050, size - 1050) == bytes(size - 1050)
        assert (f.wrote_position, f.flushed_position) == (0, 0), "positions untouched"
    finally:
        f.close()


def test_zero_dirty_tail_stops_after_clean_pages(tmp_path):
    size = 64 * PAGE
    f = MappedFile.create(str(tmp_path / name(0)), size)
    try:
        f.write_at(10, b"\x03")
        f.write_at(16 * PAGE + 7, b"\x04")  # after 15 clean pages: still zeroed (run resets)
        f.write_at(33 * PAGE, b"\x05")  # after 16 clean pages (17..32): left alone
        end = f.zero_dirty_tail(5)
        assert end == 16 * PAGE + 8
        assert f.read(10, 1) == b"\0" and f.read(16 * PAGE + 7, 1) == b"\0"
        assert f.read(33 * PAGE, 1) == b"\x05"
        # with one clean page as the limit, a gap of one page stops it
        f.write_at(34 * PAGE + 1, b"\x06")
        f.write_at(36 * PAGE + 1, b"\x07")
        assert f.zero_dirty_tail(34 * PAGE, clean_pages=1) == 34 * PAGE + 2
        assert f.read(34 * PAGE + 1, 1) == b"\0" and f.read(36 * PAGE + 1, 1) == b"\x07"
    finally:
        f.close()


def test_zero_dirty_tail_clean_and_edges(mf):
    assert mf.zero_dirty_tail(100) == 100
    assert mf.zero_dirty_tail(FS) == FS
    mf.write_at(FS - 1, b"\x09")
    assert mf.zero_dirty_tail(FS - 1) == FS
    assert mf.read(FS - 1, 1) == b"\0"
    with pytest.raises(IndexError):
        mf.zero_dirty_tail(FS + 1)


# -- warm-up -----------------------------------------------------------------------------------

def test_warm_sync_flush(tmp_path):
    size = 1 << 20
    f = MappedFile.create(str(tmp_path / name(0)), size)
    try:
        least = 16
        r = f.warm(True, least)
        assert r["pages"] == size // PAGE
        expected = size // PAGE // least + 1
        assert abs(r["forces"] - expected) <= 1, r
        assert r["warm_ns"] > 0
        assert r["mlock_ok"] is (r["mlock_errno"] == 0)
        assert f.locked_in_memory is r["mlock_ok"]
        if os.geteuid() == 0:
            assert r["mlock_ok"] is True, r  # root has CAP_IPC_LOCK
        f.munlock()
        assert not f.locked_in_memory
        r0 = f.warm(True, 0)
        assert r0["forces"] == 1, "leastPages 0: only the final force"
    finally:
        f.close()


def test_warm_async_flush_and_no_lock(tmp_path):
    size = 256 * 1024
    f = MappedFile.create(str(tmp_path / name(0)), size)
    try:
        f.write_at(1, b"kept")
        r = f.warm(False, 16, lock_memory=False)
        assert r["pages"] == size // PAGE
        assert r["forces"] == 0, "no forces under async flush"
        assert r["mlock_ok"] is False and not f.locked_in_memory
        assert f.read(1, 4) == b"kept", "warm writes one byte per page start only"
        assert (f.wrote_position, f.flushed_position) == (0, 0)
    finally:
        f.close()


# -- full disk / file size limit ---------------------------------------------------------------

@pytest.mark.skipif(not tmpfs_supported(), reason="needs a tmpfs in a private mount namespace (root + unshare)")
def test_create_on_full_disk_is_enospc_and_leaves_nothing(tmp_path):
    out = run_in_tmpfs("""
        import errno
        from mqstore.log._mapped import MappedFile
        out = {}
        big = os.path.join(TMPFS, "%020d" % 0)
        try:
            MappedFile.create(big, 2 << 20)
            out["big"] = "created"
        except OSError as e:
            out["big"] = [e.errno, str(e)]
        out["after_big"] = sorted(os.listdir(TMPFS))
        fits = MappedFile.create(big, 640 << 10)
        st = os.stat(big)
        out["fits"] = [st.st_size, st.st_blocks * 512]
        second = os.path.join(TMPFS, "%020d" % (640 << 10))
        try:
            MappedFile.create(second, 640 << 10)
            out["second"] = "created"
        except OSError as e:
            out["second"] = [e.errno, str(e)]
        out["after_second"] = sorted(os.listdir(TMPFS))
        emit(out)
    """, tmp_path / "mnt", size="1m")
    assert out["big"][0] == errno.ENOSPC, out
    assert name(0) in out["big"][1]
    assert out["after_big"] == [], "no file or temp file may be left after ENOSPC"
    assert out["fits"][0] == 640 << 10 and out["fits"][1] >= 640 << 10
    assert out["second"][0] == errno.ENOSPC, out
    assert out["after_second"] == [name(0)]


def test_create_beyond_rlimit_fsize_is_efbig(tmp_path):
    code = textwrap.dedent(f"""
        import errno, os, resource, signal, sys
        from mqstore.log._mapped import MappedFile
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))
        d = {str(tmp_path)!r}
        small = MappedFile.create(os.path.join(d, "%020d" % 0), 65536)
        small.close()
        try:
            MappedFile.create(os.path.join(d, "%020d" % 65536), 1 << 20)
        except OSError as e:
            print("ERR", e.errno)
            sys.exit(0)
        print("CREATED")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30, cwd=REPO,
                       env={**os.environ, "PYTHONPATH": REPO})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["ERR", str(errno.EFBIG)], r.stdout + r.stderr
    assert sorted(os.listdir(tmp_path)) == [name(0)], "the failed file and its temp are gone"


def test_a_mapped_file_holds_no_descriptor_once_mapped(tmp_path):
    """A store of many small files (ConsumeQueues of a few units) must not run out of file
    descriptors: the mapping outlives its descriptor, which is closed at once; a file created
    in part keeps its own for allocate_to."""
    before = len(os.listdir("/proc/self/fd"))
    files = [MappedFile.create(str(tmp_path / file_name(i * 4096)), 4096) for i in range(64)]
    files += [MappedFile.open(f.path, 4096) for f in files[:32]]
    assert len(os.listdir("/proc/self/fd")) - before < 8
    files[0].write_at(0, b"still mapped")
    assert files[64].read(0, 12) == b"still mapped"
    partial = MappedFile.create(str(tmp_path / file_name(1 << 20)), 1 << 16, 4096)
    os.unlink(partial.path)  # an index file may be deleted while a process still grows it
    assert partial.allocate_to(8192) == 8192
    for f in files + [partial]:
        f.close()
