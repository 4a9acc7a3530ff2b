"""CommitLog disk space is allocated in steps ahead of the write position
(commit_log_allocate_step_bytes): a small store takes little disk, a put never writes past what
is allocated (the control block's ``reserved``), and on a full disk the put that needs more gets
CREATE_MAPEDFILE_FAILED naming the error, never SIGBUS, and puts resume once there is room."""

from __future__ import annotations

import os
import textwrap

import pytest

from mqstore import Message, MessageStore
from mqstore.log.mapped_file_queue import reservation_step
from mqstore.tools.checker import check_store

from helpers_fs import CHILD_HELPERS, run_in_tmpfs, tmpfs_supported

MiB = 1 << 20
CFG = {"mapped_file_size_commit_log": 4 * MiB, "commit_log_allocate_step_bytes": 256 * 1024}


def disk_bytes(path: str) -> int:
    return os.stat(path).st_blocks * 512


def commitlog_files(root: str) -> list[str]:
    d = os.path.join(root, "commitlog")
    return [os.path.join(d, n) for n in sorted(os.listdir(d))]


def test_files_are_allocated_in_steps_ahead_of_the_writes(tmp_path):
    root = str(tmp_path / "store")
    with MessageStore(root, **CFG) as store:
        store.put_message(Message("T", b"first")).check()
        first = commitlog_files(root)[0]
        assert os.path.getsize(first) == 4 * MiB  # full length, sparse
        assert disk_bytes(first) <= 512 * 1024 + 64 * 1024  # the step written into and the next one
        assert store.ctl.get("reserved") == 512 * 1024
        body = b"x" * 1000
        for i in range(1000):  # ~1 MiB: several steps
            store.put_message(Message("T", body)).check()
            wrote = store.positions()["wrote"]
            assert store.ctl.get("reserved") >= wrote + 8, "a put never writes past what is allocated"
        assert store.ctl.get("reserved") % (256 * 1024) == 0
        assert disk_bytes(first) < 2 * MiB
        for i in range(4000):  # into the second file: its allocation starts over
            store.put_message(Message("T", body)).check()
        assert len(commitlog_files(root)) >= 2
        wrote = store.positions()["wrote"]
        assert wrote // (4 * MiB) * (4 * MiB) < store.ctl.get("reserved") <= (wrote // (4 * MiB) + 1) * (4 * MiB)
    check_store(root).raise_if_failed()
    with MessageStore(root, **CFG) as store:  # a reopen reserves from the write position again
        assert store.put_message(Message("T", b"after")).check().queue_offset == 5001
        assert store.ctl.get("reserved") > store.positions()["wrote"]
    check_store(root).raise_if_failed()


def test_the_step_doubles_with_what_the_file_holds_up_to_the_setting():
    assert [reservation_step(pos, 64 * MiB) for pos in (0, 1, MiB, MiB + 1, 3 * MiB, 40 * MiB, 900 * MiB)] == \
        [MiB, MiB, MiB, 2 * MiB, 4 * MiB, 64 * MiB, 64 * MiB]
    assert reservation_step(0, 256 * 1024) == reservation_step(5 * MiB, 256 * 1024) == 256 * 1024
    assert reservation_step(10 * MiB, 12 * 4096) == 12 * 4096  # a setting that is no power of two


def test_a_small_store_takes_little_disk_whatever_the_step(tmp_path):
    """64 MiB steps in 64 MiB files: a store of a few messages reserves 1 MiB and 1 MiB ahead,
    not the whole step; one of ~3 MiB reserves 4 MiB and 4 MiB ahead."""
    root = str(tmp_path / "store")
    with MessageStore(root, mapped_file_size_commit_log=64 * MiB, commit_log_allocate_step_bytes=64 * MiB,
                      message_index_enable=False) as store:
        store.put_message(Message("T", b"first")).check()
        first = commitlog_files(root)[0]
        assert store.ctl.get("reserved") == 2 * MiB
        assert disk_bytes(first) <= 2 * MiB + 64 * 1024
        store.put_messages([Message("T", b"y" * 1000) for _ in range(3000)]).check()
        assert 3 * MiB < store.positions()["wrote"] < 4 * MiB
        assert store.ctl.get("reserved") == 8 * MiB
        assert disk_bytes(first) <= 8 * MiB + 64 * 1024
    check_store(root).raise_if_failed()


