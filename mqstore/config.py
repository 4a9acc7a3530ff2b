"""Store configuration: one object with every knob (spec Appendix A, §6-§9, §13, §14).

Keys are RocketMQ 4.9.7 ``MessageStoreConfig`` field names in snake_case (RocketMQ's own spellings
kept: ``warm_maped_file_enable``), so a RocketMQ ``broker.conf`` maps 1:1 onto
``StoreConfig.from_broker_conf``. Every key is defined once in ``DEFINITIONS`` with its type,
default, unit, allowed values and one line of why it matters (the shape of Kafka's
``LogConfig.define(name, type, default, validator, doc)``); ``docs/config.md`` is rendered from
that table by ``render_config_doc()`` (``python -m mqstore.config > docs/config.md``).

Values are coerced and checked one key at a time whenever they are set; ``StoreConfig.validate()``
checks combinations of keys and is what a store calls when it opens.
"""

from __future__ import annotations

from mqstore._config_keys import TypedKeys
from mqstore.layout import CQ_STORE_UNIT_SIZE, OS_PAGE_SIZE

import difflib
import ipaddress
import os
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

from mqstore.errors import ConfigError
from mqstore.roles import BrokerRole, FlushDiskType

__all__ = [
    "CQ_STORE_UNIT_SIZE",
    "DEFINITIONS",
    "OS_PAGE_SIZE",
    "RECORD_HEADROOM",
    "BrokerRole",
    "Definition",
    "FlushDiskType",
    "Rule",
    "StoreConfig",
    "camel_to_snake",
    "parse_properties",
    "render_config_doc",
]

RECORD_HEADROOM = 65536  # spec §1.1: a whole record may be max_message_size + 64 KiB
_INDEX_HEADER_SIZE, _INDEX_SLOT_SIZE, _INDEX_ENTRY_SIZE = 40, 4, 20  # spec §4.1
_HA_SLAVE_READ_BUFFER, _HA_FRAME_HEADER = 4 * 1024 * 1024, 12  # spec §13.1
_CQ_EXT_UNIT_HEADER, _CQ_EXT_UNIT_MAX = 20, 32767  # ConsumeQueueExt.CqExtUnit: short size

_INT_MAX = 2**31 - 1  # RocketMQ keeps most of these in Java ints
_LONG_MAX = 2**63 - 1


# ------------------------------------------------------------------------------------------------
# camelCase -> snake_case

_ACRONYM_BOUNDARY = re.compile(r"([A-Z]+)([A-Z][a-z])")  # "CRCOn" -> "CRC_On"
_WORD_BOUNDARY = re.compile(r"([a-z0-9])([A-Z])")  # "checkCRC" -> "check_CRC"


def camel_to_snake(name: str) -> str:
    """``flushIntervalCommitLog`` -> ``flush_interval_commit_log``; acronyms stay one word
    (``checkCRCOnRecover`` -> ``check_crc_on_recover``); snake_case passes through unchanged."""
    return _WORD_BOUNDARY.sub(r"\1_\2", _ACRONYM_BOUNDARY.sub(r"\1_\2", name)).lower()


# ------------------------------------------------------------------------------------------------
# Rules: what values a key accepts


@dataclass(frozen=True)
class Rule:
    """Allowed values of one key: a description (docs, error hints) and the check itself.

    ``check`` gets the coerced value and returns ``None`` or what is wrong with it. ``low``,
    ``high``, ``step`` and ``power_of_two`` describe integer rules for introspection (tests
    generate valid values from them).
    """

    description: str
    check: Callable[[Any], str | None] = field(repr=False, compare=False)
    low: int | None = None
    high: int | None = None
    step: int = 1
    power_of_two: bool = False


def _int_range(low: int, high: int, *, step: int = 1) -> Rule:
    description = f"{low} .. {high}" if step == 1 else f"multiple of {step} in {low} .. {high}"

    def check(value: int) -> str | None:
        if not low <= value <= high:
            return "out of range"
        if value % step:
            return f"not a multiple of {step}"
        return None

    return Rule(description, check, low, high, step)


def _power_of_two(low: int, high: int) -> Rule:
    def check(value: int) -> str | None:
        if not low <= value <= high:
            return "out of range"
        if value & (value - 1):
            return "not a power of two"
        return None

    return Rule(f"power of two in {low} .. {high}", check, low, high, power_of_two=True)


def _no_check(_value: Any) -> None:
    return None


def _enum_rule(enum_type: type[Enum]) -> Rule:
    return Rule(", ".join(member.value for member in enum_type), _no_check)


_BOOL = Rule("true, false (also yes/no, 1/0)", _no_check)
_POSITIVE = _int_range(1, _INT_MAX)
_NON_NEGATIVE = _int_range(0, _INT_MAX)
_PERCENT = _int_range(0, 100)

_DELAY_UNIT_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_DELAY_TOKEN = re.compile(r"(\d+)([smhd])")


def _check_delay_levels(value: str) -> str | None:
    tokens = value.split()
    if not tokens:
        return "empty (at least one level is needed)"
    bad = [token for token in tokens if not _DELAY_TOKEN.fullmatch(token)]
    return f"not a list of delays: {' '.join(bad)!r}" if bad else None


def _check_delete_when(value: str) -> str | None:
    for token in value.split(";"):
        token = token.strip()
        if not (token.isdigit() and len(token) <= 2 and int(token) <= 23):
            return f"not a list of hours: {token!r}"
    return None


_HOST_PORT = re.compile(r"(?:\[(?P<v6>[^\]]+)\]|(?P<v4>[^:\[\]]+)):(?P<port>\d{1,5})")


def _parse_host_port(value: str) -> tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]:
    """``"10.0.0.2:10911"`` / ``"[fe80::2]:10911"`` -> (address, port); ValueError otherwise."""
    match = _HOST_PORT.fullmatch(value)
    if match is None:
        raise ValueError("not host:port (IPv6 is written [::1]:10911)")
    port = int(match["port"])
    if not 1 <= port <= 65535:
        raise ValueError("port out of range 1 .. 65535")
    if match["v6"] is not None:
        return ipaddress.IPv6Address(match["v6"]), port
    return ipaddress.IPv4Address(match["v4"]), port


def _check_store_host(value: str) -> str | None:
    try:
        _parse_host_port(value)
    except ValueError as exc:
        return str(exc)
    return None


def _check_commit_log_path(value: str) -> str | None:
    if "," in value:
        return "a comma-separated multi-path list (RocketMQ 4.9 MultiPathMappedFileQueue), not supported"
    return None


_ROOT_DIR_RULE = Rule('"" or the directory passed to open', _no_check)
_COMMIT_LOG_PATH_RULE = Rule('one path (no commas); "" = ROOT/commitlog', _check_commit_log_path)
_DELAY_RULE = Rule("Ns, Nm, Nh or Nd, space-separated, at least one", _check_delay_levels)
_DELETE_WHEN_RULE = Rule('";"-separated hours 0 .. 23', _check_delete_when)
_SERVICE_MODE_RULE = Rule("threads, processes", lambda v: None if v in ("threads", "processes") else "unknown mode")
_STORE_HOST_RULE = Rule("IPv4:port or [IPv6]:port, port 1 .. 65535", _check_store_host)


# ------------------------------------------------------------------------------------------------
# Definitions


class _Invalid(Exception):
    """A raw value that can not be converted to the key's type (turned into ConfigError)."""


_INT_TEXT = re.compile(r"[+-]?\d+")
_TRUE_TEXT = frozenset({"true", "yes", "1"})
_FALSE_TEXT = frozenset({"false", "no", "0"})


def _to_int(raw: Any) -> int:
    if isinstance(raw, bool):  # bool is an int subclass; True as a size is a mistake
        raise _Invalid("a boolean, not an integer")
    if isinstance(raw, int):
        return raw
    if isinstance(raw, str) and _INT_TEXT.fullmatch(raw.strip()):
        return int(raw.strip())
    raise _Invalid("not an integer")


