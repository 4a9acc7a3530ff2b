"""mqstore.client against a real broker on loopback (tests/helpers_broker.py): sends, batches,
oneway sends, concurrent requests on one connection, pulls with tag filters and long polling,
offsets, send-back, error responses, NameServer routes in both JSON forms, requests the server
sends, and connections that close under pending requests. Every broker test runs with JSON and
with ROCKETMQ headers. pytest-asyncio is not used: each test runs its coroutine with asyncio.run,
bounded by a timeout."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import socket
import subprocess
import sys
import time
import zlib

import pytest

from helpers_broker import running_broker
from mqstore.log._codec import encode_record
from mqstore.remoting._remoting import ROCKETMQ, FrameReader, RemotingCommand
from mqstore.client import (ClientStateError, ConnectFailedError, ConnectionClosedError, Message, MessageDecodeError,
                            MessageQueue, MQClientError, Producer, PullConsumer, PullStatus, RemotingConnection,
                            RemotingTimeoutError, RequestCode, ResponseCode, RouteError, SendStatus, UniqIdGenerator,
                            decode_messages, parse_expression, parse_route_data)
from mqstore.client.protocol import SYSTEM_PROPERTIES

SERIALIZE = pytest.mark.parametrize("ser", ["JSON", "ROCKETMQ"])
TEST_TIMEOUT_S = 30.0
_topic_seq = itertools.count()


def run(coro):
    """Run one test's coroutine, bounded."""
    async def bounded():
        return await asyncio.wait_for(coro, TEST_TIMEOUT_S)
    return asyncio.run(bounded())


def new_topic(name: str, ser: str) -> str:
    return f"{name}_{ser}_{next(_topic_seq)}"


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    """One broker for the module; delay levels of 1 s so send-back retries come back soon."""
    with running_broker(str(tmp_path_factory.mktemp("client") / "store"), message_delay_level="1s 1s 1s") as b:
        yield b


async def queues_of(consumer: PullConsumer, topic: str, deadline_s: float = 5.0) -> list[MessageQueue]:
    """The topic's queues once the NameServer has its route: a broker registers a topic created
    by a send right after answering that send, so a consumer may ask a little before it is there."""
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            return await consumer.queues(topic)
        except MQClientError as exc:
            assert exc.code == ResponseCode.TOPIC_NOT_EXIST and time.monotonic() < deadline, exc
            await asyncio.sleep(0.02)


async def collect(consumer: PullConsumer, mq: MessageQueue, count: int, *, offset: int = 0, expression: str = "*",
                  deadline_s: float = 5.0):
    """Pull mq from offset until count messages came (long polling between), within deadline_s."""
    got = []
    deadline = time.monotonic() + deadline_s
    assert mq in await queues_of(consumer, mq.topic, deadline_s)
    while len(got) < count:
        left = deadline - time.monotonic()
        assert left > 0, f"only {len(got)} of {count} messages of {mq} within {deadline_s} s"
        result = await consumer.pull(mq, offset, expression=expression, suspend_ms=int(min(left, 1.0) * 1000))
        assert result.status in (PullStatus.FOUND, PullStatus.NO_NEW_MSG, PullStatus.NO_MATCHED_MSG), result
        got += result.messages
        offset = result.next_begin_offset
    return got


# -- sends and pulls ------------------------------------------------------------------------------
@SERIALIZE
def test_send_and_pull_round_trip_keeps_everything_in_queue_order(broker, ser):
    topic = new_topic("RoundTrip", ser)

    async def main():
        async with Producer("PG_rt", broker.namesrv_address, serialize=ser) as producer, \
                PullConsumer("CG_rt", broker.namesrv_address, serialize=ser) as consumer:
            sent = []
            for i in range(5):
                body = bytes([i]) * (i + 1) + b"\x00\xff body"
                props = {"user": f"u{i}", "empty-ish": " ", "ünïcode": "välue ✓"}
                result = await producer.send(topic, body, tags=f"Tag{i % 2}", keys=[f"k{i}", "shared"],
                                             properties=props, queue_id=1, flag=i)
                assert result.status is SendStatus.SEND_OK
                assert (result.topic, result.broker_name, result.queue_id) == (topic, "broker-a", 1)
                assert re.fullmatch(r"[0-9A-F]{32}", result.msg_id)
                assert re.fullmatch(r"[0-9A-F]{32}", result.offset_msg_id) and result.offset_msg_id != result.msg_id
                sent.append((body, props, result))
            assert [r.queue_offset for _, _, r in sent] == [0, 1, 2, 3, 4]
            mq = MessageQueue(topic, "broker-a", 1)
            got = await collect(consumer, mq, 5)
            assert len(got) == 5
            host, port = broker.address.split(":")
            for i, ((body, props, result), msg) in enumerate(zip(sent, got)):
                assert msg.body == body and msg.topic == topic and msg.queue_id == 1 and msg.queue_offset == i
                assert msg.tags == f"Tag{i % 2}" and msg.keys == [f"k{i}", "shared"] and msg.flag == i
                assert msg.user_properties == props
                assert msg.msg_id == msg.uniq_key == result.msg_id
                assert msg.offset_msg_id == result.offset_msg_id
                assert msg.offset_msg_id.endswith(f"{msg.commit_log_offset:016X}")
                assert msg.store_host == (host, int(port)) and msg.broker_name == "broker-a"
                assert msg.reconsume_times == 0 and msg.born_timestamp <= msg.store_timestamp + 1000
                assert msg.properties["CLUSTER"] == "DefaultCluster" and "WAIT" not in msg.properties
            assert await consumer.max_offset(mq) == 5
    run(main())


