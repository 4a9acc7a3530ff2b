"""A broker with acl_enable lets a client set a consumer group's offsets (UPDATE_CONSUMER_OFFSET)
when its account is admin, when its account lists the group in groupPerms with SUB, or when the
client is a live consumer of the group: a heartbeat on its connection registered a consumer of the
group, which the broker still holds (docs/security.md "Offsets are the group's"). A pull carrying a
commit keeps RocketMQ 4.9.7's rule: SUB on its topic and group, defaultGroupPerm included.
Checked with raw requests on one connection (heartbeat, update, unregister), mqstore.client and
the real C++ push consumer on an account that has its group only by defaultGroupPerm."""

from __future__ import annotations

import asyncio
import itertools
import json
import platform
import socket
import time
from typing import Any

import pytest
from helpers_broker import running_broker
from helpers_proc import wait_until

from mqstore.remoting._remoting import FrameReader, RemotingCommand
from mqstore.acl.signature import sign_fields
from mqstore.client import PullConsumer, SyncProducer
from mqstore.client.message import MessageQueue
from mqstore.protocol import RequestCode, ResponseCode

pytestmark = pytest.mark.multiprocess

TOPIC = "TopicOffsets"
ACL = f"""\
accounts:
  - accessKey: consumer
    secretKey: consumer-secret
    admin: false
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms:
      - {TOPIC}=PUB|SUB
    groupPerms:
      - CID_OWN=SUB
      - CID_DENIED=DENY
  - accessKey: cluster
    secretKey: cluster-secret
    admin: true
"""
CONSUMER = ("consumer", "consumer-secret")
ADMIN = ("cluster", "cluster-secret")


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    base = tmp_path_factory.mktemp("acl-offsets")
    acl_file = base / "plain_acl.yml"
    acl_file.write_text(ACL)
    with running_broker(str(base / "store"), acl_enable=True, acl_file=str(acl_file), front_processes=1) as broker:
        with SyncProducer("PID_OFFSETS", broker.namesrv_address, credentials=ADMIN) as admin:
            for i in range(8):
                admin.send(TOPIC, f"seed-{i}".encode())
        yield broker


class Client:
    """One connection to the broker, as a client: signed requests, answered in turn."""

    def __init__(self, address: str, credentials: tuple[str, str]) -> None:
        host, _, port = address.rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.credentials = credentials
        self.frames = FrameReader()
        self.opaques = itertools.count(1)
        self.client_id = f"127.0.0.1@raw-{id(self):x}"

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.sock.close()

    def call(self, code: int, fields: dict[str, str], body: bytes = b"", *, oneway: bool = False
             ) -> RemotingCommand | None:
        fields = sign_fields(dict(fields), body or None, *self.credentials)
        opaque = next(self.opaques)
        self.sock.sendall(RemotingCommand(code, opaque=opaque, flag=2 if oneway else 0, ext_fields=fields,
                                          body=body).encode())
        if oneway:
            return None
        while True:  # the broker's own requests (NOTIFY_CONSUMER_IDS_CHANGED, oneway) are passed over
            while (frame := self.frames.next()) is None:
                data = self.sock.recv(65536)
                assert data, "the broker closed the connection"
                self.frames.feed(data)
            if frame.is_response and frame.opaque == opaque:
                return frame

    def update(self, group: str, offset: int, queue_id: int = 0) -> RemotingCommand:
        got = self.call(RequestCode.UPDATE_CONSUMER_OFFSET, {"consumerGroup": group, "topic": TOPIC,
                                                             "queueId": str(queue_id), "commitOffset": str(offset)})
        assert got is not None
        return got

    def heartbeat(self, group: str) -> None:
        """HEART_BEAT registering a (pull) consumer of group on this connection."""
        consumer = {"groupName": group, "consumeType": "CONSUME_ACTIVELY", "messageModel": "CLUSTERING",
                    "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET", "subscriptionDataSet": [], "unitMode": False}
        body = json.dumps({"clientID": self.client_id, "consumerDataSet": [consumer],
                           "producerDataSet": []}).encode()
        got = self.call(RequestCode.HEART_BEAT, {}, body)
        assert got is not None and got.code == ResponseCode.SUCCESS, got.remark if got else None

    def unregister(self, group: str) -> None:
        got = self.call(RequestCode.UNREGISTER_CLIENT, {"clientID": self.client_id, "consumerGroup": group})
        assert got is not None and got.code == ResponseCode.SUCCESS, got.remark if got else None


