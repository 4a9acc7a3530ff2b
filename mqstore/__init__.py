"""mqstore: Apache RocketMQ's broker message store, rebuilt for Python.

    from mqstore import MessageStore, Message
    with MessageStore("/tmp/store") as store:
        result = store.put_message(Message("TopicTest", b"hello", tags="TagA"))

The names below load on first use (PEP 562), so ``import mqstore`` and the ``mqstore`` command
start without loading the compiled kernels and the store.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> the module that defines it
_EXPORTS = {
    "Message": "mqstore.log._message",
    "MessageBatch": "mqstore.log._message",
    "PutMessageResult": "mqstore.log._message",
    "StoreConfig": "mqstore.config",
    "BodyDecompressError": "mqstore.errors",
    "CompressionLibraryMissingError": "mqstore.errors",
    "ConfigError": "mqstore.errors",
    "CorruptRecordError": "mqstore.errors",
    "MQStoreError": "mqstore.errors",
    "NotAStoreError": "mqstore.errors",
    "PutMessageError": "mqstore.errors",
    "StoreClosedError": "mqstore.errors",
    "StoreLockedError": "mqstore.errors",
    "AppendMessageStatus": "mqstore.status",
    "GetMessageStatus": "mqstore.status",
    "PutMessageStatus": "mqstore.status",
    "MessageStore": "mqstore.store",
}

__all__ = sorted([*_EXPORTS, "__version__"])


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'mqstore' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


if TYPE_CHECKING:  # "X as X": explicit re-exports for type checkers
    from mqstore.log._message import Message as Message
    from mqstore.log._message import MessageBatch as MessageBatch
    from mqstore.log._message import PutMessageResult as PutMessageResult
    from mqstore.config import StoreConfig as StoreConfig
    from mqstore.errors import BodyDecompressError as BodyDecompressError
    from mqstore.errors import CompressionLibraryMissingError as CompressionLibraryMissingError
    from mqstore.errors import ConfigError as ConfigError
    from mqstore.errors import CorruptRecordError as CorruptRecordError
    from mqstore.errors import MQStoreError as MQStoreError
    from mqstore.errors import NotAStoreError as NotAStoreError
    from mqstore.errors import PutMessageError as PutMessageError
    from mqstore.errors import StoreClosedError as StoreClosedError
    from mqstore.errors import StoreLockedError as StoreLockedError
    from mqstore.status import AppendMessageStatus as AppendMessageStatus
    from mqstore.status import GetMessageStatus as GetMessageStatus
    from mqstore.status import PutMessageStatus as PutMessageStatus
    from mqstore.store import MessageStore as MessageStore
