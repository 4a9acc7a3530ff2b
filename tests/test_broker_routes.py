"""The NameServer's route table (docs/rocketmq-remoting-spec.md §2.3; RocketMQ 4.9.7
RouteInfoManager): registration, routes in both JSON forms, expiry, unregistration, slaves."""

from __future__ import annotations

import json
import zlib

import pytest

from mqstore.broker.routes import BROKER_CHANNEL_EXPIRED_MS, RegisterBody, RouteTable, parse_register_body, route_json


def body(*topics: str, counter: int = 1, queues: int = 4, perm: int = 6) -> RegisterBody:
    return RegisterBody({t: {"topicName": t, "readQueueNums": queues, "writeQueueNums": queues, "perm": perm,
                             "topicSysFlag": 0, "topicFilterType": "SINGLE_TAG", "order": False} for t in topics},
                        {"counter": counter, "timestamp": 1700000000000})


def test_a_route_in_the_form_the_cpp_client_reads_and_in_standard_json():
    t = RouteTable()
    assert t.register_broker("DefaultCluster", "10.0.0.1:10911", "broker-a", 0, "10.0.0.1:10912", body("T"),
                             now_ms=0) == (None, None)
    assert t.register_broker("DefaultCluster", "10.0.0.2:10911", "broker-a", 1, "10.0.0.2:10912", body("T"),
                             now_ms=0) == ("10.0.0.1:10912", "10.0.0.1:10911")
    route = t.route("T")
    assert route_json(route, standard=False) == (
        b'{"brokerDatas":[{"brokerAddrs":{0:"10.0.0.1:10911",1:"10.0.0.2:10911"},"brokerName":"broker-a",'
        b'"cluster":"DefaultCluster"}],"filterServerTable":{},"queueDatas":[{"brokerName":"broker-a","perm":6,'
        b'"readQueueNums":4,"topicSysFlag":0,"writeQueueNums":4}]}')  # the spec's example, byte for byte
    standard = json.loads(route_json(route, standard=True))
    assert standard["brokerDatas"][0]["brokerAddrs"] == {"0": "10.0.0.1:10911", "1": "10.0.0.2:10911"}
    assert t.route("unknown") is None


def test_queue_data_comes_from_the_master_and_only_when_its_data_version_changes():
    t = RouteTable()
    t.register_broker("C", "a:1", "broker-a", 0, "a:2", body("T", counter=1, queues=4), now_ms=0)
    t.register_broker("C", "b:1", "broker-a", 1, "b:2", body("T", "FromSlave", counter=9, queues=8), now_ms=0)
    assert t.route("FromSlave") is None and t.route("T")["queueDatas"][0]["readQueueNums"] == 4
    t.register_broker("C", "a:1", "broker-a", 0, "a:2", body("T", counter=1, queues=16), now_ms=10)
    assert t.route("T")["queueDatas"][0]["readQueueNums"] == 4, "same data version: not read again"
    t.register_broker("C", "a:1", "broker-a", 0, "a:2", body("T", "U", counter=2, queues=16), now_ms=20)
    assert t.route("T")["queueDatas"][0]["readQueueNums"] == 16 and t.route("U") is not None


def test_two_brokers_serve_one_topic_and_an_expired_one_drops_out():
    t = RouteTable()
    t.register_broker("C", "a:1", "broker-a", 0, "", body("T"), now_ms=0)
    t.register_broker("C", "b:1", "broker-b", 0, "", body("T"), now_ms=60_000)
    assert [b["brokerName"] for b in t.route("T")["brokerDatas"]] == ["broker-a", "broker-b"]
    assert t.expire(BROKER_CHANNEL_EXPIRED_MS) == []
    assert t.expire(BROKER_CHANNEL_EXPIRED_MS + 1) == ["a:1"]
    route = t.route("T")
    assert [b["brokerName"] for b in route["brokerDatas"]] == ["broker-b"]
    assert [q["brokerName"] for q in route["queueDatas"]] == ["broker-b"]
    assert t.clusters == {"C": {"broker-b"}}
    t.register_broker("C", "a:1", "broker-a", 0, "", body("T"), now_ms=200_000)  # it comes back
    assert len(t.route("T")["brokerDatas"]) == 2
    t.unregister_broker("C", "b:1", "broker-b", 0)
    assert [b["brokerName"] for b in t.route("T")["brokerDatas"]] == ["broker-a"]
    t.unregister_broker("C", "a:1", "broker-a", 0)
    assert t.route("T") is None and t.clusters == {} and t.topics == {}


def test_a_slave_that_becomes_master_on_the_same_address_keeps_one_entry():
    t = RouteTable()
    t.register_broker("C", "a:1", "broker-a", 0, "", body("T"), now_ms=0)
    t.register_broker("C", "b:1", "broker-a", 1, "", None, now_ms=0)
    t.unregister_broker("C", "a:1", "broker-a", 0)
    t.register_broker("C", "b:1", "broker-a", 0, "", body("T", counter=3), now_ms=1)
    assert t.brokers["broker-a"]["brokerAddrs"] == {0: "b:1"}


def test_the_registration_body():
    raw = json.dumps({"filterServerList": [], "topicConfigSerializeWrapper": {
        "dataVersion": {"counter": 3, "timestamp": 5},
        "topicConfigTable": {"T": {"topicName": "T", "readQueueNums": 8, "writeQueueNums": 8, "perm": 6}}}}).encode()
    parsed = parse_register_body(raw, body_crc32=str(zlib.crc32(raw) & 0x7FFFFFFF))
    assert parsed.topic_configs["T"]["readQueueNums"] == 8 and parsed.data_version == {"counter": 3, "timestamp": 5}
    assert parse_register_body(raw).filter_servers == []
    with pytest.raises(ValueError, match="crc32 not match"):
        parse_register_body(raw, body_crc32="12345")
    with pytest.raises(ValueError, match="compressedRegister=true"):
        parse_register_body(raw, compressed="true")
    with pytest.raises(ValueError, match="not JSON"):
        parse_register_body(b"{nope")
    with pytest.raises(ValueError, match="topicConfigTable"):
        parse_register_body(b'{"topicConfigSerializeWrapper":{"topicConfigTable":{"T":1}}}')
    t = RouteTable()
    with pytest.raises(ValueError, match="readQueueNums must be an integer"):
        t.register_broker("C", "a:1", "a", 0, "", RegisterBody({"T": {"readQueueNums": "8"}}, None), now_ms=0)
    assert t.brokers == {} and t.clusters == {} and t.live == {}, "a refused registration changes nothing"
