"""The object-store client of the tier (tiered-storage spec §5.1 keys, §4.2 errors and back-off,
§9, §10): obstore's S3Store behind a small API whose errors are mqstore exceptions.

- **Keys** (§5.1): ``prefix_of(config)`` is
  ``[object_store_prefix/]<md5(broker_cluster_name)[0:8]>_<broker_cluster_name>/<broker_name>``
  (RocketMQ 5 PosixFileSegment's ``<hash>_<cluster>/<broker>``); under it ``STORE.json``,
  ``seg/<log>/<20-digit file start>.<upload id>.mqseg``,
  ``idx/<log>/<17-digit index file name>.<upload id>.mqidx`` and
  ``manifest/<20-digit sequence>.json``. An upload id is 16 hex digits from ``os.urandom(8)``:
  a retried copy never overwrites an earlier attempt's object.
- **ObjectStore**: put (one PutObject up to ``tiered_store_upload_part_size``, a multipart
  upload of such parts above it with ``tiered_store_upload_concurrency`` in flight), conditional
  create (``If-None-Match: *``), whole and ranged get (sync, and async for the fronts' event
  loops), head, list, delete (404 counts as done).
- **Errors**: every failure is an ``ObjectStoreError`` naming the operation, the key and the
  cause: ``ObjectStoreTimeoutError`` (object_store_request_timeout_ms), ``ObjectStoreUnavailableError``
  (refused, dropped or cut-short connections, 5xx), ``ObjectStorePermissionError`` (401/403),
  ``NoSuchBucketError``, ``ObjectNotFoundError``, ``ObjectAlreadyExistsError``. The first two are
  retried (obstore's own retries are off) with Kafka's back-off (``Backoff``: 500 ms doubling to
  30 s, ±20 % jitter, 5 tries); the others are raised at once.
- **Fencing** (§5.1): ``claim_store(config, store_id)`` creates ``<P>/STORE.json`` or checks that
  the one there names this store.

Not possible with obstore 0.12 (checked): it exposes neither a multipart upload's id nor
ListMultipartUploads / AbortMultipartUpload. A put that fails aborts its own multipart upload
(obstore does, checked against moto); a process killed in the middle of one leaves it for the
bucket's lifecycle rule ``AbortIncompleteMultipartUpload`` (docs/tier-objects.md).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import random
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal, TypeVar, Union

from mqstore.config import StoreConfig
from mqstore.errors import (ConfigError, NoSuchBucketError, ObjectAlreadyExistsError, ObjectNotFoundError,
                            ObjectStoreError, ObjectStorePermissionError, ObjectStoreTimeoutError,
                            ObjectStoreUnavailableError)

if TYPE_CHECKING:
    from typing_extensions import Buffer

    from obstore.store import S3Store

__all__ = ["Backoff", "ObjectInfo", "ObjectStore", "PutInfo", "SegmentKey", "claim_store", "index_key",
           "manifest_key", "new_upload_id", "parse_segment_key", "prefix_of", "segment_key", "store_key"]

T = TypeVar("T")
Payload = Union[bytes, bytearray, memoryview, Iterable["Buffer"], Callable[[], Iterable["Buffer"]]]

# ------------------------------------------------------------------------------------------------
# keys (spec §5.1)

_UPLOAD_ID = re.compile(r"[0-9a-f]{16}")
_SEGMENT_TAIL = re.compile(r"seg/(\d+)/(\d{20})\.([0-9a-f]{16})\.mqseg")


def prefix_of(config: StoreConfig) -> str:
    """``[object_store_prefix/]<md5(cluster)[0:8]>_<cluster>/<broker>``: the store's part of the
    bucket (RocketMQ 5 ``MessageStoreUtil.getHash`` + ``toFilePath``)."""
    cluster = config.broker_cluster_name
    digest = hashlib.md5(cluster.encode("utf-8"), usedforsecurity=False).hexdigest()[:8]
    parts = [config.object_store_prefix] if config.object_store_prefix else []
    return "/".join([*parts, f"{digest}_{cluster}", config.broker_name])


def store_key(prefix: str) -> str:
    """``<P>/STORE.json``: which store owns the prefix (claim_store)."""
    return f"{prefix}/STORE.json"


def new_upload_id() -> str:
    """16 lower-case hex digits from os.urandom(8): a fresh one for every copy attempt."""
    return os.urandom(8).hex()


def _check_upload_id(upload_id: str) -> None:
    if not _UPLOAD_ID.fullmatch(upload_id):
        raise ValueError(f"upload id {upload_id!r} is not 16 lower-case hex digits (new_upload_id())")


def segment_key(prefix: str, log: int, file_start: int, upload_id: str) -> str:
    """``<P>/seg/<log>/<20-digit file start>.<upload id>.mqseg``."""
    _check_upload_id(upload_id)
    if log < 0 or not 0 <= file_start < 10**20:
        raise ValueError(f"log {log} / file start {file_start} out of range")
    return f"{prefix}/seg/{log}/{file_start:020d}.{upload_id}.mqseg"


def index_key(prefix: str, log: int, index_file_name: str, upload_id: str) -> str:
    """``<P>/idx/<log>/<17-digit index file name>.<upload id>.mqidx`` (an IndexFile is named by
    its creation time, yyyyMMddHHmmssSSS)."""
    _check_upload_id(upload_id)
    if not re.fullmatch(r"\d{17}", index_file_name):
        raise ValueError(f"index file name {index_file_name!r} is not 17 digits (yyyyMMddHHmmssSSS)")
    return f"{prefix}/idx/{log}/{index_file_name}.{upload_id}.mqidx"


def manifest_key(prefix: str, sequence: int) -> str:
    """``<P>/manifest/<20-digit sequence>.json``: a manifest snapshot copy (spec §6.6)."""
    return f"{prefix}/manifest/{sequence:020d}.json"


class SegmentKey(tuple[int, int, str]):
    """(log, file_start, upload_id) read back from a segment key."""

    __slots__ = ()

    def __new__(cls, log: int, file_start: int, upload_id: str) -> SegmentKey:
        return super().__new__(cls, (log, file_start, upload_id))

    @property
    def log(self) -> int:
        return self[0]

    @property
    def file_start(self) -> int:
        return self[1]

    @property
    def upload_id(self) -> str:
        return self[2]


def parse_segment_key(prefix: str, key: str) -> SegmentKey | None:
    """The (log, file start, upload id) of a segment key under prefix; None for any other key
    (the orphan sweep and the rebuild list ``<P>/seg/``)."""
    if not key.startswith(prefix + "/"):
        return None
    match = _SEGMENT_TAIL.fullmatch(key[len(prefix) + 1:])
    if match is None:
        return None
    return SegmentKey(int(match[1]), int(match[2]), match[3])


# ------------------------------------------------------------------------------------------------
# back-off (spec §4.2: Kafka's remote.log.manager.task.retry.backoff.{ms,max.ms}, retry.jitter)


@dataclass(frozen=True)
class Backoff:
    """Exponential back-off with jitter: try ``attempts`` times; before try n + 1 wait
    ``min(max_ms, initial_ms x 2^(n-1))`` times a random factor in [1 - jitter, 1 + jitter]."""

    initial_ms: float = 500.0
    max_ms: float = 30_000.0
    jitter: float = 0.2
    attempts: int = 5

    def __post_init__(self) -> None:
        if self.attempts < 1 or self.initial_ms < 0 or self.max_ms < self.initial_ms or not 0 <= self.jitter < 1:
            raise ValueError(f"bad back-off {self}: attempts >= 1, 0 <= initial_ms <= max_ms, 0 <= jitter < 1")

    def delay_s(self, retry: int, rng: random.Random | None = None) -> float:
        """Seconds to wait before retry number ``retry`` (1 = the second try)."""
        base = min(self.max_ms, self.initial_ms * 2 ** (retry - 1))
        factor = (rng or random).uniform(1 - self.jitter, 1 + self.jitter)
        return base * factor / 1000.0


# ------------------------------------------------------------------------------------------------
# results


@dataclass(frozen=True)
class ObjectInfo:
    """One object: its key (the full key, prefix included), size, last modification, ETag."""

    key: str
    size: int
    last_modified: datetime
    e_tag: str | None


@dataclass(frozen=True)
class PutInfo:
    """A finished upload: ``multipart`` tells how it went up (the multipart upload's id is not
    exposed by obstore 0.12)."""

    key: str
    size: int
    e_tag: str | None
    multipart: bool


# ------------------------------------------------------------------------------------------------
# errors: obstore's exceptions as mqstore's


_STATUS = re.compile(r"non-2xx status code: (\d{3})(?: ([A-Za-z ]+))?")


def _summary(text: str) -> str:
    """obstore's message without its Debug dump, on one line, at most 300 characters."""
    first = text.split("\n\nDebug source", 1)[0].replace("\n", " ").strip()
    return first if len(first) <= 300 else first[:297] + "..."


