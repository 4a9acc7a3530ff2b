"""Exceptions raised at the edges of mqstore.

The hot path reports problems as status values (``PutMessageStatus``); these
exceptions are for the friendly API, for opening a store and for tools. Every
exception carries a ``hint`` that says what to do about it.
"""

from __future__ import annotations


class MQStoreError(Exception):
    """Base class of every mqstore error."""

    hint: str = ""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        if hint is not None:
            self.hint = hint
        super().__init__(message)

    def __str__(self) -> str:
        text = super().__str__()
        return f"{text} (hint: {self.hint})" if self.hint else text


class ConfigError(MQStoreError, ValueError):
    """A configuration key is unknown, has a bad value, or conflicts with another."""

    hint = "see docs/config.md for every key, its unit, default and allowed values"


class NotAStoreError(MQStoreError):
    """A directory exists but is not laid out like a store."""

    hint = "point the store at an empty directory or at one written by mqstore/RocketMQ"


class StoreLockedError(MQStoreError):
    """Another running store owns the directory (its ``lock`` file is held)."""

    hint = "stop the other store first, or open a different directory"


class StoreClosedError(MQStoreError):
    """An operation was attempted on a store that was shut down."""

    hint = "open the store again"


class CorruptRecordError(MQStoreError, ValueError):
    """Bytes that should hold a CommitLog record do not parse as one."""

    hint = "run the invariant checker (mqstore.tools.checker.check_store) on the directory"


class BodyDecompressError(CorruptRecordError):
    """A body flagged compressed in its record's sysFlag does not inflate (mqstore.compression);
    the message names the record. The stored bytes are left as they are."""

    hint = ("the stored bytes can still be read as they are: MessageView.raw_body, bodies(decompress=False), "
            "BatchColumns(decompress=False), mqstore dump --raw-body")


class CompressionLibraryMissingError(MQStoreError, ImportError):
    """A body is stored LZ4- or ZSTD-compressed (RocketMQ 5's sysFlag compression types) and the
    PyPI package that inflates it is not installed."""

    hint = "pip install 'mqstore[compression]' (the PyPI packages lz4 and zstandard)"


class PutMessageError(MQStoreError):
    """Raised by ``PutMessageResult.check()`` when a put did not end in PUT_OK."""

    def __init__(self, message: str, *, status: object = None, hint: str | None = None) -> None:
        self.status = status
        super().__init__(message, hint=hint)


class PortInUseError(MQStoreError):
    """A port a listener needs is taken by another process (another broker, anything else)."""

    hint = "stop what holds the port, or give the setting another port (0 = any free one)"

    @classmethod
    def of(cls, what: str, host: str, port: int, setting: str, exc: OSError) -> PortInUseError:
        """``the <what> port <port> (<setting>) on <host> is taken: <why>``."""
        return cls(f"the {what} port {port} ({setting}) on {host} is taken: {exc.strerror or exc}")
