# cython: language_level=3
"""The broker front's send hot path (SendMessageProcessor, docs/rocketmq-remoting-spec.md
§2.4.1), in C: ``parse_send`` reads the header fields of a plainly well-formed SEND_MESSAGE or
SEND_MESSAGE_V2 request straight from its extFields (under either set of names), each number
parsed once, without the dict under the long names and the second parse of every number that
the general path (mqstore/broker/front.py: ``send_fields``, ``check_header``, ``int_field``)
makes to name what is wrong with a request. ``send_ok_response`` encodes the answer to a stored
send.

A request the fast path does not take returns None and goes the general way, which answers it
exactly as before: a batch (SEND_BATCH_MESSAGE, or ``batch`` other than "false"), a field it
needs missing, or a number that is not 1 to 9 plain ASCII digits (18 for bornTimestamp): a sign,
a space, 10 digits (an Integer may still be in range), anything Java's parseInt reads otherwise
or refuses.

Twin: the general path itself (tests/test_broker_send.py checks parity with hypothesis).
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from libc.stdint cimport uint32_t
from libc.string cimport memcpy

from mqstore.remoting._remoting import RemotingCommand
from mqstore.protocol import VERSION as _VERSION

#: SendMessageRequestHeaderV2's one-letter names, then SendMessageRequestHeader's, in one order:
#: producerGroup, topic, defaultTopic, defaultTopicQueueNums, queueId, sysFlag, bornTimestamp,
#: flag, properties, reconsumeTimes, unitMode, maxReconsumeTimes, batch
cdef tuple _V2 = ("a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m")
cdef tuple _V1 = ("producerGroup", "topic", "defaultTopic", "defaultTopicQueueNums", "queueId", "sysFlag",
                  "bornTimestamp", "flag", "properties", "reconsumeTimes", "unitMode", "maxReconsumeTimes", "batch")

DEF SEND_MESSAGE = 10
DEF SEND_MESSAGE_V2 = 310


cdef inline void _put_be32(char *p, uint32_t v) noexcept:
    p[0] = <char>(v >> 24)
    p[1] = <char>(v >> 16)
    p[2] = <char>(v >> 8)
    p[3] = <char>v


cdef inline long long _digits(object value, int max_len):
    """value as a number of 1..max_len ASCII decimal digits, else -1 (None gives -2)."""
    if value is None:
        return -2
    if type(value) is not str:
        return -1
    cdef str s = <str>value
    cdef Py_ssize_t n = len(s)
    if n == 0 or n > max_len:
        return -1
    cdef long long x = 0
    cdef Py_UCS4 c
    for c in s:
        if c < 48 or c > 57:  # '0' .. '9'
            return -1
        x = x * 10 + <long long>c - 48
    return x


def parse_send(int code, dict fields):
    """(topic, queue_id, sys_flag, born_timestamp, flag, reconsume_times, properties) of a
    SEND_MESSAGE (10) or SEND_MESSAGE_V2 (310) request whose header is plainly well formed
    (producerGroup, topic and queueId present, every number present plain digits; sysFlag,
    bornTimestamp, flag and reconsumeTimes 0 when absent, properties None when absent); None
    for any other request, which the general path then serves or refuses."""
    cdef tuple names
    if code == SEND_MESSAGE_V2:
        names = _V2
    elif code == SEND_MESSAGE:
        names = _V1
    else:
        return None
    topic = fields.get(names[1])
    if topic is None or type(topic) is not str or fields.get(names[0]) is None:
        return None
    batch = fields.get(names[12])
    if batch is not None and batch != "false":
        return None
    cdef long long queue_id = _digits(fields.get(names[4]), 9)
    if queue_id < 0:
        return None
    if _digits(fields.get(names[3]), 9) == -1 or _digits(fields.get(names[11]), 9) == -1:
        return None  # numbers the send does not use, but Java parses them all
    cdef long long sys_flag = _digits(fields.get(names[5]), 9)
    cdef long long born = _digits(fields.get(names[6]), 18)
    cdef long long flag = _digits(fields.get(names[7]), 9)
    cdef long long reconsume = _digits(fields.get(names[9]), 9)
    if sys_flag == -1 or born == -1 or flag == -1 or reconsume == -1:
        return None
    return (topic, queue_id, 0 if sys_flag < 0 else sys_flag, 0 if born < 0 else born, 0 if flag < 0 else flag,
            0 if reconsume < 0 else reconsume, fields.get(names[8]))


cdef bytes _JSON_ANSWER = (b'{"code":%d,"extFields":{"msgId":"%s","queueId":"%d","queueOffset":"%d",'
                           b'"MSG_REGION":"DefaultRegion","TRACE_ON":"true"},"flag":1,"language":"JAVA",'
                           b'"opaque":%d,"serializeTypeCurrentRPC":"JSON","version":%d}')


cdef inline bint _plain_id(str msg_id):
    """Offset message ids (hex digits, commas between a batch's): nothing to escape in JSON."""
    cdef Py_UCS4 c
    for c in msg_id:
        if not (48 <= c <= 57 or 65 <= c <= 90 or 97 <= c <= 122 or c == 44):
            return False
    return True


def send_ok_response(request, int code, str msg_id, int queue_id, long long queue_offset) -> bytes:
    """The encoded answer to a stored send (SUCCESS or a stored-but code: FLUSH_DISK_TIMEOUT,
    ...): msgId, queueId, queueOffset and RocketMQ's MSG_REGION / TRACE_ON, with the request's
    opaque, in its serialization. A JSON answer is written from a template (the bytes
    RemotingCommand.encode makes for it, 0.5 us instead of 2.8)."""
    cdef bytes header, out
    cdef Py_ssize_t hlen
    cdef char *p
    if request.serialize_type == 0 and _plain_id(msg_id):
        header = _JSON_ANSWER % (code, msg_id.encode("ascii"), queue_id, queue_offset, <int>request.opaque, _VERSION)
        hlen = len(header)
        out = PyBytes_FromStringAndSize(NULL, 8 + hlen)
        p = PyBytes_AS_STRING(out)
        _put_be32(p, <uint32_t>(4 + hlen))
        _put_be32(p + 4, <uint32_t>hlen)  # serialization type 0 (JSON) in the top byte
        memcpy(p + 8, PyBytes_AS_STRING(header), hlen)
        return out
    return RemotingCommand(code, language="JAVA", version=_VERSION, opaque=request.opaque, flag=1,
                           ext_fields={"msgId": msg_id, "queueId": str(queue_id), "queueOffset": str(queue_offset),
                                       "MSG_REGION": "DefaultRegion", "TRACE_ON": "true"},
                           serialize_type=request.serialize_type).encode()