def test_zero_allocates_whole_files(tmp_path):
    root = str(tmp_path / "store")
    with MessageStore(root, mapped_file_size_commit_log=4 * MiB, commit_log_allocate_step_bytes=0) as store:
        store.put_message(Message("T", b"first")).check()
        assert disk_bytes(commitlog_files(root)[0]) >= 4 * MiB
        assert store.ctl.get("reserved") == 0  # not used


def test_warm_up_allocates_whole_files(tmp_path):
    root = str(tmp_path / "store")
    with MessageStore(root, **CFG, warm_maped_file_enable=True) as store:
        store.put_message(Message("T", b"first")).check()
        store.wait_dispatched()
        assert disk_bytes(commitlog_files(root)[0]) >= 4 * MiB


def test_the_step_is_whole_pages():
    from mqstore.config import StoreConfig
    from mqstore.errors import ConfigError

    with pytest.raises(ConfigError, match="commit_log_allocate_step_bytes"):
        StoreConfig(commit_log_allocate_step_bytes=1000)
    with pytest.raises(ConfigError, match="commit_log_allocate_step_bytes"):
        StoreConfig(commit_log_allocate_step_bytes=-4096)


@pytest.mark.multiprocess
@pytest.mark.skipif(not tmpfs_supported(), reason="needs a tmpfs in a private mount namespace (root + unshare)")
def test_a_full_disk_refuses_the_put_that_needs_more_space_and_puts_resume(tmp_path):
    """A 6 MiB disk, 4 MiB files allocated 256 KiB at a time: a ballast file takes the rest of
    the disk, the puts run until the next step cannot be allocated (a status, no SIGBUS), the
    ballast goes, and the same store takes puts again; the checker passes on what it wrote."""
    out = run_in_tmpfs(CHILD_HELPERS + textwrap.dedent(r'''
        from mqstore import Message, MessageStore
        from mqstore.tools.checker import check_store

        root = os.path.join(TMPFS, "store")
        cfg = dict(mapped_file_size_commit_log=4 << 20, commit_log_allocate_step_bytes=256 << 10,
                   mapped_file_size_consume_queue=20 * 6000, message_index_enable=False,
                   disk_max_used_space_ratio=99, disk_space_clean_forcibly_ratio=99, disk_space_warning_level_ratio=99)
        out = {}
        s = MessageStore(root, **cfg)
        s.put_message(Message("T", b"one")).check()
        ballast = os.path.join(TMPFS, "ballast")
        fill(ballast)
        acked, refusal = 1, None
        for i in range(10_000):
            r = s.put_message(Message("T", b"b" * 1000))
            if r.status.name != "PUT_OK":
                refusal = [r.status.name, str(r.detail)]
                break
            acked += 1
        out["acked"], out["refusal"] = acked, refusal
        out["reserved_ok"] = s.ctl.get("reserved") >= s.positions()["wrote"] + 8
        os.unlink(ballast)
        # the cleaner's disk check (every 10 s) may have seen the full disk and set DISK_FULL:
        # puts are SERVICE_NOT_AVAILABLE until its next check sees the space again
        deadline = time.monotonic() + 25
        while (after := s.put_message(Message("T", b"after")).status.name) == "SERVICE_NOT_AVAILABLE" \
                and time.monotonic() < deadline:
            time.sleep(0.1)
        out["after"] = after
        s.wait_dispatched()
        out["max_offset"] = s.get_max_offset_in_queue("T", 0)
        s.shutdown()
        out["check"] = [str(p) for p in check_store(root).problems]
        emit(out)
    '''), tmp_path / "mnt", size="6m")
    assert isinstance(out, dict)
    assert out["refusal"] is not None and out["refusal"][0] == "CREATE_MAPEDFILE_FAILED", out
    assert "cannot allocate disk space" in out["refusal"][1] and "No space left" in out["refusal"][1], out
    assert 100 < out["acked"] < 5000 and out["reserved_ok"]
    assert out["after"] == "PUT_OK" and out["max_offset"] == out["acked"] + 1
    assert out["check"] == []
