"""The store's reads a broker front serves itself (docs/rocketmq-remoting-spec.md §2.4.7, §2.4.8):
GET_MAX_OFFSET, GET_MIN_OFFSET, SEARCH_OFFSET_BY_TIMESTAMP, GET_EARLIEST_MSG_STORETIME,
VIEW_MESSAGE_BY_ID and QUERY_MESSAGE, in both header serializations, and the errors they answer."""

from __future__ import annotations

import asyncio

import pytest

from mqstore.remoting._remoting import RemotingCommand
from mqstore.client import Producer, RemotingConnection, decode_messages
from mqstore.protocol import RequestCode, ResponseCode

from helpers_broker import running_broker

pytestmark = pytest.mark.multiprocess


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with running_broker(str(tmp_path_factory.mktemp("reads") / "store")) as b:
        yield b


async def _produce(broker, topic: str) -> list:
    async with Producer("PID_READS", broker.namesrv_address) as producer:
        return [await producer.send(topic, b"body-%d" % i, keys=[f"key{i % 3}"], tags="T", queue_id=0)
                for i in range(9)]


@pytest.mark.parametrize("serialize", ["JSON", "ROCKETMQ"])
def test_offsets_times_ids_and_keys(broker, serialize) -> None:
    topic = f"Reads{serialize}"

    async def run() -> None:
        sent = await _produce(broker, topic)
        assert [r.queue_offset for r in sent] == list(range(9))
        conn = await RemotingConnection.open(broker.address, serialize=serialize)
        try:
            async def ask(code: int, **fields: str) -> RemotingCommand:
                return await conn.request(RemotingCommand(code, ext_fields=fields), 5.0)

            for _ in range(100):  # the max offset is the dispatched one: the dispatcher follows the puts
                got = await ask(RequestCode.GET_MAX_OFFSET, topic=topic, queueId="0")
                if got.ext_fields.get("offset") == "9":
                    break
                await asyncio.sleep(0.02)
            assert (got.code, got.ext_fields["offset"]) == (ResponseCode.SUCCESS, "9")
            assert got.serialize_type == conn.serialize_type  # answered in the request's serialization
            got = await ask(RequestCode.GET_MIN_OFFSET, topic=topic, queueId="0")
            assert got.ext_fields["offset"] == "0"
            got = await ask(RequestCode.GET_EARLIEST_MSG_STORETIME, topic=topic, queueId="0")
            first = int(got.ext_fields["timestamp"])
            assert first > 0
            got = await ask(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, topic=topic, queueId="0", timestamp=str(first))
            assert got.ext_fields["offset"] == "0"
            # VIEW_MESSAGE_BY_ID: the commit-log offset an offset msgId encodes
            phy = int(sent[4].offset_msg_id[16:], 16)
            got = await ask(RequestCode.VIEW_MESSAGE_BY_ID, offset=str(phy))
            assert got.code == ResponseCode.SUCCESS
            [view] = decode_messages(got.body)
            assert (view.body, view.queue_offset, view.msg_id) == (b"body-4", 4, sent[4].msg_id)
            got = await ask(RequestCode.VIEW_MESSAGE_BY_ID, offset=str(phy + 1))
            assert got.code == ResponseCode.SYSTEM_ERROR and "can not find message by the offset" in got.remark
            # QUERY_MESSAGE by key (the index is built by the dispatcher: wait for it)
            for _ in range(100):
                got = await ask(RequestCode.QUERY_MESSAGE, topic=topic, key="key1", maxNum="32", beginTimestamp="0",
                                endTimestamp=str(2**63 - 1))
                if got.code == ResponseCode.SUCCESS and len(decode_messages(got.body)) == 3:
                    break
                await asyncio.sleep(0.05)
            assert sorted(m.body for m in decode_messages(got.body)) == [b"body-1", b"body-4", b"body-7"]
            assert int(got.ext_fields["indexLastUpdatePhyoffset"]) >= phy
            got = await ask(RequestCode.QUERY_MESSAGE, topic=topic, key="nokey", maxNum="32", beginTimestamp="0",
                            endTimestamp=str(2**63 - 1))
            assert got.code == ResponseCode.QUERY_NOT_FOUND
            # bad fields are named
            got = await ask(RequestCode.GET_MAX_OFFSET, topic=topic)
            assert got.code == ResponseCode.SYSTEM_ERROR and "<queueId> is null" in got.remark
            got = await ask(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, topic=topic, queueId="0", timestamp="soon")
            assert got.code == ResponseCode.SYSTEM_ERROR and "<timestamp> is not a number" in got.remark
            got = await ask(RequestCode.QUERY_MESSAGE, topic=topic, key="k", maxNum="0")
            assert got.code == ResponseCode.SYSTEM_ERROR and "<maxNum>" in got.remark
            got = await ask(9999)
            assert got.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED and "9999" in got.remark
        finally:
            conn.close()

    asyncio.run(run())