def _translate(exc: BaseException, operation: str, key: str, where: str, timeout_ms: int) -> ObjectStoreError:
    from obstore import exceptions as obx

    text = str(exc)
    status_match = _STATUS.search(text)
    status = int(status_match[1]) if status_match else None
    kind: type[ObjectStoreError]
    if isinstance(exc, (obx.AlreadyExistsError, FileExistsError)):
        kind, cause = ObjectAlreadyExistsError, "already exists (conditional create refused)"
    elif "NoSuchBucket" in text:
        kind, cause = NoSuchBucketError, "no such bucket"
    elif isinstance(exc, (obx.NotFoundError, FileNotFoundError)) or status == 404:
        kind, cause = ObjectNotFoundError, "404 no such key"
    elif isinstance(exc, (obx.PermissionDeniedError, obx.UnauthenticatedError, PermissionError)) or status in (401, 403):
        kind, cause = ObjectStorePermissionError, f"{status or 403} access denied"
    elif status is not None and status >= 500:
        kind, cause = ObjectStoreUnavailableError, f"{status} {(status_match and status_match[2]) or ''}".strip()
    elif status is not None:
        kind, cause = ObjectStoreError, f"{status} {(status_match and status_match[2]) or ''}".strip()
    elif "kind: Timeout" in text or "timed out" in text.lower():
        kind, cause = ObjectStoreTimeoutError, f"timed out (object_store_request_timeout_ms={timeout_ms})"
    elif "kind: Connect" in text:
        refused = "refused" in text.lower() or "os error 111" in text
        kind, cause = ObjectStoreUnavailableError, "connection refused" if refused else "could not connect"
    elif "body error" in text or "kind: Body" in text or "Interrupted" in text or "kind: Request" in text:
        kind, cause = ObjectStoreUnavailableError, "connection dropped (response cut short or request not sent)"
    else:
        kind, cause = ObjectStoreError, "error"
    message = f"{operation} {where}: {cause}: {_summary(text)}"
    return kind(message, operation=operation, key=key, cause=cause)