def _offset(broker, group: str, queue_id: int = 0) -> int:
    return broker.controller.offsets.query(group, TOPIC, queue_id)


def _assert_refused(got: RemotingCommand, group: str) -> None:
    assert got.code == ResponseCode.NO_PERMISSION, got.remark
    remark = got.remark or ""
    assert f"setting the offsets of group:{group}" in remark, remark
    assert f"this client is not one of {group}'s consumers" in remark, remark
    assert f"accessKey=consumer is not admin and does not list {group} in groupPerms" in remark, remark


def test_an_account_listing_the_group_sets_its_offsets_without_a_heartbeat(broker):
    with Client(broker.address, CONSUMER) as client:
        got = client.update("CID_OWN", 3)
        assert got.code == ResponseCode.SUCCESS, got.remark
    assert _offset(broker, "CID_OWN") == 3


def test_a_client_sets_a_groups_offsets_only_while_it_is_a_consumer_of_the_group(broker):
    """Regression (issue 25, point 8): with defaultGroupPerm SUB any client of the account could
    reset any group's offsets (RocketMQ 4.9.7 lets it). A connection that never heartbeated in
    the group is refused; after its heartbeat as a consumer of the group it may; after it
    unregistered it may not; a heartbeat in another group or on another connection gives nothing;
    an admin always may."""
    group = "CID_VICTIM"
    with Client(broker.address, ADMIN) as admin:
        assert admin.update(group, 2).code == ResponseCode.SUCCESS  # an admin, never a consumer
    assert _offset(broker, group) == 2
    with Client(broker.address, CONSUMER) as client, Client(broker.address, CONSUMER) as other:
        _assert_refused(client.update(group, 2**63 - 1), group)
        client.call(RequestCode.UPDATE_CONSUMER_OFFSET, {"consumerGroup": group, "topic": TOPIC, "queueId": "0",
                                                         "commitOffset": "0"}, oneway=True)
        client.heartbeat("CID_ELSEWHERE")  # a consumer of another group
        _assert_refused(client.update(group, 0), group)  # also answers after the oneway one was served
        assert _offset(broker, group) == 2
        # reading the group's offset needs no more than 4.9.7 asks
        got = client.call(RequestCode.QUERY_CONSUMER_OFFSET, {"consumerGroup": group, "topic": TOPIC, "queueId": "0"})
        assert got is not None and got.code == ResponseCode.SUCCESS and got.ext_fields["offset"] == "2"

        client.heartbeat(group)
        assert broker.controller.consumers.find_channel(group, client.client_id) is not None
        got = client.update(group, 5)
        assert got.code == ResponseCode.SUCCESS, got.remark
        assert _offset(broker, group) == 5
        _assert_refused(other.update(group, 0), group)  # membership is the connection's, not the account's
        assert _offset(broker, group) == 5

        client.unregister(group)
        _assert_refused(client.update(group, 6), group)
        assert _offset(broker, group) == 5
    with Client(broker.address, ADMIN) as admin:
        assert admin.update(group, 1).code == ResponseCode.SUCCESS
    assert _offset(broker, group) == 1


def test_mqstore_clients_pull_consumer_commits_by_the_default_group_perm(broker):
    """mqstore.client's PullConsumer heartbeats the broker when it learns its route, so its
    commits are a consumer's (tests/test_broker_acl.py commits CID_A this way too)."""
    async def run() -> None:
        async with PullConsumer("CID_PULL_CLIENT", broker.namesrv_address, credentials=CONSUMER) as consumer:
            await consumer.commit(MessageQueue(TOPIC, broker.config.broker_name, 0), 4)
    asyncio.run(asyncio.wait_for(run(), 60))
    assert _offset(broker, "CID_PULL_CLIENT") == 4


def _pull(group: str, sys_flag: int, commit_offset: int) -> dict[str, str]:
    return {"consumerGroup": group, "topic": TOPIC, "queueId": "0", "queueOffset": "0", "maxMsgNums": "1",
            "sysFlag": str(sys_flag), "commitOffset": str(commit_offset), "suspendTimeoutMillis": "0",
            "subscription": "*", "subVersion": "0"}


