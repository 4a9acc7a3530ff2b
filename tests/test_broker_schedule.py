"""Delayed delivery and consumer send-back (docs/rocketmq-remoting-spec.md §2.4.9): the schedule
service that puts due SCHEDULE_TOPIC_XXXX messages back into their real topic and queue, its
config/delayOffset.json in RocketMQ's format, and CONSUMER_SEND_MSG_BACK's retry / DLQ message,
all on real stores in tmp dirs (levels of 1 s, 2 s and 3 s)."""

from __future__ import annotations

import os
import random
import time

import pytest

from mqstore import Message
from mqstore.broker.retry import (DLQ_NUMS_PER_GROUP, SendBack, dlq_topic, max_reconsume_times, retry_topic,
                                  send_back_message)
from mqstore.broker.schedule import (SCHEDULE_TOPIC, ScheduleMessageService, decode_delay_offsets,
                                     encode_delay_offsets)
from mqstore.errors import ConfigError
from mqstore.status import PutMessageStatus

LEVELS = "1s 2s 3s"
BORN = ("10.1.2.3", 50123)


def delayed(topic: str, body: bytes, level: int, queue_id: int = 0, **fields) -> Message:
    props = {"DELAY": str(level), "UNIQ_KEY": "C0A80001" + body.hex().upper().rjust(24, "0"), "user": "u1"}
    return Message(topic, body, queue_id=queue_id, properties=props, **fields)


def put(store, msg: Message):
    r = store.put_message(msg)
    assert r.status is PutMessageStatus.PUT_OK, r.detail
    return r


def queue_bodies(store, topic: str, qid: int) -> list[bytes]:
    store.wait_dispatched()
    got = store.read_messages(topic, qid, 0, 1000)
    return [bytes(m.body) for m in got] if got.ok else []


def wait_until(predicate, timeout_s: float = 5.0):
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def offsets_file(store) -> str:
    return os.path.join(store.root, "config", "delayOffset.json")


@pytest.fixture
def store(open_store):
    return open_store(message_delay_level=LEVELS)


# -- delivery --------------------------------------------------------------------------------------
def test_the_thread_delivers_after_the_delay_and_not_before(store):
    svc = ScheduleMessageService(store, store.root)
    svc.start()
    try:
        one = put(store, delayed("T", b"one", 1, queue_id=2))
        two = put(store, delayed("T", b"two", 2, queue_id=2))
        assert queue_bodies(store, "T", 2) == []
        wait_until(lambda: store.get_max_offset_in_queue("T", 2) >= 1)
        first = store.look_message_by_queue_offset("T", 2, 0)
        assert bytes(first.body) == b"one"
        assert 1000 <= first.store_timestamp - one.store_timestamp < 1000 + 500, "due after 1 s, seen soon after"
        assert store.get_max_offset_in_queue("T", 2) == 1, "the 2 s one is not due yet"
        wait_until(lambda: store.get_max_offset_in_queue("T", 2) >= 2)
        second = store.look_message_by_queue_offset("T", 2, 1)
        assert bytes(second.body) == b"two" and second.store_timestamp - two.store_timestamp >= 2000
    finally:
        svc.stop()
    assert not svc.running
    assert decode_delay_offsets(open(offsets_file(store)).read()) == {1: 1, 2: 1}


def test_deliver_takes_what_is_due_at_now_in_order(store):
    svc = ScheduleMessageService(store, store.root)
    rs = [put(store, delayed(f"T{i % 3}", b"m%d" % i, 2, queue_id=i % 2)) for i in range(6)]
    fast = put(store, delayed("F", b"fast", 1))
    store.wait_dispatched()
    t0 = rs[0].store_timestamp
    assert svc.deliver(now_ms=t0 + 999) == 0
    assert svc.deliver(now_ms=fast.store_timestamp + 1000) == 1, "level 1 is due, level 2 not"
    assert queue_bodies(store, "F", 0) == [b"fast"]
    due = sum(r.store_timestamp <= rs[2].store_timestamp for r in rs)   # 3, or more in the same ms
    assert svc.deliver(now_ms=rs[2].store_timestamp + 2000) == due, "the due head of level 2 only"
    assert svc.deliver(now_ms=rs[-1].store_timestamp + 2000) == 6 - due
    assert svc.deliver(now_ms=rs[-1].store_timestamp + 10_000) == 0, "nothing delivered twice"
    assert svc.offset_table() == {1: 1, 2: 6}
    store.wait_dispatched()
    views = [store.look_message_by_queue_offset(f"T{i % 3}", i % 2, 0) for i in range(6)]   # 6 distinct queues
    order = sorted(views, key=lambda v: v.physical_offset)
    assert [bytes(v.body) for v in order] == [b"m%d" % i for i in range(6)], "a level keeps its order"
    [level1, level2, level3] = svc.stats()[:3]
    assert (level2.level, level2.delay_ms, level2.offset, level2.max_offset, level2.delivered, level2.pending) == \
        (2, 2000, 6, 6, 6, 0)
    assert (level1.offset, level3.offset, level3.max_offset, level3.delay_ms) == (1, 0, 0, 3000)
    assert svc.running_stats() == {"scheduleMessageOffset_1": "1,1", "scheduleMessageOffset_2": "6,6"}


