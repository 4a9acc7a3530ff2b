"""What every request handler of the broker needs (docs/rocketmq-remoting-spec.md §2.4, §5):
header fields read as RocketMQ reads them (a missing field, a number that is not one of its Java
type, both named in a SYSTEM_ERROR), and the response to a request. Shared by the front processes,
the controller and the NameServer."""

from __future__ import annotations

import time

from mqstore._remoting import RemotingCommand
from mqstore.protocol import VERSION, RequestCode, ResponseCode

__all__ = ["BadBody", "BadField", "HEADER_NUMBERS", "check_header", "field", "int_field", "parse_number", "response",
           "wall_ms"]


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


class BadField(ValueError):
    """A request header field that is missing or not what its type needs (SYSTEM_ERROR naming it)."""

    code: int = ResponseCode.SYSTEM_ERROR


class BadBody(BadField):
    """A send's body that cannot hold what its header says (MESSAGE_ILLEGAL naming why)."""

    code = ResponseCode.MESSAGE_ILLEGAL


def field(fields: dict[str, str], name: str) -> str:
    value = fields.get(name)
    if value is None:
        raise BadField(f"the custom field <{name}> is null")
    return value


#: the numeric fields of each request header the broker serves, with their Java type's width
#: (Integer 32, Long 64; SendMessageRequestHeader, PullMessageRequestHeader, ...): RocketMQ parses
#: every field of a request's header class before serving it, so a value that is not a number of
#: its type fails the request whether or not the processor goes on to use it
_I, _L = 32, 64
_SEND_NUMBERS = {"defaultTopicQueueNums": _I, "queueId": _I, "sysFlag": _I, "bornTimestamp": _L, "flag": _I,
                 "reconsumeTimes": _I, "maxReconsumeTimes": _I}
HEADER_NUMBERS: dict[int, dict[str, int]] = {
    RequestCode.SEND_MESSAGE: _SEND_NUMBERS, RequestCode.SEND_MESSAGE_V2: _SEND_NUMBERS,
    RequestCode.SEND_BATCH_MESSAGE: _SEND_NUMBERS,
    RequestCode.PULL_MESSAGE: {"queueId": _I, "queueOffset": _L, "maxMsgNums": _I, "sysFlag": _I, "commitOffset": _L,
                               "suspendTimeoutMillis": _L, "subVersion": _L},
    RequestCode.QUERY_MESSAGE: {"maxNum": _I, "beginTimestamp": _L, "endTimestamp": _L},
    RequestCode.GET_MAX_OFFSET: {"queueId": _I}, RequestCode.GET_MIN_OFFSET: {"queueId": _I},
    RequestCode.GET_EARLIEST_MSG_STORETIME: {"queueId": _I},
    RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: {"queueId": _I, "timestamp": _L},
    RequestCode.VIEW_MESSAGE_BY_ID: {"offset": _L},
    RequestCode.QUERY_CONSUMER_OFFSET: {"queueId": _I},
    RequestCode.UPDATE_CONSUMER_OFFSET: {"queueId": _I, "commitOffset": _L},
    RequestCode.CONSUMER_SEND_MSG_BACK: {"offset": _L, "delayLevel": _I, "maxReconsumeTimes": _I},
    RequestCode.REGISTER_BROKER: {"brokerId": _L}, RequestCode.UNREGISTER_BROKER: {"brokerId": _L},
    RequestCode.UPDATE_AND_CREATE_TOPIC: {"readQueueNums": _I, "writeQueueNums": _I, "perm": _I, "topicSysFlag": _I},
}
#: the Long fields among them (any other numeric field is an Integer)
_LONG_FIELDS = frozenset(name for table in HEADER_NUMBERS.values() for name, bits in table.items() if bits == _L)


def parse_number(name: str, value: str, bits: int | None = None) -> int:
    """A header field's text as Java's Integer.parseInt / Long.parseLong read it (an optional sign,
    then decimal digits, within the type's range); BadField naming the field otherwise."""
    if bits is None:
        bits = _L if name in _LONG_FIELDS else _I
    # the common case first: a few ASCII digits always fit (9 an Integer, 18 a Long)
    if value.isascii() and value.isdigit() and len(value) <= (9 if bits == _I else 18):
        return int(value)
    digits = value[1:] if value[:1] in ("-", "+") else value
    if not digits.isdecimal():
        raise BadField(f"the custom field <{name}> is not a number: {value[:64]!r}")
    # no int() of thousands of digits (Python refuses past 4300): 19 significant digits is the most
    number = int(value) if len(digits.lstrip("0")) <= 19 else 1 << 64
    if not -(1 << (bits - 1)) <= number < 1 << (bits - 1):
        kind = "an Integer (32-bit)" if bits == _I else "a Long (64-bit)"
        raise BadField(f"the custom field <{name}> is out of range for {kind}: {value[:64]!r}")
    return number


def check_header(code: int, fields: dict[str, str]) -> None:
    """Every numeric field the request carries parses as its type (BadField naming the first that
    does not); ``fields`` under the header's long names (``send_fields`` for V2 sends)."""
    for name, bits in HEADER_NUMBERS.get(code, {}).items():
        value = fields.get(name)
        if value is not None:
            parse_number(name, value, bits)


def int_field(fields: dict[str, str], name: str, default: int | None = None) -> int:
    value = fields.get(name)
    if value is None:
        if default is not None:
            return default
        raise BadField(f"the custom field <{name}> is null")
    return parse_number(name, value)


def response(request: RemotingCommand, code: int, remark: str | None = None, *,
             ext_fields: dict[str, str] | None = None, body: bytes = b"") -> RemotingCommand:
    """The response to `request`: its opaque, the response flag, in its serialization."""
    return RemotingCommand(code, language="JAVA", version=VERSION, opaque=request.opaque, flag=1, remark=remark,
                           ext_fields=ext_fields, body=body, serialize_type=request.serialize_type)
