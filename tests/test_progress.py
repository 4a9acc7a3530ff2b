"""Progress of long work (issue 14): log lines for a store's recovery and start-up dispatch when
they take more than a moment, with amounts, percentages and an ETA; nothing for quick ones."""

from __future__ import annotations

import logging
import os
import re
import shutil

import pytest

from mqstore import Message, MessageStore
from mqstore import progress as progress_module
from mqstore.progress import LogProgress, describe


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_quick_work_logs_nothing_and_slow_work_logs_a_line_a_second(caplog):
    clock = Clock()
    logger = logging.getLogger("mqstore.test-progress")
    caplog.set_level(logging.INFO, logger=logger.name)
    quick = LogProgress(logger, "quick", clock=clock)
    for i in range(10):
        clock.now += 0.05
        quick("CommitLog", i << 20, 10 << 20)
    quick.finish()
    assert caplog.records == []
    slow = LogProgress(logger, "slow", clock=clock)
    for i in range(1, 101):
        clock.now += 0.1
        slow("CommitLog", i << 20, 100 << 20)
    slow.finish("100 files")
    lines = [r.getMessage() for r in caplog.records]
    assert 8 <= len(lines) <= 11  # about one a second over 10 s, after the first second
    pcts = [int(m.group(1)) for m in (re.search(r"\((\d+) %\)", line) for line in lines) if m]
    assert pcts == sorted(pcts) and pcts[-1] == 100
    assert "ETA" in lines[0] and "MiB" in lines[0]
    assert lines[-1] == "slow: done in 10.0 s (100 files)"


def test_describe():
    assert describe("CommitLog", 1 << 20, 4 << 20, 2.0) == "CommitLog 1.0 MiB of 4.0 MiB (25 %), ETA 6 s"
    assert describe("ConsumeQueues", 3, 3, 1.0) == "ConsumeQueues 3 of 3 (100 %)"
    assert describe("index files", 2, 0, 1.0) == "index files 2"


@pytest.fixture
def log_at_once(monkeypatch):
    monkeypatch.setattr(progress_module, "DEFAULT_THRESHOLD_S", 0.0)
    monkeypatch.setattr(progress_module, "DEFAULT_INTERVAL_S", 0.0)


def test_an_abnormal_recovery_and_its_start_up_dispatch_report_progress(tmp_path, caplog, log_at_once):
    root = str(tmp_path / "s")
    cfg = {"mapped_file_size_commit_log": 64 * 1024, "max_hash_slot_num": 64, "max_index_num": 512}
    with MessageStore(root, **cfg) as store:
        for i in range(2000):
            store.put_message(Message("P", b"x" * 100, queue_id=i % 3, keys=[f"k{i}"])).check()
    files = len(os.listdir(os.path.join(root, "commitlog")))
    assert files >= 4
    open(os.path.join(root, "abort"), "wb").close()  # as after a crash: scan from the checkpoint
    shutil.rmtree(os.path.join(root, "consumequeue"))  # and dispatch everything again
    caplog.set_level(logging.INFO, logger="mqstore")
    with MessageStore(root, **cfg) as store:
        assert store.recovery.redispatched_records == 2000
    scan = [r.getMessage() for r in caplog.records if r.getMessage().startswith("recovery: CommitLog")]
    dispatch = [r.getMessage() for r in caplog.records if r.getMessage().startswith("start-up dispatch: dispatch")]
    assert scan and dispatch
    for lines in (scan, dispatch):
        pcts = [int(re.search(r"\((\d+) %\)", line).group(1)) for line in lines]
        assert pcts == sorted(pcts) and pcts[-1] == 100, lines
    assert any(r.getMessage().startswith("recovery: done in") for r in caplog.records)
    assert any(r.getMessage().startswith("start-up dispatch: done in") for r in caplog.records)