@SERIALIZE
def test_send_message_code_10_and_compressed_bodies(broker, ser):
    """send_code="SEND_MESSAGE" sends the long header names; compress_over zlib-compresses bodies
    (sys flag bit 0) and a pull inflates them."""
    topic = new_topic("Code10", ser)
    big = os.urandom(100) * 50

    async def main():
        async with Producer("PG_v1", broker.namesrv_address, serialize=ser, send_code="SEND_MESSAGE",
                            compress_over=1000) as producer, \
                PullConsumer("CG_v1", broker.namesrv_address, serialize=ser) as consumer:
            small = await producer.send(topic, b"small", tags="T", queue_id=0)
            large = await producer.send(topic, big, tags="T", queue_id=0)
            assert (small.queue_offset, large.queue_offset) == (0, 1)
            got = await collect(consumer, MessageQueue(topic, "broker-a", 0), 2)
            assert [m.body for m in got] == [b"small", big]
            assert [m.sys_flag & 1 for m in got] == [0, 1]
            assert [m.msg_id for m in got] == [small.msg_id, large.msg_id]
    run(main())


@SERIALIZE
def test_sends_go_round_robin_over_every_write_queue(broker, ser):
    topic = new_topic("RoundRobin", ser)

    async def main():
        async with Producer("PG_rr", broker.namesrv_address, serialize=ser) as producer:
            results = [await producer.send(topic, b"m%d" % i) for i in range(12)]
            queues = await producer.queues(topic)
            assert len(queues) == 4  # a topic created by a send gets min(4, TBW102's 8) queues
            ids = [r.queue_id for r in results]
            assert sorted(ids) == sorted([q.queue_id for q in queues] * 3)
            assert all(ids[i] != ids[i + 1] for i in range(len(ids) - 1))
    run(main())


@SERIALIZE
def test_a_batch_of_100_is_stored_as_100_messages_in_order(broker, ser):
    topic = new_topic("Batch", ser)

    async def main():
        items = []
        for i in range(100):
            if i % 3 == 0:
                items.append(b"plain %d" % i)
            elif i % 3 == 1:
                items.append((b"with props %d" % i, {"i": str(i)}))
            else:
                items.append(Message(b"message %d" % i, tags="BatchTag", keys=f"key{i}", properties={"i": str(i)}))
        async with Producer("PG_batch", broker.namesrv_address, serialize=ser) as producer, \
                PullConsumer("CG_batch", broker.namesrv_address, serialize=ser) as consumer:
            result = await producer.send_batch(topic, items, queue_id=2)
            assert result.status is SendStatus.SEND_OK and result.queue_id == 2 and result.queue_offset == 0
            ids, offset_ids = result.msg_id.split(","), result.offset_msg_id.split(",")
            assert len(ids) == len(set(ids)) == 100 and len(offset_ids) == 100
            got = await collect(consumer, MessageQueue(topic, "broker-a", 2), 100)
            assert [m.queue_offset for m in got] == list(range(100))
            assert [m.msg_id for m in got] == ids and [m.offset_msg_id for m in got] == offset_ids
            for i, m in enumerate(got):
                if i % 3 == 0:
                    assert m.body == b"plain %d" % i and m.user_properties == {} and m.tags is None
                elif i % 3 == 1:
                    assert m.body == b"with props %d" % i and m.user_properties == {"i": str(i)}
                else:
                    assert (m.body, m.tags, m.keys) == (b"message %d" % i, "BatchTag", [f"key{i}"])
            tagged = await collect(consumer, MessageQueue(topic, "broker-a", 2), 33, expression="BatchTag")
            assert [m.queue_offset for m in tagged] == list(range(2, 100, 3))
    run(main())


@SERIALIZE
def test_oneway_sends_are_stored_without_an_answer(broker, ser):
    topic = new_topic("Oneway", ser)

    async def main():
        async with Producer("PG_ow", broker.namesrv_address, serialize=ser) as producer, \
                PullConsumer("CG_ow", broker.namesrv_address, serialize=ser) as consumer:
            ids = [await producer.send_oneway(topic, b"oneway %d" % i, tags="OW", queue_id=3) for i in range(3)]
            assert all(re.fullmatch(r"[0-9A-F]{32}", i) for i in ids)
            got = await collect(consumer, MessageQueue(topic, "broker-a", 3), 3)
            assert [m.body for m in got] == [b"oneway 0", b"oneway 1", b"oneway 2"]
            assert [m.msg_id for m in got] == ids
    run(main())


@SERIALIZE
def test_50_concurrent_sends_share_one_connection(broker, ser):
    topic = new_topic("Concurrent", ser)

    async def main():
        async with Producer("PG_cc", broker.namesrv_address, serialize=ser) as producer, \
                PullConsumer("CG_cc", broker.namesrv_address, serialize=ser) as consumer:
            await producer.send(topic, b"first", queue_id=0)  # creates the topic
            results = await asyncio.gather(*(producer.send(topic, b"c%d" % i) for i in range(50)))
            assert all(r.status is SendStatus.SEND_OK for r in results)
            assert len({r.msg_id for r in results}) == 50
            assert len({(r.queue_id, r.queue_offset) for r in results}) == 50
            conn = producer.client.connections[broker.address]
            assert [a for a in producer.client.connections if a != broker.namesrv_address] == [broker.address]
            assert conn.max_in_flight > 1, "the sends were in flight together"
            bodies = []
            for mq in await queues_of(consumer, topic):
                count = sum(1 for r in results if r.queue_id == mq.queue_id) + (mq.queue_id == 0)
                bodies += [m.body for m in await collect(consumer, mq, count)]
            assert sorted(bodies) == sorted([b"first"] + [b"c%d" % i for i in range(50)])
    run(main())


