"""The broker with acl_enable (docs/security.md): RocketMQ 4.9.7's plain ACL checked in the fronts
through the request table's ACL column, against mqstore.client's credentials, raw requests as an
attacker sends them, and the real C++ client's set_session_credentials."""

from __future__ import annotations

import asyncio
import platform
import socket
import time

import pytest
from helpers_broker import running_broker
from helpers_proc import wait_until

from mqstore._remoting import FrameReader, RemotingCommand
from mqstore.acl.signature import sign_fields
from mqstore.client import MQClientError, PullConsumer, SyncProducer
from mqstore.client.message import MessageQueue
from mqstore.protocol import RequestCode, ResponseCode

pytestmark = pytest.mark.multiprocess

ACL = """\
globalWhiteRemoteAddresses:
accounts:
  - accessKey: RocketMQ
    secretKey: "12345678"
    whiteRemoteAddress:
    admin: false
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms:
      - TopicA=PUB|SUB
      - TopicRO=SUB
    groupPerms:
      - CID_DENIED=DENY
  - accessKey: rocketmq2
    secretKey: "87654321"
    whiteRemoteAddress:
    admin: true
"""
USER = ("RocketMQ", "12345678")
ADMIN = ("rocketmq2", "87654321")


@pytest.fixture(scope="module")
def acl_broker(tmp_path_factory):
    base = tmp_path_factory.mktemp("acl")
    acl_file = base / "plain_acl.yml"
    acl_file.write_text(ACL)
    with running_broker(str(base / "store"), acl_enable=True, acl_file=str(acl_file), front_processes=1) as broker:
        with SyncProducer("PID_ADMIN", broker.namesrv_address, credentials=ADMIN) as admin:
            for topic in ("TopicA", "TopicRO", "TopicB"):
                admin.send(topic, b"seed")
        broker.acl_file = acl_file  # type: ignore[attr-defined]
        yield broker


def _request(address: str, cmd: RemotingCommand, timeout_s: float = 10.0) -> RemotingCommand:
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
        sock.sendall(cmd.encode())
        frames = FrameReader()
        while (answer := frames.next()) is None:
            data = sock.recv(65536)
            assert data, "the broker closed the connection"
            frames.feed(data)
    return answer


def _signed(code: int, fields: dict[str, str], credentials: tuple[str, str] | None, body: bytes = b"",
            opaque: int = 1) -> RemotingCommand:
    fields = dict(fields)
    if credentials is not None:
        sign_fields(fields, body, *credentials)
    return RemotingCommand(code, opaque=opaque, ext_fields=fields, body=body)


def _max_offset(store, topic: str) -> int:
    store.wait_dispatched()
    return sum(store.get_max_offset_in_queue(topic, q) for q in range(8))


# -- producers ------------------------------------------------------------------------------------

def test_a_producer_with_its_keys_sends(acl_broker):
    with SyncProducer("PID_USER", acl_broker.namesrv_address, credentials=USER) as producer:
        result = producer.send("TopicA", b"allowed")
    assert result.status.name == "SEND_OK"


@pytest.mark.parametrize(("credentials", "topic", "named"), [
    (None, "TopicA", "no AccessKey"),
    (("RocketMQ", "wrong-secret"), "TopicA", "signature"),
    (("nobody", "12345678"), "TopicA", "no acl config for accessKey=nobody"),
    (USER, "TopicRO", "PUB"),
    (USER, "TopicB", "PUB"),  # defaultTopicPerm DENY
])
def test_a_send_without_the_right_keys_or_permission_is_refused_and_stores_nothing(acl_broker, credentials, topic,
                                                                                   named):
    before = _max_offset(acl_broker.store, topic)
    with SyncProducer("PID_USER", acl_broker.namesrv_address, credentials=credentials) as producer:
        with pytest.raises(MQClientError) as caught:
            producer.send(topic, b"refused")
    assert caught.value.code == ResponseCode.NO_PERMISSION
    assert named in str(caught.value)
    assert _max_offset(acl_broker.store, topic) == before


# -- consumers ------------------------------------------------------------------------------------

def test_a_consumer_with_its_keys_pulls_and_commits_and_one_without_cannot(acl_broker):
    async def run(credentials: tuple[str, str] | None) -> int:
        async with PullConsumer("CID_A", acl_broker.namesrv_address, credentials=credentials) as consumer:
            mq = MessageQueue("TopicA", acl_broker.config.broker_name, 0)
            found = 0
            for queue in await consumer.queues("TopicA"):
                result = await consumer.pull(queue, 0, 32)
                found += len(result.messages)
            await consumer.commit(mq, 0)
            return found

    assert asyncio.run(run(USER)) >= 1
    with pytest.raises(MQClientError) as caught:
        asyncio.run(run(None))
    assert caught.value.code == ResponseCode.NO_PERMISSION


