"""mqstore.parts.open_parts: one loader maps a store's parts for every process role (the owner,
an attached store, each service process, the Spark rebuild), and what it opened is closed again,
also when the open fails half-way."""

from __future__ import annotations

import os

import pytest

from mqstore import Message, MessageStore
from mqstore.layout import checkpoint_path, consumequeue_dir
from mqstore.parts import ROLES, StoreParts, open_parts

SMALL = {"mapped_file_size_commit_log": 64 * 1024, "mapped_file_size_consume_queue": 20 * 100,
         "max_hash_slot_num": 100, "max_index_num": 400}
FIELDS = ("log_files", "commitlog", "consume_queues", "index", "checkpoint", "dispatcher", "pool")
#: what each role maps (beside the root, the configuration and the control block)
EXPECTED = {
    "allocator": {"log_files"},
    "flusher": {"log_files", "commitlog"},
    "dispatcher": {"log_files", "commitlog", "consume_queues", "checkpoint", "index", "dispatcher"},
    "cleaner": {"log_files", "consume_queues", "checkpoint", "index"},
    "ha": {"log_files"},  # a master's: the files it sends
    "attached": {"log_files", "commitlog", "consume_queues", "index", "dispatcher"},
}


def mapped(parts: StoreParts) -> set[str]:
    return {name for name in FIELDS if getattr(parts, name) is not None}


@pytest.fixture
def live(tmp_path):
    """A store with messages over several CommitLog files, its owner still running."""
    store = MessageStore(str(tmp_path / "s"), **SMALL)
    for i in range(600):
        store.put_message(Message("P", b"b%04d" % i + b"x" * 200, queue_id=i % 3, keys=[f"k{i}"])).check()
    assert store.wait_dispatched()
    yield store
    store.shutdown()


@pytest.mark.parametrize("role", sorted(EXPECTED))
def test_each_role_maps_what_its_process_needs_and_closes_it(live, role):
    owners = {f.file_from for f in live.commitlog.queue.files}
    parts = open_parts(live.root, live.config, live.ctl, role)
    try:
        assert mapped(parts) == EXPECTED[role]
        if parts.commitlog is not None:
            assert parts.log_files is parts.commitlog.queue
        if role != "allocator":  # they map the owner's files (the allocator only creates the next ones)
            assert owners <= {f.file_from for f in parts.log_files.files} and len(owners) > 1
        if role == "dispatcher":
            # resumed at what the owner's dispatcher published: every unit, nothing cut
            assert sorted((cq.queue_id, cq.max_offset_in_queue) for cq in parts.consume_queues) == \
                [(0, 200), (1, 200), (2, 200)]
        closers = list(parts.closers)
        assert closers
    finally:
        parts.close()
    assert parts.closers == []
    parts.close()  # twice: nothing left to close
    if role in ("flusher", "dispatcher", "attached"):
        assert parts.commitlog.queue.files == []  # unmapped
    # the owner's own parts are untouched
    r = live.get_message("G", "P", 1, 190, 32)
    assert r.max_offset == 200 and [b[:5] for b in r.bodies()] == [b"b%04d" % (3 * q + 1) for q in range(190, 200)]


def test_the_owner_and_the_rebuild_roles(tmp_path, live):
    root = str(tmp_path / "fresh")
    os.makedirs(root)
    rebuilt = open_parts(root, live.config, None, "rebuild")
    try:
        assert mapped(rebuilt) == {"consume_queues", "checkpoint", "index"}
        assert os.path.exists(checkpoint_path(root)) and rebuilt.index.files == []
        cq = rebuilt.consume_queues.dispatch_target("P", 0)  # queues are created under root
        assert cq is not None and cq.store_path.startswith(consumequeue_dir(root))
    finally:
        rebuilt.close()
    # the owner's parts are what open_parts gave it (the services are built over the same objects)
    assert live.commitlog is live._parts.commitlog and live.consume_queues is live._parts.consume_queues


def test_unknown_roles_and_a_missing_control_block_are_refused(live):
    with pytest.raises(ValueError, match="unknown role 'writer'; one of owner, attached"):
        open_parts(live.root, live.config, live.ctl, "writer")
    with pytest.raises(ValueError, match="role 'cleaner' needs the store's control block"):
        open_parts(live.root, live.config, None, "cleaner")
    assert set(ROLES) == set(EXPECTED) | {"owner", "rebuild"}


def test_a_failure_half_way_closes_what_was_opened(live, monkeypatch):
    from mqstore.log.commitlog import CommitLog
    from mqstore.queue.consume_queue import ConsumeQueueTable
    from mqstore.queue.index import IndexService

    closed = []
    for cls in (CommitLog, ConsumeQueueTable):
        real = cls.close
        monkeypatch.setattr(cls, "close", lambda self, real=real, name=cls.__name__: (closed.append(name), real(self)))

    def broken_load(self, clean):
        raise OSError(5, "Input/output error", "index/20261129000000000")

    monkeypatch.setattr(IndexService, "load", broken_load)
    with pytest.raises(OSError, match="Input/output error"):
        open_parts(live.root, live.config, live.ctl, "dispatcher")
    assert closed == ["ConsumeQueueTable", "CommitLog"]  # last opened first