@SERIALIZE
def test_tag_filtering(broker, ser):
    topic = new_topic("Tags", ser)

    async def main():
        async with Producer("PG_tag", broker.namesrv_address, serialize=ser) as producer, \
                PullConsumer("CG_tag", broker.namesrv_address, serialize=ser) as consumer:
            tags = ["TagA", "TagB", None, "TagC"] * 3
            for i, tag in enumerate(tags):
                await producer.send(topic, b"%d" % i, tags=tag, queue_id=0)
            mq = MessageQueue(topic, "broker-a", 0)
            await collect(consumer, mq, len(tags))  # all dispatched
            a = await consumer.pull(mq, 0, expression="TagA")
            assert a.status is PullStatus.FOUND and [m.tags for m in a.messages] == ["TagA"] * 3
            assert a.next_begin_offset == 12, "filtered-out entries are scanned too"
            ab = await consumer.pull(mq, 0, expression=" TagA || TagB ")
            assert [m.body for m in ab.messages] == [b"0", b"1", b"4", b"5", b"8", b"9"]
            every = await consumer.pull(mq, 0, expression="*")
            assert len(every.messages) == 12
            none = await consumer.pull(mq, 0, expression="NoSuchTag")
            assert none.status is PullStatus.NO_MATCHED_MSG and none.messages == []
            assert none.next_begin_offset == 12
    run(main())


@SERIALIZE
def test_a_long_polling_pull_is_answered_soon_after_a_put(broker, ser):
    topic = new_topic("LongPoll", ser)

    async def main():
        async with Producer("PG_lp", broker.namesrv_address, serialize=ser) as producer, \
                Producer("PG_lp2", broker.namesrv_address, serialize=ser) as other, \
                PullConsumer("CG_lp", broker.namesrv_address, serialize=ser) as consumer:
            await producer.send(topic, b"first", queue_id=0)
            mq = MessageQueue(topic, "broker-a", 0)
            await collect(consumer, mq, 1)
            idle = await consumer.pull(mq, 1, suspend_ms=200)
            assert idle.status is PullStatus.NO_NEW_MSG and idle.next_begin_offset == 1

            async def put_later():
                await asyncio.sleep(0.3)
                return await other.send(topic, b"later", queue_id=0)

            started = time.monotonic()
            pulled, put = await asyncio.gather(consumer.pull(mq, 1, suspend_ms=10_000), put_later())
            elapsed = time.monotonic() - started
            assert pulled.status is PullStatus.FOUND and [m.body for m in pulled.messages] == [b"later"]
            assert pulled.messages[0].msg_id == put.msg_id
            assert elapsed < 5.0, f"the held pull was answered {elapsed:.1f} s after it was sent"
    run(main())


@SERIALIZE
def test_offsets_commit_fetch_and_queue_bounds(broker, ser):
    topic = new_topic("Offsets", ser)

    async def main():
        async with Producer("PG_off", broker.namesrv_address, serialize=ser) as producer, \
                PullConsumer("CG_off", broker.namesrv_address, serialize=ser) as consumer, \
                PullConsumer("CG_off", broker.namesrv_address, serialize=ser) as same_group:
            before = time.time_ns() // 1_000_000
            results = [await producer.send(topic, b"%d" % i, queue_id=1) for i in range(6)]
            mq = MessageQueue(topic, "broker-a", 1)
            got = await collect(consumer, mq, 6)
            assert await consumer.fetch_offset(mq) == 0, "a new group on a queue starting at 0 reads from 0"
            await consumer.commit(mq, 4)
            assert await consumer.fetch_offset(mq) == 4
            assert await same_group.fetch_offset(mq) == 4, "offsets live on the broker"
            await same_group.commit(mq, 6)
            assert await consumer.fetch_offset(mq) == 6
            assert (await consumer.min_offset(mq), await consumer.max_offset(mq)) == (0, 6)
            assert await consumer.search_offset(mq, before - 60_000) == 0
            assert await consumer.search_offset(mq, got[3].store_timestamp) <= 3
            earliest = await consumer.earliest_msg_store_time(mq)
            assert earliest == got[0].store_timestamp and results[0].queue_offset == 0
            empty = MessageQueue(topic, "broker-a", 3)
            assert (await consumer.min_offset(empty), await consumer.max_offset(empty)) == (0, 0)
    run(main())


@SERIALIZE
def test_pull_statuses_no_new_msg_and_offset_illegal(broker, ser):
    topic = new_topic("Statuses", ser)

    async def main():
        async with Producer("PG_st", broker.namesrv_address, serialize=ser) as producer, \
                PullConsumer("CG_st", broker.namesrv_address, serialize=ser) as consumer:
            for i in range(3):
                await producer.send(topic, b"%d" % i, queue_id=0)
            mq = MessageQueue(topic, "broker-a", 0)
            await collect(consumer, mq, 3)
            caught_up = await consumer.pull(mq, 3)
            assert caught_up.status is PullStatus.NO_NEW_MSG and caught_up.next_begin_offset == 3
            assert (caught_up.min_offset, caught_up.max_offset) == (0, 3) and caught_up.messages == []
            beyond = await consumer.pull(mq, 10)
            assert beyond.status is PullStatus.OFFSET_ILLEGAL and beyond.next_begin_offset == 3
            empty = MessageQueue(topic, "broker-a", 2)
            assert (await consumer.pull(empty, 0)).status is PullStatus.NO_NEW_MSG
            moved = await consumer.pull(empty, 5)
            assert moved.status is PullStatus.OFFSET_ILLEGAL and moved.next_begin_offset == 0
            few = await consumer.pull(mq, 1, max_nums=1)
            assert [m.body for m in few.messages] == [b"1"] and few.next_begin_offset == 2
    run(main())


