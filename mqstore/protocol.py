"""The remoting protocol's constants, shared by the broker and the client
(docs/rocketmq-remoting-spec.md §1, §2): request and response codes with RocketMQ 4.9.7's names
and values (RequestCode.java, ResponseCode.java, RemotingSysResponseCode.java), the pull request's
flags, topic permission bits and the version both sides announce."""

from __future__ import annotations

from enum import IntEnum

__all__ = ["MASTER_ID", "PERM_INHERIT", "PERM_PRIORITY", "PERM_READ", "PERM_WRITE", "PullSysFlag", "RequestCode",
           "ResponseCode", "VERSION", "code_name", "request_name"]

#: the MQVersion ordinal mqstore sends (V4_9_7); clients >= 401 (V4_9_4) get standard JSON routes
VERSION = 407
#: the broker id of a master (MixAll.MASTER_ID); a slave has an id > 0
MASTER_ID = 0
#: PermName bits
PERM_PRIORITY, PERM_READ, PERM_WRITE, PERM_INHERIT = 8, 4, 2, 1


class RequestCode(IntEnum):
    """RocketMQ's RequestCode (4.9.7): the requests clients, brokers and admin tools send."""

    SEND_MESSAGE = 10
    PULL_MESSAGE = 11
    QUERY_MESSAGE = 12
    QUERY_CONSUMER_OFFSET = 14
    UPDATE_CONSUMER_OFFSET = 15
    UPDATE_AND_CREATE_TOPIC = 17
    GET_ALL_TOPIC_CONFIG = 21
    GET_BROKER_RUNTIME_INFO = 28
    SEARCH_OFFSET_BY_TIMESTAMP = 29
    GET_MAX_OFFSET = 30
    GET_MIN_OFFSET = 31
    GET_EARLIEST_MSG_STORETIME = 32
    VIEW_MESSAGE_BY_ID = 33
    HEART_BEAT = 34
    UNREGISTER_CLIENT = 35
    CONSUMER_SEND_MSG_BACK = 36
    END_TRANSACTION = 37
    GET_CONSUMER_LIST_BY_GROUP = 38
    CHECK_TRANSACTION_STATE = 39
    NOTIFY_CONSUMER_IDS_CHANGED = 40
    LOCK_BATCH_MQ = 41
    UNLOCK_BATCH_MQ = 42
    GET_ALL_CONSUMER_OFFSET = 43
    GET_ALL_DELAY_OFFSET = 45
    REGISTER_BROKER = 103
    UNREGISTER_BROKER = 104
    GET_ROUTEINFO_BY_TOPIC = 105
    GET_ALL_SUBSCRIPTIONGROUP_CONFIG = 201
    GET_CONSUMER_CONNECTION_LIST = 203
    GET_ALL_TOPIC_LIST_FROM_NAMESERVER = 206
    RESET_CONSUMER_CLIENT_OFFSET = 220
    GET_CONSUMER_RUNNING_INFO = 307
    SEND_MESSAGE_V2 = 310
    SEND_BATCH_MESSAGE = 320
    QUERY_DATA_VERSION = 322


class ResponseCode(IntEnum):
    """RemotingSysResponseCode and ResponseCode (4.9.7)."""

    SUCCESS = 0
    SYSTEM_ERROR = 1
    SYSTEM_BUSY = 2
    REQUEST_CODE_NOT_SUPPORTED = 3
    TRANSACTION_FAILED = 4
    FLUSH_DISK_TIMEOUT = 10
    SLAVE_NOT_AVAILABLE = 11
    FLUSH_SLAVE_TIMEOUT = 12
    MESSAGE_ILLEGAL = 13
    SERVICE_NOT_AVAILABLE = 14
    VERSION_NOT_SUPPORTED = 15
    NO_PERMISSION = 16
    TOPIC_NOT_EXIST = 17
    TOPIC_EXIST_ALREADY = 18
    PULL_NOT_FOUND = 19
    PULL_RETRY_IMMEDIATELY = 20
    PULL_OFFSET_MOVED = 21
    QUERY_NOT_FOUND = 22
    SUBSCRIPTION_PARSE_FAILED = 23
    SUBSCRIPTION_NOT_EXIST = 24
    SUBSCRIPTION_NOT_LATEST = 25
    SUBSCRIPTION_GROUP_NOT_EXIST = 26
    FILTER_DATA_NOT_EXIST = 27
    FILTER_DATA_NOT_LATEST = 28
    TRANSACTION_SHOULD_COMMIT = 200
    TRANSACTION_SHOULD_ROLLBACK = 201
    TRANSACTION_STATE_UNKNOW = 202
    TRANSACTION_STATE_GROUP_WRONG = 203
    CONSUMER_NOT_ONLINE = 206
    CONSUME_MSG_TIMEOUT = 207
    NO_MESSAGE = 208
    FLOW_CONTROL = 215


class PullSysFlag:
    """PullSysFlag bits (§2.4.2)."""

    COMMIT_OFFSET = 0x1
    SUSPEND = 0x2
    SUBSCRIPTION = 0x4
    CLASS_FILTER = 0x8


def code_name(code: int) -> str:
    """'TOPIC_NOT_EXIST(17)' for a response code, 'UNKNOWN(999)' for one RocketMQ does not define."""
    try:
        return f"{ResponseCode(code).name}({code})"
    except ValueError:
        return f"UNKNOWN({code})"


def request_name(code: int) -> str:
    """'SEND_MESSAGE_V2(310)' for a request code."""
    try:
        return f"{RequestCode(code).name}({code})"
    except ValueError:
        return f"request({code})"