def test_the_delivered_message_is_the_original_with_delay_cleared(store):
    svc = ScheduleMessageService(store, store.root)
    msg = delayed("Orders", b"\x00body\xff", 1, queue_id=3, flag=7, born_host=BORN, born_timestamp=1_700_000_000_123,
                  reconsume_times=4)
    msg.properties.update({"TAGS": "TagA", "KEYS": "k1 k2", "WAIT": "true"})
    r = put(store, msg)
    scheduled = store.look_message_by_offset(r.wrote_offset)
    assert (scheduled.topic, scheduled.queue_id) == (SCHEDULE_TOPIC, 0)
    store.wait_dispatched()
    assert svc.deliver(now_ms=r.store_timestamp + 1000) == 1
    store.wait_dispatched()
    got = store.look_message_by_queue_offset("Orders", 3, 0).decode()
    assert got.body == b"\x00body\xff" and (got.flag, got.reconsume_times, got.sys_flag) == (7, 4, scheduled.sys_flag)
    assert (got.born_host, got.born_timestamp) == (BORN, 1_700_000_000_123)
    assert got.tags == "TagA" and got.keys == ["k1", "k2"]
    assert "DELAY" not in got.properties
    # RocketMQ's record keeps the scheduled one's properties string: REAL_TOPIC and REAL_QID stay;
    # messageTimeup's WAIT=false is what makes the put not wait for a flush
    assert got.properties == {"UNIQ_KEY": msg.properties["UNIQ_KEY"], "user": "u1", "TAGS": "TagA", "KEYS": "k1 k2",
                              "WAIT": "false", "REAL_TOPIC": "Orders", "REAL_QID": "3"}
    assert store.query_message("Orders", "k2").messages, "indexed by its keys in its real topic"


def test_a_level_above_the_configured_ones_is_delivered_with_the_highest_delay(store):
    svc = ScheduleMessageService(store, store.root)
    r = put(store, delayed("T", b"late", 7))   # the store keeps it in queue 6 (level 7)
    store.wait_dispatched()
    assert store.get_max_offset_in_queue(SCHEDULE_TOPIC, 6) == 1
    assert svc.deliver(now_ms=r.store_timestamp + 2999) == 0
    assert svc.deliver(now_ms=r.store_timestamp + 3000) == 1
    assert queue_bodies(store, "T", 0) == [b"late"]
    assert [(s.level, s.delay_ms, s.offset) for s in svc.stats()] == [(1, 1000, 0), (2, 2000, 0), (3, 3000, 0),
                                                                      (7, 3000, 1)]


def test_a_failed_put_is_retried_later_and_never_skipped(store):
    class FailingPuts:
        """The store, with its first `failures` puts answered by a real failed put."""

        def __init__(self, inner, failures: int) -> None:
            self.inner, self.failures, self.attempts = inner, failures, []

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def put_message(self, msg):
            self.attempts.append(bytes(msg.body))
            if self.failures:
                self.failures -= 1
                return self.inner.put_message(Message("no such/topic", b""))   # MESSAGE_ILLEGAL
            return self.inner.put_message(msg)

    flaky = FailingPuts(store, failures=2)
    svc = ScheduleMessageService(flaky, store.root, put_retry_ms=100)
    rs = [put(store, delayed("T", b"m%d" % i, 1)) for i in range(3)]
    store.wait_dispatched()
    now = rs[-1].store_timestamp + 1000
    assert svc.deliver(now_ms=now) == 0
    [level1] = svc.stats()[:1]
    assert "MESSAGE_ILLEGAL" in level1.blocked and level1.retry_at_ms == now + 100 and level1.offset == 0
    assert svc.deliver(now_ms=now + 99) == 0 and flaky.attempts == [b"m0"], "no put before the retry time"
    assert svc.deliver(now_ms=now + 100) == 0 and flaky.attempts == [b"m0", b"m0"]
    assert svc.deliver(now_ms=now + 200) == 3
    assert flaky.attempts == [b"m0", b"m0", b"m0", b"m1", b"m2"]
    assert queue_bodies(store, "T", 0) == [b"m0", b"m1", b"m2"]
    assert svc.stats()[0].blocked is None and svc.offset_table() == {1: 3}