@SERIALIZE
def test_send_back_puts_the_message_in_the_retry_topic(broker, ser):
    topic = new_topic("SendBack", ser)
    group = f"CG_back_{ser}"

    async def main():
        async with Producer("PG_back", broker.namesrv_address, serialize=ser) as producer, \
                PullConsumer(group, broker.namesrv_address, serialize=ser) as consumer:
            sent = await producer.send(topic, b"failed once", tags="Back", keys="kb", properties={"p": "1"}, queue_id=0)
            [msg] = await collect(consumer, MessageQueue(topic, "broker-a", 0), 1)
            await consumer.send_back(msg)  # level 0: 3 + reconsume times, 1 s with this broker's levels
            retry_queues = await queues_of(consumer, f"%RETRY%{group}")
            assert retry_queues == [MessageQueue(f"%RETRY%{group}", "broker-a", 0)]
            [back] = await collect(consumer, retry_queues[0], 1, deadline_s=8.0)
            assert back.body == b"failed once" and back.topic == f"%RETRY%{group}"
            assert back.reconsume_times == 1 and back.msg_id == sent.msg_id
            assert back.properties["RETRY_TOPIC"] == topic
            assert back.properties["ORIGIN_MESSAGE_ID"] == msg.offset_msg_id
            assert (back.tags, back.keys, back.user_properties) == ("Back", ["kb"], {"p": "1"})
    run(main())


@SERIALIZE
def test_send_back_with_a_negative_level_goes_to_the_dlq(broker, ser):
    """delayLevel < 0 sends the message straight to %DLQ%<group>, which RocketMQ 4.9.7 creates
    with perm READ|WRITE (docs/rocketmq-remoting-spec.md §2.4.9), so it can be pulled."""
    topic = new_topic("Dlq", ser)
    group = f"CG_dlq_{ser}"

    async def main():
        async with Producer("PG_dlq", broker.namesrv_address, serialize=ser) as producer, \
                PullConsumer(group, broker.namesrv_address, serialize=ser) as consumer:
            await producer.send(topic, b"dead", queue_id=0)
            [msg] = await collect(consumer, MessageQueue(topic, "broker-a", 0), 1)
            await queues_of(consumer, f"%RETRY%{group}")  # made by the heartbeat, and registered
            await consumer.send_back(msg, delay_level=-1)
            dlq = await queues_of(consumer, f"%DLQ%{group}")
            assert dlq == [MessageQueue(f"%DLQ%{group}", "broker-a", 0)]
            [dead] = await collect(consumer, dlq[0], 1)
            assert dead.body == b"dead" and dead.properties["RETRY_TOPIC"] == topic
    run(main())


# -- errors -----------------------------------------------------------------------------------------
@SERIALIZE
def test_error_responses_name_the_code_and_the_remark(broker, ser):
    topic = new_topic("Errors", ser)

    async def main():
        async with Producer("PG_err", broker.namesrv_address, serialize=ser) as producer, \
                PullConsumer("CG_err", broker.namesrv_address, serialize=ser) as consumer:
            with pytest.raises(MQClientError) as bad:
                await producer.send("bad topic!", b"x")
            assert bad.value.code == ResponseCode.SYSTEM_ERROR and bad.value.address == broker.address
            assert "illegal characters" in bad.value.remark
            assert str(bad.value).startswith(f"SYSTEM_ERROR(1) from {broker.address} to SEND_MESSAGE_V2(310): ")
            with pytest.raises(MQClientError) as system:
                await producer.send("SCHEDULE_TOPIC_XXXX", b"x")
            assert system.value.code == ResponseCode.NO_PERMISSION and "forbidden" in system.value.remark
            with pytest.raises(MQClientError) as unknown:
                await consumer.queues(topic)
            assert unknown.value.code == ResponseCode.TOPIC_NOT_EXIST
            assert unknown.value.address == broker.namesrv_address and topic in unknown.value.remark
            assert "TOPIC_NOT_EXIST(17)" in str(unknown.value)
            await producer.send(topic, b"x", queue_id=0)
            await queues_of(consumer, topic)  # the broker is known now
            with pytest.raises(MQClientError) as missing:
                await consumer.pull(MessageQueue(topic + "_none", "broker-a", 0), 0)
            assert missing.value.code == ResponseCode.TOPIC_NOT_EXIST and "not exist" in missing.value.remark
            with pytest.raises(MQClientError) as queue:
                await consumer.pull(MessageQueue(topic, "broker-a", 99), 0)
            assert queue.value.code == ResponseCode.SYSTEM_ERROR and "queueId[99] is illegal" in queue.value.remark
            with pytest.raises(ValueError, match=r"no write queue \*:7; its write queues are broker-a:0, "):
                await producer.send(topic, b"x", queue_id=7)
            with pytest.raises(RouteError, match="no address of broker broker-z"):
                await consumer.pull(MessageQueue(topic, "broker-z", 0), 0)
    run(main())


@SERIALIZE
def test_oneway_requests_get_no_response_even_when_refused(broker, ser):
    """RocketMQ never answers a request flagged oneway (NettyRemotingAbstract.processRequestCommand):
    not a refused send, not a forwarded UPDATE_CONSUMER_OFFSET."""
    topic = new_topic("OnewayRefused", ser)

    async def main():
        async with Producer("PG_owr", broker.namesrv_address, serialize=ser) as producer, \
                PullConsumer("CG_owr", broker.namesrv_address, serialize=ser) as consumer:
            await producer.send(topic, b"x", queue_id=0)
            await producer.send_oneway("bad topic!", b"refused")
            conn = await consumer.client.connection(broker.address)
            await conn.oneway(RemotingCommand(RequestCode.UPDATE_CONSUMER_OFFSET, ext_fields={
                "consumerGroup": "CG_owr", "topic": topic, "queueId": "0", "commitOffset": "1"}))
            mq = MessageQueue(topic, "broker-a", 0)
            deadline = time.monotonic() + 5
            while await consumer.fetch_offset(mq) != 1:
                assert time.monotonic() < deadline, "the oneway commit was not applied"
                await asyncio.sleep(0.05)
            await producer.send(topic, b"y", queue_id=0)  # a round trip after the oneway send
            refused_send = producer.client.connections[broker.address].unmatched
            forwarded_commit = conn.unmatched
            assert (refused_send, forwarded_commit) == (0, 0), "responses to oneway requests"
    run(main())


