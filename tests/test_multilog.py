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
