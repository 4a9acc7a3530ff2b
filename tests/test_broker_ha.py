"""A master broker and its slave broker (docs/replication.md): the slave registers with the
master's NameServer as broker id 1, learns the master's HA address from the NameServer's answer,
replicates the CommitLog, copies the master's topics, offsets and groups, serves pulls of what
the master stored, and refuses sends."""

from __future__ import annotations

import asyncio
import json

import pytest

from mqstore.remoting._remoting import RemotingCommand
from mqstore.client import RemotingConnection, SyncProducer
from mqstore.client.message import decode_messages
from mqstore.ha import read_ha_master
from mqstore.protocol import RequestCode, ResponseCode

from helpers_broker import running_broker
from helpers_proc import wait_until

pytestmark = pytest.mark.multiprocess


async def _request(address: str, cmd: RemotingCommand) -> RemotingCommand:
    conn = await RemotingConnection.open(address)
    try:
        return await conn.request(cmd, 5.0)
    finally:
        conn.close()


def request(address: str, cmd: RemotingCommand) -> RemotingCommand:
    return asyncio.run(_request(address, cmd))


def pull(address: str, topic: str, queue_id: int, offset: int) -> RemotingCommand:
    return request(address, RemotingCommand(RequestCode.PULL_MESSAGE, ext_fields={
        "consumerGroup": "CG_HA", "topic": topic, "queueId": str(queue_id), "queueOffset": str(offset),
        "maxMsgNums": "32", "sysFlag": "4", "commitOffset": "0", "suspendTimeoutMillis": "0", "subscription": "*",
        "subVersion": "0", "expressionType": "TAG"}))


def test_a_slave_broker_serves_what_its_master_stored(tmp_path):
    with running_broker(str(tmp_path / "master")) as master:
        namesrv = master.controller.namesrv_addrs[0]
        ha_port = master.store.ctl.get("ha_port")
        assert ha_port > 0  # a master broker accepts slaves (listen_port + 1, or a free port)
        with running_broker(str(tmp_path / "slave"), broker_role="SLAVE", broker_id=1, namesrv_addr=namesrv) as slave:
            with SyncProducer("PG_HA", namesrv) as producer:
                sent = [producer.send("TopicHA", b"message %d" % i, tags="TagA", queue_id=i % 4) for i in range(200)]
                producer.send("TopicDelayed", b"in a second", delay_level=1)
            assert read_ha_master(slave.root) == f"127.0.0.1:{ha_port}"  # from the NameServer's answer
            end = master.store.ctl.get("wrote")
            wait_until(lambda: slave.store.ctl.get("dispatched") == end, 30, what="the slave to hold the master's log")
            wait_until(lambda: slave.controller.slave_syncs > 0 and "TopicHA" in slave.controller.topics.table,
                       30, what="the slave to copy the master's topics")
            # the delay offsets too, once the master delivered the delayed message (level 1: 1 s)
            wait_until(lambda: master.controller.schedule.offsets_json() == slave.controller.schedule.offsets_json()
                       and '1:1' in slave.controller.schedule.offsets_json(), 30,
                       what="the slave to copy the delay offsets")
            # the NameServer lists both under the broker's name
            route = request(namesrv, RemotingCommand(RequestCode.GET_ROUTEINFO_BY_TOPIC,
                                                     ext_fields={"topic": "TopicHA"}))
            assert route.code == ResponseCode.SUCCESS
            addrs = json.loads(route.body.decode().replace('{0:', '{"0":').replace(',1:', ',"1":'))
            (broker,) = addrs["brokerDatas"]
            assert set(broker["brokerAddrs"]) == {"0", "1"}
            assert broker["brokerAddrs"]["1"] == slave.address
            # a pull from the slave: the master's messages, byte for byte
            for q in range(4):
                messages, offset = [], 0
                for _ in range(10):
                    got = pull(slave.address, "TopicHA", q, offset)
                    if got.code == ResponseCode.PULL_NOT_FOUND:
                        break
                    assert got.code == ResponseCode.SUCCESS, got.remark
                    messages += decode_messages(got.body)
                    offset = int(got.ext_fields["nextBeginOffset"])
                assert [bytes(m.body) for m in messages] == [b"message %d" % i for i in range(q, 200, 4)]
                assert [m.msg_id for m in messages] == [r.msg_id for r in sent[q::4]]
            # sends go to the master only: a slave refuses them
            refused = request(slave.address, RemotingCommand(RequestCode.SEND_MESSAGE, ext_fields={
                "producerGroup": "PG_HA", "topic": "TopicHA", "defaultTopic": "TBW102", "defaultTopicQueueNums": "4",
                "queueId": "0", "sysFlag": "0", "bornTimestamp": "0", "flag": "0", "properties": ""}, body=b"x"))
            assert refused.code == ResponseCode.SERVICE_NOT_AVAILABLE and "slave" in refused.remark
