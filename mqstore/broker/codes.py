"""Request and response codes of the remoting protocol (docs/rocketmq-remoting-spec.md §2.1,
§2.2), the short field names of SEND_MESSAGE_V2, and the answer a send gets for each
PutMessageStatus (§3.1, SendMessageProcessor.handlePutMessageResult)."""

from __future__ import annotations

from mqstore.protocol import RequestCode, ResponseCode  # re-exported: the broker names codes from here
from mqstore.status import PutMessageStatus

__all__ = ["FAQ", "RequestCode", "ResponseCode", "SEND_V2_FIELDS", "put_response", "send_fields", "topic_not_exist"]

#: what RocketMQ appends to a remark that has an FAQ entry (FAQUrl.suggestTodo)
FAQ = "\nSee http://rocketmq.apache.org/docs/faq/ for further details."


def topic_not_exist(topic: str) -> str:
    """TOPIC_NOT_EXIST's remark for a send or a pull (SendMessageProcessor, PullMessageProcessor)."""
    return f"topic[{topic}] not exist, apply first please!{FAQ}"


#: SendMessageRequestHeaderV2's short extFields names (SEND_MESSAGE_V2, SEND_BATCH_MESSAGE)
SEND_V2_FIELDS: dict[str, str] = {
    "a": "producerGroup", "b": "topic", "c": "defaultTopic", "d": "defaultTopicQueueNums", "e": "queueId",
    "f": "sysFlag", "g": "bornTimestamp", "h": "flag", "i": "properties", "j": "reconsumeTimes", "k": "unitMode",
    "l": "maxReconsumeTimes", "m": "batch", "n": "brokerName",
}


def send_fields(code: int, ext_fields: dict[str, str]) -> dict[str, str]:
    """A send request's extFields under SendMessageRequestHeader's names: V2 (310) and batch
    (320) requests carry them under one-letter keys (unknown keys are kept as they are)."""
    if code in (RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE):
        return {SEND_V2_FIELDS.get(k, k): v for k, v in ext_fields.items()}
    return dict(ext_fields)


def put_response(status: PutMessageStatus, detail: str | None = None, *, max_message_size: int = 4 * 1024 * 1024,
                 disk_util: str = "") -> tuple[ResponseCode, str | None]:
    """The response code and remark a send gets for a put's status, with RocketMQ 4.9.7's remarks
    (SendMessageProcessor.handlePutMessageResult); the put's own detail (what mqstore says went
    wrong) is appended, so a client sees the cause. One deliberate difference: RocketMQ answers
    OS_PAGECACHE_BUSY with SYSTEM_ERROR (1); here it is SYSTEM_BUSY (2), the code a client backs
    off on, with the same remark."""
    S, C = PutMessageStatus, ResponseCode
    if status is S.PUT_OK:
        return C.SUCCESS, None
    code: ResponseCode
    remark: str | None
    if status is S.FLUSH_DISK_TIMEOUT:
        code, remark = C.FLUSH_DISK_TIMEOUT, None  # stored: RocketMQ's sendOK, remark null
    elif status is S.FLUSH_SLAVE_TIMEOUT:
        code, remark = C.FLUSH_SLAVE_TIMEOUT, None
    elif status is S.SLAVE_NOT_AVAILABLE:
        code, remark = C.SLAVE_NOT_AVAILABLE, None
    elif status is S.CREATE_MAPEDFILE_FAILED:
        code, remark = C.SYSTEM_ERROR, "create mapped file failed, server is busy or broken."
    elif status in (S.MESSAGE_ILLEGAL, S.PROPERTIES_SIZE_EXCEEDED):
        code, remark = C.MESSAGE_ILLEGAL, (f"the message is illegal, maybe msg body or properties length not "
                                           f"matched. msg body length limit {max_message_size}B, msg properties "
                                           f"length limit 32KB.")
    elif status is S.SERVICE_NOT_AVAILABLE:
        code, remark = C.SERVICE_NOT_AVAILABLE, ("service not available now. It may be caused by one of the "
                                                 f"following reasons: the broker's disk is full [{disk_util}], "
                                                 "messages are put to the slave, message store has been shut "
                                                 "down, etc.")
    elif status is S.OS_PAGECACHE_BUSY:
        code, remark = C.SYSTEM_BUSY, "[PC_SYNCHRONIZED]broker busy, start flow control for a while"
    elif status is S.LMQ_CONSUME_QUEUE_NUM_EXCEEDED:
        code, remark = C.SYSTEM_ERROR, ("[LMQ_CONSUME_QUEUE_NUM_EXCEEDED]broker config enableLmq and "
                                        "enableMultiDispatch, lmq consumeQueue num exceed maxLmqConsumeQueueNum "
                                        "config num, default limit 2w.")
    elif status is S.UNKNOWN_ERROR:
        code, remark = C.SYSTEM_ERROR, "UNKNOWN_ERROR"
    else:
        code, remark = C.SYSTEM_ERROR, "UNKNOWN_ERROR DEFAULT"
    if detail:
        remark = f"{remark} ({detail})" if remark else detail
    return code, remark