def test_undeliverable_records_are_skipped_and_the_level_goes_on(store):
    svc = ScheduleMessageService(store, store.root)
    put(store, delayed("bad/topic", b"x", 1))                                 # scheduled, but no queue can hold it
    put(store, Message(SCHEDULE_TOPIC, b"y", queue_id=0))                    # no REAL_TOPIC at all
    put(store, Message(SCHEDULE_TOPIC, b"z", queue_id=0, properties={"REAL_TOPIC": "T", "REAL_QID": "one"}))
    r = put(store, delayed("T", b"good", 1))
    store.wait_dispatched()
    assert svc.deliver(now_ms=r.store_timestamp + 1000) == 1
    assert queue_bodies(store, "T", 0) == [b"good"]
    level1 = svc.stats()[0]
    assert (level1.offset, level1.delivered, level1.skipped) == (4, 1, 3)


# -- delayOffset.json ------------------------------------------------------------------------------
def test_offsets_are_written_in_rocketmqs_format_and_a_restart_neither_repeats_nor_skips(open_store, store_dir):
    store = open_store(message_delay_level=LEVELS)
    svc = ScheduleMessageService(store, store.root)
    rs = [put(store, delayed("T", b"a%d" % i, 1)) for i in range(2)]
    store.wait_dispatched()
    assert svc.deliver(now_ms=rs[1].store_timestamp + 1000) == 2
    rs.append(put(store, delayed("T", b"a2", 1)))   # not delivered before the restart
    svc.stop()
    path = offsets_file(store)
    assert open(path).read() == '{\n\t"offsetTable":{1:2\n\t}\n}'
    store.shutdown()

    store = open_store(message_delay_level=LEVELS)
    svc = ScheduleMessageService(store, store.root)
    assert svc.offset_table() == {1: 2}
    rs.append(put(store, delayed("T", b"a3", 1)))
    store.wait_dispatched()
    assert svc.deliver(now_ms=rs[-1].store_timestamp + 1000) == 2
    assert queue_bodies(store, "T", 0) == [b"a0", b"a1", b"a2", b"a3"]
    svc.persist()
    assert open(path).read() == '{\n\t"offsetTable":{1:4\n\t}\n}'
    assert open(path + ".bak").read() == '{\n\t"offsetTable":{1:2\n\t}\n}', "the previous file kept"


def test_the_thread_writes_the_offsets_every_flush_interval(store):
    svc = ScheduleMessageService(store, store.root, flush_interval_ms=50)
    svc.start()
    try:
        put(store, delayed("T", b"x", 1))
        wait_until(lambda: os.path.exists(offsets_file(store))
                   and decode_delay_offsets(open(offsets_file(store)).read()) == {1: 1})
    finally:
        svc.stop()


@pytest.mark.parametrize("text", [
    '{\n\t"offsetTable":{1:2,2:0\n\t}\n}',          # what RocketMQ 4.9.7 writes (fastjson, pretty)
    '{"offsetTable":{1:2,2:0}}',                    # fastjson, compact
    '{"offsetTable":{"1":2,"2":0}}',                # standard JSON
    '{"dataVersion":{"counter":3},"offsetTable":{"1":"2","2":0}}',
])
def test_a_rocketmq_written_file_loads(open_store, store_dir, text):
    os.makedirs(os.path.join(store_dir, "config"))
    with open(os.path.join(store_dir, "config", "delayOffset.json"), "w") as fh:
        fh.write(text)
    store = open_store(message_delay_level=LEVELS)
    rs = [put(store, delayed("T", b"r%d" % i, 1)) for i in range(3)]
    store.wait_dispatched()
    svc = ScheduleMessageService(store, store.root)
    assert svc.offset_table() == {1: 2, 2: 0}
    assert svc.deliver(now_ms=rs[-1].store_timestamp + 1000) == 1
    assert queue_bodies(store, "T", 0) == [b"r2"]


