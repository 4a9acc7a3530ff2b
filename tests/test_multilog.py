"""Several CommitLogs (docs/parallel-commitlogs.md): the tests of the issue, T1 first."""

from __future__ import annotations

import json

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
    import os

    import pytest

    from mqstore import Message, MessageStore
    from mqstore.errors import NotAStoreError

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
