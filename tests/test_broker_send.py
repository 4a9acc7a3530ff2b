"""Sends the C++ client makes that a broker must take apart: a batch whose body is compressed
(the C++ client zlib-compresses any body of 4 KiB or more, a batch's too)."""

from __future__ import annotations

import asyncio
import zlib

import pytest

from mqstore import Message, MessageBatch
from mqstore.remoting._remoting import RemotingCommand
from mqstore.client import RemotingConnection
from mqstore.protocol import ResponseCode

from helpers_broker import running_broker

pytestmark = pytest.mark.multiprocess


def _batch_request(topic: str, body: bytes, sys_flag: int) -> RemotingCommand:
    return RemotingCommand(10, ext_fields={
        "producerGroup": "PID_Z", "topic": topic, "defaultTopic": "TBW102", "defaultTopicQueueNums": "4",
        "queueId": "0", "sysFlag": str(sys_flag), "bornTimestamp": "0", "flag": "0", "properties": "WAIT\x01true\x02",
        "reconsumeTimes": "0", "unitMode": "0", "batch": "1"}, body=body)


def test_a_compressed_batch_is_stored_as_its_messages(tmp_path) -> None:
    bodies = [b"message %03d " % i + b"x" * 90 for i in range(100)]  # 10 KiB: the C++ client compresses it
    plain = MessageBatch.from_messages([Message("Zipped", b, tags="TagZ") for b in bodies]).body

    async def run(address: str) -> list[RemotingCommand]:
        conn = await RemotingConnection.open(address)
        try:
            return [await conn.request(_batch_request("Zipped", zlib.compress(plain), 1), 5.0),
                    await conn.request(_batch_request("Zipped", b"\x78\x9c not zlib at all", 1), 5.0),
                    await conn.request(_batch_request("Zipped", zlib.compress(plain)[:-20], 1), 5.0)]
        finally:
            conn.close()

    with running_broker(str(tmp_path / "store")) as broker:
        ok, garbage, cut = asyncio.run(run(broker.address))
        assert ok.code == ResponseCode.SUCCESS and ok.ext_fields["queueOffset"] == "0"
        assert len(ok.ext_fields["msgId"].split(",")) == 100
        assert garbage.code == ResponseCode.MESSAGE_ILLEGAL and "does not inflate" in garbage.remark
        assert cut.code == ResponseCode.MESSAGE_ILLEGAL and "cut short" in cut.remark
        broker.store.wait_dispatched()
        got = broker.store.read_messages("Zipped", 0, 0, 1000)
        assert got.bodies() == bodies  # each stored uncompressed, nothing from the refused ones
        assert {m.sys_flag & 1 for m in got} == {0} and {m.tags for m in got} == {"TagZ"}


def test_short_polling_holds_a_pull_short_polling_time_mills_not_its_suspend_time(tmp_path) -> None:
    """long_polling_enable=false: a suspended pull that finds nothing is held
    short_polling_time_mills (PullRequestHoldService's short polling), not the 20 s it asked for."""
    import time

    from mqstore.client import Producer, PullConsumer, PullStatus

    async def run(broker) -> tuple[float, PullStatus, PullStatus]:
        async with Producer("PID_SP", broker.namesrv_address) as producer, \
                PullConsumer("CID_SP", broker.namesrv_address) as consumer:
            sent = await producer.send("Short", b"first", queue_id=0)
            mq = None
            for _ in range(100):  # the topic reaches the NameServer with the broker's next registration
                try:
                    mq = next(q for q in await consumer.queues("Short") if q.queue_id == 0)
                    break
                except Exception:
                    await asyncio.sleep(0.05)
            assert mq is not None
            for _ in range(200):  # dispatched: a pull past the queue's end before that is OFFSET_ILLEGAL
                if await consumer.max_offset(mq) > sent.queue_offset:
                    break
                await asyncio.sleep(0.01)
            t0 = time.monotonic()
            empty = await consumer.pull(mq, sent.queue_offset + 1, suspend_ms=20_000, timeout=30)
            held = time.monotonic() - t0
            found = await consumer.pull(mq, sent.queue_offset, suspend_ms=20_000, timeout=30)
            return held, empty.status, found.status

    with running_broker(str(tmp_path / "store"), long_polling_enable=False, short_polling_time_mills=300) as broker:
        held, empty, found = asyncio.run(run(broker))
    assert empty is PullStatus.NO_NEW_MSG and found is PullStatus.FOUND
    assert 0.25 <= held < 10, held  # held about 300 ms, never the 20 s the pull asked for
