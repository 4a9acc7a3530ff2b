"""Opening, owning, closing and recovering a store directory (spec §5.2, §5.4)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from mqstore import ConfigError, Message, MessageStore, NotAStoreError, StoreLockedError
from mqstore.tools.checker import check_store

SMALL = {"mapped_file_size_commit_log": 64 * 1024, "max_message_size": 16 * 1024}


def fill(store, n, queue_ids=3, body=b"payload-%d"):
    return [store.put_message(Message("T", body % i, queue_id=i % queue_ids)).check() for i in range(n)]


def test_layout_and_clean_reopen(store_dir):
    with MessageStore(store_dir, **SMALL) as store:
        assert os.path.exists(os.path.join(store_dir, "abort"))
        results = fill(store, 1000)
    assert sorted(os.listdir(store_dir)) == ["checkpoint", "commitlog", "consumequeue", "lock", "mqstore.clean.json",
                                             "mqstore.config.json", "mqstore.shm"]
    assert all(len(n) == 20 for n in os.listdir(os.path.join(store_dir, "commitlog")))
    with MessageStore(store_dir, **SMALL) as store:
        assert store.last_exit_ok and store.recovery.stop_reason == "clean-close record"
        assert not os.path.exists(os.path.join(store_dir, "mqstore.clean.json"))  # it is only good until a write
        assert store.max_phy_offset == results[-1].wrote_offset + results[-1].wrote_bytes
        assert [store.next_queue_offset("T", q) for q in range(3)] == [334, 333, 333]
        assert store.put_message(Message("T", b"next", queue_id=0)).check().queue_offset == 334
    check_store(store_dir).raise_if_failed()


def test_second_instance_is_refused_in_process(store_dir):
    with MessageStore(store_dir, **SMALL):
        with pytest.raises(StoreLockedError, match=f"pid {os.getpid()}"):
            MessageStore(store_dir, **SMALL)
    MessageStore(store_dir, **SMALL).shutdown()


def test_second_instance_is_refused_across_processes(store_dir):
    with MessageStore(store_dir, **SMALL) as store:
        fill(store, 10)
        code = textwrap.dedent(f"""
            from mqstore import MessageStore, StoreLockedError
            try:
                MessageStore({store_dir!r}, mapped_file_size_commit_log=65536)
            except StoreLockedError as exc:
                print("LOCKED", exc)
        """)
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        assert out.stdout.startswith("LOCKED") and "owned by another running store" in out.stdout
        assert store.put_message(Message("T", b"still mine")).ok


def test_lock_is_released_when_the_owner_is_killed(store_dir):
    code = textwrap.dedent(f"""
        import os, signal
        from mqstore import MessageStore, Message
        s = MessageStore({store_dir!r}, mapped_file_size_commit_log=65536)
        s.put_message(Message("T", b"x")).check()
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    subprocess.run([sys.executable, "-c", code], timeout=60)
    with MessageStore(store_dir, **SMALL) as store:
        assert not store.last_exit_ok and store.recovery.records == 1


def test_not_a_store(tmp_path):
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "notes.txt").write_text("hello")
    with pytest.raises(NotAStoreError, match="holds no store files"):
        MessageStore(str(junk), **SMALL)
    assert (junk / "notes.txt").read_text() == "hello" and sorted(os.listdir(junk)) == ["notes.txt"]
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(NotAStoreError, match="is a file"):
        MessageStore(str(afile), **SMALL)


def test_wrong_file_size_is_refused_and_data_kept(store_dir):
    with MessageStore(store_dir, **SMALL) as store:
        fill(store, 50)
    with pytest.raises(ConfigError, match="mapped_file_size_commit_log=131072, but the store was created with"):
        MessageStore(store_dir, mapped_file_size_commit_log=128 * 1024)
    assert check_store(store_dir).raise_if_failed().records == 50
    with MessageStore(store_dir, **SMALL) as store:  # the lock was released by the failed open
        assert store.recovery.stop_reason == "clean-close record"  # the failed open left it in place
        assert sum(store.get_max_offset_in_queue("T", q) for q in range(3)) == 50


def test_impossible_config_is_refused_at_open(store_dir):
    with pytest.raises(ConfigError, match="transient_store_pool_enable"):
        MessageStore(store_dir, transient_store_pool_enable=True, flush_disk_type="SYNC_FLUSH")
    with pytest.raises(ConfigError, match="mapped_file_size_commit_log"):
        MessageStore(store_dir, mapped_file_size_commit_log=1000)
    assert not os.path.exists(os.path.join(store_dir, "lock"))


def _damage_and_reopen(store_dir, damage):
    with MessageStore(store_dir, **SMALL) as store:
        results = fill(store, 200, body=b"body-%d-" + b"z" * 50)
    last = results[-1]
    path = os.path.join(store_dir, "commitlog", f"{last.wrote_offset - last.wrote_offset % 65536:020d}")
    pos = last.wrote_offset % 65536
    with open(path, "r+b") as f:
        damage(f, pos, last.wrote_bytes)
    store = MessageStore(store_dir, **SMALL)
    return store, results


@pytest.mark.parametrize("name,damage", [
    ("bit flip in the body", lambda f, pos, n: _flip(f, pos + 100)),
    ("zeroed tail", lambda f, pos, n: (f.seek(pos + 40), f.write(b"\x00" * (n - 40)))),
    ("torn record", lambda f, pos, n: (f.seek(pos + n // 2), f.write(b"\x00" * (n - n // 2)))),
    ("garbage length", lambda f, pos, n: (f.seek(pos), f.write(b"\x7f\xff\xff\xff"))),
])
def test_recovery_truncates_a_damaged_last_record(store_dir, name, damage):
    store, results = _damage_and_reopen(store_dir, damage)
    try:
        last = results[-1]
        assert store.recovery.records == 199
        assert store.recovery.valid_end == last.wrote_offset == store.max_phy_offset
        assert store.recovery.dropped_bytes > 0
        assert "dropped" in store.recovery.summary()
        q = last.queue_offset
        r = store.put_message(Message("T", b"replacement", queue_id=199 % 3)).check()
        assert r.wrote_offset == last.wrote_offset and r.queue_offset == q
    finally:
        store.shutdown()
    check_store(store_dir).raise_if_failed()


def _flip(f, pos):
    f.seek(pos)
    b = f.read(1)[0]
    f.seek(pos)
    f.write(bytes([b ^ 0x10]))


def test_checker_reports_damage_it_finds(store_dir):
    with MessageStore(store_dir, **SMALL) as store:
        results = fill(store, 20)
    path = os.path.join(store_dir, "commitlog", "0" * 20)
    with open(path, "r+b") as f:
        _flip(f, results[5].wrote_offset + 88)  # first body byte
    report = check_store(store_dir)
    assert not report.ok
    assert any("CRC" in p.message for p in report.problems)
    with pytest.raises(AssertionError, match="violates"):
        report.raise_if_failed()