def test_topics_created_during_a_registration_are_routable_soon(broker):
    """A broker registers with its NameServers at once when a topic is created (§2.3.2), also
    when the topic is created while an earlier registration is on its way: 100 topics created
    1 ms apart are all routable within 5 s (the registration period is 30 s)."""
    async def main():
        async with Producer("PG_reg", broker.namesrv_address) as producer, \
                PullConsumer("CG_reg", broker.namesrv_address) as consumer:
            topics = [new_topic("Registered", "JSON") for _ in range(100)]

            async def create(i: int) -> None:
                await asyncio.sleep(i * 0.001)
                await producer.send(topics[i], b"x")
            await asyncio.gather(*(create(i) for i in range(len(topics))))
            missing = set(topics)
            deadline = time.monotonic() + 5
            while missing and time.monotonic() < deadline:
                for topic in sorted(missing):
                    try:
                        await consumer.client.query_route(topic)
                        missing.discard(topic)
                    except MQClientError as exc:
                        assert exc.code == ResponseCode.TOPIC_NOT_EXIST
                await asyncio.sleep(0.05)
            assert not missing, f"{len(missing)} of {len(topics)} new topics have no route after 5 s"
    run(main())


def test_bad_arguments_are_refused_naming_the_cause(broker):
    ns = broker.namesrv_address
    for group, match in (("", "blank"), ("a b", "illegal characters"), ("x" * 256, "longer than 255"),
                         ("DEFAULT_PRODUCER", "DEFAULT_PRODUCER"), (7, "must be a str")):
        with pytest.raises(ValueError, match=match):
            Producer(group, ns)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="DEFAULT_CONSUMER"):
        PullConsumer("DEFAULT_CONSUMER", ns)
    for namesrv, match in (("", "namesrv is empty"), ("localhost", "not a 'host:port'"),
                           ("127.0.0.1:0", "not a 'host:port'"), ("a:1;b", "'b' is not")):
        with pytest.raises(ValueError, match=match):
            Producer("PG", namesrv)
    with pytest.raises(ValueError, match="serialize must be"):
        Producer("PG", ns, serialize="XML")
    with pytest.raises(ValueError, match="send_code must be"):
        Producer("PG", ns, send_code="SEND_MESSAGE_V3")
    with pytest.raises(ValueError, match="compress_over"):
        Producer("PG", ns, compress_over=0)
    with pytest.raises(ValueError, match="timeout must be a positive"):
        PullConsumer("CG", ns, timeout=0)
    with pytest.raises(ValueError, match="max_reconsume_times"):
        PullConsumer("CG", ns, max_reconsume_times=-1)
    with pytest.raises(ValueError, match="names no tag"):
        parse_expression("||")
    assert parse_expression(" * ") is None and parse_expression("a||b ") == {"a", "b"}

    async def main():
        producer = Producer("PG_args", ns)
        consumer = PullConsumer("CG_args", ns)
        mq = MessageQueue("T", "broker-a", 0)
        with pytest.raises(ClientStateError, match="not started"):
            await producer.send("T", b"x")
        with pytest.raises(ClientStateError, match="not started"):
            await consumer.pull(mq, 0)
        await producer.start()
        await consumer.start()
        cases = [
            (producer.send("T", b""), "body length is zero"),
            (producer.send("T", "text"), "must be bytes"),  # type: ignore[arg-type]
            (producer.send("T", b"x" * (4 * 1024 * 1024 + 1)), "over max value"),
            (producer.send("T", b"x", properties={"TAGS": "a"}), "used by the system"),
            (producer.send("T", b"x", properties={"a": "b\x01c"}), "separator"),
            (producer.send("T", b"x", properties={"a": ""}), "is empty"),
            (producer.send("T", b"x", keys=["a b"]), "contains a space"),
            (producer.send("T", b"x", keys=[]), "empty list"),
            (producer.send("T", b"x", flag=2**31), "int32"),
            (producer.send("T", b"x", delay_level=-1), "delay_level"),
            (producer.send(5, b"x"), "topic must be a str"),  # type: ignore[arg-type]
            (producer.send_batch("T", []), "at least one message"),
            (producer.send_batch("T", [Message(b"x", delay_level=2)]), "not supported for batching"),
            (producer.send_batch("T", ["str"]), "batch item 0"),  # type: ignore[list-item]
            (consumer.pull(mq, -1), "offset must be an int >= 0"),
            (consumer.pull(mq, 0, max_nums=0), "max_nums"),
            (consumer.pull(mq, 0, suspend_ms=-5), "suspend_ms"),
            (consumer.pull(("T", "b", 0), 0), "must be a MessageQueue"),  # type: ignore[arg-type]
            (consumer.commit(mq, -2), "offset must be"),
            (consumer.send_back("msg"), "must be a MessageExt"),  # type: ignore[arg-type]
        ]
        for coro, match in cases:
            with pytest.raises(ValueError, match=match):
                await coro
        await producer.close()
        await consumer.close()
        with pytest.raises(ClientStateError, match="closed"):
            await producer.send("T", b"x")
        with pytest.raises(ClientStateError, match="closed"):
            await consumer.queues("T")
    run(main())


