"""The broker front's send hot path (SendMessageProcessor, docs/rocketmq-remoting-spec.md
§2.4.1): ``parse_send`` reads a plainly well-formed SEND_MESSAGE / SEND_MESSAGE_V2 header in one
pass (None for anything the general path must serve or refuse); ``send_ok_response`` encodes
the answer to a stored send."""

from typing import Any

def parse_send(code: int, fields: dict[str, str]) -> tuple[str, int, int, int, int, int, str | None] | None:
    """(topic, queue_id, sys_flag, born_timestamp, flag, reconsume_times, properties) of a
    SEND_MESSAGE (10) or SEND_MESSAGE_V2 (310) request whose header is plainly well formed
    (producerGroup, topic and queueId present, every number present plain digits; sysFlag,
    bornTimestamp, flag and reconsumeTimes 0 when absent, properties None when absent); None
    for any other request, which the general path then serves or refuses."""

def send_ok_response(request: Any, code: int, msg_id: str, queue_id: int, queue_offset: int) -> bytes:
    """The encoded answer to a stored send (SUCCESS or a stored-but code: FLUSH_DISK_TIMEOUT,
    ...): msgId, queueId, queueOffset and RocketMQ's MSG_REGION / TRACE_ON, with the request's
    opaque, in its serialization."""