def _obstore_errors() -> tuple[type[BaseException], ...]:
    from obstore import exceptions as obx

    return (obx.BaseError, FileNotFoundError, FileExistsError, PermissionError, TimeoutError, ConnectionError)


# ------------------------------------------------------------------------------------------------
# the store


class ObjectStore:
    """The tier's bucket, built from a StoreConfig (object_store_* keys): obstore's S3Store with
    its retries off, so ``backoff`` is the only retry policy.

    ``part_size`` overrides tiered_store_upload_part_size (tests; the config refuses less than
    S3's 5 MiB); ``sleep`` is what waits between tries.
    """

    def __init__(self, config: StoreConfig, *, backoff: Backoff | None = None, part_size: int | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        try:
            from obstore.store import S3Store
        except ImportError:  # the `tier` extra
            raise ConfigError("tiered storage needs obstore, which is not installed",
                              hint="pip install 'mqstore[tier]'") from None
        if not config.object_store_bucket:
            raise ConfigError("object_store_bucket is empty: the tier has no bucket",
                              hint="set object_store_bucket (and object_store_endpoint)")
        self.config = config
        self.bucket: str = config.object_store_bucket
        self.prefix: str = prefix_of(config)
        self.backoff = backoff or Backoff()
        self.part_size = part_size or config.tiered_store_upload_part_size
        self.concurrency = config.tiered_store_upload_concurrency
        self.timeout_ms = config.object_store_request_timeout_ms
        self._sleep = sleep
        options: dict[str, Any] = {
            "region": config.object_store_region,
            "virtual_hosted_style_request": False,
        }
        if config.object_store_endpoint:
            options["endpoint"] = config.object_store_endpoint
        if config.object_store_access_key or config.object_store_secret_key:
            options["access_key_id"] = config.object_store_access_key
            options["secret_access_key"] = config.object_store_secret_key
        self._store: S3Store = S3Store(
            self.bucket,
            client_options={"allow_http": config.object_store_allow_http,
                            "timeout": timedelta(milliseconds=config.object_store_request_timeout_ms),
                            "connect_timeout": timedelta(milliseconds=config.object_store_connect_timeout_ms)},
            retry_config={"max_retries": 0},
            **options,
        )

    def __repr__(self) -> str:
        return f"ObjectStore(s3://{self.bucket}/{self.prefix}/)"

    def _where(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"

    # --- retries ----------------------------------------------------------------------------------

    def _retry(self, operation: str, key: str, call: Callable[[], T], *, attempts: int | None = None) -> T:
        tries = attempts or self.backoff.attempts
        for attempt in range(1, tries + 1):
            try:
                return call()
            except _obstore_errors() as exc:
                error = _translate(exc, operation, key, self._where(key), self.timeout_ms)
            if not error.retryable or attempt == tries:
                raise self._final(error, attempt)
            self._sleep(self.backoff.delay_s(attempt))
        raise AssertionError("unreachable")

    async def _retry_async(self, operation: str, key: str, call: Callable[[], Awaitable[T]]) -> T:
        tries = self.backoff.attempts
        for attempt in range(1, tries + 1):
            try:
                return await call()
            except _obstore_errors() as exc:
                error = _translate(exc, operation, key, self._where(key), self.timeout_ms)
            if not error.retryable or attempt == tries:
                raise self._final(error, attempt)
            await asyncio.sleep(self.backoff.delay_s(attempt))
        raise AssertionError("unreachable")

    @staticmethod
    def _final(error: ObjectStoreError, attempt: int) -> ObjectStoreError:
        if attempt > 1:
            error.args = (f"{error.args[0]} (gave up after {attempt} tries)",)
        return error

    # --- writes -----------------------------------------------------------------------------------

    def put(self, key: str, data: Payload, *, size: int | None = None) -> PutInfo:
        """Upload ``data`` under ``key`` (overwriting): one PutObject when it is at most the part
        size, else a multipart upload of part-size parts, ``concurrency`` in flight.

        ``data``: bytes-like; or a zero-argument callable returning an iterable of buffers
        (called again for every try, so it is retried like bytes); or an iterable of buffers,
        which can be read once: tried once. ``size`` (the total) picks single vs multipart for
        the last two; unknown = multipart.
        """
        if isinstance(data, (bytes, bytearray, memoryview)):
            view = memoryview(data).cast("B")
            return self._put(key, lambda: view, len(view), "overwrite", attempts=None)
        if callable(data):
            factory = data
            return self._put(key, lambda: _Counted(factory()), size, "overwrite", attempts=None)
        once = _Counted(data)
        return self._put(key, lambda: once, size, "overwrite", attempts=1)

    def create(self, key: str, data: bytes | bytearray | memoryview) -> PutInfo:
        """Create ``key`` only if nothing is there (``If-None-Match: *``; one PutObject): an
        ObjectAlreadyExistsError names the key otherwise. A try that timed out may have created
        the object: its retry then reports AlreadyExists, so callers compare the content."""
        view = memoryview(data).cast("B")
        return self._put(key, lambda: view, len(view), "create", attempts=None)

    def _put(self, key: str, payload: Callable[[], Any], size: int | None, mode: Literal["create", "overwrite"],
             *, attempts: int | None) -> PutInfo:
        import obstore

        multipart = mode == "overwrite" and (size is None or size > self.part_size)
        sent: list[Any] = []

        def call() -> Any:
            body = payload()
            sent.append(body)
            return obstore.put(self._store, key, body, mode=mode, use_multipart=multipart,
                               chunk_size=self.part_size, max_concurrency=self.concurrency)

        result = self._retry("create" if mode == "create" else "put", key, call, attempts=attempts)
        body = sent[-1]
        total = body.count if isinstance(body, _Counted) else len(body)
        return PutInfo(key, total, result.get("e_tag"), multipart)

    def delete(self, key: str) -> None:
        """Delete ``key``; an object that is not there counts as deleted (spec §4.2)."""
        import obstore

        try:
            self._retry("delete", key, lambda: obstore.delete(self._store, key))
        except ObjectNotFoundError:
            pass

    # --- reads ------------------------------------------------------------------------------------

    def get(self, key: str) -> bytes:
        """The whole object (its size checked against the response's)."""
        import obstore

        def call() -> bytes:
            result = obstore.get(self._store, key)
            data = bytes(result.bytes())
            if len(data) != result.meta["size"]:
                raise _ShortRead(len(data), result.meta["size"])
            return data

        return self._with_short_reads("get", key, call)

    def get_range(self, key: str, start: int, length: int) -> bytes:
        """Bytes [start, start + length) of ``key``; a range past the object's end is an error
        naming both."""
        import obstore

        _check_range(start, length)

        def call() -> bytes:
            data = bytes(obstore.get_range(self._store, key, start=start, length=length))
            if len(data) != length:
                raise _ShortRead(len(data), length)
            return data

        return self._with_short_reads(f"get bytes {start}..{start + length} of", key, call)

    async def get_range_async(self, key: str, start: int, length: int) -> bytes:
        """get_range on obstore's async API (an event loop is never blocked)."""
        import obstore

        _check_range(start, length)

        async def call() -> bytes:
            data = bytes(await obstore.get_range_async(self._store, key, start=start, length=length))
            if len(data) != length:
                raise _ShortRead(len(data), length)
            return data

        operation = f"get bytes {start}..{start + length} of"
        try:
            return await self._retry_async(operation, key, call)
        except _ShortRead as short:
            raise short.error(operation, key, self._where(key)) from None

    def _with_short_reads(self, operation: str, key: str, call: Callable[[], bytes]) -> bytes:
        try:
            return self._retry(operation, key, call)
        except _ShortRead as short:
            raise short.error(operation, key, self._where(key)) from None

    def head(self, key: str) -> ObjectInfo:
        """Size, last modification and ETag of ``key`` (ObjectNotFoundError when absent)."""
        import obstore

        meta = self._retry("head", key, lambda: obstore.head(self._store, key))
        return ObjectInfo(meta["path"], meta["size"], meta["last_modified"], meta["e_tag"])

    def exists(self, key: str) -> bool:
        try:
            self.head(key)
        except ObjectNotFoundError:
            return False
        return True

    def list(self, prefix: str) -> list[ObjectInfo]:
        """Every object under the directory ``prefix`` (whole path segments: ``P/seg`` lists
        ``P/seg/...``, not ``P/segx``), in key order."""
        import obstore

        def call() -> list[ObjectInfo]:
            return [ObjectInfo(m["path"], m["size"], m["last_modified"], m["e_tag"])
                    for batch in obstore.list(self._store, prefix.rstrip("/") or None) for m in batch]

        return sorted(self._retry("list", prefix, call), key=lambda o: o.key)


def _check_range(start: int, length: int) -> None:
    if start < 0 or length <= 0:
        raise ValueError(f"bad range: start {start}, length {length} (start >= 0, length > 0)")


class _ShortRead(Exception):
    """A response with fewer bytes than asked for (not retried: the range passes the end)."""

    def __init__(self, got: int, wanted: int) -> None:
        super().__init__(got, wanted)
        self.got, self.wanted = got, wanted

    def error(self, operation: str, key: str, where: str) -> ObjectStoreError:
        cause = f"returned {self.got} of {self.wanted} bytes (the range passes the object's end)"
        return ObjectStoreError(f"{operation} {where}: {cause}", operation=operation, key=key, cause=cause)


class _Counted:
    """An iterable of buffers that counts the bytes it hands out (a put's size)."""

    def __init__(self, parts: Iterable[Buffer]) -> None:
        self._parts = iter(parts)
        self.count = 0

    def __iter__(self) -> Iterator[Buffer]:
        return self

    def __next__(self) -> Buffer:
        part = next(self._parts)
        self.count += memoryview(part).nbytes
        return part


# ------------------------------------------------------------------------------------------------
# fencing (spec §5.1)


def claim_store(config: StoreConfig, store_id: str, *, objects: ObjectStore | None = None,
                now_ms: int | None = None) -> dict[str, Any]:
    """Make this store the owner of its prefix: create ``<P>/STORE.json`` (conditional create)
    naming ``store_id``, or check that the one there names it. Another store id there raises
    ConfigError naming both ids (two brokers must never share a prefix). Returns STORE.json's
    content."""
    store = objects or ObjectStore(config)
    key = store_key(store.prefix)
    document = {"store_id": store_id, "created_ms": int(time.time() * 1000) if now_ms is None else now_ms,
                "logs": config.commit_log_count, "mapped_file_size_commit_log": config.mapped_file_size_commit_log}
    try:
        store.create(key, json.dumps(document, sort_keys=True).encode("utf-8"))
        return document
    except ObjectAlreadyExistsError:
        pass
    raw = store.get(key)
    try:
        existing = json.loads(raw)
        owner = existing["store_id"]
    except (ValueError, KeyError, TypeError):
        raise ConfigError(f"s3://{store.bucket}/{key} is not a STORE.json (no store_id in {raw[:200]!r})",
                          hint="something else wrote under this store's prefix: set object_store_prefix apart, "
                               "or remove the object if nothing uses it") from None
    if owner != store_id:
        raise ConfigError(
            f"s3://{store.bucket}/{store.prefix}/ belongs to store {owner}, not to this store {store_id}: "
            "two stores must never tier to one prefix (tiered-storage spec §5.1)",
            hint="give this store its own prefix (object_store_prefix, broker_cluster_name or broker_name), "
                 f"or, if store {owner} is gone for good and this one replaces it, delete "
                 f"s3://{store.bucket}/{key}")
    return dict(existing)
