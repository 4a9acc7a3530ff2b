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


class TierError(MQStoreError):
    """Tiered storage (mqstore.tier, docs/tiering.md): the bucket, the manifest or the tier
    queue index refused an operation; the message names the cause."""

    hint = "mqstore tier status DIR shows the tier's state; docs/tiering.md explains each part"


class CorruptSegmentError(TierError, ValueError):
    """A tiered segment (``.mqseg``, spec §5.2) or compacted index (``.mqidx``, §5.3) object
    fails a check: its size, magic, version, a CRC or its layout; the message names the field."""

    hint = ("the object was damaged or cut in the bucket: `mqstore tier verify` lists it; "
            "`tier verify --repair` uploads it again while the CommitLog file is still local")


class ManifestError(TierError):
    """tier/manifest.log or tier/manifest.snapshot cannot be loaded: a record that is not the
    last one fails its CRC or does not parse (the message names its sequence number), or the
    records do not follow each other (spec §4.4)."""

    hint = "mqstore tier rebuild DIR recreates the manifest from the bucket (spec §6.6)"


class ManifestTransitionError(TierError, ValueError):
    """A manifest record asks for a transition the segment state machine does not allow
    (spec §4.2): the message names the upload id, its state and the refused one."""

    hint = "the records of one upload go COPY_STARTED (MPU) COPY_FINISHED DELETE_STARTED DELETE_FINISHED"


class ObjectStoreError(TierError):
    """A request to the object store failed (mqstore.tier.objects): the message names the
    operation, the key and the cause; ``retryable`` says whether trying again can help."""

    retryable = False
    hint = "check object_store_endpoint, object_store_bucket and the credentials (docs/config.md)"

    def __init__(self, message: str, *, operation: str = "", key: str = "", cause: str = "",
                 hint: str | None = None) -> None:
        self.operation, self.key, self.cause = operation, key, cause
        super().__init__(message, hint=hint)


class ObjectStoreTimeoutError(ObjectStoreError):
    """A request took longer than object_store_request_timeout_ms (or the connect timeout)."""

    retryable = True
    hint = "the object store is slow or hung; raise object_store_request_timeout_ms if it is only slow"


class ObjectStoreUnavailableError(ObjectStoreError):
    """The object store refused or dropped the connection, cut a response short, or answered 5xx."""

    retryable = True
    hint = "the object store is down or overloaded; requests are retried with back-off"


class ObjectStorePermissionError(ObjectStoreError):
    """403 / 401: the credentials may not do this (or are wrong)."""

    hint = ("check object_store_access_key / object_store_secret_key (or the AWS credential chain) "
            "and the bucket policy")


class NoSuchBucketError(ObjectStoreError):
    """object_store_bucket does not exist (the tierer never creates buckets)."""

    hint = "create the bucket, or fix object_store_bucket / object_store_endpoint"


class ObjectNotFoundError(ObjectStoreError, FileNotFoundError):
    """No object under the key (404 NoSuchKey)."""

    hint = "the object was deleted, or never finished uploading; `mqstore tier verify` lists missing ones"


class ObjectAlreadyExistsError(ObjectStoreError, FileExistsError):
    """A conditional create (If-None-Match: *) found an object under the key."""

    hint = "the key is taken; keys carry a fresh upload id, so this means two writers share a prefix"


class PortInUseError(MQStoreError):
    """A port a listener needs is taken by another process (another broker, anything else)."""

    hint = "stop what holds the port, or give the setting another port (0 = any free one)"

    @classmethod
    def of(cls, what: str, host: str, port: int, setting: str, exc: OSError) -> PortInUseError:
        """``the <what> port <port> (<setting>) on <host> is taken: <why>``."""
        return cls(f"the {what} port {port} ({setting}) on {host} is taken: {exc.strerror or exc}")
