"""StoreConfig: the settings of one store, the combinations validate() refuses, and the
RocketMQ keys it ignores or refuses."""

from __future__ import annotations

from mqstore._config_keys import TypedKeys

import difflib
import ipaddress
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, Literal

from mqstore.errors import ConfigError
from mqstore.layout import commit_log_k_dir
from mqstore.roles import BrokerRole, FlushDiskType, TieredStorageLevel
from mqstore.config.definitions import DEFINITIONS, SECRET_KEYS, Definition, _FALSE_TEXT
from mqstore.config.parsing import _read_broker_conf, parse_properties
from mqstore.config.rules import (RECORD_HEADROOM, _DELAY_TOKEN, _DELAY_UNIT_MS, _INDEX_ENTRY_SIZE,
                                  _INDEX_HEADER_SIZE, _INDEX_SLOT_SIZE, _INT_MAX, _S3_PART_MIN, _parse_host_port,
                                  camel_to_snake, java_key_to_name)


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


def _several_logs(cfg: StoreConfig) -> tuple[str, str] | None:
    n = cfg.commit_log_count
    paths = cfg.store_path_commit_logs
    if paths and len(paths.split(";")) != n:
        return (f"store_path_commit_logs names {len(paths.split(';'))} path(s) for commit_log_count={n}",
                "name one directory per CommitLog, or leave store_path_commit_logs empty")
    return None


def _tier_without_bucket(cfg: StoreConfig) -> tuple[str, str] | None:
    level = cfg.tiered_storage_level
    if level is not TieredStorageLevel.DISABLE and not cfg.object_store_bucket:
        return (f"tiered_storage_level={level.value} needs object_store_bucket (the tierer copies closed "
                "CommitLog files to that bucket)",
                "set object_store_bucket (and object_store_endpoint), or tiered_storage_level=DISABLE")
    return None


def _tier_on_slave(cfg: StoreConfig) -> tuple[str, str] | None:
    level = cfg.tiered_storage_level
    if level is not TieredStorageLevel.DISABLE and cfg.broker_role is BrokerRole.SLAVE:
        return (f"tiered_storage_level={level.value} conflicts with broker_role=SLAVE (a slave does not "
                "tier in v1; its master does, and a promoted slave rebuilds from the bucket)",
                "set tiered_storage_level=DISABLE on slaves")
    return None


def _tier_part_too_small(cfg: StoreConfig) -> tuple[str, str] | None:
    if cfg.tiered_store_upload_part_size < _S3_PART_MIN:
        return (f"tiered_store_upload_part_size={cfg.tiered_store_upload_part_size} is below S3's smallest "
                f"multipart part ({_S3_PART_MIN} bytes)",
                f"set tiered_store_upload_part_size to at least {_S3_PART_MIN}")
    return None


def _tier_http_endpoint(cfg: StoreConfig) -> tuple[str, str] | None:
    if cfg.object_store_endpoint.lower().startswith("http://") and not cfg.object_store_allow_http:
        return (f"object_store_endpoint={cfg.object_store_endpoint!r} is plain http:// and "
                "object_store_allow_http is false (requests, signatures and data would travel unencrypted)",
                "use an https:// endpoint, or set object_store_allow_http=true (loopback, a private network)")
    return None


@dataclass(frozen=True)
class _Unimplemented:
    """Keys accepted from RocketMQ configurations whose feature mqstore does not have yet: a
    value other than the default is refused when a store opens (never silently ignored)."""

    keys: tuple[str, ...]
    why: str  # what is missing
    hint: str


_UNIMPLEMENTED: tuple[_Unimplemented, ...] = (
    _Unimplemented(("offset_check_in_slave", "duplication_enable"),
                   "a slave's offset correction and the confirm-offset dispatch (DLedger) are not implemented",
                   "leave offset_check_in_slave and duplication_enable false"),
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
    _Combination("`store_path_commit_logs` naming another number of paths than `commit_log_count`.",
                 _several_logs),
    _Combination("`max_hash_slot_num` and `max_index_num` giving an index file above 2147483647 "
                 "bytes (40 + 4 x slots + 20 x entries).", _index_file_too_big),
    _Combination("`tiered_storage_level` other than `DISABLE` without `object_store_bucket`.",
                 _tier_without_bucket),
    _Combination("`tiered_storage_level` other than `DISABLE` with `broker_role=SLAVE` (a slave does "
                 "not tier in v1).", _tier_on_slave),
    _Combination("`tiered_store_upload_part_size` below 5 MiB (S3's smallest multipart part).",
                 _tier_part_too_small),
    _Combination("An `http://` `object_store_endpoint` without `object_store_allow_http`.", _tier_http_endpoint),
)


# ------------------------------------------------------------------------------------------------
# broker.conf keys that are not store keys

