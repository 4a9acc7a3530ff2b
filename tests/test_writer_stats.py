"""Per-writer statistics (issue 17 item 8): the statistics every put updates live in the writer
process's own slot of the control block, so writers on different cores do not pull one cache
line back and forth; stats() sums the slots with the shared cells, and the slot of a process
that is gone is taken by the next writer after its counts move into the shared cells."""

from __future__ import annotations

import os

import pytest

from mqstore import Message, MessageStore

from helpers_proc import run_in_child

pytestmark = pytest.mark.multiprocess


def _writer(root: str, n: int) -> None:
    store = MessageStore.open(root)
    assert store.attached
    for i in range(n):
        store.put_message(Message("T", b"w%d" % i, queue_id=1)).check()
    store.close()


def test_writer_slots_are_summed_and_a_dead_writers_slot_is_folded_and_reused(tmp_path):
    root = str(tmp_path / "s")
    with MessageStore(root) as store:
        for _ in range(3):
            store.put_message(Message("T", b"owner")).check()
        assert run_in_child(_writer, root, 7, timeout_s=60) == 0
        slots = store.ctl.writer_slots()
        assert set(slots) - {os.getpid()}, "the child wrote into a slot of its own"
        (child_a,) = set(slots) - {os.getpid()}
        assert slots[os.getpid()]["put_messages"] == 3 and slots[child_a]["put_messages"] == 7
        assert slots[child_a]["lock_acquires"] >= 7 and slots[child_a]["put_requests"] == 7
        stats = store.ctl.stats()
        assert stats["put_messages"] == 10 and stats["put_requests"] == 10
        assert stats["lock_acquires"] == sum(s["lock_acquires"] for s in slots.values())
        assert stats["lock_hold_ns_max"] == max(s["lock_hold_ns_max"] for s in slots.values())
        a_bytes = slots[child_a]["put_bytes"]

        assert run_in_child(_writer, root, 5, timeout_s=60) == 0  # takes the dead child's slot
        slots = store.ctl.writer_slots()
        assert len(slots) == 2 and child_a not in slots
        (child_b,) = set(slots) - {os.getpid()}
        assert slots[child_b]["put_messages"] == 5
        stats = store.ctl.stats()
        assert stats["put_messages"] == 15 and stats["put_requests"] == 15, "the dead writer's counts were kept"
        assert stats["put_bytes"] == sum(s["put_bytes"] for s in slots.values()) + a_bytes
        assert store.stats()["put_messages"] == 15