def _to_bool(raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, int) and raw in (0, 1):
        return bool(raw)
    if isinstance(raw, str):
        text = raw.strip().lower()
        if text in _TRUE_TEXT:
            return True
        if text in _FALSE_TEXT:
            return False
    raise _Invalid("not a boolean (true/false, yes/no, 1/0)")


def _to_str(raw: Any) -> str:
    if isinstance(raw, os.PathLike):
        raw = os.fspath(raw)
    if isinstance(raw, str):
        return str(raw).strip()
    raise _Invalid("not a string")


def _round_up_to_cq_unit(size: int) -> int:
    """RocketMQ's getMappedFileSizeConsumeQueue(): round up to whole 20-byte entries (spec §2)."""
    return -(-size // CQ_STORE_UNIT_SIZE) * CQ_STORE_UNIT_SIZE


@dataclass(frozen=True)
class Definition:
    """One configuration key: the single source for coercion, checks and docs."""

    name: str
    type: type
    default: Any
    unit: str
    rule: Rule
    doc: str
    java_name: str | None
    origin: str  # "4.9.7", "5.x", "BrokerConfig" or "mqstore"
    normalize: Callable[[Any], Any] | None = field(default=None, repr=False, compare=False)

    @property
    def allowed(self) -> str:
        """Human description of the allowed values (the validator)."""
        return self.rule.description

    @property
    def type_name(self) -> str:
        return "enum" if issubclass(self.type, Enum) else self.type.__name__

    def coerce(self, raw: Any) -> Any:
        """Convert ``raw`` (a Python value or text from a file) and check it; ConfigError if bad."""
        try:
            value = self._convert(raw)
        except _Invalid as exc:
            raise ConfigError(f"{self.name}: {raw!r} is {exc}", hint=self._hint()) from None
        if self.normalize is not None:
            value = self.normalize(value)
        problem = self.rule.check(value)
        if problem is not None:
            raise ConfigError(f"{self.name}: {raw!r} is {problem}", hint=self._hint())
        return value

    def _convert(self, raw: Any) -> Any:
        if issubclass(self.type, Enum):
            if isinstance(raw, self.type):
                return raw
            if isinstance(raw, str) and raw.strip().upper() in self.type.__members__:
                return self.type[raw.strip().upper()]
            raise _Invalid(f"not one of {self.allowed}")
        if self.type is bool:
            return _to_bool(raw)
        if self.type is int:
            return _to_int(raw)
        return _to_str(raw)

    def _hint(self) -> str:
        unit = f" {self.unit}" if self.unit != "-" else ""
        return f"{self.name} takes {self.allowed}{unit}"


_OWN = "mqstore"


def _key(
    name: str,
    type_: type,
    default: Any,
    unit: str,
    rule: Rule,
    doc: str,
    *,
    java: str | None,
    origin: str = "4.9.7",
    normalize: Callable[[Any], Any] | None = None,
) -> Definition:
    return Definition(name, type_, default, unit, rule, doc, java, origin, normalize)


# Order = order in docs/config.md: paths and roles, files and records, put path, flush and commit,
# transient pool, reads, index, consume queue ext, dispatch, HA, cleaning.
_TABLE: tuple[Definition, ...] = (
    _key("store_path_root_dir", str, "", "-", _ROOT_DIR_RULE,
         "Root of the store (commitlog/, consumequeue/, index/, checkpoint, abort, lock); "
         '"" = the directory passed to open (RocketMQ: ~/store); a store opened on another '
         'directory than this one is refused (ConfigError); "~" is expanded.',
         java="storePathRootDir"),
    _key("store_path_commit_log", str, "", "-", _COMMIT_LOG_PATH_RULE,
         '"" = ROOT/commitlog. A relative path is taken from the root, not from the working '
         "directory, so every process agrees; 4.9's comma-separated multi-path is refused.",
         java="storePathCommitLog"),
    _key("broker_role", BrokerRole, BrokerRole.ASYNC_MASTER, "-", _enum_rule(BrokerRole),
         "ASYNC_MASTER replicates best-effort; SYNC_MASTER makes puts wait for a slave "
         "(FLUSH_SLAVE_TIMEOUT / SLAVE_NOT_AVAILABLE); SLAVE refuses puts and appends replicated bytes.",
         java="brokerRole"),
    _key("flush_disk_type", FlushDiskType, FlushDiskType.ASYNC_FLUSH, "-", _enum_rule(FlushDiskType),
         "ASYNC_FLUSH: a background service flushes, a crash may lose the unflushed tail; "
         "SYNC_FLUSH: a put waits for group commit (FLUSH_DISK_TIMEOUT after sync_flush_timeout).",
         java="flushDiskType"),
    _key("store_host", str, "127.0.0.1:10911", "-", _STORE_HOST_RULE,
         "STOREHOSTADDRESS written into every record and into each msgId; an IP literal "
         "(IPv6 sets the STOREHOSTADDRESS_V6 sysflag). RocketMQ takes it from brokerIP1:listenPort.",
         java=None, origin=_OWN),
    # --- files and records -------------------------------------------------------------------
    _key("mapped_file_size_commit_log", int, 1024 * 1024 * 1024, "bytes",
         _int_range(OS_PAGE_SIZE, _INT_MAX // OS_PAGE_SIZE * OS_PAGE_SIZE, step=OS_PAGE_SIZE),
         "Size of every commit log file. Left at the default, a reopened store takes the size it was "
         "created with; another size is refused (ConfigError). Whole 4 KiB pages so flush/msync "
         "ranges and warm-up stay page aligned (RocketMQ accepts any int).",
         java="mappedFileSizeCommitLog"),
    _key("mapped_file_size_consume_queue", int, 300_000 * CQ_STORE_UNIT_SIZE, "bytes",
         _int_range(CQ_STORE_UNIT_SIZE, _INT_MAX // CQ_STORE_UNIT_SIZE * CQ_STORE_UNIT_SIZE,
                    step=CQ_STORE_UNIT_SIZE),
         "Size of every consume queue file (reused from the store like mapped_file_size_commit_log); "
         "rounded UP to a multiple of 20 (whole entries) when "
         "set, exactly like RocketMQ's getter, so 100 and 90 both become 100.",
         java="mappedFileSizeConsumeQueue", normalize=_round_up_to_cq_unit),
    _key("max_message_size", int, 4 * 1024 * 1024, "bytes", _int_range(1, _INT_MAX - RECORD_HEADROOM),
         "Largest body a put accepts (MESSAGE_ILLEGAL above); a whole record may be this + 64 KiB. "
         "A record too big for one commit log file is refused per message, not when opening.",
         java="maxMessageSize"),
    _key("max_topic_length", int, 127, "chars", _int_range(1, 127),
         "Longest topic a put accepts (MESSAGE_ILLEGAL above); at most 127 because V1 records store "
         "the topic length in one byte (same name as 5.x's deprecated maxTopicLength).",
         java="maxTopicLength", origin=_OWN),
    _key("check_crc_on_recover", bool, True, "-", _BOOL,
         "Recovery verifies every body CRC, so a torn or corrupted tail is cut off instead of "
         "being dispatched; off = faster restart, trusts the bytes.",
         java="checkCRCOnRecover"),
    _key("check_crc_on_read", bool, True, "-", _BOOL,
         "Reads verify the body CRC of every message they return (as Kafka's consumers check "
         "CRCs; RocketMQ does not): get_message stops before a damaged message and returns "
         "MESSAGE_CORRUPTED naming its offsets when it is the first, look-ups raise "
         "CorruptRecordError, query_message skips it; off = damaged bodies are returned as data. "
         "Cost (bench/test_crc_on_read.py): ~20 % on a consumer that copies 1 KiB bodies, several "
         "times a get that only takes zero-copy views without touching the bodies (turn it off "
         "there).",
         java=None, origin=_OWN),
    # --- put path -------------------------------------------------------------------------------
    _key("use_reentrant_lock_when_put_message", bool, True, "-", _BOOL,
         'Put lock kind: true = "mutex" (robust process-shared kernel mutex, released if the '
         'holder dies); false = "spin" (CAS on a shared-memory word, dead owner taken over).',
         java="useReentrantLockWhenPutMessage"),
    _key("os_page_cache_busy_time_out_mills", int, 1000, "ms", _int_range(1, _LONG_MAX),
         "When a put has held the lock longer than this, other puts fail fast with "
         "OS_PAGECACHE_BUSY instead of queueing behind a stalled page fault.",
         java="osPageCacheBusyTimeOutMills"),
    _key("lock_hold_warn_ms", int, 500, "ms", _POSITIVE,
         "Log a warning when one put holds the put lock longer than this (RocketMQ: fixed 500 ms).",
         java=None, origin=_OWN),
    _key("allocate_wait_timeout_ms", int, 5000, "ms", _POSITIVE,
         "How long a put waits for the allocate service to hand over the next commit log file "
         "before returning CREATE_MAPEDFILE_FAILED (RocketMQ: fixed 5 s).",
         java=None, origin=_OWN),
    _key("service_mode", str, "threads", "-", _SERVICE_MODE_RULE,
         'Where the owner runs the allocate, flush, dispatch (and ConsumeQueue flush) services: '
         '"threads" of the opening process, or "processes": one supervised OS process each (the '
         "node; `mqstore node`). Other processes attach the same way to either.",
         java=None, origin=_OWN),
    _key("topic_queue_table_slots", int, 16384, "count", _power_of_two(64, 1 << 22),
         'Capacity of the shared-memory topic-queue offset table ("topic-queueId" -> next queue '
         "offset); bounds how many queues one store can hold.",
         java=None, origin=_OWN),
    _key("message_delay_level", str, "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h",
         "-", _DELAY_RULE,
         "Delay of each DELAY level (level n = n-th entry); decides the deliver time stored as "
         "tagsCode for SCHEDULE_TOPIC_XXXX and the highest level (levels above are clamped).",
         java="messageDelayLevel"),
    _key("warm_maped_file_enable", bool, False, "-", _BOOL,
         "Pre-fault every page of a new commit log file (and mlock it) in the allocator, so the "
         "put path never takes a page fault; costs a full file write per allocation.",
         java="warmMapedFileEnable"),
    _key("flush_least_pages_when_warm_maped_file", int, 1024 // 4 * 16, "pages", _NON_NEGATIVE,
         "While warming a file under SYNC_FLUSH, force it every this many pages (4096 = 16 MiB) "
         "so warm-up does not build one huge dirty range.",
         java="flushLeastPagesWhenWarmMapedFile"),
    # --- flush and commit ------------------------------------------------------------------------
    _key("flush_interval_commit_log", int, 500, "ms", _POSITIVE,
         "ASYNC_FLUSH flush service period; bounds how much acknowledged data a crash can lose.",
         java="flushIntervalCommitLog"),
    _key("flush_commit_log_least_pages", int, 4, "pages", _NON_NEGATIVE,
         "An async flush only runs once this many dirty 4 KiB pages piled up (0 = any dirty byte); "
         "fewer, larger msyncs.",
         java="flushCommitLogLeastPages"),
    _key("flush_commit_log_thorough_interval", int, 10_000, "ms", _NON_NEGATIVE,
         "At least this often an async flush ignores least-pages and flushes everything, so a "
         "slow trickle of puts still reaches disk.",
         java="flushCommitLogThoroughInterval"),
    _key("flush_commit_log_timed", bool, True, "-", _BOOL,
         "true: the async flusher sleeps flush_interval_commit_log between rounds; false: puts "
         "wake it (real-time flush, more msyncs, smaller loss window).",
         java="flushCommitLogTimed"),
    _key("commit_interval_commit_log", int, 200, "ms", _POSITIVE,
         "Transient pool only: period of the commit service copying write buffers into the file; "
         "readers only see committed bytes.",
         java="commitIntervalCommitLog"),
    _key("commit_commit_log_least_pages", int, 4, "pages", _NON_NEGATIVE,
         "Transient pool only: commit once this many pages are pending (0 = any byte).",
         java="commitCommitLogLeastPages"),
    _key("commit_commit_log_thorough_interval", int, 200, "ms", _NON_NEGATIVE,
         "Transient pool only: commit everything at least this often regardless of least-pages.",
         java="commitCommitLogThoroughInterval"),
    _key("sync_flush_timeout", int, 5000, "ms", _int_range(1, _LONG_MAX),
         "SYNC_FLUSH: how long a put waits for group commit before FLUSH_DISK_TIMEOUT "
         "(the message is stored, its durability unconfirmed).",
         java="syncFlushTimeout"),
    _key("group_commit_interval_ms", int, 10, "ms", _POSITIVE,
         "SYNC_FLUSH: the group commit service swaps its request lists and flushes at least this "
         "often (RocketMQ: fixed 10 ms); trades put latency against msync count.",
         java=None, origin=_OWN),
    _key("flush_interval_consume_queue", int, 1000, "ms", _POSITIVE,
         "Consume queue flush period; consume queues are rebuilt from the commit log on recovery, "
         "so this bounds rebuild work, not data loss.",
         java="flushIntervalConsumeQueue"),
    _key("flush_consume_queue_least_pages", int, 2, "pages", _NON_NEGATIVE,
         "A consume queue flush only runs once this many dirty pages piled up (0 = any byte).",
         java="flushConsumeQueueLeastPages"),
    _key("flush_consume_queue_thorough_interval", int, 60_000, "ms", _NON_NEGATIVE,
         "Full consume queue flush at least this often; also persists checkpoint.logicsMsgTimestamp.",
         java="flushConsumeQueueThoroughInterval"),
    # --- transient store pool ------------------------------------------------------------------
    _key("transient_store_pool_enable", bool, False, "-", _BOOL,
         "Append into mlocked write buffers in shared memory (/dev/shm, one pool per store, used by "
         "every writer process) and let the commit service copy them into the CommitLog files "
         "(spec §7); readers see committed bytes only, puts get OS_PAGECACHE_BUSY while the buffer "
         "they need still holds uncommitted bytes. Refused with SYNC_FLUSH or on a SLAVE (RocketMQ "
         "silently ignores it there).",
         java="transientStorePoolEnable"),
    _key("transient_store_pool_size", int, 5, "count", _POSITIVE,
         "Buffers in the pool, each one commit log file big and mlocked: memory = this x "
         "mapped_file_size_commit_log.",
         java="transientStorePoolSize"),
    _key("fast_fail_if_no_buffer_in_store_pool", bool, False, "-", _BOOL,
         "Accepted for RocketMQ configurations; changes nothing here: buffers are not borrowed "
         "per allocated file (file i writes into buffer i mod the pool size), and a put whose "
         "buffer is not free always fails at once with OS_PAGECACHE_BUSY (docs/node.md).",
         java="fastFailIfNoBufferInStorePool"),
    # --- reads ------------------------------------------------------------------------------------
    _key("max_transfer_bytes_on_message_in_memory", int, 256 * 1024, "bytes", _POSITIVE,
         "A get stops adding messages past this many bytes when the data is still in page cache.",
         java="maxTransferBytesOnMessageInMemory"),
    _key("max_transfer_count_on_message_in_memory", int, 32, "count", _POSITIVE,
         "A get returns at most this many messages when the data is in page cache.",
         java="maxTransferCountOnMessageInMemory"),
    _key("max_transfer_bytes_on_message_in_disk", int, 64 * 1024, "bytes", _POSITIVE,
         "Byte cap of one get when the data is probably on disk (cold reads cost real I/O).",
         java="maxTransferBytesOnMessageInDisk"),
    _key("max_transfer_count_on_message_in_disk", int, 8, "count", _POSITIVE,
         "Message cap of one get when the data is probably on disk.",
         java="maxTransferCountOnMessageInDisk"),
    _key("access_message_in_memory_max_ratio", int, 40, "percent", _PERCENT,
         "Data further behind the log end than this share of physical RAM counts as on disk: "
         "smaller get batches and suggestPullingFromSlave.",
         java="accessMessageInMemoryMaxRatio"),
    _key("offset_check_in_slave", bool, False, "-", _BOOL,
         "false: a SLAVE answers out-of-range pulls with the requested offset instead of a "
         "corrected one, so consumers do not jump because the slave lags.",
         java="offsetCheckInSlave"),
    _key("time_lookup_warm_bytes", int, 8192, "bytes", _NON_NEGATIVE,
         "Time lookups search the ConsumeQueue units in the last this-many bytes (whole pages) "
         "first when the target is newer than their first unit (Kafka's hot/cold split), so "
         "lookups near the tail touch at most these pages; 0 = plain binary search.",
         java=None, origin=_OWN),
    _key("default_query_max_num", int, 32, "count", _POSITIVE,
         "Default result cap of key/time queries when the caller gives none.",
         java="defaultQueryMaxNum"),
    _key("long_polling_enable", bool, True, "-", _BOOL,
         "Hold pulls that found nothing until a message arrives: the dispatcher wakes every "
         "waiter of the 'dispatched' channel after each applied batch (costs dispatch CPU); "
         "false = short polling, waiters are woken only when dispatch has caught up.",
         java="longPollingEnable", origin="BrokerConfig"),
    _key("short_polling_time_mills", int, 1000, "ms", _POSITIVE,
         "Hold time of a pull that found nothing when long polling is off.",
         java="shortPollingTimeMills", origin="BrokerConfig"),
    # --- index ------------------------------------------------------------------------------------
    _key("message_index_enable", bool, True, "-", _BOOL,
         "Build the key index (UNIQ_KEY and KEYS) so messages can be found by key and time.",
         java="messageIndexEnable"),
    _key("message_index_safe", bool, False, "-", _BOOL,
         "Abnormal recovery starts early enough to rebuild index entries lost in the crash "
         "(uses checkpoint.indexMsgTimestamp); slower recovery.",
         java="messageIndexSafe"),
    _key("max_hash_slot_num", int, 5_000_000, "count", _POSITIVE,
         "Hash slots per index file; fewer slots = longer collision chains per key lookup. Reused "
         "from the store's mqstore.config.json when left at the default.",
         java="maxHashSlotNum"),
    _key("max_index_num", int, 20_000_000, "count", _int_range(2, _INT_MAX),
         "Entries per index file (entry #0 is never used, so at least 2); with max_hash_slot_num "
         "it fixes the index file size (420000040 bytes by default).",
         java="maxIndexNum"),
    _key("max_msgs_num_batch", int, 64, "count", _POSITIVE,
         "Most offsets one index query returns per call.",
         java="maxMsgsNumBatch"),
    # --- consume queue ext ------------------------------------------------------------------------
    _key("enable_consume_queue_ext", bool, False, "-", _BOOL,
         "Keep per-entry filter bitmaps in consumequeue_ext/ (tagsCode becomes an ext address).",
         java="enableConsumeQueueExt"),
    _key("mapped_file_size_consume_queue_ext", int, 48 * 1024 * 1024, "bytes",
         _int_range(_CQ_EXT_UNIT_HEADER, _INT_MAX),
         "Size of every consume queue ext file (at least one 20-byte unit header).",
         java="mappedFileSizeConsumeQueueExt"),
    _key("bit_map_length_consume_queue_ext", int, 64, "bits",
         _int_range(0, (_CQ_EXT_UNIT_MAX - _CQ_EXT_UNIT_HEADER) * 8, step=8),
         "Length of the filter bitmap stored per ext unit; whole bytes, and a unit (20-byte header "
         "+ bitmap) is at most 32767 bytes because its size is a Java short.",
         java="bitMapLengthConsumeQueueExt"),
    # --- dispatch and recovery ---------------------------------------------------------------------
    _key("enable_build_consume_queue_concurrently", bool, False, "-", _BOOL,
         "Parse dispatch batches (4 MiB) in parallel and apply them in order (5.x concurrent "
         "reput); fixes dispatch lag at high put rates.",
         java="enableBuildConsumeQueueConcurrently", origin="5.x"),
    _key("batch_dispatch_request_thread_pool_nums", int, 16, "count", _POSITIVE,
         "Parser threads of the concurrent reput (they parse without the GIL, so more than the "
         "CPUs only adds switching).",
         java="batchDispatchRequestThreadPoolNums", origin="5.x"),
    _key("dispatch_batch_bytes", int, 4 * 1024 * 1024, "bytes", _POSITIVE,
         "The concurrent reput cuts the log into batches of whole records of at least this many "
         "bytes (5.x: 4 MiB, fixed); smaller batches follow a slow writer with less delay, larger "
         "ones cost less hand-off per record.",
         java=None, origin=_OWN),
    _key("auto_message_version_on_topic_len", bool, True, "-", _BOOL,
         "Write V2 records (2-byte topic length) for topics longer than 127; mqstore caps topics "
         "at max_topic_length, so this only matters for reading 5.x stores.",
         java="autoMessageVersionOnTopicLen", origin="5.x"),
    _key("duplication_enable", bool, False, "-", _BOOL,
         "Dispatch only below the confirm offset (used when another replica decides what is "
         "committed).",
         java="duplicationEnable"),
    # --- HA -------------------------------------------------------------------------------------------
    _key("ha_listen_port", int, 10912, "-", _int_range(0, 65535),
         "TCP port the master accepts slaves on (0 = any free port, for tests).",
         java="haListenPort"),
    _key("ha_send_heartbeat_interval", int, 5000, "ms", _POSITIVE,
         "Master sends an empty frame after this much silence so the slave keeps the link.",
         java="haSendHeartbeatInterval"),
    _key("ha_housekeeping_interval", int, 20_000, "ms", _POSITIVE,
         "A replication connection silent for this long is closed (dead peer detection).",
         java="haHousekeepingInterval"),
    _key("ha_transfer_batch_size", int, 32 * 1024, "bytes",
         _int_range(1, _HA_SLAVE_READ_BUFFER - _HA_FRAME_HEADER),
         "Most commit log bytes per replication frame; a frame must fit the slave's 4 MiB read "
         "buffer with its 12-byte header.",
         java="haTransferBatchSize"),
    _key("ha_slave_fallbehind_max", int, 256 * 1024 * 1024, "bytes", _POSITIVE,
         "SYNC_MASTER: a slave further behind than this is not waited for (SLAVE_NOT_AVAILABLE).",
         java="haSlaveFallbehindMax"),
    _key("slave_timeout", int, 3000, "ms", _POSITIVE,
         "SYNC_MASTER: how long a put waits for the slave ack before FLUSH_SLAVE_TIMEOUT.",
         java="slaveTimeout"),
    # --- cleaning -------------------------------------------------------------------------------------
    _key("delete_when", str, "04", "-", _DELETE_WHEN_RULE,
         "Hours of the day (local time) when expired commit log files are deleted, e.g. \"04;16\".",
         java="deleteWhen"),
    _key("file_reserved_time", int, 72, "hours", _NON_NEGATIVE,
         "Commit log files whose last write is older than this are expired (deleted at "
         "delete_when, or at once when the disk is full).",
         java="fileReservedTime"),
    _key("disk_max_used_space_ratio", int, 75, "percent", _PERCENT,
         "Disk usage above which expired files are deleted at any hour; the effective value is "
         "clamped to 10 .. 95 (effective_disk_max_used_space_ratio).",
         java="diskMaxUsedSpaceRatio"),
    _key("clean_resource_interval", int, 10_000, "ms", _POSITIVE,
         "Period of the cleaning service (first run 60 s after start); the disk is checked every "
         "10 s in between.",
         java="cleanResourceInterval"),
    _key("delete_commit_log_files_interval", int, 100, "ms", _NON_NEGATIVE,
         "Pause between two commit log file deletions, to spread the I/O.",
         java="deleteCommitLogFilesInterval"),
    _key("delete_consume_queue_files_interval", int, 100, "ms", _NON_NEGATIVE,
         "Pause after each consume queue that deleted files.",
         java="deleteConsumeQueueFilesInterval"),
    _key("destroy_maped_file_interval_forcibly", int, 120_000, "ms", _NON_NEGATIVE,
         "A file still held (a flush, an index query) this long after its deletion started is "
         "deleted anyway; views handed to readers keep their mapping valid either way.",
         java="destroyMapedFileIntervalForcibly"),
    _key("redelete_hanged_file_interval", int, 120_000, "ms", _NON_NEGATIVE,
         "Retry period for a first CommitLog file whose deletion hung (still held).",
         java="redeleteHangedFileInterval"),
    _key("clean_file_forcibly_enable", bool, True, "-", _BOOL,
         "Above disk_space_clean_forcibly_ratio, delete commit log files even if not expired, "
         "oldest first.",
         java="cleanFileForciblyEnable"),
    _key("delete_file_batch_max", int, 10, "count", _POSITIVE,
         "Most commit log files deleted in one cleaning run.",
         java="deleteFileBatchMax", origin="5.x"),
    _key("disk_space_warning_level_ratio", int, 90, "percent", _PERCENT,
         "Disk usage above which the store refuses puts (DISK_FULL) and cleans at once "
         "(4.9: JVM property, 0.90).",
         java="diskSpaceWarningLevelRatio", origin="5.x"),
    _key("disk_space_clean_forcibly_ratio", int, 85, "percent", _PERCENT,
         "Disk usage above which files are cleaned at once, expired or not (4.9: JVM property, 0.85).",
         java="diskSpaceCleanForciblyRatio", origin="5.x"),
)

DEFINITIONS: Mapping[str, Definition] = MappingProxyType({d.name: d for d in _TABLE})
"""Every key, name -> Definition, in documentation order."""


# ------------------------------------------------------------------------------------------------
# Combinations checked by StoreConfig.validate()


@dataclass(frozen=True)
class _Combination:
    description: str  # for docs/config.md
    check: Callable[[StoreConfig], tuple[str, str] | None]  # -> (message, hint) when violated


def _pool_with_sync_flush(cfg: StoreConfig) -> tuple[str, str] | None:
    if cfg.transient_store_pool_enable and cfg.flush_disk_type is FlushDiskType.SYNC_FLUSH:
        return ("transient_store_pool_enable=true conflicts with flush_disk_type=SYNC_FLUSH "
                "(RocketMQ silently ignores the pool under sync flush; mqstore refuses)",
                "set transient_store_pool_enable=false, or use flush_disk_type=ASYNC_FLUSH")
    return None


def _pool_on_slave(cfg: StoreConfig) -> tuple[str, str] | None:
    if cfg.transient_store_pool_enable and cfg.broker_role is BrokerRole.SLAVE:
        return ("transient_store_pool_enable=true conflicts with broker_role=SLAVE (a slave appends "
                "replicated bytes straight into the files; RocketMQ silently ignores the pool)",
                "set transient_store_pool_enable=false on slaves")
    return None


def _index_file_too_big(cfg: StoreConfig) -> tuple[str, str] | None:
    if cfg.index_file_size > _INT_MAX:
        return (f"max_hash_slot_num={cfg.max_hash_slot_num} and max_index_num={cfg.max_index_num} "
                f"make index files of {cfg.index_file_size} bytes, above {_INT_MAX} "
                "(RocketMQ computes the size as a Java int)",
                "lower max_index_num or max_hash_slot_num")
    return None


@dataclass(frozen=True)
class _Unimplemented:
    """Keys accepted from RocketMQ configurations whose feature mqstore does not have yet: a
    value other than the default is refused when a store opens (never silently ignored)."""

    keys: tuple[str, ...]
    why: str  # what is missing
    hint: str


_UNIMPLEMENTED: tuple[_Unimplemented, ...] = (
    _Unimplemented(("broker_role", "ha_listen_port", "ha_send_heartbeat_interval", "ha_housekeeping_interval",
                    "ha_transfer_batch_size", "ha_slave_fallbehind_max", "slave_timeout", "offset_check_in_slave",
                    "duplication_enable"),
                   "master/slave replication is not implemented yet, so a SYNC_MASTER would acknowledge puts no "
                   "slave has and a SLAVE would never receive anything",
                   "leave broker_role at ASYNC_MASTER and the HA settings at their defaults"),
    _Unimplemented(("enable_consume_queue_ext", "mapped_file_size_consume_queue_ext",
                    "bit_map_length_consume_queue_ext"),
                   "ConsumeQueueExt units and bitmap filters are not implemented",
                   "leave enable_consume_queue_ext=false and the consume queue ext sizes at their defaults"),
)
UNIMPLEMENTED_KEYS: frozenset[str] = frozenset(k for rule in _UNIMPLEMENTED for k in rule.keys)
"""Keys refused by ``validate()`` unless left at their default."""


def _unimplemented(cfg: StoreConfig) -> tuple[str, str] | None:
    found = []
    for rule in _UNIMPLEMENTED:
        changed = [f"{k}={_plain(cfg._values[k])}" for k in rule.keys if cfg._values[k] != DEFINITIONS[k].default]
        if changed:
            found.append((f"{', '.join(changed)} is refused: {rule.why}", rule.hint))
    if not found:
        return None
    return "; ".join(m for m, _ in found), "; ".join(h for _, h in found)


_COMBINATIONS: tuple[_Combination, ...] = (
    _Combination("A value other than the default for a key whose feature is not implemented yet: "
                 "`broker_role` (only `ASYNC_MASTER`), the HA keys (`ha_*`, `slave_timeout`, "
                 "`offset_check_in_slave`, `duplication_enable`) until replication exists, and the "
                 "ConsumeQueueExt keys (`enable_consume_queue_ext`, `*_consume_queue_ext`).", _unimplemented),
    _Combination("`transient_store_pool_enable` with `flush_disk_type=SYNC_FLUSH` (RocketMQ "
                 "silently ignores the pool; mqstore refuses).", _pool_with_sync_flush),
    _Combination("`transient_store_pool_enable` with `broker_role=SLAVE` (RocketMQ silently "
                 "ignores the pool; mqstore refuses).", _pool_on_slave),
    _Combination("`max_hash_slot_num` and `max_index_num` giving an index file above 2147483647 "
                 "bytes (40 + 4 x slots + 20 x entries).", _index_file_too_big),
)


# ------------------------------------------------------------------------------------------------
# broker.conf keys that are not store keys

# Broker, remoting and store settings of RocketMQ that mqstore does not implement: collected in
# StoreConfig.ignored_broker_keys (putMsgIndexHightWater is read by nothing in 4.9.7's store, nor is
# 5.x's maxRecoveryCommitlogFiles in any release; diskFallRecorded feeds the broker's statistics,
# which mqstore does not keep). An unlisted key is ignored too unless it looks like a typo of a
# store key (see _TYPO_CUTOFF).
_OTHER_ROCKETMQ_KEYS = frozenset(camel_to_snake(key) for key in """
    brokerClusterName brokerName brokerId brokerIP1 brokerIP2 namesrvAddr listenPort rocketmqHome
    brokerConfigPath brokerPermission defaultTopicQueueNums autoCreateTopicEnable clusterTopicEnable
    brokerTopicEnable autoCreateSubscriptionGroup messageStorePlugIn msgTraceTopicName
    traceTopicEnable sendMessageThreadPoolNums putMessageFutureThreadPoolNums
    pullMessageThreadPoolNums litePullMessageThreadPoolNums ackMessageThreadPoolNums
    processReplyMessageThreadPoolNums queryMessageThreadPoolNums adminBrokerThreadPoolNums
    clientManageThreadPoolNums consumerManageThreadPoolNums heartbeatThreadPoolNums
    endTransactionThreadPoolNums flushConsumerOffsetInterval flushConsumerOffsetHistoryInterval
    rejectTransactionMessage fetchNamesrvAddrByAddressServer sendThreadPoolQueueCapacity
    putThreadPoolQueueCapacity pullThreadPoolQueueCapacity replyThreadPoolQueueCapacity
    queryThreadPoolQueueCapacity clientManagerThreadPoolQueueCapacity
    consumerManagerThreadPoolQueueCapacity heartbeatThreadPoolQueueCapacity
    endTransactionPoolQueueCapacity filterServerNums notifyConsumerIdsChangedEnable highSpeedMode
    commercialEnable commercialTimerCount commercialTransCount commercialBigCount
    commercialBaseCount transferMsgByHeap maxDelayTime regionId registerBrokerTimeoutMills
    slaveReadEnable disableConsumeIfConsumerReadSlowly consumerFallbehindThreshold
    brokerFastFailureEnable waitTimeMillsInSendQueue waitTimeMillsInPullQueue
    waitTimeMillsInHeartbeatQueue waitTimeMillsInTransactionQueue startAcceptSendRequestTimeStamp
    traceOn enableCalcFilterBitMap expectConsumerNumUseFilter maxErrorRateOfBloomFilter
    filterDataCleanTimeSpan filterSupportRetry enablePropertyFilter compressedRegister
    forceRegister registerNameServerPeriod transactionTimeOut transactionCheckMax
    transactionCheckInterval aclEnable storeReplyMessageEnable autoDeleteUnusedStats
    isolateLogEnable enableDetailStat enableControllerMode controllerAddr enableSlaveActingMaster
    serverWorkerThreads serverCallbackExecutorThreads serverSelectorThreads
    serverOnewaySemaphoreValue serverAsyncSemaphoreValue serverChannelMaxIdleTimeSeconds
    serverSocketSndBufSize serverSocketRcvBufSize serverPooledByteBufAllocatorEnable
    useEpollNativeSelector writeBufferHighWaterMark writeBufferLowWaterMark serverSocketBacklog
    clientWorkerThreads clientCallbackExecutorThreads clientOnewaySemaphoreValue
    clientAsyncSemaphoreValue connectTimeoutMillis channelNotActiveInterval
    clientChannelMaxIdleTimeSeconds clientSocketSndBufSize clientSocketRcvBufSize
    clientPooledByteBufAllocatorEnable clientCloseSocketIfTimeout useTLS
    haMasterAddress flushDelayOffsetInterval debugLockEnable dLegerGroup dLegerPeers dLegerSelfId
    preferredLeaderId enableBatchPush enableScheduleMessageStats enableLmq enableMultiDispatch
    maxLmqConsumeQueueNum enableScheduleAsyncDeliver scheduleAsyncDeliverMaxPendingLimit
    scheduleAsyncDeliverMaxResendNum2Blocked storePathDLedgerCommitLog storePathEpochFile
    storePathBrokerIdentity readOnlyCommitLogStorePaths mapperFileSizeBatchConsumeQueue
    maxFilterMessageSize putMessageTimeout haMaxGapNotInSync writeWithoutMmap
    maxBatchDeleteFilesNum dispatchCqThreads dispatchCqCacheNum enableAsyncReput
    recheckReputOffsetFromCq enabledAppendPropCRC forceVerifyPropCRC
    travelCqFileNumWhenGetMessage correctLogicMinOffsetSleepInterval
    correctLogicMinOffsetForceInterval wakeCommitWhenPutMessage wakeFlushWhenPutMessage
    enableCleanExpiredOffset maxAsyncPutMessageRequests pullBatchMaxMessageCount totalReplicas
    inSyncReplicas minInSyncReplicas allAckInSyncStateSet enableAutoInSyncReplicas
    haFlowControlEnable maxHaTransferByteInSecond haMaxTimeSlaveNotCatchup readUnCommitted
    spinLockCollisionRetreatOptimalDegree useABSLock topicQueueLockNum timerWheelEnable
    putMsgIndexHightWater diskFallRecorded maxRecoveryCommitlogFiles
""".split())

# Store keys whose non-default value would change the on-disk format: refused, never ignored.
# snake_case name -> (accepted values, lower case; why)
_REFUSED_UNLESS = {
    "enable_d_leger_commit_log": (_FALSE_TEXT, "DLedger commit logs are a different file format; "
                                  "mqstore implements the classic master/slave store"),
    "store_type": (frozenset({"default"}), "mqstore keeps consume queues in files, not in RocksDB"),
}

_TYPO_CUTOFF = 0.9  # difflib ratio above which an unknown file key is taken for a misspelt store key


# ------------------------------------------------------------------------------------------------
# StoreConfig


def _definition(key: str) -> Definition:
    definition = DEFINITIONS.get(key)
    if definition is None:
        raise _unknown_key(key)
    return definition


def _unknown_key(key: str) -> ConfigError:
    snake = camel_to_snake(key)
    if snake in DEFINITIONS:
        return ConfigError(f"unknown configuration key {key!r}; did you mean {snake!r}?",
                           hint="keyword arguments are snake_case; camelCase is for broker.conf")
    closest = difflib.get_close_matches(snake, DEFINITIONS.keys(), n=1, cutoff=0.0)
    suggestion = f"; did you mean {closest[0]!r}?" if closest else ""
    return ConfigError(f"unknown configuration key {key!r}{suggestion}")


def _plain(value: Any) -> Any:
    return value.value if isinstance(value, Enum) else value


class StoreConfig(TypedKeys):
    """Every setting of one store. Keyword arguments only; unknown keys and bad values raise
    ConfigError at once, combinations are checked by ``validate()`` (called when a store opens).

    >>> StoreConfig(flush_disk_type="SYNC_FLUSH", mapped_file_size_commit_log=1 << 20).is_sync_flush
    True
    """

    __slots__ = ("_values", "_ignored_broker_keys", "_explicit")
    _values: dict[str, Any]
    _ignored_broker_keys: tuple[str, ...]
    _explicit: frozenset[str]

    def __init__(self, **settings: Any) -> None:
        values = {name: definition.default for name, definition in DEFINITIONS.items()}
        for key, raw in settings.items():
            values[key] = _definition(key).coerce(raw)
        object.__setattr__(self, "_values", values)
        object.__setattr__(self, "_ignored_broker_keys", ())
        object.__setattr__(self, "_explicit", frozenset(settings))

    # --- attribute protocol: keys are read through generated properties (below the class) ------

    def __setattr__(self, name: str, value: Any) -> None:
        definition = DEFINITIONS.get(name)
        if definition is None:
            if hasattr(type(self), name):
                raise AttributeError(f"{name} is derived from other keys and can not be set")
            raise _unknown_key(name)
        self._values[name] = definition.coerce(value)
        object.__setattr__(self, "_explicit", self._explicit | {name})

    def __getattr__(self, name: str) -> Any:  # only reached for names that are not keys
        closest = difflib.get_close_matches(name, DEFINITIONS.keys(), n=1)
        suggestion = f"; did you mean {closest[0]!r}?" if closest else ""
        raise AttributeError(f"StoreConfig has no key {name!r}{suggestion}")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StoreConfig):
            return NotImplemented
        return self._values == other._values

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        changed = ", ".join(f"{k}={v!r}" for k, v in self.to_dict(changed_only=True).items())
        return f"StoreConfig({changed})"

    def __reduce__(self) -> tuple[Any, ...]:
        values = {k: v for k, v in self.to_dict().items() if k in self._explicit or v != _plain(DEFINITIONS[k].default)}
        return (_restore, (values, self._ignored_broker_keys, tuple(sorted(self._explicit))))

    # --- copies and plain data ----------------------------------------------------------------

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        """All key names, in documentation order."""
        return tuple(DEFINITIONS)

    def replace(self, **changes: Any) -> StoreConfig:
        """A copy with ``changes`` applied (coerced and checked like the constructor)."""
        copy = _restore({}, self._ignored_broker_keys, self._explicit | set(changes))
        copy._values.update(self._values)
        for key, raw in changes.items():
            copy._values[key] = _definition(key).coerce(raw)
        return copy

    def to_dict(self, *, changed_only: bool = False) -> dict[str, Any]:
        """Plain values (enums as their names); ``changed_only`` drops keys left at default."""
        return {name: _plain(value) for name, value in self._values.items()
                if not changed_only or value != DEFINITIONS[name].default}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StoreConfig:
        """Inverse of ``to_dict`` (missing keys take their defaults)."""
        return cls(**data)

    @property
    def explicit_keys(self) -> frozenset[str]:
        """The keys somebody chose (constructor, replace(), assignment, a broker.conf line),
        whatever their value; the others are at their defaults because nobody set them. A
        reopened store takes its file sizes from disk unless they are here; an attached store
        refuses those of them that differ from the owner's."""
        return self._explicit

    @property
    def ignored_broker_keys(self) -> tuple[str, ...]:
        """Keys of the loaded broker.conf that are broker (not store) settings, as written there."""
        return self._ignored_broker_keys

    # --- combinations ---------------------------------------------------------------------------

    def validate(self) -> StoreConfig:
        """Refuse impossible combinations of keys (each key alone is checked when set).

        Raises one ConfigError listing every violated combination; returns ``self`` otherwise.
        """
        problems = [found for rule in _COMBINATIONS if (found := rule.check(self)) is not None]
        if problems:
            raise ConfigError("; ".join(message for message, _ in problems),
                              hint="; ".join(hint for _, hint in problems))
        return self

    # --- derived values -------------------------------------------------------------------------

    @property
    def put_lock_kind(self) -> Literal["mutex", "spin"]:
        """spec §9.3: "mutex" (robust kernel mutex) or "spin" (CAS on a shared-memory word)."""
        return "mutex" if self._values["use_reentrant_lock_when_put_message"] else "spin"

    @property
    def is_sync_flush(self) -> bool:
        """flush_disk_type is SYNC_FLUSH (puts wait for group commit)."""
        return self._values["flush_disk_type"] is FlushDiskType.SYNC_FLUSH

    @property
    def is_slave(self) -> bool:
        """broker_role is SLAVE (puts are refused)."""
        return self._values["broker_role"] is BrokerRole.SLAVE

    @property
    def max_record_size(self) -> int:
        """spec §1.1: the largest whole record a put may encode (max_message_size + 64 KiB)."""
        return int(self._values["max_message_size"]) + RECORD_HEADROOM

    @property
    def effective_disk_max_used_space_ratio(self) -> int:
        """spec §14: disk_max_used_space_ratio as RocketMQ's getter returns it, clamped to 10 .. 95."""
        return min(95, max(10, int(self._values["disk_max_used_space_ratio"])))

    @property
    def index_file_size(self) -> int:
        """spec §4.1: bytes of one index file (420000040 by default)."""
        slots, entries = int(self._values["max_hash_slot_num"]), int(self._values["max_index_num"])
        return _INDEX_HEADER_SIZE + _INDEX_SLOT_SIZE * slots + _INDEX_ENTRY_SIZE * entries

    @property
    def delay_levels_ms(self) -> tuple[int, ...]:
        """message_delay_level parsed: the delay of level n is ``delay_levels_ms[n - 1]``."""
        return tuple(int(m[1]) * _DELAY_UNIT_MS[m[2]]
                     for m in map(_DELAY_TOKEN.fullmatch, self._values["message_delay_level"].split())
                     if m is not None)

    @property
    def delete_when_hours(self) -> frozenset[int]:
        """delete_when parsed: hours of the day (0 .. 23) when expired files are deleted."""
        return frozenset(int(hour) for hour in self._values["delete_when"].split(";"))

    @property
    def store_host_address(self) -> tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]:
        """store_host parsed: (address, port); ``address.packed`` is what records carry."""
        return _parse_host_port(self._values["store_host"])

    def root_dir(self, root: str | os.PathLike[str] | None = None) -> str:
        """The store root: ``root`` (the directory passed to open) if given, else
        store_path_root_dir, with "~" expanded."""
        if root is not None:
            return os.path.expanduser(os.fspath(root))
        configured = str(self._values["store_path_root_dir"])
        if configured:
            return os.path.expanduser(configured)
        raise ConfigError("no store directory: store_path_root_dir is empty and none was given",
                          hint="open the store with a directory, or set store_path_root_dir")

    def commit_log_dir(self, root: str | os.PathLike[str] | None = None) -> str:
        """spec §2: store_path_commit_log, or ROOT/commitlog; relative paths hang off the root."""
        configured = os.path.expanduser(str(self._values["store_path_commit_log"]))
        if os.path.isabs(configured):
            return configured
        return os.path.join(self.root_dir(root), configured or "commitlog")

    # --- broker.conf ----------------------------------------------------------------------------

    @classmethod
    def from_broker_conf(cls, path_or_text: str | os.PathLike[str], /, **overrides: Any) -> StoreConfig:
        """Load a RocketMQ ``broker.conf`` (Java .properties) and apply ``overrides`` on top.

        ``path_or_text`` is a path (``os.PathLike``, or a ``str`` without line breaks) or the text
        itself (a ``str`` containing a line break). camelCase and snake_case keys are accepted.
        Broker settings that are not store settings end up in ``ignored_broker_keys``; a bad value
        of a store key, or a key that looks like a misspelt store key, raises ConfigError naming
        the file, the line and the key.
        """
        source, text = _read_broker_conf(path_or_text)
        values: dict[str, Any] = {}
        ignored: dict[str, None] = {}  # ordered set
        for lineno, key, raw in parse_properties(text, source=source):
            where = f"{source}:{lineno}: {key}"
            name = camel_to_snake(key)
            definition = DEFINITIONS.get(name)
            if definition is not None:
                try:
                    values[name] = definition.coerce(raw)
                except ConfigError as exc:
                    raise ConfigError(f"{where}: {exc.args[0]}", hint=exc.hint) from None
            elif name in _REFUSED_UNLESS:
                accepted, why = _REFUSED_UNLESS[name]
                if raw.lower() not in accepted:
                    raise ConfigError(f"{where}={raw!r} is not supported: {why}",
                                      hint=f"remove the {key} line")
                ignored[key] = None
            elif name in _OTHER_ROCKETMQ_KEYS:
                ignored[key] = None
            else:
                typo = difflib.get_close_matches(name, DEFINITIONS.keys(), n=1, cutoff=_TYPO_CUTOFF)
                if typo:
                    java = DEFINITIONS[typo[0]].java_name or typo[0]
                    raise ConfigError(f"{where}: unknown store key; did you mean {java!r} ({typo[0]})?",
                                      hint="fix the spelling; see docs/config.md for every key")
                ignored[key] = None
        values.update(overrides)
        config = cls(**values)
        object.__setattr__(config, "_ignored_broker_keys", tuple(ignored))
        return config