def test_an_offset_past_its_queue_is_corrected_down(open_store, store_dir):
    os.makedirs(os.path.join(store_dir, "config"))
    with open(os.path.join(store_dir, "config", "delayOffset.json"), "w") as fh:
        fh.write('{"offsetTable":{1:50,3:-4}}')
    store = open_store(message_delay_level=LEVELS)
    put(store, delayed("T", b"old", 1))
    svc = ScheduleMessageService(store, store.root)
    assert svc.offset_table() == {1: 1, 3: 0}, "to the queue's max; below its min up to the min"
    r = put(store, delayed("T", b"new", 1))
    store.wait_dispatched()
    assert svc.deliver(now_ms=r.store_timestamp + 1000) == 1
    assert queue_bodies(store, "T", 0) == [b"new"], "the message after the old end is not skipped"


def test_a_damaged_file_falls_back_on_its_bak_or_fails_naming_it(store):
    path = offsets_file(store)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        fh.write('{"offsetTable":{1:')
    with pytest.raises(ConfigError, match="delayOffset.json cannot be read .* no .*delayOffset.json.bak"):
        ScheduleMessageService(store, store.root)
    with open(path + ".bak", "w") as fh:
        fh.write('{"offsetTable":{1:0,2:0}}')
    assert ScheduleMessageService(store, store.root).offset_table() == {1: 0, 2: 0}
    with open(path + ".bak", "w") as fh:
        fh.write('{"offsetTable":{"one":3}}')
    with pytest.raises(ConfigError, match="delayOffset.json.bak cannot be read either .*'one' is not an integer"):
        ScheduleMessageService(store, store.root)
    os.remove(path)
    with open(path + ".bak", "w") as fh:
        fh.write('{"offsetTable":{2:0}}')
    assert ScheduleMessageService(store, store.root).offset_table() == {2: 0}, "a missing file: its .bak"
    os.remove(path + ".bak")
    assert ScheduleMessageService(store, store.root).offset_table() == {}


def test_encode_and_decode(tmp_path):
    assert encode_delay_offsets({}) == '{\n\t"offsetTable":{}\n}'
    assert encode_delay_offsets({10: 5, 2: 7, 1: 0}) == '{\n\t"offsetTable":{1:0,2:7,10:5\n\t}\n}'
    assert decode_delay_offsets(encode_delay_offsets({3: 9, 18: 1})) == {3: 9, 18: 1}
    for bad, why in [("[]", "not a JSON object"), ('{"offsetTable":[1]}', "not an object"),
                     ('{"offsetTable":{1:true}}', "not an integer offset"), ("{", "not JSON")]:
        with pytest.raises(ValueError, match=why):
            decode_delay_offsets(bad)


def test_bad_arguments_are_named(store):
    with pytest.raises(ValueError, match="levels_ms"):
        ScheduleMessageService(store, store.root, levels_ms=[1000, 0])
    with pytest.raises(ValueError, match="put_retry_ms"):
        ScheduleMessageService(store, store.root, put_retry_ms=0)
    svc = ScheduleMessageService(store, store.root, levels_ms=[10, 20])
    assert svc.delay_level_table == {1: 10, 2: 20}
    svc.start()
    with pytest.raises(RuntimeError, match="already started"):
        svc.start()
    svc.stop()


# -- consumer send-back ----------------------------------------------------------------------------
def consumed(store, topic: str = "T", *, reconsume_times: int = 0, properties=None, queue_id: int = 1):
    """A stored message as a consumer got it: its record, looked up by its CommitLog offset."""
    props = {"UNIQ_KEY": "C0A8000100002A9F0000000000000001", "TAGS": "TagA", "KEYS": "k", **(properties or {})}
    r = put(store, Message(topic, b"payload", queue_id=queue_id, flag=3, properties=props, born_host=BORN,
                           born_timestamp=1_700_000_000_000, reconsume_times=reconsume_times))
    return store.look_message_by_offset(r.wrote_offset)


