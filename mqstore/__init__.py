"""mqstore: Apache RocketMQ's broker message store, rebuilt for Python.

    from mqstore import MessageStore, Message
    with MessageStore("/tmp/store") as store:
        result = store.put_message(Message("TopicTest", b"hello", tags="TagA"))
"""

from mqstore._commitlog import Message, MessageBatch, PutMessageResult
from mqstore.config import StoreConfig
from mqstore.errors import (
    ConfigError,
    CorruptRecordError,
    MQStoreError,
    NotAStoreError,
    PutMessageError,
    StoreClosedError,
    StoreLockedError,
)
from mqstore.status import AppendMessageStatus, GetMessageStatus, PutMessageStatus
from mqstore.store import MessageStore

__version__ = "0.1.0"

__all__ = [
    "AppendMessageStatus",
    "ConfigError",
    "CorruptRecordError",
    "GetMessageStatus",
    "MQStoreError",
    "Message",
    "MessageBatch",
    "MessageStore",
    "NotAStoreError",
    "PutMessageError",
    "PutMessageResult",
    "PutMessageStatus",
    "StoreClosedError",
    "StoreConfig",
    "StoreLockedError",
    "__version__",
]
