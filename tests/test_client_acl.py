"""mqstore.client's credentials: every request the asyncio Producer and PullConsumer, the
blocking SyncProducer and a bare RemotingConnection send (to the NameServer and the broker) is
signed as RocketMQ's AclClientRPCHook signs it, over the fields as they go on the wire (V2's
one-letter names) and the body, in JSON and ROCKETMQ headers alike; a recording loopback server
checks each frame with mqstore.acl."""

from __future__ import annotations

import asyncio

import pytest
from helpers_acl import RecordingServer

from mqstore.acl import _acl
from mqstore.remoting._remoting import RemotingCommand
from mqstore.acl import PlainAcl, SessionCredentials, check, parse_acl
from mqstore.acl import signature as twin
from mqstore.client import Message, Producer, PullConsumer, RemotingConnection, SyncProducer

AK, SK = "clientAccess", "clientSecret1"
SERIALIZE = pytest.mark.parametrize("ser", ["JSON", "ROCKETMQ"])


def run(coro):
    async def bounded():
        return await asyncio.wait_for(coro, 30)
    return asyncio.run(bounded())


def acl() -> PlainAcl:
    return parse_acl({"accounts": [{"accessKey": AK, "secretKey": SK, "defaultTopicPerm": "PUB|SUB",
                                    "defaultGroupPerm": "SUB"}]})


def assert_all_signed(server: RecordingServer, codes: set[int], token: str | None = None) -> None:
    requests = list(server.requests)
    assert {r.code for r in requests} >= codes, [r.code for r in requests]
    the_acl = acl()
    for r in requests:
        assert r.ext_fields.get("AccessKey") == AK, (r.code, r.ext_fields)
        assert r.ext_fields.get("SecurityToken") == token
        assert twin.signature_matches(r.ext_fields, r.body, SK), (r.code, r.ext_fields)
        assert _acl.signature_matches(r.ext_fields, r.body, SK)
        assert not twin.signature_matches(r.ext_fields, r.body, SK + "!")
        assert check(the_acl, r.code, r.ext_fields, r.body, "127.0.0.1") is None, r.code


@SERIALIZE
def test_producer_requests_are_signed(ser):
    async def go(server: RecordingServer) -> None:
        producer = Producer("PG_ACL", server.address, serialize=ser, credentials=(AK, SK))
        async with producer:
            assert (await producer.send("TopicAcl", b"v2 body", tags="TagA", keys="k1")).queue_offset >= 1
            await producer.send_batch("TopicAcl", [b"one", b"two"])
            await producer.send_oneway("TopicAcl", b"oneway")
            await producer.heartbeat()
        v1 = Producer("PG_ACL", server.address, serialize=ser, send_code="SEND_MESSAGE",
                      credentials=SessionCredentials(AK, SK))
        async with v1:
            await v1.send("TopicAcl", b"v1 body")

    with RecordingServer() as server:
        run(go(server))
        server.wait_for(35)
        assert_all_signed(server, {105, 310, 320, 10, 34, 35})
        send = server.of(310)[0]
        assert send.ext_fields["b"] == "TopicAcl" and send.body == b"v2 body"  # signed under the short names


@SERIALIZE
def test_pull_consumer_requests_are_signed(ser):
    async def go(server: RecordingServer) -> None:
        consumer = PullConsumer("CG_ACL", server.address, serialize=ser,
                                credentials=SessionCredentials(AK, SK, security_token="token-1"))
        async with consumer:
            mq = (await consumer.queues("TopicAcl"))[0]
            offset = await consumer.fetch_offset(mq)
            await consumer.pull(mq, offset)
            await consumer.commit(mq, 1)
            await consumer.max_offset(mq)
            await consumer.min_offset(mq)
            await consumer.search_offset(mq, 0)
            await consumer.consumer_ids("TopicAcl")
            await consumer.heartbeat()

    with RecordingServer() as server:
        run(go(server))
        server.wait_for(35)
        assert_all_signed(server, {105, 14, 11, 15, 30, 31, 29, 38, 34, 35}, token="token-1")


@SERIALIZE
def test_sync_producer_requests_are_signed(ser):
    with RecordingServer() as server:
        with SyncProducer("PG_ACL", server.address, serialize=ser, credentials=(AK, SK)) as producer:
            producer.send("TopicAcl", b"sync body")
            producer.send_message("TopicAcl", Message(b"sync message"))
            producer.send_batch("TopicAcl", [b"a", b"b"])
        assert_all_signed(server, {105, 34, 310, 320})


def test_a_remoting_connection_signs_and_an_unsigned_one_does_not():
    async def go(server: RecordingServer) -> None:
        signed = await RemotingConnection.open(server.address, credentials=SessionCredentials(AK, SK))
        plain = await RemotingConnection.open(server.address)
        cmd = RemotingCommand(105, ext_fields={"topic": "T"})
        await signed.request(cmd, timeout=3)
        await signed.request(cmd, timeout=3)  # a command sent again is signed again, the same
        await plain.request(RemotingCommand(105, ext_fields={"topic": "U"}), timeout=3)
        for conn in (signed, plain):
            conn.close()
            await conn.wait_closed()

    with RecordingServer() as server:
        run(go(server))
        first, again, unsigned = server.of(105)
    assert twin.signature_matches(first.ext_fields, first.body, SK) and again.ext_fields == first.ext_fields
    assert "AccessKey" not in unsigned.ext_fields and "Signature" not in unsigned.ext_fields
    assert check(acl(), 105, unsigned.ext_fields, b"", "127.0.0.1").startswith("no AccessKey in the request")


def test_bad_credentials_are_refused_at_construction():
    with pytest.raises(ValueError, match="credentials must be"):
        Producer("PG", "127.0.0.1:9876", credentials="ak:sk")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="secret_key must be a non-empty str"):
        SyncProducer("PG", "127.0.0.1:9876", credentials=(AK, ""))