def _restore(values: Mapping[str, Any], ignored_broker_keys: tuple[str, ...],
             explicit: Iterable[str] | None = None) -> StoreConfig:
    config = StoreConfig(**values)
    object.__setattr__(config, "_ignored_broker_keys", tuple(ignored_broker_keys))
    if explicit is not None:
        object.__setattr__(config, "_explicit", frozenset(explicit))
    return config


def _key_property(name: str) -> property:
    def get(self: StoreConfig) -> Any:
        return self._values[name]

    get.__name__ = name
    get.__doc__ = DEFINITIONS[name].doc
    return property(get)


for _name in DEFINITIONS:
    if hasattr(StoreConfig, _name):  # a key must never shadow a method or a derived value
        raise RuntimeError(f"configuration key {_name!r} collides with a StoreConfig attribute")
    setattr(StoreConfig, _name, _key_property(_name))
del _name


# ------------------------------------------------------------------------------------------------
# Java .properties parsing


_LINE_BREAK = re.compile(r"\r\n|\r|\n")
_WHITESPACE = " \t\f"
_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def _read_broker_conf(path_or_text: str | os.PathLike[str]) -> tuple[str, str]:
    """-> (name for error messages, text)."""
    if isinstance(path_or_text, str) and ("\n" in path_or_text or "\r" in path_or_text):
        return "<broker.conf text>", path_or_text
    path = Path(os.fspath(path_or_text))
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"can not read broker.conf {str(path)!r}: {exc.strerror}",
                          hint="pass an existing file, or the file's text (with its line breaks)") from None
    try:  # Java reads .properties as ISO-8859-1; UTF-8 is what people write today
        return str(path), data.decode("utf-8-sig")
    except UnicodeDecodeError:
        return str(path), data.decode("latin-1")


