"""Several CommitLogs (docs/parallel-commitlogs.md): the tests of the issue, T1 first."""

from __future__ import annotations

import json
import os

import pytest

from mqstore.errors import NotAStoreError

from golden_store import GOLDEN, golden_digest


def test_one_commit_log_store_is_byte_identical_to_the_golden_digest(tmp_path):
    """T1: a store with one CommitLog is written byte for byte as the code wrote it before the
    CommitLog was split (the clock zeroed): every file of commitlog/, consumequeue/, index/,
    the clean-close record and the saved geometry, and every msgId."""
    want = json.loads(GOLDEN.read_text())
    got = golden_digest(str(tmp_path / "store"))
    assert got["messages"] == want["messages"]
    assert sorted(got["files"]) == sorted(want["files"]), "the store's files are not the same set"
    differ = [name for name in want["files"] if got["files"][name] != want["files"][name]]
    assert not differ, f"files whose bytes changed: {differ}"
    assert got["msg_ids"] == want["msg_ids"]


def test_a_store_fenced_for_several_logs_is_refused_and_left_as_it_was(tmp_path):
    """Item 7 / T2's refusal: the fence an N > 1 store writes into commitlog/ (a 20-digit name
    past 2^63 - 1) makes this code refuse to open the store, naming the file, before anything
    in it is changed (an owner that went on would recover commitlog/ alone and cut every
    ConsumeQueue unit of the other logs)."""
    import hashlib

    from mqstore import Message, MessageStore

    root = tmp_path / "store"
    with MessageStore(str(root), mapped_file_size_commit_log=64 * 1024) as store:
        for i in range(50):
            store.put_message(Message("T", b"m%d" % i, queue_id=i % 2)).check()
    fence = root / "commitlog" / "99999999999999999999"
    fence.write_text("mqstore store with 2 commit logs (commit_log_count); open it with an mqstore that has "
                     "commit_log_count\n")
    os.utime(fence, (1, 1))

    def digest() -> dict[str, str]:
        return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() + str(p.stat().st_mtime_ns)
                for p in sorted(root.rglob("*")) if p.is_file()}

    before = digest()
    with pytest.raises(NotAStoreError, match="99999999999999999999"):
        MessageStore(str(root))
    assert digest() == before


def test_a_second_commit_log_is_written_in_its_own_directory_offsets_and_cells(tmp_path):
    """Log 1 of a store with two CommitLogs, on its own: files named from 2^56 in steps of a
    file size that does not divide 2^56, records whose PHYSICALOFFSET is the encoded offset
    their put answered, its own positions, flush and statistics; log 0 untouched by it; a
    reload finds the same contiguous files."""
    from mqstore import Message, _shm
    from mqstore._codec import decode_record
    from mqstore.config import StoreConfig
    from mqstore.layout import commit_log_k_dir, file_start_of, local_of, log_base, log_of
    from mqstore.log.commitlog import CommitLog
    from mqstore.log.mapped_file_queue import MappedFileQueue

    size = 12 * 1024
    assert (1 << 56) % size
    root = str(tmp_path)
    cfg = StoreConfig(mapped_file_size_commit_log=size, store_host="10.0.0.1:10911")
    ctl = _shm.ControlBlock.create(str(tmp_path / "mqstore.shm"), table_slots=64, file_size=size, lock_kind="spin",
                                   sync_flush=False, log_count=2)
    logs = [CommitLog(root, cfg, ctl, log=k) for k in (0, 1)]
    try:
        puts: list[tuple[int, int, bytes, int]] = []
        for i in range(300):
            k = i % 3 % 2  # two of every three to log 0
            body = b"%d-" % i + b"x" * (i * 37 % 900)
            r = logs[k].appender.put_message(Message("T", body, queue_id=k)).check()
            assert log_of(r.wrote_offset) == k and r.msg_id.endswith("%016X" % r.wrote_offset)
            puts.append((k, r.wrote_offset, body, r.queue_offset))
        for k in (0, 1):
            mine = [p for p in puts if p[0] == k]
            assert [p[3] for p in mine] == list(range(len(mine))), "queue offsets of the log's queue"
            assert ctl.get("wrote", log=k) > mine[-1][1] >= log_base(k)
            assert ctl.log_stats(k)["puts"] == len(mine)
            assert ctl.log_stats(k)["bytes"] == sum(
                decode_record(logs[k].queue.find_mapped_file_by_offset(p[1]).read(
                    p[1] - file_start_of(p[1], size), size - (p[1] - file_start_of(p[1], size)))).total_size
                for p in mine)
        names = sorted(os.listdir(commit_log_k_dir(root, 1)))
        assert names == [f"{log_base(1) + j * size:020d}" for j in range(len(names))] and len(names) > 3
        for k, phy, body, qoff in puts:
            mf = logs[k].queue.find_mapped_file_by_offset(phy)
            rec = decode_record(mf.read(phy - mf.file_from, size - (phy - mf.file_from)))
            assert (rec.physical_offset, bytes(rec.body), rec.queue_offset, rec.queue_id) == (phy, body, qoff, k)
        wrote0 = ctl.get("wrote")
        assert logs[1].flush(0) and ctl.get("flushed", log=1) == ctl.get("wrote", log=1)
        assert ctl.get("flushed") == 0 and ctl.get("wrote") == wrote0, "log 0 is not log 1's business"
        again = MappedFileQueue(commit_log_k_dir(root, 1), size, base=log_base(1))
        again.load()
        assert [mf.file_name for mf in again.files] == names
        assert again.find_mapped_file_by_offset(ctl.get("wrote", log=1) - 1).file_from == file_start_of(
            ctl.get("wrote", log=1) - 1, size)
        assert local_of(again.mapped_end) == len(names) * size
        again.close()
        misplaced = MappedFileQueue(commit_log_k_dir(root, 1), size)  # read as if it were log 0's
        with pytest.raises(NotAStoreError, match="not all of CommitLog 0"):
            misplaced.load()
        misplaced.close()
    finally:
        for cl in logs:
            cl.close()
        ctl.close()