# -- connections ----------------------------------------------------------------------------------
@SERIALIZE
def test_the_broker_closing_the_connection_fails_pending_requests(tmp_path, ser):
    async def main(b):
        async with PullConsumer("CG_gone", b.namesrv_address, serialize=ser) as consumer, \
                Producer("PG_gone", b.namesrv_address, serialize=ser) as producer:
            await producer.send("Gone", b"x", queue_id=0)
            mq = MessageQueue("Gone", "broker-a", 0)
            await collect(consumer, mq, 1)
            held = asyncio.ensure_future(consumer.pull(mq, 1, suspend_ms=10_000))
            await asyncio.sleep(0.2)
            assert not held.done()
            started = time.monotonic()
            await asyncio.get_running_loop().run_in_executor(None, b.shutdown)
            with pytest.raises(ConnectionClosedError) as closed:
                await held
            assert time.monotonic() - started < 8.0
            assert closed.value.address == b.address and b.address in str(closed.value)
            assert "PULL_MESSAGE(11)" in str(closed.value) and "closed by the peer" in str(closed.value)
            with pytest.raises(ConnectFailedError) as refused:
                await consumer.pull(mq, 1)
            assert refused.value.address == b.address and f"cannot connect to {b.address}" in str(refused.value)

    with running_broker(str(tmp_path / "store")) as b:
        run(main(b))


@SERIALIZE
def test_a_request_times_out_and_its_late_response_is_dropped(broker, ser):
    topic = new_topic("Timeout", ser)

    async def main():
        async with Producer("PG_to", broker.namesrv_address, serialize=ser) as producer:
            await producer.send(topic, b"x", queue_id=0)
        conn = await RemotingConnection.open(broker.address, serialize=ser)
        try:
            deadline = time.monotonic() + 5
            while (await conn.request(RemotingCommand(RequestCode.GET_MAX_OFFSET, ext_fields={
                    "topic": topic, "queueId": "0"}), timeout=3)).ext_fields.get("offset") != "1":
                assert time.monotonic() < deadline, "the message was not dispatched"
                await asyncio.sleep(0.02)
            pull = RemotingCommand(RequestCode.PULL_MESSAGE, ext_fields={
                "consumerGroup": "CG_to", "topic": topic, "queueId": "0", "queueOffset": "1", "maxMsgNums": "1",
                "sysFlag": "6", "commitOffset": "0", "suspendTimeoutMillis": "800", "subscription": "*",
                "subVersion": "0"})
            with pytest.raises(RemotingTimeoutError) as late:
                await conn.request(pull, timeout=0.2)
            assert late.value.address == broker.address and late.value.timeout == 0.2
            assert f"no response from {broker.address} to PULL_MESSAGE(11)" in str(late.value)
            while conn.unmatched == 0:
                assert time.monotonic() < deadline, "the held pull was never answered"
                await asyncio.sleep(0.05)
            ok = await conn.request(RemotingCommand(RequestCode.GET_MAX_OFFSET,
                                                    ext_fields={"topic": topic, "queueId": "0"}), timeout=3)
            assert ok.code == ResponseCode.SUCCESS and ok.ext_fields["offset"] == "1"
            assert ok.serialize_type == (ROCKETMQ if ser == "ROCKETMQ" else 0)
            held = asyncio.ensure_future(conn.request(pull, timeout=10))
            await asyncio.sleep(0.1)
            assert conn.in_flight == 1
        finally:
            conn.close()
            await conn.wait_closed()
        with pytest.raises(ConnectionClosedError, match=r"closed by the client while PULL_MESSAGE\(11\)"):
            await held
        with pytest.raises(ConnectionClosedError, match="closed by the client"):
            await conn.request(RemotingCommand(RequestCode.GET_MAX_OFFSET), timeout=1)
    run(main())


@SERIALIZE
def test_consumers_hear_when_their_group_changes(broker, ser):
    """NOTIFY_CONSUMER_IDS_CHANGED, a request the broker sends, reaches the callback when a second
    consumer of the group heartbeats and when it unregisters."""
    topic = new_topic("Notify", ser)
    group = f"CG_notify_{ser}"

    async def main():
        heard: list[str] = []
        async with Producer("PG_n", broker.namesrv_address, serialize=ser) as producer:
            await producer.send(topic, b"x")
        first = PullConsumer(group, broker.namesrv_address, serialize=ser, on_consumer_ids_changed=heard.append)
        await first.start()
        await queues_of(first, topic)  # the route names the broker: it gets the first heartbeat
        assert await first.consumer_ids(topic) == [first.client_id]
        heard.clear()
        second = PullConsumer(group, broker.namesrv_address, serialize=ser)
        await second.start()
        await queues_of(second, topic)
        deadline = time.monotonic() + 5
        while not heard:
            assert time.monotonic() < deadline, "no NOTIFY_CONSUMER_IDS_CHANGED"
            await asyncio.sleep(0.02)
        assert heard[0] == group
        assert sorted(await first.consumer_ids(topic)) == sorted([first.client_id, second.client_id])
        heard.clear()
        await second.close()  # UNREGISTER_CLIENT
        while not heard:
            assert time.monotonic() < deadline + 5, "no NOTIFY_CONSUMER_IDS_CHANGED after the unregister"
            await asyncio.sleep(0.02)
        assert await first.consumer_ids(topic) == [first.client_id]
        await first.close()
    run(main())


def test_heartbeats_repeat_every_interval(broker):
    async def main():
        async with Producer("PG_hb", broker.namesrv_address, heartbeat_interval=0.1) as producer:
            await producer.send(new_topic("Heartbeat", "JSON"), b"x")
            first = producer.client.heartbeats
            assert first >= 1, "the broker named by the route is heartbeated at once"
            deadline = time.monotonic() + 5
            while producer.client.heartbeats < first + 3:
                assert time.monotonic() < deadline, "the heartbeat timer does not run"
                await asyncio.sleep(0.05)
            await producer.heartbeat()
    run(main())


class FakeServer:
    """A real TCP server on loopback that sends the client what a test says (requests of its
    own, a frame that cannot be decoded) and records what comes back."""

    def __init__(self) -> None:
        self.received: list[RemotingCommand] = []
        self.writer: asyncio.StreamWriter | None = None
        self.connected = asyncio.Event()

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self.connected.set()
        frames = FrameReader()
        while data := await reader.read(65536):
            frames.feed(data)
            while (cmd := frames.next()) is not None:
                self.received.append(cmd)

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.server.close()
        await self.server.wait_closed()