def _ends_in_continuation(line: str) -> bool:
    return (len(line) - len(line.rstrip("\\"))) % 2 == 1


def _unescape(text: str, source: str, lineno: int) -> str:
    out: list[str] = []
    i = 0
    while i < len(text):
        char = text[i]
        i += 1
        if char != "\\" or i == len(text):
            out.append(char)
            continue
        char = text[i]
        i += 1
        if char == "u":
            digits = text[i:i + 4]
            if len(digits) != 4 or any(d not in "0123456789abcdefABCDEF" for d in digits):
                raise ConfigError(f"{source}:{lineno}: malformed \\uXXXX escape {text[i - 2:i + 4]!r}",
                                  hint="a \\u escape takes exactly four hex digits")
            out.append(chr(int(digits, 16)))
            i += 4
        else:
            out.append(_ESCAPES.get(char, char))
    return "".join(out)


def _split_key_value(line: str) -> tuple[str, str]:
    """java.util.Properties: the key ends at the first unescaped '=', ':' or whitespace."""
    escaped = False
    end = len(line)
    for index, char in enumerate(line):
        if not escaped and (char in "=:" or char in _WHITESPACE):
            end = index
            break
        escaped = char == "\\" and not escaped
    rest = line[end:].lstrip(_WHITESPACE)
    if rest[:1] in ("=", ":"):
        rest = rest[1:]
    return line[:end], rest


