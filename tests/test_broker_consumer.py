"""Embedded consumer groups (mqstore.broker.consumer.GroupConsumer): members in Python processes
on the broker's machine, reading the store directly, with the broker's offsets and membership."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from mqstore import MessageStore
from mqstore.broker.consumer import BrokerLinkError, GroupConsumer, allocate_averagely

from helpers_broker import running_broker, send_raw

pytestmark = pytest.mark.multiprocess


@pytest.mark.parametrize(("queues", "consumers"), [(4, 1), (4, 2), (4, 3), (8, 3), (3, 5), (16, 4), (1, 2)])
def test_allocate_averagely_covers_every_queue_once(queues: int, consumers: int) -> None:
    ids = [f"c{i}" for i in range(consumers)]
    shares = [allocate_averagely(list(range(queues)), ids, me) for me in ids]
    taken = sorted(q for share in shares for q in share)
    assert taken == list(range(queues))
    sizes = [len(s) for s in shares]
    assert max(sizes) - min(sizes) <= 1
    assert allocate_averagely(list(range(queues)), ids, "stranger") == []


def test_a_member_reads_its_queues_from_the_group_offsets_and_commits(tmp_path) -> None:
    with running_broker(str(tmp_path / "store")) as broker:
        answers = send_raw(broker.address, "TopicE", [f"m{i}".encode() for i in range(8)])
        assert all(code == 0 for code, _, _ in answers)
        store = MessageStore.attach(broker.root)
        try:
            with GroupConsumer(store, "CID_E", "TopicE") as consumer:
                assert sorted(consumer.positions) == [0, 1, 2, 3]
                got = sorted(m.body_bytes() for m in consumer.messages(timeout_s=1))
                assert got == sorted(f"m{i}".encode() for i in range(8))
            # closed: committed and left the group
            assert broker.controller.offsets.table() == {"TopicE@CID_E": {0: 2, 1: 2, 2: 2, 3: 2}}
            assert broker.controller.consumers.consumer_ids("CID_E") == []
            send_raw(broker.address, "TopicE", [b"later0", b"later1"])
            with GroupConsumer(store, "CID_E", "TopicE") as again:
                assert sorted(m.body_bytes() for m in again.messages(timeout_s=1)) == [b"later0", b"later1"]
        finally:
            store.shutdown()


def _poll_until(consumer: GroupConsumer, done: Callable[[], bool], timeout_s: float = 60.0) -> None:
    """Poll (which takes the broker's group-changed notices) until done() or timeout_s: the
    notice crosses the broker's processes, which a loaded machine delays by seconds (CI once
    missed it within one 0.5 s poll)."""
    deadline = time.monotonic() + timeout_s
    while not done() and time.monotonic() < deadline:
        consumer.poll(1, 0.5)


def test_two_members_split_the_queues_and_rebalance_when_one_leaves(tmp_path) -> None:
    with running_broker(str(tmp_path / "store")) as broker:
        send_raw(broker.address, "TopicS", [b"x"] * 4)
        store = MessageStore.attach(broker.root)
        try:
            one = GroupConsumer(store, "CID_S", "TopicS", instance_name="one")
            two = GroupConsumer(store, "CID_S", "TopicS", instance_name="two")
            # the broker tells it the group changed (a notice it takes in its next poll): it gives up half
            _poll_until(one, lambda: len(one.positions) == 2)
            assert sorted(one.positions) + sorted(two.positions) == [0, 1, 2, 3]
            assert not set(one.positions) & set(two.positions)
            assert sorted(broker.controller.consumers.consumer_ids("CID_S")) == sorted([one.client_id, two.client_id])
            two.close()
            _poll_until(one, lambda: len(one.positions) == 4)
            assert sorted(one.positions) == [0, 1, 2, 3]
            one.close()
        finally:
            store.shutdown()


def test_a_poll_blocks_until_a_message_arrives(tmp_path) -> None:
    import threading

    with running_broker(str(tmp_path / "store")) as broker:
        send_raw(broker.address, "TopicW", [b"first"], queue_id=0)
        store = MessageStore.attach(broker.root)
        try:
            with GroupConsumer(store, "CID_W", "TopicW") as consumer:
                assert [m.body_bytes() for m in consumer.poll(32, 1.0)] == [b"first"]
                timer = threading.Timer(0.3, send_raw, (broker.address, "TopicW", [b"second"]), {"queue_id": 1})
                timer.start()
                got = consumer.poll(32, 10.0)
                timer.join()
                assert [m.body_bytes() for m in got] == [b"second"]
        finally:
            store.shutdown()


def test_a_consumer_without_a_broker_says_so(tmp_path) -> None:
    with MessageStore(str(tmp_path / "plain")) as store:
        with pytest.raises(BrokerLinkError, match="broker's controller"):
            GroupConsumer(store, "CID_X", "T")
