# cython: language_level=3
"""The message types of the put path: Message, MessageBatch and PutMessageResult (spec §9).

The appender (``mqstore.log._commitlog``) cimports them (``_message.pxd``) and reads their fields
in C; users build them through ``mqstore.Message`` / ``mqstore.MessageBatch``.
"""

cimport cython
from libc.stdint cimport int64_t

from mq_record cimport *
from mq_status cimport *

from mqstore.errors import PutMessageError
from mqstore.status import HINTS, PutMessageStatus

cdef tuple _STATUSES = tuple(PutMessageStatus)


@cython.freelist(1024)
@cython.no_gc
cdef class Message:
    # no_gc: a Message is built per message (1,000 per put_messages call), and a tracked one
    # makes every ~700 of them run a young-generation collection (40 ns a message measured).
    # Its fields are str, bytes, ints, a str->str properties dict and born_host; a cycle
    # through a Message needs the message put into its own properties or born_host (which a
    # put refuses anyway), and such a cycle is then never collected, like one through a tuple
    # the collector does not track.
    """A message to put: topic, body and RocketMQ's message fields.

    tags and keys are stored in the TAGS and KEYS properties; wait_store_msg_ok=False sets
    WAIT=false (sync flush then returns without waiting for the disk). born_timestamp 0 means
    "now" at put time; born_host None means the store host.
    """


    def __init__(self, str topic, body=b"", *, int queue_id=0, int flag=0, tags=None, keys=None,
                 properties=None, wait_store_msg_ok=None, int64_t born_timestamp=0, born_host=None,
                 int sys_flag=0, int reconsume_times=0, int64_t prepared_transaction_offset=0):
        self.topic = topic
        self.body = body if type(body) is bytes else bytes(body)
        self.queue_id = queue_id
        self.flag = flag
        self.sys_flag = sys_flag
        self.born_timestamp = born_timestamp
        self.born_host = born_host
        self.reconsume_times = reconsume_times
        self.prepared_transaction_offset = prepared_transaction_offset
        self._properties = dict(properties) if properties else None
        if tags is not None:
            self.properties["TAGS"] = tags
        if keys is not None:
            self.properties["KEYS"] = keys if isinstance(keys, str) else " ".join(keys)
        if wait_store_msg_ok is not None:
            self.properties["WAIT"] = "true" if wait_store_msg_ok else "false"

    @property
    def properties(self) -> dict:
        """The message's properties (TAGS, KEYS, WAIT and the user's), a dict to change in place."""
        if self._properties is None:
            self._properties = {}
        return self._properties

    @properties.setter
    def properties(self, value):
        self._properties = dict(value) if value else None

    @property
    def tags(self):
        """The TAGS property, or None."""
        return None if self._properties is None else self._properties.get("TAGS")

    @property
    def keys(self) -> list:
        """The KEYS property split on spaces (the keys the index finds the message by)."""
        if self._properties is None:
            return []
        return [k for k in self._properties.get("KEYS", "").split(" ") if k]

    @property
    def wait_store_msg_ok(self) -> bool:
        """False when WAIT=false: a SYNC_FLUSH put then returns without waiting for the disk."""
        return wait_store_msg_ok(self._properties)

    def __repr__(self):
        return f"Message(topic={self.topic!r}, queue_id={self.queue_id}, body={len(self.body)} bytes, properties={self._properties})"


cdef class MessageBatch:
    """A client batch (MessageExtBatch, spec §9.4): one topic and queue, a §1.10 batch body,
    batch-level properties, flag, born timestamp and host."""


    def __init__(self, str topic, bytes body, *, int queue_id=0, properties=None, int sys_flag=0,
                 int64_t born_timestamp=0, born_host=None, int reconsume_times=0):
        self.topic = topic
        self.body = body
        self.queue_id = queue_id
        self.properties = dict(properties) if properties else {}
        self.sys_flag = sys_flag
        self.born_timestamp = born_timestamp
        self.born_host = born_host
        self.reconsume_times = reconsume_times

    @staticmethod
    def from_messages(messages, *, str topic=None, queue_id=None, properties=None):
        """Encode messages into a batch body like the Java client's encodeMessages (§1.10)."""
        from mqstore.log._codec import encode_batch_body
        messages = list(messages)
        if not messages:
            raise ValueError("a batch needs at least one message")
        first = messages[0]
        topic = topic if topic is not None else first.topic
        queue_id = queue_id if queue_id is not None else first.queue_id
        cdef Message m
        cdef list items = []
        for item in messages:
            m = <Message?>item
            items.append((m.body, m._properties, m.flag))
        body = encode_batch_body(items)
        return MessageBatch(topic, body, queue_id=queue_id, properties=properties, sys_flag=first.sys_flag,
                            born_timestamp=first.born_timestamp, born_host=first.born_host)