def _logical_lines(text: str) -> Iterator[tuple[int, str]]:
    """Yield (first line number, logical line) with comments and blank lines dropped and
    backslash continuations joined (leading whitespace of continuation lines skipped)."""
    lines = _LINE_BREAK.split(text)
    index = 0
    while index < len(lines):
        lineno = index + 1
        line = lines[index].lstrip(_WHITESPACE)
        index += 1
        if not line or line[0] in "#!":
            continue
        while _ends_in_continuation(line):
            line = line[:-1]
            if index == len(lines):
                break
            line += lines[index].lstrip(_WHITESPACE)
            index += 1
        yield lineno, line


def parse_properties(text: str, *, source: str = "<properties>") -> list[tuple[int, str, str]]:
    """Parse Java .properties text -> [(line number, key, value)] in file order.

    ``key=value``, ``key: value`` and ``key value``; ``#`` and ``!`` comment lines; backslash line
    continuation; ``\\uXXXX``, ``\\t``, ``\\n``, ``\\r``, ``\\f`` and ``\\<char>`` escapes. Values
    have surrounding whitespace trimmed. Later duplicates win when applied in order (as in Java).
    """
    result: list[tuple[int, str, str]] = []
    for lineno, line in _logical_lines(text):
        raw_key, raw_value = _split_key_value(line)
        key = _unescape(raw_key, source, lineno)
        if not key:
            raise ConfigError(f"{source}:{lineno}: a line with a value but no key",
                              hint="write key=value")
        result.append((lineno, key, _unescape(raw_value, source, lineno).strip(_WHITESPACE)))
    return result