# Broker, remoting and store settings of RocketMQ that mqstore does not implement: collected in
# StoreConfig.ignored_broker_keys (putMsgIndexHightWater is read by nothing in 4.9.7's store, nor is
# 5.x's maxRecoveryCommitlogFiles in any release; diskFallRecorded feeds the broker's statistics,
# which mqstore does not keep). An unlisted key is ignored too unless it looks like a typo of a
# store key (see _TYPO_CUTOFF).
_OTHER_ROCKETMQ_KEYS = frozenset(camel_to_snake(key) for key in """
    brokerIP2 rocketmqHome brokerConfigPath messageStorePlugIn msgTraceTopicName
    traceTopicEnable sendMessageThreadPoolNums putMessageFutureThreadPoolNums
    pullMessageThreadPoolNums litePullMessageThreadPoolNums ackMessageThreadPoolNums
    processReplyMessageThreadPoolNums queryMessageThreadPoolNums adminBrokerThreadPoolNums
    clientManageThreadPoolNums consumerManageThreadPoolNums heartbeatThreadPoolNums
    endTransactionThreadPoolNums flushConsumerOffsetHistoryInterval rejectTransactionMessage
    fetchNamesrvAddrByAddressServer sendThreadPoolQueueCapacity putThreadPoolQueueCapacity
    pullThreadPoolQueueCapacity replyThreadPoolQueueCapacity queryThreadPoolQueueCapacity
    clientManagerThreadPoolQueueCapacity consumerManagerThreadPoolQueueCapacity
    heartbeatThreadPoolQueueCapacity endTransactionPoolQueueCapacity filterServerNums
    highSpeedMode commercialEnable commercialTimerCount commercialTransCount commercialBigCount
    commercialBaseCount transferMsgByHeap maxDelayTime regionId registerBrokerTimeoutMills
    disableConsumeIfConsumerReadSlowly consumerFallbehindThreshold brokerFastFailureEnable
    waitTimeMillsInSendQueue waitTimeMillsInPullQueue waitTimeMillsInHeartbeatQueue
    waitTimeMillsInTransactionQueue startAcceptSendRequestTimeStamp traceOn
    enableCalcFilterBitMap expectConsumerNumUseFilter maxErrorRateOfBloomFilter
    filterDataCleanTimeSpan filterSupportRetry enablePropertyFilter compressedRegister
    forceRegister transactionTimeOut transactionCheckMax transactionCheckInterval 
    storeReplyMessageEnable autoDeleteUnusedStats isolateLogEnable enableDetailStat
    enableControllerMode controllerAddr enableSlaveActingMaster serverWorkerThreads
    serverCallbackExecutorThreads serverSelectorThreads serverOnewaySemaphoreValue
    serverAsyncSemaphoreValue  serverSocketSndBufSize
    serverSocketRcvBufSize serverPooledByteBufAllocatorEnable useEpollNativeSelector
      serverSocketBacklog clientWorkerThreads
    clientCallbackExecutorThreads clientOnewaySemaphoreValue clientAsyncSemaphoreValue
    connectTimeoutMillis channelNotActiveInterval clientChannelMaxIdleTimeSeconds
    clientSocketSndBufSize clientSocketRcvBufSize clientPooledByteBufAllocatorEnable
    clientCloseSocketIfTimeout useTLS flushDelayOffsetInterval debugLockEnable
    dLegerGroup dLegerPeers dLegerSelfId preferredLeaderId enableBatchPush
    enableScheduleMessageStats enableLmq enableMultiDispatch maxLmqConsumeQueueNum
    enableScheduleAsyncDeliver scheduleAsyncDeliverMaxPendingLimit
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
        changed = ", ".join(f"{k}={'***' if k in SECRET_KEYS else repr(v)}"
                            for k, v in self.to_dict(changed_only=True).items())
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

    @property
    def effective_bind_address(self) -> str:
        """The address the broker's listeners bind (docs/security.md): bind_address when set;
        else 127.0.0.1, or 0.0.0.0 when broker_ip1 is an address of another network (an
        operator who names the address clients reach the broker at means it to be reached)."""
        if self._values["bind_address"]:
            return str(self._values["bind_address"])
        ip1 = ipaddress.IPv4Address(self._values["broker_ip1"])
        return "127.0.0.1" if ip1.is_loopback else "0.0.0.0"

    def acl_path(self, root: str | os.PathLike[str] | None = None) -> str:
        """The plain ACL file: acl_file (relative to the store's root), or ROOT/conf/plain_acl.yml."""
        configured = os.path.expanduser(str(self._values["acl_file"]))
        return os.path.join(self.root_dir(root), configured or os.path.join("conf", "plain_acl.yml"))

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

    def commit_log_dirs(self, root: str | os.PathLike[str] | None = None) -> list[str]:
        """The directory of each CommitLog (docs/parallel-commitlogs.md): store_path_commit_logs,
        or log 0 at commit_log_dir() and log k at ROOT/commitlog-k."""
        base = self.root_dir(root)
        configured = str(self._values["store_path_commit_logs"])
        if configured:
            return [os.path.join(base, os.path.expanduser(p.strip())) for p in configured.split(";")]
        return [self.commit_log_dir(root)] + [commit_log_k_dir(base, k)
                                              for k in range(1, int(self._values["commit_log_count"]))]

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
            name = java_key_to_name(key)
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