@SERIALIZE
def test_requests_from_the_server_and_bad_frames(ser):
    async def main():
        server = FakeServer()
        address = await server.start()
        seen: list[RemotingCommand] = []

        def handler(conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand | None:
            seen.append(cmd)
            return RemotingCommand(ResponseCode.SUCCESS, body=b"running") if cmd.code == 307 else None

        plain = await RemotingConnection.open(address, serialize=ser)
        await server.connected.wait()
        writer = server.writer
        server.connected.clear()
        stype = ROCKETMQ if ser == "ROCKETMQ" else 0
        writer.write(RemotingCommand(999, opaque=77, serialize_type=stype).encode())
        writer.write(RemotingCommand(40, opaque=78, flag=2, ext_fields={"consumerGroup": "g"},
                                     serialize_type=stype).encode())
        deadline = time.monotonic() + 5
        while len(server.received) < 1:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        [answer] = server.received
        assert (answer.code, answer.opaque, answer.is_response) == (ResponseCode.REQUEST_CODE_NOT_SUPPORTED, 77, True)
        assert answer.serialize_type == stype
        plain.close()
        await plain.wait_closed()

        conn = await RemotingConnection.open(address, serialize=ser, on_request=handler)
        await server.connected.wait()
        writer = server.writer
        server.received.clear()
        writer.write(RemotingCommand(307, opaque=5, serialize_type=stype).encode())
        writer.write(RemotingCommand(40, opaque=6, flag=2, ext_fields={"consumerGroup": "g"}).encode())
        while len(server.received) < 1 or len(seen) < 2:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        assert [c.code for c in seen] == [307, 40] and seen[1].ext_fields == {"consumerGroup": "g"}
        [running] = server.received
        assert (running.code, running.opaque, running.body) == (0, 5, b"running")
        pending = asyncio.ensure_future(conn.request(RemotingCommand(RequestCode.HEART_BEAT), timeout=5))
        while len(server.received) < 2:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        writer.write(b"\x00\x00\x00\x08\x00\x00\x00\xff{}{}")  # a header longer than its frame
        with pytest.raises(ConnectionClosedError) as bad:
            await pending
        assert address in str(bad.value) and "cannot be decoded" in str(bad.value)
        assert "HEART_BEAT(34)" in str(bad.value) and conn.closed
        await server.close()
    run(main())


def test_timeouts_fire_soon_after_their_deadlines_without_a_timer_per_request():
    """Requests with different timeouts in flight on one connection to a server that never
    answers: each fails with RemotingTimeoutError within 250 ms after its own deadline (one
    timer per connection, re-armed for the earliest deadline), and the connection stays usable."""
    async def main():
        server = FakeServer()
        address = await server.start()
        conn = await RemotingConnection.open(address)
        loop = asyncio.get_running_loop()
        failed: dict[float, float] = {}

        async def one(timeout: float) -> None:
            started = loop.time()
            with pytest.raises(RemotingTimeoutError) as late:
                await conn.request(RemotingCommand(RequestCode.HEART_BEAT), timeout=timeout)
            failed[timeout] = loop.time() - started
            assert late.value.timeout == timeout and late.value.address == address
            assert re.fullmatch(rf"no response from {address} to HEART_BEAT\(34\) \(opaque \d+\) in {timeout:g} s",
                                str(late.value))

        first = asyncio.ensure_future(one(1.2))
        await asyncio.sleep(0.05)
        assert conn.in_flight == 1
        await asyncio.gather(first, one(0.3), one(0.6), one(0.25))
        for timeout, elapsed in failed.items():
            assert timeout <= elapsed < timeout + 0.25, f"the {timeout} s timeout fired after {elapsed:.3f} s"
        assert conn.in_flight == 0 and not conn.closed
        for _ in range(20):  # the scan stops once nothing is in flight
            if conn._scan is None:
                break
            await asyncio.sleep(0.05)
        assert conn._scan is None
        pending = asyncio.ensure_future(conn.request(RemotingCommand(RequestCode.HEART_BEAT), timeout=30))
        await asyncio.sleep(0.05)
        assert conn._scan is not None
        conn.close()
        await conn.wait_closed()
        assert conn._scan is None, "closing cancels the scan"
        with pytest.raises(ConnectionClosedError):
            await pending
        await server.close()
    run(main())


def test_connecting_to_nothing_names_the_address():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: connections are refused

        async def main():
            with pytest.raises(ConnectFailedError) as refused:
                await RemotingConnection.open(f"127.0.0.1:{port}")
            assert refused.value.address == f"127.0.0.1:{port}" and f"cannot connect to 127.0.0.1:{port}" in str(
                refused.value)
            async with Producer("PG_none", f"127.0.0.1:{port}") as producer:
                with pytest.raises(ConnectFailedError, match=f"no NameServer answered the route of T: cannot "
                                                             f"connect to 127.0.0.1:{port}"):
                    await producer.send("T", b"x")
        run(main())


def test_the_client_loads_neither_the_store_nor_the_broker():
    code = "import sys, mqstore.client; print(' '.join(sorted(m for m in sys.modules if m.startswith('mqstore'))))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                            check=True).stdout.split()
    assert "mqstore.client.producer" in loaded and "mqstore.remoting._remoting" in loaded
    assert [m for m in loaded if m.partition(".")[2].split(".")[0] in ("store", "broker", "node", "services", "queue",
                                                                        "tools")] == []


# -- routes, ids, records -------------------------------------------------------------------------
def test_route_data_in_both_json_forms(broker):
    from mqstore.broker.routes import route_json

    route = {"brokerDatas": [{"brokerAddrs": {0: "10.0.0.1:10911", 1: "10.0.0.2:10911"}, "brokerName": "broker-b",
                              "cluster": "C"},
                             {"brokerAddrs": {1: "10.0.0.3:10911"}, "brokerName": "broker-a", "cluster": "C"}],
             "filterServerTable": {},
             "queueDatas": [{"brokerName": "broker-b", "perm": 6, "readQueueNums": 2, "topicSysFlag": 0,
                             "writeQueueNums": 3},
                            {"brokerName": "broker-a", "perm": 4, "readQueueNums": 1, "topicSysFlag": 0,
                             "writeQueueNums": 1}]}
    plain, standard = route_json(route, standard=False), route_json(route, standard=True)
    assert b'{0:"10.0.0.1:10911"' in plain and b'{"0":"10.0.0.1:10911"' in standard
    a, b = parse_route_data(plain), parse_route_data(standard)
    assert a == b
    assert a.broker("broker-b").addrs == {0: "10.0.0.1:10911", 1: "10.0.0.2:10911"}
    assert a.publish_queues("T") == [MessageQueue("T", "broker-b", i) for i in range(3)], "broker-a: no master"
    assert a.subscribe_queues("T") == [MessageQueue("T", "broker-a", 0), MessageQueue("T", "broker-b", 0),
                                       MessageQueue("T", "broker-b", 1)]
    tricky = json.dumps({"brokerDatas": [{"brokerAddrs": {}, "brokerName": "x,1:y {2:z}", "cluster": "c"}],
                         "queueDatas": []}).encode().replace(b"{}", b"{7:\"a:1\", 8 : \"b\"}")
    assert parse_route_data(tricky).broker_datas[0].addrs == {7: "a:1", 8: "b"}
    assert parse_route_data(tricky).broker_datas[0].broker_name == "x,1:y {2:z}"
    ordered = json.loads(standard)
    ordered["orderTopicConf"] = "broker-b:2"
    assert parse_route_data(json.dumps(ordered).encode()).publish_queues("T") == [
        MessageQueue("T", "broker-b", 0), MessageQueue("T", "broker-b", 1)]
    for body, match in ((b"\xff", "not UTF-8"), (b"{not json", "not JSON"), (b"[]", "not a JSON object"),
                        (b'{"queueDatas":[{"brokerName":"a","perm":"6","readQueueNums":1,"writeQueueNums":1}]}',
                         r"queueDatas\[0\].perm must be an integer"),
                        (b'{"brokerDatas":[{"brokerName":"a","brokerAddrs":{"m":"x"}}]}', "not a broker id")):
        with pytest.raises(RouteError, match=match):
            parse_route_data(body)

    async def main():
        """The embedded NameServer sends the bare-key form to a client older than V4_9_4."""
        async with Producer("PG_route", broker.namesrv_address) as producer:
            await producer.send("RouteForms", b"x")
        bodies = []
        for version in (63, 407):
            conn = await RemotingConnection.open(broker.namesrv_address, version=version)
            got = await conn.request(RemotingCommand(RequestCode.GET_ROUTEINFO_BY_TOPIC,
                                                     ext_fields={"topic": "RouteForms"}), timeout=3)
            conn.close()
            bodies.append(got.body)
        assert b'{0:"' in bodies[0] and b'{"0":"' in bodies[1]
        old, new = (parse_route_data(body) for body in bodies)
        assert old == new and old.broker("broker-a").master == broker.address
    run(main())


def test_message_ids_are_like_rocketmqs():
    gen = UniqIdGenerator("10.1.2.3")
    ids = [gen.next() for _ in range(70_000)]
    assert all(re.fullmatch(r"[0-9A-F]{32}", i) for i in ids)
    assert len(set(ids)) == len(ids), "the counter wraps at 65536 but the clock moves on"
    raw = bytes.fromhex(ids[0])
    assert raw[:4] == bytes([10, 1, 2, 3]) and int.from_bytes(raw[4:6], "big") == os.getpid() & 0xFFFF
    assert len({i[:20] for i in ids}) == 1, "ip, pid and salt are fixed per generator"
    t = time.localtime()
    month_start = time.mktime((t.tm_year, t.tm_mon, 1, 0, 0, 0, 0, 0, -1)) * 1000
    assert abs(month_start + int.from_bytes(raw[10:14], "big") - time.time() * 1000) < 60_000
    assert len(UniqIdGenerator("::1").next()) == 32, "an IPv6 address gets RocketMQ's fake 4-byte ip"


def test_records_decode_and_garbage_is_named():
    props = {"TAGS": "t", "UNIQ_KEY": "AB" * 16, "x": "y"}
    one = encode_record(topic="T", body=b"plain", queue_id=3, queue_offset=7, physical_offset=100,
                        properties=props, store_host=("127.0.0.1", 10911))
    packed = zlib.compress(b"inflated" * 10)
    two = encode_record(topic="T", body=packed, sys_flag=1, queue_offset=8, physical_offset=100 + len(one),
                        store_host=("127.0.0.1", 10911))
    a, b = decode_messages(one + two, broker_name="bn")
    assert (a.body, a.tags, a.msg_id, a.queue_offset, a.commit_log_offset) == (b"plain", "t", "AB" * 16, 7, 100)
    assert a.user_properties == {"x": "y"} and set(a.properties) - {"x"} <= SYSTEM_PROPERTIES
    assert b.body == b"inflated" * 10 and b.msg_id == b.offset_msg_id and b.message_queue.broker_name == "bn"
    with pytest.raises(MessageDecodeError, match=f"byte {len(one)} of {len(one) + 3}"):
        decode_messages(one + b"xyz", address="1.2.3.4:5")
    bad = encode_record(topic="T", body=b"not zlib", sys_flag=1)
    with pytest.raises(MessageDecodeError, match="does not inflate"):
        decode_messages(bad)