def test_the_first_failure_goes_to_the_retry_topic_at_level_3(store):
    view = consumed(store)
    back = send_back_message(view, group="G", delay_level=0, max_reconsume_times=16, retry_queue_nums=1,
                             random=random.Random(7))
    assert isinstance(back, SendBack)
    assert (back.topic, back.queue_id, back.to_dlq, back.delay_level, back.queue_nums) == ("%RETRY%G", 0, False, 3, 1)
    m = back.message
    assert (m.topic, m.queue_id, m.reconsume_times, m.flag, m.body) == ("%RETRY%G", 0, 1, 3, b"payload")
    assert (m.born_host, m.born_timestamp, m.sys_flag) == (BORN, 1_700_000_000_000, view.sys_flag)
    assert m.properties == {**view.properties, "RETRY_TOPIC": "T", "WAIT": "false", "DELAY": "3",
                            "ORIGIN_MESSAGE_ID": view.msg_id}
    r = put(store, m)          # the store schedules it: level 3, for the retry topic
    stored = store.look_message_by_offset(r.wrote_offset)
    assert (stored.topic, stored.queue_id) == (SCHEDULE_TOPIC, 2)
    assert (stored.properties["REAL_TOPIC"], stored.properties["REAL_QID"]) == ("%RETRY%G", "0")
    store.wait_dispatched()
    svc = ScheduleMessageService(store, store.root)
    assert svc.deliver(now_ms=r.store_timestamp + 2999) == 0
    assert svc.deliver(now_ms=r.store_timestamp + 3000) == 1
    store.wait_dispatched()
    retried = store.look_message_by_queue_offset("%RETRY%G", 0, 0)
    assert retried.reconsume_times == 1 and retried.properties["RETRY_TOPIC"] == "T"

    # its next failure keeps RETRY_TOPIC and ORIGIN_MESSAGE_ID, and waits one level longer
    again = send_back_message(retried, group="G", delay_level=0, max_reconsume_times=16, retry_queue_nums=1)
    assert again.message.properties["RETRY_TOPIC"] == "T"
    assert again.message.properties["ORIGIN_MESSAGE_ID"] == view.msg_id != retried.msg_id
    assert (again.delay_level, again.message.reconsume_times) == (4, 2)


def test_the_level_the_client_asks_for_is_kept_and_the_queue_is_random(store):
    view = consumed(store)
    rng = random.Random(1)
    backs = [send_back_message(view, group="G", delay_level=2, max_reconsume_times=16, retry_queue_nums=4, random=rng)
             for _ in range(64)]
    assert {b.message.properties["DELAY"] for b in backs} == {"2"} and {b.delay_level for b in backs} == {2}
    assert {b.queue_id for b in backs} == {0, 1, 2, 3} and all(b.message.queue_id == b.queue_id for b in backs)
    assert {b.queue_nums for b in backs} == {4}


def test_the_17th_failure_and_a_negative_level_go_to_the_dlq(store):
    last_retry = send_back_message(consumed(store, "%RETRY%G", reconsume_times=15, properties={"RETRY_TOPIC": "T"}),
                                   group="G", delay_level=0, max_reconsume_times=16, retry_queue_nums=1)
    assert (last_retry.to_dlq, last_retry.delay_level) == (False, 18)
    view = consumed(store, "%RETRY%G", reconsume_times=16, properties={"RETRY_TOPIC": "T"})
    back = send_back_message(view, group="G", delay_level=0, max_reconsume_times=16, retry_queue_nums=1)
    assert (back.topic, back.queue_id, back.to_dlq, back.delay_level, back.queue_nums) == \
        ("%DLQ%G", 0, True, 0, DLQ_NUMS_PER_GROUP)
    assert back.message.reconsume_times == 17 and back.message.properties["DELAY"] == "0"
    assert back.message.properties["RETRY_TOPIC"] == "T"
    r = put(store, back.message)
    stored = store.look_message_by_offset(r.wrote_offset)
    assert (stored.topic, stored.queue_id, stored.reconsume_times) == ("%DLQ%G", 0, 17), "DELAY 0: stored as is"

    direct = send_back_message(consumed(store), group="G", delay_level=-1, max_reconsume_times=16, retry_queue_nums=8)
    assert (direct.topic, direct.to_dlq, direct.message.reconsume_times, direct.queue_id) == ("%DLQ%G", True, 1, 0)


def test_no_retry_queues_means_nothing_to_put_and_bad_inputs_are_named(store):
    view = consumed(store)
    assert send_back_message(view, group="G", delay_level=0, max_reconsume_times=16, retry_queue_nums=0) is None
    args = dict(group="G", delay_level=0, max_reconsume_times=16, retry_queue_nums=1)
    for field, value in [("group", ""), ("group", "a b"), ("group", "g" * 121), ("group", None),
                         ("delay_level", "1"), ("max_reconsume_times", 1.5), ("retry_queue_nums", None),
                         ("random", 42)]:
        with pytest.raises(ValueError, match=field):
            send_back_message(view, **{**args, field: value})
    with pytest.raises(ValueError, match="view"):
        send_back_message(None, **args)  # type: ignore[arg-type]


def test_topics_and_max_reconsume_times():
    assert (retry_topic("G-1"), dlq_topic("G-1")) == ("%RETRY%G-1", "%DLQ%G-1")
    with pytest.raises(ValueError, match="group"):
        retry_topic("a/b")
    assert max_reconsume_times(16, None, 407) == 16
    assert max_reconsume_times(16, 3, 63) == 16, "the C++ client's version: the header is ignored"
    assert max_reconsume_times(16, 3, 121) == 3