def topic_problem_of(str topic, Py_ssize_t max_length=MQ_MAX_TOPIC_BYTES_V1):
    """Why topic cannot be put (RocketMQ's TopicValidator: not empty, only letters, digits
    and %|_-, at most max_length characters), or None: the put path's own check."""
    return topic_problem(topic, max_length)


def properties_problem_of(dict props not None):
    """Why a properties map cannot be stored so that it reads back the same (a name or
    value holding \\x01 or \\x02, an empty name or value, a name that is not a str), or
    None: the put path's own check."""
    try:
        checked_properties_string(props)
    except ValueError as exc:
        return str(exc)
    return None


@cython.freelist(64)
@cython.no_gc
cdef class PutMessageResult:
    # no_gc: its fields (ints, str, bytes, a list of ints) can never form a reference cycle
    """Outcome of a put (RocketMQ PutMessageResult + AppendMessageResult)."""


    @property
    def status_code(self) -> int:
        """The status as its number (RocketMQ's PutMessageStatus ordinal)."""
        return self.c_status

    @property
    def wrote_offset(self) -> int:
        """Where the (first) record starts in the CommitLog."""
        return self.c_wrote_offset

    @property
    def wrote_bytes(self) -> int:
        """Bytes appended: the record, or every record of a batch."""
        return self.c_wrote_bytes

    @property
    def queue_offset(self) -> int:
        """The (first) message's offset in its queue."""
        return self.c_queue_offset

    @property
    def store_timestamp(self) -> int:
        """When the store appended it (ms since the epoch)."""
        return self.c_store_timestamp

    @property
    def msg_num(self) -> int:
        """Messages stored by this put (1, or a batch's count; 0 when nothing was)."""
        return self.c_msg_num

    @property
    def detail(self):
        """Why a put failed (or its durability is not confirmed), in words; None when PUT_OK."""
        return self.c_detail

    @property
    def status(self):
        """The PutMessageStatus (PUT_OK, MESSAGE_ILLEGAL, ...)."""
        return _STATUSES[self.c_status]

    @property
    def ok(self) -> bool:
        """True for PUT_OK (stored and, under SYNC_FLUSH, flushed)."""
        return self.c_status == MQ_PUT_OK

    @property
    def msg_id(self):
        """Offset msgId(s) (spec §1.2); comma-joined for a batch (spec §9.4)."""
        if self.c_msg_num == 0 or self._store_host is None:
            return None
        if self._record_sizes is None:
            return (self._store_host + self.c_wrote_offset.to_bytes(8, "big")).hex().upper()
        ids = []
        off = self.c_wrote_offset
        for size in self._record_sizes:
            ids.append((self._store_host + off.to_bytes(8, "big")).hex().upper())
            off += size
        return ",".join(ids)

    def check(self):
        """Return self if PUT_OK, else raise PutMessageError naming the status and its cause."""
        if self.c_status == MQ_PUT_OK:
            return self
        st = self.status
        raise PutMessageError(f"put failed: {st.name}" + (f": {self.c_detail}" if self.c_detail else ""),
                              status=st, hint=HINTS.get(st))

    def __repr__(self):
        return (f"PutMessageResult(status={self.status.name}, wrote_offset={self.c_wrote_offset}, "
                f"wrote_bytes={self.c_wrote_bytes}, queue_offset={self.c_queue_offset}, msg_num={self.c_msg_num}, "
                f"store_timestamp={self.c_store_timestamp}" + (f", detail={self.c_detail!r})" if self.c_detail else ")"))


cdef PutMessageResult _result(int status, object detail=None):
    cdef PutMessageResult r = PutMessageResult.__new__(PutMessageResult)
    r.c_status = status
    r.c_detail = detail
    return r