def test_a_group_denied_cannot_pull(acl_broker):
    fields = {"consumerGroup": "CID_DENIED", "topic": "TopicA", "queueId": "0", "queueOffset": "0",
              "maxMsgNums": "1", "sysFlag": "4", "commitOffset": "0", "suspendTimeoutMillis": "0",
              "subscription": "*", "subVersion": "0"}
    got = _request(acl_broker.address, _signed(RequestCode.PULL_MESSAGE, fields, USER))
    assert got.code == ResponseCode.NO_PERMISSION and "CID_DENIED" in (got.remark or "")


# -- what the attacks did -----------------------------------------------------------------------------

def test_anonymous_and_non_admin_topic_changes_are_refused(acl_broker):
    """Regression: an anonymous UPDATE_AND_CREATE_TOPIC set a live topic read-only."""
    fields = {"topic": "TopicA", "defaultTopic": "TBW102", "readQueueNums": "8", "writeQueueNums": "8",
              "perm": "4", "topicFilterType": "SINGLE_TAG", "topicSysFlag": "0", "order": "false"}
    for who in (None, USER):
        got = _request(acl_broker.address, _signed(RequestCode.UPDATE_AND_CREATE_TOPIC, fields, who))
        assert got.code == ResponseCode.NO_PERMISSION, (who, got.remark)
    assert acl_broker.controller.topics.get("TopicA")["perm"] == 6
    got = _request(acl_broker.address, _signed(RequestCode.UPDATE_AND_CREATE_TOPIC,
                                               {**fields, "topic": "TopicMadeByAdmin", "perm": "6"}, ADMIN))
    assert got.code == ResponseCode.SUCCESS, got.remark
    assert acl_broker.controller.topics.get("TopicMadeByAdmin") is not None


