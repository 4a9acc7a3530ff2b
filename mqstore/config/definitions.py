"""Every configuration key, defined once: type, default, unit, check, documentation, Java name
(DEFINITIONS)."""

from __future__ import annotations

from mqstore.layout import CQ_STORE_UNIT_SIZE, OS_PAGE_SIZE

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType
from typing import Any

from mqstore.errors import ConfigError
from mqstore.roles import BrokerRole, FlushDiskType, TieredStorageLevel
from mqstore.config.rules import (RECORD_HEADROOM, Rule, _BOOL, _COMMIT_LOG_PATH_RULE, _COMMIT_LOG_PATHS_RULE,
                                  _CQ_EXT_UNIT_HEADER, _CQ_EXT_UNIT_MAX, _DELAY_RULE, _DELETE_WHEN_RULE, _HA_FRAME_HEADER,
                                  _HA_SLAVE_READ_BUFFER, _INT_MAX, _LONG_MAX, _NON_NEGATIVE, _PERCENT, _POSITIVE,
                                  _ROOT_DIR_RULE, _SERVICE_MODE_RULE, _HA_MASTER_RULE, _STORE_HOST_RULE, _IPV4_RULE,
                                  _NAME_RULE, _NAMESRV_RULE, _SERIALIZE_RULE, _enum_rule, _int_range,
                                  _ANY_TEXT, _BIND_RULE, _TLS_AUTH_RULE, _TLS_MODE_RULE,
                                  _power_of_two, _TIER_LEVEL_RULE, _ENDPOINT_RULE, _BUCKET_RULE, _REGION_RULE,
                                  _PREFIX_RULE, _S3_PART_MAX)


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
    origin: str  # "4.9.7", "5.x", "BrokerConfig", "NettyServerConfig", "TlsSystemConfig" or "mqstore"
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
    _key("commit_log_count", int, 1, "count", _int_range(1, 32),
         "CommitLogs written in parallel, each with its own directory, files, put lock, flush, "
         "dispatch cursor and checkpoint; a topic-queue is bound to one of them "
         "(docs/parallel-commitlogs.md). Fixed when the store is created (kept in "
         "mqstore.config.json; another value on reopen is refused). 1 = RocketMQ 4.9.7's layout "
         "byte for byte. With the transient store pool each CommitLog has its own pool "
         "(transient_store_pool_size buffers each); a master and its slave must have the same count.",
         java=None, origin=_OWN),
    _key("store_path_commit_logs", str, "", "-", _COMMIT_LOG_PATHS_RULE,
         'The directory of each CommitLog when commit_log_count > 1, ";"-separated (exactly '
         'commit_log_count distinct paths, relative ones taken from the root); "" = log 0 at '
         "store_path_commit_log, log k at ROOT/commitlog-k. A log on its own disk is what makes "
         "its copies and flushes independent.",
         java=None, origin=_OWN),
    _key("commit_log_recovery_threads", int, 0, "count", _int_range(0, 32),
         "Threads recovering the CommitLogs of a store with several at open (each log's scan lets "
         "go of the GIL); 0 = one per log, at most the CPUs (Kafka's num.recovery.threads.per.data.dir).",
         java=None, origin=_OWN),
    _key("dispatch_logs_in_parallel", bool, True, "-", _BOOL,
         "With commit_log_count > 1: dispatch each CommitLog on its own (a node runs a dispatcher "
         "process per log, dispatcher-k for log k >= 1; the threads mode a reput thread per log), "
         "so one log's dispatch lag never waits behind another's and the logs' dispatch runs on "
         "several cores; off = one dispatcher serves the logs in turn. 1 log: no effect "
         "(docs/parallel-commitlogs.md).",
         java=None, origin=_OWN),
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
    _key("commit_log_allocate_step_bytes", int, 64 * 1024 * 1024, "bytes",
         _int_range(0, _INT_MAX // OS_PAGE_SIZE * OS_PAGE_SIZE, step=OS_PAGE_SIZE),
         "Disk space of a CommitLog file is allocated (posix_fallocate) in steps ahead of the write "
         "position, instead of the whole file when it is created: 1 MiB first, each step the size "
         "written in the file so far (doubling), at most this much, and one step more ahead, so a "
         "small store takes little disk. A put never writes past what is allocated, so a full disk is a "
         "CREATE_MAPEDFILE_FAILED status naming the error, never SIGBUS. 0 = whole files, as "
         "before. Whole 4 KiB pages.",
         java=None, origin=_OWN),
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
         "Append into mlocked write buffers in shared memory (/dev/shm, one pool per CommitLog, used by "
         "every writer process) and let the commit service copy them into the CommitLog files "
         "(spec §7); readers see committed bytes only, puts get OS_PAGECACHE_BUSY while the buffer "
         "they need still holds uncommitted bytes. Refused with SYNC_FLUSH or on a SLAVE (RocketMQ "
         "silently ignores it there).",
         java="transientStorePoolEnable"),
    _key("transient_store_pool_size", int, 5, "count", _POSITIVE,
         "Buffers in the pool of each CommitLog, each one commit log file big and mlocked: memory = "
         "this x mapped_file_size_commit_log x commit_log_count.",
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
    _key("ha_master_address", str, "", "-", _HA_MASTER_RULE,
         "SLAVE: host:port of the master's HA service to replicate from; \"\" = learned from the "
         "NameServer registration (a broker), or no replication (a store). A master serves slaves "
         "when it is SYNC_MASTER or ha_listen_port is given (`mqstore broker`: listen_port + 1).",
         java="haMasterAddress"),
    # --- broker front (BrokerConfig, NettyServerConfig) ----------------------------------------------
    _key("listen_port", int, 10911, "-", _int_range(0, 65535),
         "TCP port the broker's front processes accept clients on: the owner process listens on it "
         "once, without SO_REUSEPORT, and every front accepts on that one socket (a second broker "
         "cannot share the port); 0 = a free port picked at start (tests).",
         java="listenPort", origin="NettyServerConfig"),
    _key("bind_address", str, "", "-", _BIND_RULE,
         "Address the front processes, the HA port and the embedded NameServer listen on. \"\" = "
         "127.0.0.1 (this machine only: a broker is reachable from the network only when told), "
         "unless broker_ip1 is set to an address of another network, which opens every interface "
         "(0.0.0.0), as RocketMQ always listens. docs/security.md.",
         java=None, origin=_OWN),
    _key("broker_ip1", str, "127.0.0.1", "-", _IPV4_RULE,
         "The address clients reach the broker at: registered with the NameServers and written "
         "as STOREHOSTADDRESS (with listen_port) into every record. RocketMQ's default is the "
         "first non-loopback address of the host.",
         java="brokerIP1", origin="BrokerConfig"),
    _key("broker_name", str, "broker-a", "-", _NAME_RULE,
         "Name of the broker (the master and its slaves share it); clients see queues by broker "
         "name. RocketMQ's default is the host name.",
         java="brokerName", origin="BrokerConfig"),
    _key("broker_cluster_name", str, "DefaultCluster", "-", _NAME_RULE,
         "Cluster the broker registers in.",
         java="brokerClusterName", origin="BrokerConfig"),
    _key("broker_id", int, 0, "-", _NON_NEGATIVE,
         "0 = master, 1 and up = slaves.",
         java="brokerId", origin="BrokerConfig"),
    _key("broker_permission", int, 6, "-", _int_range(0, 7),
         "Permission bits the broker registers its topics with (4 read, 2 write, 1 inherit).",
         java="brokerPermission", origin="BrokerConfig"),
    _key("namesrv_addr", str, "", "-", _NAMESRV_RULE,
         "NameServers to register with, \"host:port;host:port\"; \"\" = the NameServer embedded in "
         "the broker (namesrv_listen_port).",
         java="namesrvAddr", origin="BrokerConfig"),
    _key("namesrv_listen_port", int, 9876, "-", _int_range(0, 65535),
         "Port of the NameServer embedded in `mqstore broker` when namesrv_addr is empty; 0 = a "
         "free port picked at start.",
         java=None, origin=_OWN),
    _key("register_name_server_period", int, 30_000, "ms", _int_range(10_000, 60_000),
         "Period of the broker's registration with every NameServer (first at start).",
         java="registerNameServerPeriod", origin="BrokerConfig"),
    _key("front_processes", int, 0, "count", _int_range(0, 64),
         "Front processes accepting clients on listen_port; 0 = one per CPU, at most 4.",
         java=None, origin=_OWN),
    _key("serialize_type", str, "JSON", "-", _SERIALIZE_RULE,
         "Header serialization of what the broker sends unprompted (NOTIFY_CONSUMER_IDS_CHANGED); "
         "responses use the request's. RocketMQ: the rocketmq.serialize.type system property.",
         java=None, origin=_OWN),
    _key("auto_create_topic_enable", bool, True, "-", _BOOL,
         "Create a topic on its first send, from TBW102 (min of the client's and TBW102's queue "
         "counts); off: such a send is refused with TOPIC_NOT_EXIST.",
         java="autoCreateTopicEnable", origin="BrokerConfig"),
    _key("default_topic_queue_nums", int, 8, "count", _int_range(1, 1024),
         "Queues of TBW102, the most an auto-created topic gets.",
         java="defaultTopicQueueNums", origin="BrokerConfig"),
    _key("cluster_topic_enable", bool, True, "-", _BOOL,
         "The topic named after the cluster is readable and writable.",
         java="clusterTopicEnable", origin="BrokerConfig"),
    _key("broker_topic_enable", bool, True, "-", _BOOL,
         "The topic named after the broker is readable and writable.",
         java="brokerTopicEnable", origin="BrokerConfig"),
    _key("auto_create_subscription_group", bool, True, "-", _BOOL,
         "Create a consumer group on its first heartbeat or pull; off: unknown groups get "
         "SUBSCRIPTION_GROUP_NOT_EXIST.",
         java="autoCreateSubscriptionGroup", origin="BrokerConfig"),
    _key("broker_suspend_max_time_millis", int, 15_000, "ms", _POSITIVE,
         "Longest a pull with the suspend flag is held when it asks for more.",
         java="brokerSuspendMaxTimeMillis", origin="BrokerConfig"),
    _key("flush_consumer_offset_interval", int, 5000, "ms", _POSITIVE,
         "Period of writing config/consumerOffset.json (and at shutdown).",
         java="flushConsumerOffsetInterval", origin="BrokerConfig"),
    _key("slave_read_enable", bool, False, "-", _BOOL,
         "Pull answers suggest the slave (whichBrokerWhenConsumeSlowly) when what is read is "
         "beyond access_message_in_memory_max_ratio of memory behind the log's end.",
         java="slaveReadEnable", origin="BrokerConfig"),
    _key("notify_consumer_ids_changed_enable", bool, True, "-", _BOOL,
         "Send NOTIFY_CONSUMER_IDS_CHANGED to a group's consumers when one joins or leaves.",
         java="notifyConsumerIdsChangedEnable", origin="BrokerConfig"),
    _key("channel_expired_timeout", int, 120_000, "ms", _POSITIVE,
         "A client silent for this long (no heartbeat) is dropped from its groups.",
         java=None, origin="BrokerConfig"),
    # --- security and limits (docs/security.md) ------------------------------------------------------
    _key("acl_enable", bool, False, "-", _BOOL,
         "Check every request against the plain ACL file (acl_file): the AccessKey's signature "
         "(AclClientRPCHook's HMAC-SHA1) and the permission its request code needs; refusals "
         "answer NO_PERMISSION (16).",
         java="aclEnable", origin="BrokerConfig"),
    _key("acl_file", str, "", "-", _ANY_TEXT,
         "RocketMQ's plain_acl.yml (accounts, topicPerms, groupPerms, globalWhiteRemoteAddresses), "
         "reloaded when it changes; \"\" = ROOT/conf/plain_acl.yml; a relative path is taken from "
         "the store's root. RocketMQ: the rocketmq.acl.plain.file property.",
         java=None, origin=_OWN),
    _key("inner_access_key", str, "", "-", _ANY_TEXT,
         "The broker's own account: it signs its registrations with the NameServers and a slave's "
         "HA handshake with it (an account of the ACL file with admin: true, or the same pair set "
         "on every broker and NameServer of the cluster).",
         java="innerAccessKey", origin="5.x"),
    _key("inner_secret_key", str, "", "-", _ANY_TEXT,
         "The secret of inner_access_key.",
         java="innerSecretKey", origin="5.x"),
    _key("server_channel_max_idle_time_seconds", int, 120, "s", _POSITIVE,
         "A client connection (to a front or the embedded NameServer) that sends nothing for this "
         "long is closed.",
         java="serverChannelMaxIdleTimeSeconds", origin="NettyServerConfig"),
    _key("write_buffer_high_water_mark", int, 4 * 1024 * 1024, "bytes", _POSITIVE,
         "Answers not yet taken by a client above which its connection is not read any more "
         "(its requests wait; memory does not grow); read again below write_buffer_low_water_mark. "
         "Not RocketMQ 4.9.7's default: there 0 leaves Netty's marks (64 KiB high, 32 KiB low), "
         "which only mark the channel unwritable and never stop reading, so a client that does "
         "not read grows the broker's memory.",
         java="writeBufferHighWaterMark", origin="NettyServerConfig"),
    _key("write_buffer_low_water_mark", int, 1024 * 1024, "bytes", _POSITIVE,
         "See write_buffer_high_water_mark (at most it); RocketMQ 4.9.7's 0 is Netty's 32 KiB.",
         java="writeBufferLowWaterMark", origin="NettyServerConfig"),
    _key("max_connections", int, 10_000, "count", _POSITIVE,
         "Client connections the broker holds at most, its front processes together (the embedded "
         "NameServer counts its own); past it a new one is closed at once.",
         java=None, origin=_OWN),
    _key("max_connections_per_ip", int, 1000, "count", _POSITIVE,
         "Client connections from one source address the broker holds at most, its front processes "
         "together (the embedded NameServer counts its own).",
         java=None, origin=_OWN),
    _key("max_requests_in_flight_per_connection", int, 1024, "count", _POSITIVE,
         "Requests of one connection being served at once (held pulls, forwarded requests); past it "
         "the connection is not read until answers go out.",
         java=None, origin=_OWN),
    _key("max_topic_count", int, 20_000, "count", _POSITIVE,
         "Topics a broker holds at most (system, retry and DLQ topics included); a creation past it "
         "is refused naming this key.",
         java=None, origin=_OWN),
    _key("auto_create_topic_max_per_second", int, 200, "count", _POSITIVE,
         "Topics created on a first send, broker-wide, per second at most; past it such a send "
         "is refused with SYSTEM_BUSY naming this key.",
         java=None, origin=_OWN),
    _key("auto_create_topic_max_per_connection", int, 100, "count", _POSITIVE,
         "Topics one client connection may create on first sends; past it TOPIC_NOT_EXIST "
         "naming this key.",
         java=None, origin=_OWN),
    _key("tls_server_mode", str, "disabled", "-", _TLS_MODE_RULE,
         "TLS on the remoting port, the embedded NameServer and the HA port: disabled (plain), "
         "permissive (TLS and plain on one port, told apart by the first byte) or enforcing "
         "(TLS only). RocketMQ: tls.server.mode.",
         java="tls.server.mode", origin="TlsSystemConfig"),
    _key("tls_server_cert_path", str, "", "-", _ANY_TEXT,
         "PEM certificate (chain) the servers present. RocketMQ: tls.server.certPath.",
         java="tls.server.certPath", origin="TlsSystemConfig"),
    _key("tls_server_key_path", str, "", "-", _ANY_TEXT,
         "PEM private key of tls_server_cert_path. RocketMQ: tls.server.keyPath.",
         java="tls.server.keyPath", origin="TlsSystemConfig"),
    _key("tls_server_key_password", str, "", "-", _ANY_TEXT,
         "Password of an encrypted tls_server_key_path. RocketMQ: tls.server.keyPassword.",
         java="tls.server.keyPassword", origin="TlsSystemConfig"),
    _key("tls_server_need_client_auth", str, "none", "-", _TLS_AUTH_RULE,
         "Whether clients must present a certificate signed by tls_server_trust_cert_path. "
         "RocketMQ: tls.server.need.client.auth.",
         java="tls.server.need.client.auth", origin="TlsSystemConfig"),
    _key("tls_server_trust_cert_path", str, "", "-", _ANY_TEXT,
         "PEM CA certificates that client certificates are checked against. RocketMQ: "
         "tls.server.trustCertPath.",
         java="tls.server.trustCertPath", origin="TlsSystemConfig"),
    _key("tls_enable", bool, False, "-", _BOOL,
         "The broker's own connections (to NameServers, a slave's to its master's HA port) use "
         "TLS. RocketMQ: tls.enable / useTLS.",
         java="tls.enable", origin="TlsSystemConfig"),
    _key("tls_client_trust_cert_path", str, "", "-", _ANY_TEXT,
         "PEM CA certificates the broker's own TLS connections check servers against; \"\" with "
         "tls_test_mode_enable false = the system's. RocketMQ: tls.client.trustCertPath.",
         java="tls.client.trustCertPath", origin="TlsSystemConfig"),
    _key("tls_client_cert_path", str, "", "-", _ANY_TEXT,
         "PEM certificate the broker's own TLS connections present. RocketMQ: tls.client.certPath.",
         java="tls.client.certPath", origin="TlsSystemConfig"),
    _key("tls_client_key_path", str, "", "-", _ANY_TEXT,
         "PEM private key of tls_client_cert_path. RocketMQ: tls.client.keyPath.",
         java="tls.client.keyPath", origin="TlsSystemConfig"),
    _key("tls_test_mode_enable", bool, False, "-", _BOOL,
         "The broker's own TLS connections do not check the server's certificate (RocketMQ's "
         "default is true; here checking is the default). RocketMQ: tls.test.mode.enable.",
         java="tls.test.mode.enable", origin="TlsSystemConfig"),
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
    # --- tiered storage (docs/tiering.md, tiered-storage spec §3) --------------------------------
    _key("tiered_storage_level", TieredStorageLevel, TieredStorageLevel.DISABLE, "-", _TIER_LEVEL_RULE,
         "DISABLE: no tier. NOT_IN_DISK: closed CommitLog files are copied to object_store_bucket "
         "and reads go there once the local file is gone; FORCE: reads go there whenever the tier "
         "has the offset. Anything but DISABLE starts the tierer and needs object_store_bucket. "
         "RocketMQ's default is NOT_IN_DISK once its tiered store is plugged in; here the plug-in "
         "is this key.",
         java="tieredStorageLevel", origin="5.x"),
    _key("object_store_endpoint", str, "", "-", _ENDPOINT_RULE,
         'S3 endpoint URL; "" = the client\'s AWS default for object_store_region. An http:// '
         "endpoint needs object_store_allow_http.",
         java="objectStoreEndpoint", origin="5.x"),
    _key("object_store_bucket", str, "", "-", _BUCKET_RULE,
         "The bucket segments go to; it must exist (the tierer never creates buckets).",
         java="objectStoreBucket", origin="5.x"),
    _key("object_store_access_key", str, "", "-", _ANY_TEXT,
         '"" = the AWS credential chain (AWS_ACCESS_KEY_ID ..., instance profile). Never written '
         "to mqstore.config.json, so processes that read the store's settings from there use "
         "the chain.",
         java="objectStoreAccessKey", origin="5.x"),
    _key("object_store_secret_key", str, "", "-", _ANY_TEXT,
         "The secret of object_store_access_key; never printed, never written to mqstore.config.json.",
         java="objectStoreSecretKey", origin="5.x"),
    _key("object_store_region", str, "us-east-1", "-", _REGION_RULE,
         "Region of the bucket (signs every request).",
         java=None, origin=_OWN),
    _key("object_store_allow_http", bool, False, "-", _BOOL,
         "Allow a plain http:// endpoint (loopback tests, a private S3-compatible store).",
         java=None, origin=_OWN),
    _key("object_store_prefix", str, "", "-", _PREFIX_RULE,
         "Key prefix inside the bucket; the store's keys are "
         "PREFIX/<md5(broker_cluster_name)[0:8]>_<broker_cluster_name>/<broker_name>/... "
         "(RocketMQ 5's PosixFileSegment layout).",
         java=None, origin=_OWN),
    _key("object_store_request_timeout_ms", int, 30_000, "ms", _POSITIVE,
         "Longest one object-store request may take; a timed-out request is an error, retried "
         "with back-off like any other.",
         java=None, origin=_OWN),
    _key("object_store_connect_timeout_ms", int, 5_000, "ms", _POSITIVE,
         "Longest the connect phase of a request may take.",
         java=None, origin=_OWN),
    _key("tiered_store_upload_part_size", int, 16 * 1024 * 1024, "bytes", _int_range(1, _S3_PART_MAX),
         "A segment up to this size goes up as one PutObject, a larger one as a multipart upload "
         "of parts this big; at least 5 MiB (S3's smallest part, checked by validate()).",
         java=None, origin=_OWN),
    _key("tiered_store_upload_concurrency", int, 4, "count", _int_range(1, 64),
         "Parts of one multipart upload in flight at once (memory: this x the part size).",
         java=None, origin=_OWN),
    _key("tiered_store_upload_max_bytes_per_second", int, -1, "bytes", _int_range(-1, _LONG_MAX),
         "Upload rate cap of the tierer; -1 (or 0) = unlimited. Kafka: "
         "remote.log.manager.copy.max.bytes.per.second.",
         java=None, origin=_OWN),
    _key("tiered_store_file_reserved_time", int, 72, "hours", _NON_NEGATIVE,
         "A segment whose newest store timestamp is older than this is deleted from the bucket "
         "(never while its file is still local).",
         java="tieredStoreFileReservedTime", origin="5.x"),
    _key("tiered_store_retention_bytes", int, -1, "bytes", _int_range(-1, _LONG_MAX),
         "Total bytes of copied segments kept in the bucket, oldest deleted first; -1 = no size "
         "limit. Kafka: retention.bytes.",
         java=None, origin=_OWN),
    _key("tiered_store_delete_file_enable", bool, True, "-", _BOOL,
         "Run the tier retention pass (tiered_store_file_reserved_time, tiered_store_retention_bytes).",
         java="tieredStoreDeleteFileEnable", origin="5.x"),
    _key("tiered_store_delete_file_interval", int, 3_600_000, "ms", _POSITIVE,
         "Period of the tier retention pass.",
         java="tieredStoreDeleteFileInterval", origin="5.x"),
    _key("tiered_store_crc_check_enable", bool, True, "-", _BOOL,
         "Check footer and trailer CRCs on every footer read and the body CRC of every record "
         "read from the tier (RocketMQ's default: false).",
         java="tieredStoreCrcCheckEnable", origin="5.x"),
    _key("tiered_store_verify_after_upload", bool, True, "-", _BOOL,
         "After an upload, read back its size, trailer and footer and compare their CRCs before "
         "the segment counts as copied.",
         java=None, origin=_OWN),
    _key("tiered_store_upload_delay_ms", int, 0, "ms", _NON_NEGATIVE,
         "A closed CommitLog file is copied once it has been closed this long (a quick re-read "
         "still hits the page cache).",
         java=None, origin=_OWN),
    _key("tiered_store_local_delete_requires_copy", bool, True, "-", _BOOL,
         "Local retention keeps a CommitLog file until it is copied, unless the disk passes "
         "disk_space_clean_forcibly_ratio (then the tier records a gap). Kafka's "
         "isSegmentEligibleForDeletion rule.",
         java=None, origin=_OWN),
    _key("read_ahead_cache_enable", bool, True, "-", _BOOL,
         "Keep what a tier read fetched beyond the request for the next reads.",
         java="readAheadCacheEnable", origin="5.x"),
    _key("read_ahead_message_count_threshold", int, 4096, "count", _POSITIVE,
         "Most messages of one queue one tier read fetches.",
         java="readAheadMessageCountThreshold", origin="5.x"),
    _key("read_ahead_message_size_threshold", int, 16 * 1024 * 1024, "bytes", _POSITIVE,
         "Most bytes one tier read fetches.",
         java="readAheadMessageSizeThreshold", origin="5.x"),
    _key("read_ahead_cache_expire_duration", int, 15_000, "ms", _POSITIVE,
         "A read-ahead cache entry not read for this long is dropped.",
         java="readAheadCacheExpireDuration", origin="5.x"),
    _key("read_ahead_cache_max_bytes", int, 256 * 1024 * 1024, "bytes", _int_range(1, _LONG_MAX),
         "Size of the read-ahead cache file shared by a store's reader processes (RocketMQ: "
         "readAheadCacheSizeThresholdRate, 0.3 of the JVM heap).",
         java=None, origin=_OWN),
    _key("tiered_store_reader_threads", int, 4, "count", _int_range(1, 256),
         "Tier reads in flight per process at most (Kafka's remote.log.reader.threads: 10).",
         java=None, origin=_OWN),
    _key("tiered_store_index_enable", bool, True, "-", _BOOL,
         "Upload full IndexFiles (compacted) so key lookups find tiered messages.",
         java=None, origin=_OWN),
)

#: keys whose values are secrets: never printed (StoreConfig's repr), kept in files only their owner reads
SECRET_KEYS = frozenset({"inner_secret_key", "tls_server_key_password", "object_store_secret_key"})

#: keys never written to mqstore.config.json (tiered-storage spec §3): the object-store credentials
#: stay with whoever configured the process; other processes take the AWS credential chain
NOT_SAVED_KEYS = frozenset({"object_store_access_key", "object_store_secret_key"})

DEFINITIONS: Mapping[str, Definition] = MappingProxyType({d.name: d for d in _TABLE})
"""Every key, name -> Definition, in documentation order."""


