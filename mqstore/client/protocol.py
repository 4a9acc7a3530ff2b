"""The protocol constants the client needs (docs/rocketmq-remoting-spec.md §1, §2): request and
response codes, flags of the pull and send headers, topic permissions and the names of RocketMQ's
system message properties.

The codes, flags and permission bits are mqstore.protocol's (shared with the broker, so
``mqstore.client`` imports nothing from the broker); the rest is what only the client uses.
"""

from __future__ import annotations

from mqstore.protocol import (MASTER_ID, PERM_READ, PERM_WRITE, VERSION, PullSysFlag, RequestCode, ResponseCode,
                              code_name, request_name)

__all__ = ["DEFAULT_TOPIC", "DEFAULT_TOPIC_QUEUE_NUMS", "MASTER_ID", "PERM_READ", "PERM_WRITE", "PullSysFlag",
           "RequestCode", "ResponseCode", "SYSTEM_PROPERTIES", "VERSION", "code_name", "request_name"]

#: the topic new topics inherit from (TopicValidator.AUTO_CREATE_TOPIC_KEY_TOPIC)
DEFAULT_TOPIC = "TBW102"
#: queues a topic auto-created by a send gets at most (DefaultMQProducer.defaultTopicQueueNums)
DEFAULT_TOPIC_QUEUE_NUMS = 4
#: MessageSysFlag.COMPRESSED_FLAG: the body is zlib-compressed
COMPRESSED_FLAG = 0x1


#: MessageConst.STRING_HASH_SET: the property names RocketMQ reserves for itself; a user property
#: may not use one (Message.putUserProperty)
SYSTEM_PROPERTIES = frozenset({
    "TRACE_ON", "MSG_REGION", "KEYS", "TAGS", "WAIT", "DELAY", "RETRY_TOPIC", "REAL_TOPIC", "REAL_QID", "TRAN_MSG",
    "PGROUP", "MIN_OFFSET", "MAX_OFFSET", "BUYER_ID", "ORIGIN_MESSAGE_ID", "TRANSFER_FLAG", "CORRECTION_FLAG",
    "MQ2_FLAG", "RECONSUME_TIME", "UNIQ_KEY", "MAX_RECONSUME_TIMES", "CONSUME_START_TIME", "INSTANCE_ID",
    "CORRELATION_ID", "REPLY_TO_CLIENT", "TTL", "ARRIVE_TIME", "PUSH_REPLY_TIME", "CLUSTER", "MSG_TYPE",
    "INNER_MULTI_QUEUE_OFFSET",
})