def test_a_pull_carrying_a_commit_keeps_the_rule_of_4_9_7(broker):
    """PullSysFlag's commit bit makes the master store the pull's commitOffset: SUB on the topic
    and the group is enough, defaultGroupPerm included, with no heartbeat; DENY is refused."""
    with Client(broker.address, CONSUMER) as client:
        got = client.call(RequestCode.PULL_MESSAGE, _pull("CID_PULLED", 0x1 | 0x4, 6))
        assert got is not None and got.code == ResponseCode.SUCCESS, got.remark if got else None
        wait_until(lambda: _offset(broker, "CID_PULLED") == 6, 10, "the pull's commit stored")
        got = client.call(RequestCode.PULL_MESSAGE, _pull("CID_DENIED", 0x1 | 0x4, 1))
        assert got is not None and got.code == ResponseCode.NO_PERMISSION and "CID_DENIED" in (got.remark or "")
    assert _offset(broker, "CID_DENIED") == -1


# -- the real C++ client ------------------------------------------------------------------------------

@pytest.mark.skipif(platform.machine() != "x86_64", reason="the rocketmq wheel exists for x86_64 Linux only")
def test_the_cpp_push_consumer_commits_by_the_default_group_perm(broker, tmp_path, monkeypatch):
    """An account with its group only by defaultGroupPerm (plain_acl.yml's common case): the C++
    push consumer consumes everything and its offsets reach every queue's end, committed by its
    pulls and by its UPDATE_CONSUMER_OFFSET (periodic and at shutdown, oneway), none refused;
    another client of the same account is refused the group's offsets until it heartbeats in
    the group; an admin always may."""
    from test_broker_cpp import ClientProc

    group = "CID_CPP_DEFAULT"
    controller = broker.controller
    checked: list[tuple[str, str | None]] = []  # the clients' offset updates: (connection, refusal)
    membership = controller._offset_membership_refusal

    def recording(code: int, fields: Any) -> str | None:
        refused = membership(code, fields)
        if "_peer" in fields and fields.get("consumerGroup") == group:
            checked.append((fields.get("_conn", ""), refused))
        return refused
    monkeypatch.setattr(controller, "_offset_membership_refusal", recording)

    store = broker.store
    store.wait_dispatched()
    ends = {q: store.get_max_offset_in_queue(TOPIC, q) for q in range(8)}
    ends = {q: end for q, end in ends.items() if end > 0}
    push = ClientProc(str(tmp_path), group, "push", group=group, namesrv=broker.namesrv_address, topic=TOPIC,
                      credentials=list(CONSUMER))
    try:
        got = push.wait_messages(8, 60)
        assert {f"seed-{i}" for i in range(8)} <= {m["body"] for m in got}
        wait_until(lambda: all(_offset(broker, group, q) == end for q, end in ends.items()), 30,
                   "the C++ consumer's offsets committed")
        members = {str(c) for c in controller.consumers.channels(group)}
        assert len(members) == 1, members
        with Client(broker.address, CONSUMER) as other:  # same account, never a consumer of the group
            for q in ends:
                _assert_refused(other.update(group, 0, q), group)
        assert {q: _offset(broker, group, q) for q in ends} == ends
        push.stop()  # its shutdown sends UPDATE_CONSUMER_OFFSET (oneway) for every queue
    finally:
        push.kill()
    wait_until(lambda: any(conn in members and refused is None for conn, refused in checked), 10,
               "an UPDATE_CONSUMER_OFFSET of the C++ consumer served")
    time.sleep(1.0)  # the last oneway commits served
    assert [c for c in checked if c[0] in members and c[1] is not None] == [], "a C++ commit refused"
    assert {q: _offset(broker, group, q) for q in ends} == ends

    with Client(broker.address, CONSUMER) as other:
        _assert_refused(other.update(group, 0), group)
        other.heartbeat(group)
        got = other.update(group, 1)
        assert got.code == ResponseCode.SUCCESS, got.remark
    assert _offset(broker, group) == 1
    with Client(broker.address, ADMIN) as admin:
        assert admin.update(group, ends.get(0, 0)).code == ResponseCode.SUCCESS
    assert _offset(broker, group) == ends.get(0, 0)