def test_anonymous_offset_resets_and_consumer_lists_are_refused(acl_broker):
    """Regression: an anonymous UPDATE_CONSUMER_OFFSET reset another group's offsets and
    GET_CONSUMER_CONNECTION_LIST handed out every consumer's id and address."""
    update = {"consumerGroup": "CID_A", "topic": "TopicA", "queueId": "0", "commitOffset": str(2**63 - 1)}
    got = _request(acl_broker.address, _signed(RequestCode.UPDATE_CONSUMER_OFFSET, update, None))
    assert got.code == ResponseCode.NO_PERMISSION
    assert acl_broker.controller.offsets.query("CID_A", "TopicA", 0) != 2**63 - 1
    for code, fields in ((RequestCode.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": "CID_A"}),
                         (RequestCode.GET_BROKER_RUNTIME_INFO, {}), (RequestCode.GET_ALL_CONSUMER_OFFSET, {}),
                         (RequestCode.GET_ALL_TOPIC_CONFIG, {})):
        for who, named in ((None, "no AccessKey"), (USER, "need admin permission")):
            got = _request(acl_broker.address, _signed(code, fields, who))
            assert got.code == ResponseCode.NO_PERMISSION and named in (got.remark or ""), (code, who, got.remark)
        got = _request(acl_broker.address, _signed(code, fields, ADMIN))
        assert got.code != ResponseCode.NO_PERMISSION, (code, got.remark)


def test_a_request_tampered_after_signing_is_refused(acl_broker):
    fields = {"topic": "TopicA", "queueId": "0"}
    cmd = _signed(RequestCode.GET_MAX_OFFSET, fields, USER)
    assert _request(acl_broker.address, cmd).code == ResponseCode.SUCCESS
    cmd.ext_fields["queueId"] = "1"
    got = _request(acl_broker.address, cmd)
    assert got.code == ResponseCode.NO_PERMISSION and "signature" in (got.remark or "")


# -- the file -----------------------------------------------------------------------------------------

def test_the_acl_file_is_reloaded_when_it_changes(acl_broker):
    acl_file = acl_broker.acl_file
    original = acl_file.read_text()
    with SyncProducer("PID_USER", acl_broker.namesrv_address, credentials=USER) as producer:
        with pytest.raises(MQClientError):
            producer.send("TopicB", b"not yet")
        try:
            acl_file.write_text(original.replace("      - TopicRO=SUB", "      - TopicRO=SUB\n      - TopicB=PUB"))

            def sends() -> bool:
                try:
                    return producer.send("TopicB", b"now allowed").status.name == "SEND_OK"
                except MQClientError:
                    return False
            wait_until(sends, 20, "the reloaded ACL letting TopicB through", every_s=0.2)
            acl_file.write_text("accounts: [this is not: valid")  # a bad version keeps the last good one
            time.sleep(1.0)  # two of the fronts' reload checks (every 0.5 s)
            assert producer.send("TopicB", b"still allowed").status.name == "SEND_OK"
        finally:
            acl_file.write_text(original)
    wait_until(lambda: _request(acl_broker.address, _signed(RequestCode.SEND_MESSAGE, {
        "producerGroup": "P", "topic": "TopicB", "defaultTopic": "TBW102", "defaultTopicQueueNums": "4",
        "queueId": "0", "sysFlag": "0", "bornTimestamp": "0", "flag": "0"}, USER)).code == ResponseCode.NO_PERMISSION,
               20, "the original ACL back in force", every_s=0.2)


def test_a_broker_with_acl_on_and_no_acl_file_does_not_start(tmp_path):
    with pytest.raises(Exception, match="plain_acl.yml"):
        with running_broker(str(tmp_path / "s"), acl_enable=True):
            pass


# -- the real C++ client --------------------------------------------------------------------------------

cpp = pytest.mark.skipif(platform.machine() != "x86_64", reason="the rocketmq wheel exists for x86_64 Linux only")


@cpp
def test_the_cpp_client_with_session_credentials(acl_broker, tmp_path):
    from test_broker_cpp import ClientProc

    def producer(name: str, credentials: tuple[str, str] | None, topic: str) -> list[dict]:
        spec = {"group": "PID_CPP", "namesrv": acl_broker.namesrv_address,
                "steps": [{"op": "sync", "topic": topic, "body": f"{name}-{i}"} for i in range(3)]}
        if credentials is not None:
            spec["credentials"] = list(credentials)
        proc = ClientProc(str(tmp_path), name, "produce", **spec)
        try:
            proc.finish(60)
            return proc.events("sent")
        finally:
            proc.kill()

    ok = producer("right", USER, "TopicA")
    assert all("error" not in e and e["status"] == 0 for e in ok), ok
    for name, credentials, topic in (("wrong", ("RocketMQ", "nope"), "TopicA"), ("anonymous", None, "TopicA"),
                                     ("readonly", USER, "TopicRO")):
        refused = producer(name, credentials, topic)
        assert refused and all("error" in e for e in refused), (name, refused)
        assert any("16" in e["error"] or "permission" in e["error"].lower() or "No route" in e["error"]
                   for e in refused), (name, refused)

    pull = ClientProc(str(tmp_path), "pull", "pull", group="CID_CPP", namesrv=acl_broker.namesrv_address,
                      topic="TopicA", credentials=list(USER), rounds=1)
    try:
        pull.finish(60)
        bodies = {m["body"] for m in pull.messages()}
    finally:
        pull.kill()
    assert {"right-0", "right-1", "right-2"} <= bodies

    push = ClientProc(str(tmp_path), "push", "push", group="CID_CPP_PUSH", namesrv=acl_broker.namesrv_address,
                      topic="TopicA", credentials=list(USER))
    try:
        got = push.wait_messages(3, 60)
        assert {"right-0", "right-1", "right-2"} <= {m["body"] for m in got}
    finally:
        push.kill()


def test_the_embedded_namesrv_takes_registrations_from_the_acls_admin_accounts_only(acl_broker):
    """The broker registers itself (its routes work above: every client found it); another
    broker must sign with an account of the ACL that is admin."""
    import json

    fields = {"clusterName": "DefaultCluster", "brokerAddr": "127.0.0.1:1", "brokerName": "broker-x",
              "brokerId": "0", "haServerAddr": "", "compressed": "false", "bodyCrc32": "0"}
    body = json.dumps({"topicConfigSerializeWrapper": {"topicConfigTable": {}, "dataVersion": {
        "timestamp": 0, "counter": 0}}, "filterServerList": []}).encode()
    namesrv = acl_broker.namesrv_address
    for who in (None, USER):
        got = _request(namesrv, _signed(RequestCode.REGISTER_BROKER, fields, who, body))
        assert got.code == ResponseCode.NO_PERMISSION, (who, got.remark)
    got = _request(namesrv, _signed(RequestCode.REGISTER_BROKER, fields, ADMIN, body))
    assert got.code == ResponseCode.SUCCESS, got.remark


def test_the_request_tables_acl_column_agrees_with_the_validator():
    """The table says which codes are admin; the ACL's own list (every code a plain client never
    sends) says the same for every code the broker serves."""
    from mqstore.acl.validator import needs_admin
    from mqstore.broker.table import REQUESTS, Access, Server

    for code, spec in REQUESTS.items():
        if spec.server in (Server.FRONT, Server.CONTROLLER):
            assert (spec.access is Access.ADMIN) == needs_admin(code), spec.name
