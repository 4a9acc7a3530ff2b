"""A broker's state managers (docs/rocketmq-remoting-spec.md §2.4.3-§2.4.6, §3.3, §3.5, §3.6): consumer
offsets and config/consumerOffset.json, subscription groups and config/subscriptionGroup.json, the
heartbeat body, and the consumer and producer registries."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqstore.broker.clients import (ConsumeFromWhere, ConsumerData, ConsumerManager, ConsumeType, MessageModel,
                                    ProducerManager, SubscriptionData, consumer_list_body, parse_heartbeat)
from mqstore.broker.groups import STARTUP_GROUPS, SubscriptionGroupConfig, SubscriptionGroups
from mqstore.broker.jsonfile import fastjson_pretty, loads_lenient, write_with_bak
from mqstore.broker.offsets import ConsumerOffsets, decode_offset_table, encode_offset_table
from mqstore.errors import ConfigError

# consumerOffset.json as a RocketMQ 4.9.7 broker writes it (fastjson PrettyFormat: tabs, bare queue ids,
# an int-keyed map's closing brace on its own line)
ROCKETMQ_OFFSETS = ('{\n\t"offsetTable":{\n'
                    '\t\t"%RETRY%CID_TEST@CID_TEST":{0:0\n\t\t},\n'
                    '\t\t"TopicTest@CID_TEST":{0:12,1:5,2:0,3:7\n\t\t},\n'
                    '\t\t"TopicTest@CID_OTHER":{0:250,1:250,2:250,3:250\n\t\t}\n'
                    '\t}\n}')


def offsets_file(root) -> str:
    return os.path.join(root, "config", "consumerOffset.json")


def write(path, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)


def read(path) -> str:
    with open(path, encoding="utf-8") as fh:
        return fh.read()


# ---------------------------------------------------------------- consumer offsets


def test_a_rocketmq_written_consumer_offset_json_loads(tmp_path):
    write(offsets_file(tmp_path), ROCKETMQ_OFFSETS)
    offsets = ConsumerOffsets(str(tmp_path))
    assert [offsets.query("CID_TEST", "TopicTest", q) for q in range(5)] == [12, 5, 0, 7, -1]
    assert offsets.query("CID_TEST", "%RETRY%CID_TEST", 0) == 0
    assert offsets.query("CID_NONE", "TopicTest", 0) == -1
    assert offsets.groups_of_topic("TopicTest") == {"CID_TEST", "CID_OTHER"}
    assert offsets.topics_of_group("CID_TEST") == {"TopicTest", "%RETRY%CID_TEST"}
    assert not offsets.dirty


def test_quoted_queue_ids_and_any_whitespace_load_too():
    standard = '{ "offsetTable" : { "T@G" : { "0" : 3 , "17": 9 },\r\n "U@G":{} } }\n'
    assert decode_offset_table(standard) == {"T@G": {0: 3, 17: 9}, "U@G": {}}
    assert decode_offset_table('{"offsetTable":{"T@G":{ 0 :3,\n\t1\t:4}}}') == {"T@G": {0: 3, 1: 4}}
    assert decode_offset_table("{}") == {} and decode_offset_table('{"offsetTable":null}') == {}


def test_the_tolerant_reader_leaves_string_contents_alone():
    assert loads_lenient('{"k":"{0:1,2:3}"}') == {"k": "{0:1,2:3}"}
    assert loads_lenient('{"a\\"{5:":{7:1},"b":"x\\\\",8:[1,2]}') == {'a"{5:': {"7": 1}, "b": "x\\", "8": [1, 2]}
    assert decode_offset_table('{"offsetTable":{"a,1:b@g":{2:3}}}') == {"a,1:b@g": {2: 3}}


@pytest.mark.parametrize("text, why", [
    ("{ damaged", "Expecting"), ("[]", "not a JSON object"), ('{"offsetTable":[]}', "offsetTable is not an object"),
    ('{"offsetTable":{"T@G":5}}', "is not an object of queue id"), ('{"offsetTable":{"T@G":{x:1}}}', "Expecting"),
    ('{"offsetTable":{"T@G":{"-1":1}}}', "not an integer >= 0"),
    ('{"offsetTable":{"T@G":{"1_0":1}}}', "not an integer"),
    ('{"offsetTable":{"T@G":{0:1.5}}}', "not a 64-bit integer"), ('{"offsetTable":{"T@G":{0:true}}}', "not a 64-bit"),
    ('{"offsetTable":{"T@G":{0:9223372036854775808}}}', "not a 64-bit"),
    ('{"offsetTable":{"T@G":{2147483648:1}}}', "out of range"), ("[" * 100_000, "nested too deeply"),
])
def test_a_damaged_offset_file_says_what_is_wrong(text, why):
    with pytest.raises(ValueError, match=why):
        decode_offset_table(text)


def test_ours_is_rocketmqs_format_and_round_trips(tmp_path):
    offsets = ConsumerOffsets(str(tmp_path))
    for q, off in enumerate((12, 5, 0, 7)):
        offsets.commit("CID_TEST", "TopicTest", q, off)
    offsets.commit("CID_OTHER", "TopicTest", 0, 250)
    offsets.commit("CID_TEST", "%RETRY%CID_TEST", 0, 0)
    assert offsets.persist()
    assert read(offsets_file(tmp_path)) == ('{\n\t"offsetTable":{\n'
                                            '\t\t"%RETRY%CID_TEST@CID_TEST":{0:0\n\t\t},\n'
                                            '\t\t"TopicTest@CID_OTHER":{0:250\n\t\t},\n'
                                            '\t\t"TopicTest@CID_TEST":{0:12,1:5,2:0,3:7\n\t\t}\n'
                                            '\t}\n}')
    again = ConsumerOffsets(str(tmp_path))
    assert again.table() == offsets.table() and again.query("CID_TEST", "TopicTest", 3) == 7
    assert encode_offset_table({}) == '{\n\t"offsetTable":{}\n}'


_NAME = st.text(alphabet="abcXYZ019%|_-", min_size=1, max_size=12)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.tuples(_NAME, _NAME).map("@".join),
                       st.dictionaries(st.integers(0, 2**31 - 1), st.integers(-(2**63), 2**63 - 1), max_size=8),
                       max_size=6))
def test_the_offset_file_format_round_trips(table):
    text = encode_offset_table(table)
    assert decode_offset_table(text) == table
    # what a standard JSON writer makes of the same table (quoted keys, other whitespace) reads the same
    standard = json.dumps({"offsetTable": {k: {str(q): o for q, o in v.items()} for k, v in table.items()}}, indent=1)
    assert decode_offset_table(standard) == table


def test_commit_overwrites_and_persist_writes_only_when_something_changed(tmp_path):
    offsets = ConsumerOffsets(str(tmp_path))
    assert not offsets.persist() and not os.path.exists(offsets_file(tmp_path)), "clean: nothing written"
    offsets.commit("G", "T", 0, 10)
    offsets.commit("G", "T", 0, 4)  # no monotonic check (commitOffset only logs a smaller offset)
    assert offsets.query("G", "T", 0) == 4 and offsets.dirty
    assert offsets.persist() and not offsets.dirty
    before = os.stat(offsets_file(tmp_path)).st_mtime_ns
    assert not offsets.persist()
    offsets.commit("G", "T", 0, 4)  # the C++ client commits every queue every 5 s, changed or not
    assert not offsets.dirty and not offsets.persist()
    assert os.stat(offsets_file(tmp_path)).st_mtime_ns == before and not os.path.exists(offsets_file(tmp_path) + ".tmp")
    offsets.commit("G", "T", 1, 0)
    assert offsets.persist()
    assert decode_offset_table(read(offsets_file(tmp_path) + ".bak")) == {"T@G": {0: 4}}, ".bak holds the previous file"


def test_a_damaged_offset_file_falls_back_to_its_bak(tmp_path):
    path = offsets_file(tmp_path)
    offsets = ConsumerOffsets(str(tmp_path))
    offsets.commit("G", "T", 0, 1)
    offsets.persist()
    offsets.commit("G", "T", 0, 2)
    offsets.persist()  # file: 2, .bak: 1
    write(path, '{\n\t"offsetTable":{\n\t\t"T@G":{0:2')  # torn
    loaded = ConsumerOffsets(str(tmp_path))
    assert loaded.query("G", "T", 0) == 1
    loaded.commit("G", "T", 0, 3)
    loaded.persist()
    assert decode_offset_table(read(path + ".bak")) == {"T@G": {0: 1}}, "the damaged file did not replace the good .bak"
    assert ConsumerOffsets(str(tmp_path)).query("G", "T", 0) == 3

    write(path, "")  # empty: RocketMQ's ConfigManager also goes to the .bak
    assert ConsumerOffsets(str(tmp_path)).query("G", "T", 0) == 1
    os.unlink(path)  # RocketMQ's string2File deletes the file before renaming the .tmp: a crash there leaves the .bak
    assert ConsumerOffsets(str(tmp_path)).query("G", "T", 0) == 1

    write(path, "{ damaged")
    write(path + ".bak", "also damaged")
    with pytest.raises(ConfigError, match=r"consumerOffset.json cannot be read: Expecting .*\.bak .* cannot be read"):
        ConsumerOffsets(str(tmp_path))
    os.unlink(path + ".bak")
    with pytest.raises(ConfigError, match=r"consumerOffset.json cannot be read: .*no consumerOffset.json.bak"):
        ConsumerOffsets(str(tmp_path))
    os.unlink(path)
    assert ConsumerOffsets(str(tmp_path)).table() == {}, "no file at all: no offsets"


@pytest.mark.parametrize("args, why", [
    (("G", "T", -1, 0), "queue_id"), (("G", "T", "0", 0), "queue_id"), (("G", "T", True, 0), "queue_id"),
    (("G", "T", 2**31, 0), "queue_id"), (("G", "T", 0, 1.5), "offset"), (("G", "T", 0, "3"), "offset"),
    (("G", "T", 0, False), "offset"), (("G", "T", 0, 2**63), "offset"), (("", "T", 0, 0), "group"),
    (("G@H", "T", 0, 0), "group .* contains '@'"), (("G", None, 0, 0), "topic"), (("G", "T@U", 0, 0), "topic"),
])
def test_commit_checks_its_arguments(tmp_path, args, why):
    offsets = ConsumerOffsets(str(tmp_path))
    with pytest.raises(ValueError, match=why):
        offsets.commit(*args)
    assert not offsets.dirty


def test_remove_group_drops_only_that_groups_keys(tmp_path):
    offsets = ConsumerOffsets(str(tmp_path))
    for group, topic in (("G", "T"), ("G", "%RETRY%G"), ("G2", "T"), ("X", "G")):
        offsets.commit(group, topic, 0, 1)
    offsets.persist()
    assert offsets.remove_group("G") and offsets.dirty
    assert sorted(offsets.table()) == ["G@X", "T@G2"]
    assert not offsets.remove_group("G")
    copy = offsets.table()
    copy["T@G2"][0] = 99
    assert offsets.query("G2", "T", 0) == 1, "table() is a copy"


# ---------------------------------------------------------------- subscription groups


def test_startup_groups_and_auto_creation(tmp_path):
    groups = SubscriptionGroups(str(tmp_path))
    assert set(STARTUP_GROUPS) <= set(groups.all())
    assert groups.find("TOOLS_CONSUMER") == SubscriptionGroupConfig("TOOLS_CONSUMER")
    assert not os.path.exists(groups.path), "looking up a known group writes nothing"
    cfg = groups.find("CID_TEST")
    assert (cfg.retry_queue_nums, cfg.retry_max_times, cfg.consume_enable, cfg.broker_id) == (1, 16, True, 0)
    assert groups.data_version["counter"] == 1
    on_disk = json.loads(read(groups.path))
    assert on_disk["dataVersion"]["counter"] == 1
    assert on_disk["subscriptionGroupTable"]["CID_TEST"] == {
        "brokerId": 0, "consumeBroadcastEnable": True, "consumeEnable": True, "consumeFromMinEnable": True,
        "groupName": "CID_TEST", "notifyConsumerIdsChangedEnable": True, "retryMaxTimes": 16, "retryQueueNums": 1,
        "whichBrokerWhenConsumeSlowly": 1}
    assert read(groups.path).startswith('{\n\t"dataVersion":{\n\t\t"counter":1,\n\t\t"timestamp":')
    again = SubscriptionGroups(str(tmp_path))
    assert again.find("CID_TEST") == cfg and again.data_version == groups.data_version


def test_without_auto_creation_only_system_groups_are_created(tmp_path):
    groups = SubscriptionGroups(str(tmp_path), auto_create_subscription_group=False)
    assert groups.find("CID_TEST") is None and groups.data_version["counter"] == 0
    assert groups.find("CID_RMQ_SYS_TRANS").group_name == "CID_RMQ_SYS_TRANS"
    with pytest.raises(ValueError, match="group"):
        groups.find("")


def test_update_delete_and_all(tmp_path):
    groups = SubscriptionGroups(str(tmp_path))
    groups.update(SubscriptionGroupConfig("CID_SLOW", consume_enable=False, retry_queue_nums=4))
    assert groups.find("CID_SLOW").consume_enable is False and groups.data_version["counter"] == 1
    assert groups.delete("CID_SLOW") and not groups.delete("CID_SLOW") and groups.data_version["counter"] == 2
    assert "CID_SLOW" not in groups.all() and "CID_SLOW" not in json.loads(read(groups.path))["subscriptionGroupTable"]
    with pytest.raises(ValueError, match="SubscriptionGroupConfig"):
        groups.update({"groupName": "x"})


def test_a_rocketmq_subscription_group_json_loads_as_is(tmp_path):
    rocketmq = {"dataVersion": {"counter": 7, "timestamp": 1700000000000},
                "subscriptionGroupTable": {
                    "CID_TEST": {"brokerId": 0, "consumeBroadcastEnable": True, "consumeEnable": False,
                                 "consumeFromMinEnable": True, "groupName": "CID_TEST",
                                 "notifyConsumerIdsChangedEnable": False, "retryMaxTimes": 3, "retryQueueNums": 2,
                                 "whichBrokerWhenConsumeSlowly": 1},
                    # a RocketMQ 5.x group: its extra properties are kept; an absent one takes the default
                    "CID_V5": {"groupName": "CID_V5", "consumeMessageOrderly": True, "groupSysFlag": 0,
                               "groupRetryPolicy": {"type": "CUSTOMIZED",
                                                    "customizedRetryPolicy": {"next": [1000, 5000]}},
                               "attributes": {}}}}
    write(os.path.join(tmp_path, "config", "subscriptionGroup.json"), fastjson_pretty(rocketmq))
    groups = SubscriptionGroups(str(tmp_path))
    cfg = groups.find("CID_TEST")
    assert (cfg.consume_enable, cfg.retry_max_times, cfg.retry_queue_nums, cfg.notify_consumer_ids_changed_enable) == (
        False, 3, 2, False)
    assert groups.data_version == {"counter": 7, "timestamp": 1700000000000}
    assert groups.find("CID_V5").retry_max_times == 16 and "TOOLS_CONSUMER" in groups.all()
    groups.find("CID_NEW")
    written = json.loads(read(groups.path))["subscriptionGroupTable"]["CID_V5"]
    assert written["groupRetryPolicy"] == {"type": "CUSTOMIZED", "customizedRetryPolicy": {"next": [1000, 5000]}}
    assert written["consumeMessageOrderly"] is True and written["retryMaxTimes"] == 16


def test_a_damaged_subscription_group_json_falls_back_to_its_bak(tmp_path):
    groups = SubscriptionGroups(str(tmp_path))
    groups.find("CID_A")
    groups.find("CID_B")  # file: A and B, .bak: A
    write(groups.path, '{"subscriptionGroupTable":{"CID_B":{"retryQueueNums":"two"}}}')
    loaded = SubscriptionGroups(str(tmp_path), auto_create_subscription_group=False)
    assert loaded.find("CID_A") is not None and loaded.find("CID_B") is None
    write(groups.path + ".bak", "[")
    with pytest.raises(ConfigError, match=r"subscriptionGroup.json cannot be read: .*CID_B.*retryQueueNums must be an"):
        SubscriptionGroups(str(tmp_path))


@pytest.mark.parametrize("obj, why", [
    ({"groupName": "G", "consumeEnable": "true"}, "consumeEnable must be a boolean"),
    ({"groupName": "G", "retryQueueNums": 1.0}, "retryQueueNums must be an integer"),
    ({"groupName": "G", "brokerId": True}, "brokerId must be an integer"),
    ({"groupName": 5}, "groupName must be a string"), ({"groupName": ""}, "must not be empty"), ([], "not an object"),
])
def test_a_subscription_group_config_checks_its_types(obj, why):
    with pytest.raises(ValueError, match=why):
        SubscriptionGroupConfig.from_json(obj, "G")


def test_a_config_without_group_name_takes_its_table_key():
    cfg = SubscriptionGroupConfig.from_json({"retryMaxTimes": 2}, "CID_K")
    assert cfg == SubscriptionGroupConfig("CID_K", retry_max_times=2)


# ---------------------------------------------------------------- heartbeats

# the C++ client's heartbeat (spec §2.4.4, E2), byte for byte, with its trailing newline
CPP_HEARTBEAT = (b'{"clientID":"24882-127.0.0.1@DEFAULT","consumerDataSet":[{"consumeFromWhere":0,"consumeType":1,'
                 b'"groupName":"CID_TEST","messageModel":1,"subscriptionDataSet":[{"subString":"*","subVersion":'
                 b'"1795541756390","topic":"%RETRY%CID_TEST"},{"subString":"*","subVersion":"1795541756390",'
                 b'"topic":"TopicTest"}]}],"producerDataSet":[{"groupName":"PID_PUSHTEST"}]}\n')

# a Java 4.9.7 client's heartbeat (fastjson: enum names, numbers, both sets present, classFilterMode, unitMode)
JAVA_HEARTBEAT = json.dumps({
    "clientID": "192.168.0.2@31337", "producerDataSet": [{"groupName": "CLIENT_INNER_PRODUCER"}, {"groupName": "P1"}],
    "consumerDataSet": [{"consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET", "consumeType": "CONSUME_PASSIVELY",
                         "groupName": "CID_JAVA", "messageModel": "BROADCASTING", "unitMode": False,
                         "subscriptionDataSet": [{"classFilterMode": False, "codeSet": [2598919, 2598920],
                                                  "expressionType": "TAG", "subString": "TagA || TagB",
                                                  "subVersion": 1700000000123, "tagsSet": ["TagA", "TagB"],
                                                  "topic": "TopicJ"}]}]}, separators=(",", ":")).encode()


def test_the_cpp_clients_heartbeat_parses():
    hb = parse_heartbeat(CPP_HEARTBEAT)
    assert hb.client_id == "24882-127.0.0.1@DEFAULT" and hb.producers == ["PID_PUSHTEST"]
    (c,) = hb.consumers
    assert (c.group, c.consume_type, c.message_model, c.consume_from_where, c.unit_mode) == (
        "CID_TEST", ConsumeType.CONSUME_PASSIVELY, MessageModel.CLUSTERING, ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET,
        False)
    assert c.subscriptions == [SubscriptionData("%RETRY%CID_TEST", "*", 1795541756390),
                               SubscriptionData("TopicTest", "*", 1795541756390)]
    assert c.subscriptions[0].tags_set == frozenset() and c.subscriptions[0].expression_type == "TAG"


def test_a_java_clients_heartbeat_parses():
    hb = parse_heartbeat(JAVA_HEARTBEAT)
    assert hb.producers == ["CLIENT_INNER_PRODUCER", "P1"]
    (c,) = hb.consumers
    assert (c.consume_type, c.message_model, c.consume_from_where) == (
        ConsumeType.CONSUME_PASSIVELY, MessageModel.BROADCASTING, ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET)
    assert c.subscriptions == [SubscriptionData("TopicJ", "TagA || TagB", 1700000000123, frozenset({"TagA", "TagB"}),
                                                frozenset({2598919, 2598920}), "TAG")]


def test_a_pull_consumer_without_subscriptions_and_a_producer_only_heartbeat():
    pull = parse_heartbeat(b'{"clientID":"1-h@I","consumerDataSet":[{"consumeFromWhere":5,"consumeType":0,'
                           b'"groupName":"CID_PULL","messageModel":0}]}\n')
    assert pull.producers == [] and pull.consumers == [ConsumerData("CID_PULL", ConsumeType.CONSUME_ACTIVELY,
                                                                    MessageModel.BROADCASTING,
                                                                    ConsumeFromWhere.CONSUME_FROM_TIMESTAMP, [])]
    producer = parse_heartbeat(b'{"clientID":"1-h@I","producerDataSet":[{"groupName":"P"}]}')
    assert producer.consumers == [] and producer.producers == ["P"]
    no_version = parse_heartbeat(b'{"clientID":"c","consumerDataSet":[{"groupName":"G","subscriptionDataSet":'
                                 b'[{"topic":"T","subString":"*"}]}]}', now_ms=42)
    (c,) = no_version.consumers
    assert c.subscriptions[0].sub_version == 42, "Java's decoder stamps an absent subVersion with the current time"
    assert (c.consume_type, c.message_model, c.consume_from_where) == (None, None, None)


@pytest.mark.parametrize("body, why", [
    (b"{", "not JSON"), (b"\xff{}", "not UTF-8"), (b"[" * 100_000, "nested too deeply"),
    (b"[]", "not a JSON object"), (b"{}", "clientID is missing"),
    (b'{"clientID":7}', "clientID must be a string"),
    (b'{"clientID":"c","consumerDataSet":{}}', "consumerDataSet must be a list"),
    (b'{"clientID":"c","producerDataSet":[{}]}', r"producerDataSet\[0\].groupName is missing"),
    (b'{"clientID":"c","producerDataSet":["P"]}', r"producerDataSet\[0\] must be an object"),
    (b'{"clientID":"c","consumerDataSet":[{"groupName":"G","consumeType":7}]}',
     r"consumerDataSet\[0\].consumeType must"),
    (b'{"clientID":"c","consumerDataSet":[{"groupName":"G","consumeType":"PUSH"}]}', "consumeType must be one of"),
    (b'{"clientID":"c","consumerDataSet":[{"groupName":"G","messageModel":true}]}', "messageModel must be one of"),
    (b'{"clientID":"c","consumerDataSet":[{"groupName":"G","unitMode":"no"}]}', "unitMode must be a boolean"),
    (b'{"clientID":"c","consumerDataSet":[{"groupName":"G","subscriptionDataSet":[{"topic":"T","subString":"*",'
     b'"subVersion":"12a"}]}]}', r"consumerDataSet\[0\].subscriptionDataSet\[0\].subVersion must be an integer"),
    (b'{"clientID":"c","consumerDataSet":[{"groupName":"G","subscriptionDataSet":[{"topic":"T","subString":"*",'
     b'"tagsSet":[1]}]}]}', "tagsSet must be a list of strings"),
    (b'{"clientID":"c","consumerDataSet":[{"groupName":"G","subscriptionDataSet":[{"topic":"T","subString":"*",'
     b'"codeSet":["1"]}]}]}', "codeSet must be a list of integers"),
    (b'{"clientID":"c","consumerDataSet":[{"groupName":"G","subscriptionDataSet":[{"subString":"*"}]}]}',
     r"subscriptionDataSet\[0\].topic is missing"),
    (b'{"clientID":"c","consumerDataSet":[{"groupName":"G","subscriptionDataSet":[5]}]}',
     r"subscriptionDataSet\[0\] must be an object"),
])
def test_a_bad_heartbeat_says_which_field(body, why):
    with pytest.raises(ValueError, match=why):
        parse_heartbeat(body)


def test_the_consumer_list_body_is_rocketmqs():
    assert consumer_list_body(["1-a@DEFAULT", "2-b@DEFAULT"]) == b'{"consumerIdList":["1-a@DEFAULT","2-b@DEFAULT"]}'
    assert consumer_list_body([]) == b'{"consumerIdList":[]}'


# ---------------------------------------------------------------- the consumer and producer registries


def consumer(group="CID_TEST", *topics, version=1, sub="*"):
    return ConsumerData(group, ConsumeType.CONSUME_PASSIVELY, MessageModel.CLUSTERING,
                        ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET, [SubscriptionData(t, sub, version) for t in topics])


A, B = (101, 1), (101, 2)  # channels as the controller keys them: (front pid, connection id)


def test_register_says_when_the_groups_channels_change():
    cm = ConsumerManager()
    assert cm.register(A, "1-a@DEFAULT", "CPP", 63, consumer("CID_TEST", "T"), 1000), "a new channel"
    assert not cm.register(A, "1-a@DEFAULT", "CPP", 63, consumer("CID_TEST", "T"), 2000), "the same again"
    assert cm.register(B, "2-b@DEFAULT", "JAVA", 401, consumer("CID_TEST", "T"), 2500)
    assert cm.consumer_ids("CID_TEST") == ["1-a@DEFAULT", "2-b@DEFAULT"] and cm.channels("CID_TEST") == [A, B]
    assert cm.groups() == ["CID_TEST"] and cm.consumer_ids("CID_NONE") == [] and cm.channels("CID_NONE") == []
    info = cm.group_info("CID_TEST")
    assert info.channels[A].last_update_ms == 2000 and info.channels[B].language == "JAVA"
    assert info.last_update_ms == 2500
    assert info.message_model is MessageModel.CLUSTERING and list(info.subscriptions) == ["T"]
    info.channels.clear()
    assert cm.channels("CID_TEST") == [A, B], "group_info is a copy"
    assert cm.find_channel("CID_TEST", "2-b@DEFAULT") == B and cm.find_channel("CID_TEST", "x") is None
    assert cm.group_info("CID_NONE") is None
    # a different client id on a known channel replaces it without a notification (RocketMQ logs a [BUG])
    assert not cm.register(A, "9-z@DEFAULT", "CPP", 63, consumer("CID_TEST", "T"), 3000)
    assert cm.consumer_ids("CID_TEST") == ["9-z@DEFAULT", "2-b@DEFAULT"]


def test_register_says_when_the_groups_topics_change():
    cm = ConsumerManager()
    cm.register(A, "a", "CPP", 63, consumer("G", "T", "%RETRY%G"), 0)
    assert cm.register(A, "a", "CPP", 63, consumer("G", "T", "%RETRY%G", "U"), 1), "a topic added"
    assert cm.subscription("G", "U") == SubscriptionData("U", "*", 1)
    assert cm.register(A, "a", "CPP", 63, consumer("G", "T", "%RETRY%G"), 2), "a topic removed"
    assert cm.subscription("G", "U") is None and cm.subscription("NONE", "T") is None
    # a newer subVersion replaces the subscription, an older one does not; neither is a change to RocketMQ
    assert not cm.register(A, "a", "CPP", 63, consumer("G", "T", "%RETRY%G", version=5, sub="TagA"), 3)
    assert cm.subscription("G", "T") == SubscriptionData("T", "TagA", 5)
    assert not cm.register(A, "a", "CPP", 63, consumer("G", "T", "%RETRY%G", version=4, sub="TagB"), 4)
    assert cm.subscription("G", "T").sub_string == "TagA"
    assert cm.register(A, "a", "CPP", 63, consumer("G"), 5), "a pull consumer's heartbeat has no subscriptions"
    assert cm.group_info("G").subscriptions == {}
    pull = ConsumerData("G", ConsumeType.CONSUME_ACTIVELY, MessageModel.BROADCASTING,
                        ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET)
    assert not cm.register(A, "a", "CPP", 63, pull, 6)
    assert cm.group_info("G").consume_type is ConsumeType.CONSUME_ACTIVELY, "the latest heartbeat's settings"


def test_unregister_and_channel_close():
    cm = ConsumerManager()
    cm.register(A, "a", "CPP", 63, consumer("G1", "T"), 0)
    cm.register(A, "a", "CPP", 63, consumer("G2", "T"), 0)
    cm.register(B, "b", "CPP", 63, consumer("G1", "T"), 0)
    assert cm.unregister(B, "G1") and not cm.unregister(B, "G1") and not cm.unregister(A, "NONE")
    assert cm.consumer_ids("G1") == ["a"]
    assert cm.channel_closed(A) == ["G1", "G2"] and cm.channel_closed(A) == []
    assert cm.groups() == [] and cm.group_info("G1") is None, "a group without channels is gone"
    cm.register(B, "b", "CPP", 63, consumer("G1", "T"), 0)
    assert cm.unregister(B, "G1") and cm.groups() == []
    with pytest.raises(ValueError, match="client_id"):
        cm.register(A, None, "CPP", 63, consumer("G1", "T"), 0)
    with pytest.raises(ValueError, match="now_ms"):
        cm.register(A, "a", "CPP", 63, consumer("G1", "T"), 1.5)


def test_silent_consumers_expire_after_120_s():
    cm = ConsumerManager()
    cm.register(A, "a", "CPP", 63, consumer("G1", "T"), 0)
    cm.register(A, "a", "CPP", 63, consumer("G2", "T"), 0)
    cm.register(B, "b", "CPP", 63, consumer("G1", "T"), 0)
    cm.register(B, "b", "CPP", 63, consumer("G1", "T"), 30_000)  # B's next heartbeat
    assert cm.scan_expired(120_000) == [], "silent for exactly 120 s: still there"
    assert cm.scan_expired_channels(120_001) == [(A, "G1"), (A, "G2")]
    assert cm.groups() == ["G1"] and cm.consumer_ids("G1") == ["b"]
    assert cm.scan_expired(150_001) == ["G1"] and cm.groups() == []
    cm.register(A, "a", "CPP", 63, consumer("G1", "T"), 0)
    assert cm.scan_expired(10_001, expiry_ms=10_000) == ["G1"]


def test_the_producer_registry():
    pm = ProducerManager()
    assert pm.register(A, "a", "P1", 0, language="CPP", version=63)
    assert not pm.register(A, "a", "P1", 50_000), "a known channel: only its time is refreshed"
    assert pm.register(A, "a", "P2", 0) and pm.register(B, "b", "P1", 0)
    assert pm.groups() == ["P1", "P2"] and pm.channels("P1") == [A, B] and pm.channels("NONE") == []
    assert pm.find_channel("b") == B and pm.find_channel("x") is None
    assert pm.unregister(B, "P1") and not pm.unregister(B, "P1") and not pm.unregister(B, "NONE")
    assert pm.scan_expired_channels(120_001) == [(A, "P2")], "P1's channel spoke at 50 s"
    assert pm.groups() == ["P1"]
    assert pm.scan_expired(170_001) == ["P1"] and pm.groups() == []
    pm.register(A, "a", "P1", 0)
    pm.register(A, "a", "P2", 0)
    assert pm.channel_closed(A) == ["P1", "P2"] and pm.groups() == [] and pm.channel_closed(A) == []


# ---------------------------------------------------------------- the file helpers


def test_write_with_bak_keeps_the_previous_file(tmp_path):
    path = os.path.join(tmp_path, "sub", "f.json")
    write_with_bak(path, "one")
    assert read(path) == "one" and not os.path.exists(path + ".bak") and not os.path.exists(path + ".tmp")
    write_with_bak(path, "two")
    assert (read(path), read(path + ".bak")) == ("two", "one")
    write_with_bak(path, "three", backup=False)
    assert (read(path), read(path + ".bak")) == ("three", "one")


def test_fastjson_pretty_writes_maps_the_way_fastjson_does():
    assert fastjson_pretty({"b": {"y": True, "x": "s"}, "a": {2: 1, 1: 0}, "c": {}}) == (
        '{\n\t"a":{1:0,2:1\n\t},\n\t"b":{\n\t\t"x":"s",\n\t\t"y":true\n\t},\n\t"c":{}\n}')
    with pytest.raises(TypeError):
        fastjson_pretty({"a": object()})
