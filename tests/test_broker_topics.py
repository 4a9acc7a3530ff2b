"""A broker's topics (docs/rocketmq-remoting-spec.md §3.1, §3.2): the checks a sent topic passes,
auto-creation from TBW102, and config/topics.json in RocketMQ's format."""

from __future__ import annotations

import json
import os

import pytest

from mqstore.broker.topics import PERM_INHERIT, TBW102, TopicConfigs, topic_problem
from mqstore.errors import ConfigError


@pytest.mark.parametrize("topic, why", [
    ("", "The specified topic is blank."), ("a b", "illegal characters"), ("T" * 128, "longer than topic max length"),
    ("SCHEDULE_TOPIC_XXXX", "Sending message to topic[SCHEDULE_TOPIC_XXXX] is forbidden."), ("Töpic", "illegal"),
])
def test_topics_a_client_may_not_send_to(topic, why):
    assert why in topic_problem(topic)


def test_topics_a_client_may_send_to():
    assert [topic_problem(t) for t in ("T", "%RETRY%g", "a|b", "x-y_z", "T" * 127)] == [None] * 5


def test_startup_topics_and_auto_creation_from_tbw102(tmp_path):
    topics = TopicConfigs(str(tmp_path), cluster="C", broker_name="b")
    assert topics.get(TBW102)["perm"] == 7 and topics.get(TBW102)["writeQueueNums"] == 8
    assert topics.get("SCHEDULE_TOPIC_XXXX")["readQueueNums"] == 18 and topics.get("C_REPLY_TOPIC") is not None
    cfg = topics.create_in_send("T", TBW102, 4)  # what the C++ client asks: defaultTopicQueueNums 4
    assert (cfg["readQueueNums"], cfg["writeQueueNums"], cfg["perm"]) == (4, 4, 6)
    assert topics.create_in_send("U", TBW102, 64)["writeQueueNums"] == 8, "at most the default topic's queues"
    assert topics.create_in_send("V", "nope", 4) is None
    assert topics.data_version["counter"] == 2
    on_disk = json.loads(open(os.path.join(tmp_path, "config", "topics.json")).read())
    assert on_disk["topicConfigTable"]["T"] == {"order": False, "perm": 6, "readQueueNums": 4,
                                                "topicFilterType": "SINGLE_TAG", "topicName": "T",
                                                "topicSysFlag": 0, "writeQueueNums": 4}
    assert on_disk["dataVersion"]["counter"] == 2
    again = TopicConfigs(str(tmp_path), cluster="C", broker_name="b")
    assert again.get("T") == cfg and again.data_version["counter"] == 2


def test_without_auto_creation_nothing_inherits(tmp_path):
    topics = TopicConfigs(str(tmp_path), auto_create_topic_enable=False)
    assert topics.get(TBW102) is None and topics.create_in_send("T", TBW102, 4) is None
    topics.table[TBW102] = {**topics.table["BenchmarkTest"], "topicName": TBW102, "perm": 7}  # e.g. loaded from a file
    assert topics.create_in_send("T", TBW102, 4) is None, "autoCreateTopicEnable=false takes INHERIT away"
    assert topics.get("DefaultCluster")["perm"] == PERM_INHERIT | 6  # clusterTopicEnable: INHERIT|R|W


def test_a_rocketmq_topics_json_loads_and_a_damaged_one_falls_back_to_its_bak(tmp_path):
    config = tmp_path / "config"
    config.mkdir()
    rocketmq = {"dataVersion": {"counter": 5, "timestamp": 1700000000000, "stateVersion": 0},
                "topicConfigTable": {"Orders": {"order": False, "perm": 6, "readQueueNums": 8, "topicFilterType":
                                                "SINGLE_TAG", "topicName": "Orders", "topicSysFlag": 0,
                                                "writeQueueNums": 8}}}
    (config / "topics.json.bak").write_text(json.dumps(rocketmq))
    (config / "topics.json").write_text("{ damaged")
    topics = TopicConfigs(str(tmp_path))
    assert topics.get("Orders")["readQueueNums"] == 8 and topics.data_version["counter"] == 5
    (config / "topics.json.bak").write_text("also damaged")
    with pytest.raises(ConfigError, match="topics.json and its .bak cannot be read"):
        TopicConfigs(str(tmp_path))
    (config / "topics.json.bak").unlink()
    with pytest.raises(ConfigError, match="cannot be read \\(and there is no"):
        TopicConfigs(str(tmp_path))