# ------------------------------------------------------------------------------------------------
# docs/config.md


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _render_default(definition: Definition) -> str:
    value = definition.default
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    if isinstance(value, Enum):
        return f"`{value.value}`"
    if isinstance(value, str):
        return f'`"{value}"`'
    return f"`{value}`"


def _render_java_name(definition: Definition) -> str:
    if definition.java_name is None:
        return "— (mqstore)"
    suffix = {"4.9.7": "", "5.x": " (5.x)", "BrokerConfig": " (BrokerConfig)", _OWN: " (mqstore; as in 5.x)"}
    return f"`{definition.java_name}`{suffix[definition.origin]}"


def render_config_doc() -> str:
    """The text of docs/config.md, rendered from DEFINITIONS (a test keeps the file in sync)."""
    lines = [
        "# mqstore configuration",
        "",
        "<!-- Generated by mqstore.config.render_config_doc(); do not edit by hand. -->",
        "<!-- Regenerate: python -m mqstore.config > docs/config.md -->",
        "",
        "Every knob of a store lives in one object, `mqstore.config.StoreConfig`. Keys are "
        "RocketMQ 4.9.7 `MessageStoreConfig` field names in snake_case, RocketMQ's own spellings "
        "kept (`warm_maped_file_enable`), so a RocketMQ `broker.conf` maps 1:1: "
        "`StoreConfig.from_broker_conf(\"broker.conf\")`. Keys marked (5.x) come from RocketMQ "
        "5.x, (BrokerConfig) from the broker, (mqstore) are our own; our own names carry their unit.",
        "",
        "- `StoreConfig(**keys)` takes keyword arguments only. Every value is coerced and checked "
        "when set, at construction and on attribute assignment: integers may be given as text "
        "(`\"500\"`), booleans as `true/false/yes/no/1/0` in any case, enums in any case. An "
        "unknown key raises `ConfigError` naming the closest known key.",
        "- `validate()` refuses impossible combinations; a store calls it when it opens.",
        "- `replace(**changes)`, `to_dict()`, `from_dict()`; `StoreConfig.keys()` and "
        "`mqstore.config.DEFINITIONS` describe every key.",
        "- Derived values: `put_lock_kind`, `is_sync_flush`, `is_slave`, `max_record_size`, "
        "`effective_disk_max_used_space_ratio`, `index_file_size`, `delay_levels_ms`, "
        "`delete_when_hours`, `store_host_address`, `root_dir(root)`, `commit_log_dir(root)`.",
        "",
        "| key | java name | type | default | unit | allowed values | doc |",
        "|---|---|---|---|---|---|---|",
    ]
    for definition in DEFINITIONS.values():
        cells = (
            f"`{definition.name}`",
            _render_java_name(definition),
            definition.type_name,
            _render_default(definition),
            definition.unit,
            definition.allowed,
            definition.doc,
        )
        lines.append("| " + " | ".join(_cell(cell) for cell in cells) + " |")
    lines += ["", "## Combinations refused by `validate()`", ""]
    lines += [f"- {rule.description}" for rule in _COMBINATIONS]
    lines += [
        "",
        "A record larger than a commit log file (`max_message_size` + 65536 + 8 > "
        "`mapped_file_size_commit_log`) is allowed here: such a put is refused per message.",
        "",
        "## Loading `broker.conf`",
        "",
        "- Java `.properties` syntax: `key=value`, `key: value`, `key value`; `#` and `!` comment "
        "lines; backslash line continuation; `\\uXXXX` and other backslash escapes; values trimmed.",
        "- camelCase keys map to snake_case (`flushIntervalCommitLog` -> "
        "`flush_interval_commit_log`); snake_case keys are accepted as well.",
        "- Broker settings that are not store settings (`brokerName`, `namesrvAddr`, `listenPort`, "
        "...) are collected in `ignored_broker_keys`. A bad value of a store key, or an unknown key "
        "that looks like a misspelt store key, raises `ConfigError` naming file, line and key.",
        "- `enableDLegerCommitLog=true` and a `storeType` other than `default` are refused: they "
        "change the on-disk format.",
        "- The file is read as UTF-8 (Java reads ISO-8859-1; that is the fallback).",
        "",
    ]
    return "\n".join(lines)


def render_typed_keys() -> str:
    """The text of mqstore/_config_keys.py, rendered from DEFINITIONS (a test keeps the file in
    sync): one annotation per key, so mypy sees ``config.flush_interval_commit_log`` as an int
    and rejects a misspelt key, while the values come from the generated properties."""
    lines = [
        '"""The type of every StoreConfig key, for type checkers.',
        "",
        "Generated by ``python -m mqstore.config --typed-keys`` from mqstore.config.DEFINITIONS; do not",
        "edit by hand (tests/test_config.py checks it is current). StoreConfig inherits the",
        "annotations; the values are read through the properties mqstore.config generates.",
        '"""',
        "",
        "from __future__ import annotations",
        "",
        "from typing import TYPE_CHECKING",
        "",
        "if TYPE_CHECKING:",
        "    from mqstore.roles import BrokerRole, FlushDiskType",
        "",
        "",
        "class TypedKeys:",
        '    """Annotations only (no attribute, no slot): one per key, in documentation order."""',
        "",
        "    __slots__ = ()",
        "",
    ]
    for name, definition in DEFINITIONS.items():
        lines.append(f"    {name}: {definition.type.__name__}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render_typed_keys() if sys.argv[1:] == ["--typed-keys"] else render_config_doc(), end="")
