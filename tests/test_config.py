"""StoreConfig: defaults (spec Appendix A), coercion, validation, broker.conf loading, docs sync."""

from __future__ import annotations

import copy
import os
import ipaddress
import pickle
from enum import Enum
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqstore.config import (
    DEFINITIONS,
    BrokerRole,
    Definition,
    FlushDiskType,
    StoreConfig,
    camel_to_snake,
    java_key_to_name,
    parse_properties,
    render_config_doc,
)
from mqstore import MessageStore
from mqstore.errors import ConfigError

DOCS = Path(__file__).resolve().parents[1] / "docs" / "config.md"

# Spec Appendix A, java name -> default, typed as mqstore stores it (every row of the table).
APPENDIX_A: dict[str, Any] = {
    "mappedFileSizeCommitLog": 1073741824,
    "mappedFileSizeConsumeQueue": 6000000,
    "mappedFileSizeConsumeQueueExt": 50331648,
    "bitMapLengthConsumeQueueExt": 64,
    "flushIntervalCommitLog": 500,
    "commitIntervalCommitLog": 200,
    "flushCommitLogLeastPages": 4,
    "commitCommitLogLeastPages": 4,
    "flushCommitLogThoroughInterval": 10000,
    "commitCommitLogThoroughInterval": 200,
    "flushCommitLogTimed": True,
    "useReentrantLockWhenPutMessage": True,
    "flushIntervalConsumeQueue": 1000,
    "flushConsumeQueueLeastPages": 2,
    "flushConsumeQueueThoroughInterval": 60000,
    "flushLeastPagesWhenWarmMapedFile": 4096,
    "warmMapedFileEnable": False,
    "maxMessageSize": 4194304,
    "checkCRCOnRecover": True,
    "osPageCacheBusyTimeOutMills": 1000,
    "maxTransferBytesOnMessageInMemory": 262144,
    "maxTransferCountOnMessageInMemory": 32,
    "maxTransferBytesOnMessageInDisk": 65536,
    "maxTransferCountOnMessageInDisk": 8,
    "accessMessageInMemoryMaxRatio": 40,
    "messageIndexEnable": True,
    "maxHashSlotNum": 5000000,
    "maxIndexNum": 20000000,
    "maxMsgsNumBatch": 64,
    "messageIndexSafe": False,
    "haListenPort": 10912,
    "haSendHeartbeatInterval": 5000,
    "haHousekeepingInterval": 20000,
    "haTransferBatchSize": 32768,
    "haSlaveFallbehindMax": 268435456,
    "brokerRole": "ASYNC_MASTER",
    "flushDiskType": "ASYNC_FLUSH",
    "syncFlushTimeout": 5000,
    "slaveTimeout": 3000,
    "messageDelayLevel": "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h",
    "deleteWhen": "04",
    "fileReservedTime": 72,
    "diskMaxUsedSpaceRatio": 75,
    "cleanResourceInterval": 10000,
    "deleteCommitLogFilesInterval": 100,
    "deleteConsumeQueueFilesInterval": 100,
    "destroyMapedFileIntervalForcibly": 120000,
    "redeleteHangedFileInterval": 120000,
    "cleanFileForciblyEnable": True,
    "transientStorePoolEnable": False,
    "transientStorePoolSize": 5,
    "fastFailIfNoBufferInStorePool": False,
    "duplicationEnable": False,
    "offsetCheckInSlave": False,
    "diskFallRecorded": True,
    "defaultQueryMaxNum": 32,
    "putMsgIndexHightWater": 600000,
    "enableConsumeQueueExt": False,
    "longPollingEnable": True,
    "shortPollingTimeMills": 1000,
    "enableBuildConsumeQueueConcurrently": False,
    "batchDispatchRequestThreadPoolNums": 16,
    "autoMessageVersionOnTopicLen": True,
    "maxRecoveryCommitlogFiles": 30,
    "deleteFileBatchMax": 10,
    "diskSpaceWarningLevelRatio": 90,
    "diskSpaceCleanForciblyRatio": 85,
}

OWN_KEYS: dict[str, Any] = {
    "commit_log_count": 1,
    "store_path_commit_logs": "",
    "commit_log_recovery_threads": 0,
    "dispatch_logs_in_parallel": True,
    "commit_log_allocate_step_bytes": 64 * 1024 * 1024,
    "store_host": "127.0.0.1:10911",
    "topic_queue_table_slots": 16384,
    "service_mode": "threads",
    "lock_hold_warn_ms": 500,
    "allocate_wait_timeout_ms": 5000,
    "group_commit_interval_ms": 10,
    "max_topic_length": 127,
    "time_lookup_warm_bytes": 8192,
    "dispatch_batch_bytes": 4 * 1024 * 1024,
    "check_crc_on_read": True,
    "bind_address": "",
    "namesrv_listen_port": 9876,
    "front_processes": 0,
    "serialize_type": "JSON",
    "acl_file": "",
    "max_connections": 10_000,
    "max_connections_per_ip": 1000,
    "max_requests_in_flight_per_connection": 1024,
    "max_topic_count": 20_000,
    "auto_create_topic_max_per_second": 200,
    "auto_create_topic_max_per_connection": 100,
    # tiered storage (tiered-storage spec §3)
    "object_store_region": "us-east-1",
    "object_store_allow_http": False,
    "object_store_prefix": "",
    "object_store_request_timeout_ms": 30_000,
    "object_store_connect_timeout_ms": 5_000,
    "tiered_store_upload_part_size": 16 * 1024 * 1024,
    "tiered_store_upload_concurrency": 4,
    "tiered_store_upload_max_bytes_per_second": -1,
    "tiered_store_retention_bytes": -1,
    "tiered_store_verify_after_upload": True,
    "tiered_store_upload_delay_ms": 0,
    "tiered_store_local_delete_requires_copy": True,
    "read_ahead_cache_max_bytes": 256 * 1024 * 1024,
    "tiered_store_reader_threads": 4,
    "tiered_store_index_enable": True,
}

UNITS = {"bytes", "ms", "s", "pages", "hours", "percent", "count", "bits", "chars", "-"}

# Valid values for every str key (hypothesis draws from them).
STR_EXAMPLES: dict[str, list[str]] = {
    "store_path_root_dir": ["", "/data/store", "~/store", "relative/dir"],
    "store_path_commit_log": ["", "/data/commitlog", "cl"],
    "store_path_commit_logs": ["", "/data/cl0;/data/cl1", "a;b;c"],
    "store_host": ["127.0.0.1:10911", "10.0.0.2:1", "[::1]:10911", "[fe80::2]:65535"],
    "message_delay_level": ["1s", "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h", "0s 7d"],
    "delete_when": ["04", "0", "23", "04;16", "1;2;3"],
    "service_mode": ["threads", "processes"],
    "bind_address": ["", "0.0.0.0", "127.0.0.1"],
    "acl_file": ["", "conf/plain_acl.yml", "/etc/rocketmq/plain_acl.yml"],
    "inner_access_key": ["", "rocketmq2"],
    "inner_secret_key": ["", "12345678"],
    "tls_server_mode": ["disabled", "permissive", "enforcing"],
    "tls_server_cert_path": ["", "/etc/rocketmq/server.pem"],
    "tls_server_key_path": ["", "/etc/rocketmq/server.key"],
    "tls_server_key_password": ["", "secret"],
    "tls_server_need_client_auth": ["none", "optional", "require"],
    "tls_server_trust_cert_path": ["", "/etc/rocketmq/ca.pem"],
    "tls_client_trust_cert_path": ["", "/etc/rocketmq/ca.pem"],
    "tls_client_cert_path": ["", "/etc/rocketmq/client.pem"],
    "tls_client_key_path": ["", "/etc/rocketmq/client.key"],
    "broker_ip1": ["127.0.0.1", "10.0.0.2"],
    "broker_name": ["broker-a", "b_1"],
    "broker_cluster_name": ["DefaultCluster", "c-2"],
    "namesrv_addr": ["", "127.0.0.1:9876", "10.0.0.1:9876;10.0.0.2:9876"],
    "ha_master_address": ["", "127.0.0.1:10912", "10.0.0.1:30912"],
    "serialize_type": ["JSON", "ROCKETMQ"],
    "object_store_endpoint": ["", "https://s3.eu-west-1.amazonaws.com", "http://127.0.0.1:9000"],
    "object_store_bucket": ["", "my-bucket", "a.b-c"],
    "object_store_access_key": ["", "AKIAEXAMPLE"],
    "object_store_secret_key": ["", "wJalrXUtnFEMI"],
    "object_store_region": ["us-east-1", "eu-west-1"],
    "object_store_prefix": ["", "tiers", "tiers/prod"],
}


# Appendix A keys nothing in RocketMQ's store reads (putMsgIndexHightWater in 4.9.7,
# maxRecoveryCommitlogFiles in 5.x: only its getter exists) or that feed the broker's statistics
# (diskFallRecorded): loaded from a broker.conf into ignored_broker_keys
NOT_STORE_KEYS = ("putMsgIndexHightWater", "diskFallRecorded", "maxRecoveryCommitlogFiles")


def test_appendix_a_keys_that_do_nothing_in_a_store_are_ignored_broker_keys() -> None:
    cfg = StoreConfig.from_broker_conf("putMsgIndexHightWater=1000\ndiskFallRecorded=false\n"
                                       "maxRecoveryCommitlogFiles=2\n")
    assert cfg.ignored_broker_keys == NOT_STORE_KEYS


@pytest.mark.parametrize("key, value", [
    ("duplication_enable", True),
    ("offset_check_in_slave", True), ("enable_consume_queue_ext", True),
    ("mapped_file_size_consume_queue_ext", 1 << 20),
])
def test_settings_of_features_not_implemented_are_refused_at_open(tmp_path, key, value) -> None:
    cfg = StoreConfig(**{key: value})  # accepted as a value, for broker.conf files
    with pytest.raises(ConfigError, match=f"{key}=.* is refused: .* not implemented"):
        cfg.validate()
    with pytest.raises(ConfigError, match=key):
        MessageStore(tmp_path / "s", cfg)
    assert not os.path.exists(tmp_path / "s" / "abort")


def _rocketmq_keys() -> dict[str, Definition]:
    return {d.java_name: d for d in DEFINITIONS.values() if d.java_name is not None}


# ------------------------------------------------------------------------------------------------
# defaults and the table itself


def test_every_appendix_a_key_is_defined_with_its_default() -> None:
    by_java = _rocketmq_keys()
    for java_name, expected in APPENDIX_A.items():
        if java_name in NOT_STORE_KEYS:
            continue
        assert java_name in by_java, java_name
        definition = by_java[java_name]
        assert definition.name == camel_to_snake(java_name)
        assert definition.default == expected, java_name


def test_defaults_spot_check_through_attributes() -> None:
    cfg = StoreConfig()
    assert cfg.mapped_file_size_commit_log == 1024 * 1024 * 1024
    assert cfg.mapped_file_size_consume_queue == 300000 * 20
    assert cfg.mapped_file_size_consume_queue_ext == 48 * 1024 * 1024
    assert cfg.bit_map_length_consume_queue_ext == 64
    assert cfg.flush_interval_commit_log == 500
    assert cfg.commit_interval_commit_log == 200
    assert cfg.flush_commit_log_least_pages == 4
    assert cfg.commit_commit_log_least_pages == 4
    assert cfg.flush_commit_log_thorough_interval == 10000
    assert cfg.commit_commit_log_thorough_interval == 200
    assert cfg.flush_commit_log_timed is True
    assert cfg.use_reentrant_lock_when_put_message is True
    assert cfg.flush_interval_consume_queue == 1000
    assert cfg.flush_consume_queue_least_pages == 2
    assert cfg.flush_consume_queue_thorough_interval == 60000
    assert cfg.flush_least_pages_when_warm_maped_file == 4096
    assert cfg.warm_maped_file_enable is False
    assert cfg.max_message_size == 4194304
    assert cfg.check_crc_on_recover is True
    assert cfg.os_page_cache_busy_time_out_mills == 1000
    assert cfg.max_transfer_bytes_on_message_in_memory == 262144
    assert cfg.max_transfer_count_on_message_in_memory == 32
    assert cfg.max_transfer_bytes_on_message_in_disk == 65536
    assert cfg.max_transfer_count_on_message_in_disk == 8
    assert cfg.access_message_in_memory_max_ratio == 40
    assert cfg.max_hash_slot_num == 5000000
    assert cfg.max_index_num == 20000000
    assert cfg.max_msgs_num_batch == 64
    assert cfg.ha_listen_port == 10912
    assert cfg.ha_send_heartbeat_interval == 5000
    assert cfg.ha_housekeeping_interval == 20000
    assert cfg.ha_transfer_batch_size == 32768
    assert cfg.ha_slave_fallbehind_max == 256 * 1024 * 1024
    assert cfg.broker_role is BrokerRole.ASYNC_MASTER
    assert cfg.flush_disk_type is FlushDiskType.ASYNC_FLUSH
    assert cfg.sync_flush_timeout == 5000
    assert cfg.slave_timeout == 3000
    assert cfg.delete_when == "04"
    assert cfg.file_reserved_time == 72
    assert cfg.disk_max_used_space_ratio == 75
    assert cfg.clean_resource_interval == 10000
    assert cfg.destroy_maped_file_interval_forcibly == 120000
    assert cfg.redelete_hanged_file_interval == 120000
    assert cfg.transient_store_pool_size == 5
    assert cfg.long_polling_enable is True
    assert cfg.short_polling_time_mills == 1000
    assert cfg.batch_dispatch_request_thread_pool_nums == 16
    assert cfg.delete_file_batch_max == 10
    assert cfg.disk_space_warning_level_ratio == 90
    assert cfg.disk_space_clean_forcibly_ratio == 85
    assert cfg.store_path_root_dir == ""
    assert cfg.store_path_commit_log == ""


def test_own_keys_and_their_defaults() -> None:
    for name, default in OWN_KEYS.items():
        definition = DEFINITIONS[name]
        assert definition.origin == "mqstore"
        assert definition.default == default
    own = {d.name for d in DEFINITIONS.values() if d.origin == "mqstore"}
    assert own == set(OWN_KEYS)


def test_rocketmq_spellings_are_kept() -> None:
    for name in ("warm_maped_file_enable", "flush_least_pages_when_warm_maped_file",
                 "destroy_maped_file_interval_forcibly", "os_page_cache_busy_time_out_mills",
                 "mapped_file_size_commit_log", "check_crc_on_recover",
                 "store_path_root_dir", "store_path_commit_log", "flush_disk_type", "broker_role",
                 "use_reentrant_lock_when_put_message", "message_delay_level"):
        assert name in DEFINITIONS


@pytest.mark.parametrize("definition", list(DEFINITIONS.values()), ids=list(DEFINITIONS))
def test_definition_is_complete_and_consistent(definition: Definition) -> None:
    if definition.java_name is not None:
        assert java_key_to_name(definition.java_name) == definition.name
    assert definition.type in (int, bool, str) or issubclass(definition.type, Enum)
    assert definition.unit in UNITS
    assert definition.doc and "\n" not in definition.doc
    assert definition.allowed
    assert definition.coerce(definition.default) == definition.default
    assert isinstance(definition.default, definition.type)
    if definition.type is str:
        assert definition.name in STR_EXAMPLES


def test_keys_and_definitions_agree() -> None:
    assert StoreConfig.keys() == tuple(DEFINITIONS)
    assert len(set(StoreConfig.keys())) == len(DEFINITIONS)
    assert set(StoreConfig().to_dict()) == set(DEFINITIONS)


# ------------------------------------------------------------------------------------------------
# camel_to_snake


@pytest.mark.parametrize(("camel", "snake"), [
    ("flushIntervalCommitLog", "flush_interval_commit_log"),
    ("haListenPort", "ha_listen_port"),
    ("maxHashSlotNum", "max_hash_slot_num"),
    ("storePathRootDir", "store_path_root_dir"),
    ("checkCRCOnRecover", "check_crc_on_recover"),
    ("osPageCacheBusyTimeOutMills", "os_page_cache_busy_time_out_mills"),
    ("warmMapedFileEnable", "warm_maped_file_enable"),
    ("bitMapLengthConsumeQueueExt", "bit_map_length_consume_queue_ext"),
    ("brokerIP1", "broker_ip1"),
    ("enabledAppendPropCRC", "enabled_append_prop_crc"),
    ("enableDLegerCommitLog", "enable_d_leger_commit_log"),
    ("HAService", "ha_service"),
    ("flush_interval_commit_log", "flush_interval_commit_log"),
    ("x", "x"),
    ("", ""),
])
def test_camel_to_snake(camel: str, snake: str) -> None:
    assert camel_to_snake(camel) == snake


# ------------------------------------------------------------------------------------------------
# coercion


def test_ints_from_text() -> None:
    cfg = StoreConfig(flush_interval_commit_log="250", ha_listen_port=" 10999 ", file_reserved_time="+48")
    assert cfg.flush_interval_commit_log == 250
    assert cfg.ha_listen_port == 10999
    assert cfg.file_reserved_time == 48


@pytest.mark.parametrize("bad", ["5.0", "abc", "", "1e3", "0x10", "1_000", True, 5.0, None, [1]])
def test_bad_ints_are_refused(bad: Any) -> None:
    with pytest.raises(ConfigError, match="flush_interval_commit_log"):
        StoreConfig(flush_interval_commit_log=bad)


@pytest.mark.parametrize(("raw", "expected"), [
    (True, True), (False, False), (1, True), (0, False),
    ("true", True), ("TRUE", True), ("Yes", True), ("1", True), (" true ", True),
    ("false", False), ("False", False), ("NO", False), ("0", False),
])
def test_bools_from_text(raw: Any, expected: bool) -> None:
    assert StoreConfig(warm_maped_file_enable=raw).warm_maped_file_enable is expected


@pytest.mark.parametrize("bad", ["ture", "on", "", 2, -1, 1.0, None])
def test_bad_bools_are_refused(bad: Any) -> None:
    with pytest.raises(ConfigError, match="warm_maped_file_enable"):
        StoreConfig(warm_maped_file_enable=bad)


def test_enums_are_case_insensitive() -> None:
    cfg = StoreConfig(flush_disk_type="sync_flush", broker_role=" Slave ")
    assert cfg.flush_disk_type is FlushDiskType.SYNC_FLUSH
    assert cfg.broker_role is BrokerRole.SLAVE
    assert cfg.flush_disk_type == "SYNC_FLUSH"
    assert StoreConfig(broker_role=BrokerRole.SYNC_MASTER).broker_role is BrokerRole.SYNC_MASTER


@pytest.mark.parametrize(("key", "bad"), [
    ("flush_disk_type", "FSYNC"), ("flush_disk_type", BrokerRole.SLAVE), ("flush_disk_type", 1),
    ("broker_role", "MASTER"), ("broker_role", None),
])
def test_bad_enums_are_refused(key: str, bad: Any) -> None:
    with pytest.raises(ConfigError, match=key) as info:
        StoreConfig(**{key: bad})
    assert "not one of" in str(info.value)


def test_strings_accept_paths_and_are_trimmed() -> None:
    cfg = StoreConfig(store_path_root_dir=Path("/data/store"), delete_when=" 04;16 ")
    assert cfg.store_path_root_dir == "/data/store"
    assert cfg.delete_when == "04;16"
    with pytest.raises(ConfigError, match="not a string"):
        StoreConfig(store_path_root_dir=42)


@pytest.mark.parametrize(("raw", "expected"), [
    (20, 20), (100, 100), (90, 100), (1, 20), (6000001, 6000020), ("99", 100),
    (2147483640, 2147483640),
])
def test_consume_queue_size_is_rounded_up_to_whole_entries(raw: Any, expected: int) -> None:
    assert StoreConfig(mapped_file_size_consume_queue=raw).mapped_file_size_consume_queue == expected


@pytest.mark.parametrize("bad", [0, -20, 2147483641])
def test_consume_queue_size_out_of_range(bad: int) -> None:
    with pytest.raises(ConfigError, match="mapped_file_size_consume_queue"):
        StoreConfig(mapped_file_size_consume_queue=bad)


# ------------------------------------------------------------------------------------------------
# single-key validation


@pytest.mark.parametrize(("key", "bad", "problem"), [
    ("mapped_file_size_commit_log", 0, "out of range"),
    ("mapped_file_size_commit_log", 4095, "out of range"),
    ("mapped_file_size_commit_log", 4097, "not a multiple of 4096"),
    ("mapped_file_size_commit_log", 1_000_000, "not a multiple of 4096"),
    ("mapped_file_size_commit_log", 2**31, "out of range"),
    ("max_message_size", 0, "out of range"),
    ("max_message_size", -1, "out of range"),
    ("flush_commit_log_least_pages", -1, "out of range"),
    ("commit_commit_log_least_pages", -1, "out of range"),
    ("flush_consume_queue_least_pages", -1, "out of range"),
    ("flush_least_pages_when_warm_maped_file", -1, "out of range"),
    ("max_hash_slot_num", 0, "out of range"),
    ("max_index_num", 0, "out of range"),
    ("max_index_num", 1, "out of range"),
    ("os_page_cache_busy_time_out_mills", 0, "out of range"),
    ("flush_interval_commit_log", 0, "out of range"),
    ("flush_interval_commit_log", 2**31, "out of range"),
    ("access_message_in_memory_max_ratio", 101, "out of range"),
    ("disk_max_used_space_ratio", -1, "out of range"),
    ("ha_listen_port", 65536, "out of range"),
    ("ha_transfer_batch_size", 4 * 1024 * 1024, "out of range"),
    ("bit_map_length_consume_queue_ext", 12, "not a multiple of 8"),
    ("bit_map_length_consume_queue_ext", 261984, "out of range"),
    ("mapped_file_size_consume_queue_ext", 19, "out of range"),
    ("transient_store_pool_size", 0, "out of range"),
    ("topic_queue_table_slots", 32, "out of range"),
    ("topic_queue_table_slots", 100, "not a power of two"),
    ("topic_queue_table_slots", 1 << 23, "out of range"),
    ("max_topic_length", 0, "out of range"),
    ("max_topic_length", 128, "out of range"),
    ("lock_hold_warn_ms", 0, "out of range"),
    ("allocate_wait_timeout_ms", 0, "out of range"),
    ("group_commit_interval_ms", 0, "out of range"),
    ("file_reserved_time", -1, "out of range"),
])
def test_out_of_range_values_are_refused(key: str, bad: int, problem: str) -> None:
    with pytest.raises(ConfigError) as info:
        StoreConfig(**{key: bad})
    text = str(info.value)
    assert key in text and problem in text
    assert DEFINITIONS[key].allowed in info.value.hint


@pytest.mark.parametrize(("key", "good"), [
    ("mapped_file_size_commit_log", 4096), ("mapped_file_size_commit_log", 1 << 20),
    ("mapped_file_size_commit_log", 2147479552), ("max_message_size", 1),
    ("flush_commit_log_least_pages", 0), ("ha_listen_port", 0), ("max_index_num", 2),
    ("topic_queue_table_slots", 64), ("topic_queue_table_slots", 1 << 22),
    ("max_topic_length", 1), ("disk_max_used_space_ratio", 100),
    ("os_page_cache_busy_time_out_mills", 2**40), ("ha_transfer_batch_size", 4 * 1024 * 1024 - 12),
    ("bit_map_length_consume_queue_ext", 0), ("bit_map_length_consume_queue_ext", 261976),
    ("mapped_file_size_consume_queue_ext", 20),
])
def test_edge_values_are_accepted(key: str, good: int) -> None:
    assert getattr(StoreConfig(**{key: good}), key) == good


@pytest.mark.parametrize(("good", "address", "port"), [
    ("127.0.0.1:10911", "127.0.0.1", 10911),
    ("10.0.0.2:1", "10.0.0.2", 1),
    ("[::1]:10911", "::1", 10911),
    ("[fe80::2]:65535", "fe80::2", 65535),
])
def test_store_host(good: str, address: str, port: int) -> None:
    cfg = StoreConfig(store_host=good)
    assert cfg.store_host_address == (ipaddress.ip_address(address), port)


@pytest.mark.parametrize("bad", [
    "::1:10911", "localhost:10911", "10.0.0.2", "10.0.0.2:0", "10.0.0.2:70000", "[10.0.0.2]:1",
    "300.1.1.1:1", "10.0.0.2:", ":10911", "[::1]10911", "",
])
def test_bad_store_host_is_refused(bad: str) -> None:
    with pytest.raises(ConfigError, match="store_host"):
        StoreConfig(store_host=bad)


def test_ipv6_hint_in_store_host_error() -> None:
    with pytest.raises(ConfigError, match=r"\[::1\]:10911"):
        StoreConfig(store_host="::1:10911")


@pytest.mark.parametrize("bad", ["", "24", "4;", "a", "04;25", "004", "-1"])
def test_bad_delete_when_is_refused(bad: str) -> None:
    with pytest.raises(ConfigError, match="delete_when"):
        StoreConfig(delete_when=bad)


@pytest.mark.parametrize("bad", ["", "1x", "s", "1s 2", "1.5s", "1S"])
def test_bad_message_delay_level_is_refused(bad: str) -> None:
    with pytest.raises(ConfigError, match="message_delay_level"):
        StoreConfig(message_delay_level=bad)


def test_multi_path_commit_log_is_refused() -> None:
    with pytest.raises(ConfigError, match="multi-path"):
        StoreConfig(store_path_commit_log="/a/commitlog,/b/commitlog")


# ------------------------------------------------------------------------------------------------
# unknown keys, attribute access


def test_unknown_keyword_names_the_closest_key() -> None:
    with pytest.raises(ConfigError) as info:
        StoreConfig(flush_interval_comit_log=100)
    assert "flush_interval_comit_log" in str(info.value)
    assert "'flush_interval_commit_log'" in str(info.value)


def test_camel_case_keyword_points_to_snake_case() -> None:
    with pytest.raises(ConfigError, match="did you mean 'flush_disk_type'") as info:
        StoreConfig(flushDiskType="SYNC_FLUSH")
    assert "snake_case" in info.value.hint


def test_nonsense_keyword_still_gets_a_suggestion() -> None:
    with pytest.raises(ConfigError, match="did you mean"):
        StoreConfig(zzz=1)


def test_positional_arguments_are_refused() -> None:
    with pytest.raises(TypeError):
        StoreConfig({"flush_interval_commit_log": 1})  # type: ignore[call-arg]


def test_assignment_is_coerced_and_checked() -> None:
    cfg = StoreConfig()
    cfg.flush_interval_commit_log = "250"
    assert cfg.flush_interval_commit_log == 250
    cfg.flush_disk_type = "sync_flush"
    assert cfg.is_sync_flush
    with pytest.raises(ConfigError, match="flush_interval_commit_log"):
        cfg.flush_interval_commit_log = -5
    assert cfg.flush_interval_commit_log == 250


def test_assignment_of_unknown_key_is_refused() -> None:
    cfg = StoreConfig()
    with pytest.raises(ConfigError, match="did you mean 'flush_disk_type'"):
        cfg.flush_disk_typ = "SYNC_FLUSH"
    with pytest.raises(AttributeError, match="derived"):
        cfg.put_lock_kind = "spin"  # type: ignore[misc]


def test_reading_unknown_attribute() -> None:
    with pytest.raises(AttributeError, match="flush_disk_type"):
        StoreConfig().flush_disk_typ  # noqa: B018


# ------------------------------------------------------------------------------------------------
# combinations


def test_defaults_validate() -> None:
    cfg = StoreConfig()
    assert cfg.validate() is cfg


def test_transient_pool_with_sync_flush_is_refused() -> None:
    cfg = StoreConfig(transient_store_pool_enable=True, flush_disk_type="SYNC_FLUSH")
    with pytest.raises(ConfigError) as info:
        cfg.validate()
    text = str(info.value)
    assert "transient_store_pool_enable" in text and "flush_disk_type" in text
    assert "ASYNC_FLUSH" in info.value.hint


def test_transient_pool_on_slave_is_refused() -> None:
    cfg = StoreConfig(transient_store_pool_enable=True, broker_role="SLAVE")
    with pytest.raises(ConfigError) as info:
        cfg.validate()
    assert "transient_store_pool_enable" in str(info.value) and "broker_role" in str(info.value)
    assert info.value.hint


def test_all_violated_combinations_are_reported_together() -> None:
    cfg = StoreConfig(transient_store_pool_enable=True, broker_role="SLAVE", flush_disk_type="SYNC_FLUSH")
    with pytest.raises(ConfigError) as info:
        cfg.validate()
    assert "SYNC_FLUSH" in str(info.value) and "SLAVE" in str(info.value)


def test_transient_pool_on_async_master_is_fine() -> None:
    StoreConfig(transient_store_pool_enable=True, broker_role="ASYNC_MASTER").validate()


def test_index_file_above_java_int_is_refused() -> None:
    cfg = StoreConfig(max_index_num=110_000_000, max_hash_slot_num=5_000_000)
    with pytest.raises(ConfigError) as info:
        cfg.validate()
    assert "max_hash_slot_num" in str(info.value) and "max_index_num" in str(info.value)


def test_record_bigger_than_a_file_is_allowed() -> None:
    cfg = StoreConfig(mapped_file_size_commit_log=4096, max_message_size=4 * 1024 * 1024)
    assert cfg.max_record_size + 8 > cfg.mapped_file_size_commit_log
    cfg.validate()


def test_validate_sees_assignments() -> None:
    cfg = StoreConfig(transient_store_pool_enable=True).validate()
    cfg.flush_disk_type = "SYNC_FLUSH"
    with pytest.raises(ConfigError):
        cfg.validate()


# ------------------------------------------------------------------------------------------------
# derived values


def test_put_lock_kind() -> None:
    assert StoreConfig().put_lock_kind == "mutex"
    assert StoreConfig(use_reentrant_lock_when_put_message=False).put_lock_kind == "spin"


def test_flush_and_role_flags() -> None:
    assert not StoreConfig().is_sync_flush
    assert StoreConfig(flush_disk_type="SYNC_FLUSH").is_sync_flush
    assert not StoreConfig().is_slave
    assert StoreConfig(broker_role="slave").is_slave


def test_max_record_size() -> None:
    assert StoreConfig().max_record_size == 4194304 + 65536
    assert StoreConfig(max_message_size=1).max_record_size == 65537


@pytest.mark.parametrize(("configured", "effective"), [
    (0, 10), (9, 10), (10, 10), (75, 75), (95, 95), (96, 95), (100, 95),
])
def test_effective_disk_max_used_space_ratio_is_clamped(configured: int, effective: int) -> None:
    cfg = StoreConfig(disk_max_used_space_ratio=configured)
    assert cfg.disk_max_used_space_ratio == configured
    assert cfg.effective_disk_max_used_space_ratio == effective


def test_index_file_size() -> None:
    assert StoreConfig().index_file_size == 420000040
    assert StoreConfig(max_hash_slot_num=100, max_index_num=400).index_file_size == 40 + 400 + 8000


def test_delay_levels_ms() -> None:
    levels = StoreConfig().delay_levels_ms
    assert len(levels) == 18
    assert levels[:4] == (1000, 5000, 10000, 30000)
    assert levels[-1] == 2 * 3600 * 1000
    assert StoreConfig(message_delay_level="  2d 0s ").delay_levels_ms == (2 * 86400000, 0)


def test_delete_when_hours() -> None:
    assert StoreConfig().delete_when_hours == {4}
    assert StoreConfig(delete_when="4;16;0").delete_when_hours == {0, 4, 16}


def test_store_host_address_packs_like_a_record() -> None:
    address, port = StoreConfig(store_host="10.0.0.2:10911").store_host_address
    assert address.packed + port.to_bytes(4, "big") == bytes.fromhex("0a00000200002a9f")
    address, _ = StoreConfig(store_host="[fe80::2]:10911").store_host_address
    assert address.version == 6 and len(address.packed) == 16


def test_root_and_commit_log_dirs(tmp_path: Path) -> None:
    cfg = StoreConfig()
    assert cfg.root_dir(tmp_path) == str(tmp_path)
    assert cfg.commit_log_dir(tmp_path) == str(tmp_path / "commitlog")
    assert cfg.commit_log_dir(str(tmp_path)) == str(tmp_path / "commitlog")
    with pytest.raises(ConfigError, match="store_path_root_dir"):
        cfg.commit_log_dir()
    configured = StoreConfig(store_path_root_dir=str(tmp_path / "root"))
    assert configured.commit_log_dir() == str(tmp_path / "root" / "commitlog")
    assert configured.commit_log_dir(tmp_path) == str(tmp_path / "commitlog")  # explicit root wins
    relative = StoreConfig(store_path_commit_log="cl")
    assert relative.commit_log_dir(tmp_path) == str(tmp_path / "cl")
    absolute = StoreConfig(store_path_commit_log=str(tmp_path / "elsewhere"))
    assert absolute.commit_log_dir() == str(tmp_path / "elsewhere")
    home = StoreConfig(store_path_root_dir="~/store")
    assert home.root_dir() == str(Path("~/store").expanduser())


def test_a_store_with_its_own_commit_log_directory_is_found_by_every_reader(tmp_path: Path) -> None:
    """store_path_commit_log is kept in the store's mqstore.config.json: a reopen without it
    uses it (it found ROOT/commitlog empty and destroyed the ConsumeQueues), another one is
    refused while the store's directory holds the files, and the read-only tools and readers
    (verify, info, the snapshot Spark reads) look where the files are."""
    from mqstore.queue.snapshot import StoreSnapshot
    from mqstore.tools.checker import check_store
    from mqstore.tools.commands.info import commitlog_files

    root = str(tmp_path / "store")
    with MessageStore(root, store_path_commit_log="cl") as store:
        store.put_bodies("T", [b"m%d" % i for i in range(10)]).check()
    assert os.listdir(os.path.join(root, "cl")) and not os.path.exists(os.path.join(root, "commitlog"))
    check_store(root).raise_if_failed()
    files, _ = commitlog_files(root)
    assert len(files) == 1
    with StoreSnapshot(root) as snap:
        assert snap.log_spans() and snap.queues()[0].max_offset == 10
    with MessageStore(root) as store:  # no store_path_commit_log: the store's own
        assert store.config.store_path_commit_log == "cl"
        assert [bytes(m.body) for m in store.read_messages("T", 0, 0, 10)] == [b"m%d" % i for i in range(10)]
    with pytest.raises(ConfigError, match=r"store_path_commit_log='elsewhere'.*CommitLog is in"):
        MessageStore(root, store_path_commit_log="elsewhere")
    with MessageStore(root, store_path_commit_log=os.path.join(root, "cl")) as store:  # the same, absolute
        assert store.get_max_offset_in_queue("T", 0) == 10
    check_store(root).raise_if_failed()


# ------------------------------------------------------------------------------------------------
# copies and plain data


def test_replace_copies() -> None:
    base = StoreConfig(flush_interval_commit_log=100)
    changed = base.replace(flush_disk_type="SYNC_FLUSH")
    assert changed is not base
    assert base.flush_disk_type is FlushDiskType.ASYNC_FLUSH
    assert changed.is_sync_flush and changed.flush_interval_commit_log == 100
    assert base.replace() == base
    with pytest.raises(ConfigError, match="did you mean"):
        base.replace(flush_disk_typ="SYNC_FLUSH")
    changed.flush_interval_commit_log = 7
    assert base.flush_interval_commit_log == 100


def test_to_dict_is_plain_and_round_trips() -> None:
    cfg = StoreConfig(flush_disk_type="SYNC_FLUSH", mapped_file_size_commit_log=1 << 20)
    plain = cfg.to_dict()
    assert plain["flush_disk_type"] == "SYNC_FLUSH" and type(plain["flush_disk_type"]) is str
    assert plain["mapped_file_size_commit_log"] == 1 << 20
    assert StoreConfig.from_dict(plain) == cfg
    assert cfg.to_dict(changed_only=True) == {"flush_disk_type": "SYNC_FLUSH",
                                              "mapped_file_size_commit_log": 1 << 20}
    assert StoreConfig.from_dict({}) == StoreConfig()
    with pytest.raises(ConfigError):
        StoreConfig.from_dict({"nope": 1})


def test_equality() -> None:
    assert StoreConfig() == StoreConfig()
    assert StoreConfig(flush_interval_commit_log="500") == StoreConfig()
    assert StoreConfig(flush_interval_commit_log=501) != StoreConfig()
    assert StoreConfig() != object()
    with pytest.raises(TypeError):
        hash(StoreConfig())


def test_repr_shows_changed_keys_only() -> None:
    assert repr(StoreConfig()) == "StoreConfig()"
    assert repr(StoreConfig(flush_disk_type="sync_flush")) == "StoreConfig(flush_disk_type='SYNC_FLUSH')"


def test_pickle_and_copy_keep_everything() -> None:
    cfg = StoreConfig.from_broker_conf("brokerIP2=10.0.0.1\nflushDiskType=SYNC_FLUSH\n")
    for clone in (pickle.loads(pickle.dumps(cfg)), copy.copy(cfg), copy.deepcopy(cfg)):
        assert clone == cfg
        assert clone.ignored_broker_keys == ("brokerIP2",)


def _valid_value(definition: Definition) -> st.SearchStrategy[Any]:
    if definition.type is bool:
        return st.booleans()
    if issubclass(definition.type, Enum):
        return st.sampled_from(list(definition.type))
    if definition.type is str:
        return st.sampled_from(STR_EXAMPLES[definition.name])
    rule = definition.rule
    assert rule.low is not None and rule.high is not None
    if rule.power_of_two:
        return st.integers(rule.low.bit_length() - 1, rule.high.bit_length() - 1).map(lambda e: 1 << e)
    return st.integers(-(-rule.low // rule.step), rule.high // rule.step).map(lambda n: n * rule.step)


_SETTINGS = st.fixed_dictionaries({}, optional={name: _valid_value(d) for name, d in DEFINITIONS.items()})


def _as_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Enum):
        return str(value.value).lower()
    return str(value)


@given(_SETTINGS)
def test_round_trip_over_valid_values(values: dict[str, Any]) -> None:
    cfg = StoreConfig(**values)
    for name, value in values.items():
        assert getattr(cfg, name) == value
    assert StoreConfig.from_dict(cfg.to_dict()) == cfg
    assert cfg.replace(**values) == cfg
    assert StoreConfig(**{k: _as_text(v) for k, v in values.items()}) == cfg


@settings(max_examples=50)
@given(_SETTINGS)
def test_broker_conf_round_trip_over_valid_values(values: dict[str, Any]) -> None:
    lines = [f"{DEFINITIONS[k].java_name or k}={_as_text(v)}" for k, v in values.items()]
    assert StoreConfig.from_broker_conf("\n".join(lines) + "\n") == StoreConfig(**values)


# ------------------------------------------------------------------------------------------------
# broker.conf


BROKER_CONF = """\
# RocketMQ 4.9 broker-a.conf, with store settings
brokerClusterName = DefaultCluster
brokerName=broker-a
brokerId=0
! another comment style
namesrvAddr=10.0.0.1:9876;10.0.0.2:9876
listenPort=10911
autoCreateTopicEnable=true

deleteWhen=04
fileReservedTime=48
brokerRole=SYNC_MASTER
flushDiskType: SYNC_FLUSH
storePathRootDir /data/rocketmq/store
mappedFileSizeCommitLog=1048576
messageDelayLevel=1s 5s \\
    10s 30s
   maxHashSlotNum = 5000000
store_host=[::1]:10911
haListenPort=\\u0031\\u0030\\u0039\\u0031\\u0032
"""


def test_broker_conf_text() -> None:
    cfg = StoreConfig.from_broker_conf(BROKER_CONF)
    assert cfg.delete_when == "04"
    assert cfg.file_reserved_time == 48
    assert cfg.broker_role is BrokerRole.SYNC_MASTER
    assert cfg.flush_disk_type is FlushDiskType.SYNC_FLUSH
    assert cfg.store_path_root_dir == "/data/rocketmq/store"
    assert cfg.mapped_file_size_commit_log == 1048576
    assert cfg.message_delay_level == "1s 5s 10s 30s"
    assert cfg.max_hash_slot_num == 5000000
    assert cfg.store_host == "[::1]:10911"
    assert cfg.ha_listen_port == 10912
    # the broker's own settings are keys now (read by `mqstore broker`)
    assert cfg.ignored_broker_keys == ()
    assert (cfg.broker_cluster_name, cfg.broker_name, cfg.broker_id) == ("DefaultCluster", "broker-a", 0)
    assert (cfg.namesrv_addr, cfg.listen_port, cfg.auto_create_topic_enable) == ("10.0.0.1:9876;10.0.0.2:9876", 10911,
                                                                              True)
    cfg.validate()  # loads as is, and a store opens with it: a SYNC_MASTER serving slaves on ha_listen_port


def test_broker_conf_file(tmp_path: Path) -> None:
    path = tmp_path / "broker.conf"
    path.write_text(BROKER_CONF, encoding="utf-8")
    expected = StoreConfig.from_broker_conf(BROKER_CONF)
    assert StoreConfig.from_broker_conf(path) == expected
    assert StoreConfig.from_broker_conf(str(path)) == expected


def test_broker_conf_overrides() -> None:
    cfg = StoreConfig.from_broker_conf(BROKER_CONF, flush_disk_type="ASYNC_FLUSH", file_reserved_time="1")
    assert cfg.flush_disk_type is FlushDiskType.ASYNC_FLUSH
    assert cfg.file_reserved_time == 1
    with pytest.raises(ConfigError, match="did you mean"):
        StoreConfig.from_broker_conf(BROKER_CONF, file_reserve_time=1)


def test_broker_conf_bad_value_names_file_line_and_key(tmp_path: Path) -> None:
    path = tmp_path / "broker.conf"
    path.write_text("brokerName=a\n# comment\n\nflushIntervalCommitLog=soon\n", encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        StoreConfig.from_broker_conf(path)
    text = str(info.value)
    assert f"{path}:4" in text and "flushIntervalCommitLog" in text and "'soon'" in text


def test_broker_conf_bad_value_on_continued_line_reports_its_first_line() -> None:
    text = "a=1\nflushDiskType=SYNC_\\\n   FLUSHX\nb=2\n"
    with pytest.raises(ConfigError, match=r"<broker.conf text>:2: flushDiskType"):
        StoreConfig.from_broker_conf(text)


def test_broker_conf_misspelt_store_key_is_refused() -> None:
    with pytest.raises(ConfigError) as info:
        StoreConfig.from_broker_conf("brokerName=a\nflushIntervalComitLog=100\n")
    text = str(info.value)
    assert ":2:" in text and "flushIntervalComitLog" in text and "'flushIntervalCommitLog'" in text


def test_broker_conf_old_maped_spelling_is_refused_with_new_name() -> None:
    with pytest.raises(ConfigError, match="mappedFileSizeCommitLog"):
        StoreConfig.from_broker_conf("mapedFileSizeCommitLog=1048576\n")


def test_broker_conf_unknown_unrelated_keys_are_ignored() -> None:
    cfg = StoreConfig.from_broker_conf("someVendorSwitch=on\nbrokerIP2=10.0.0.2\nrocketmqHome=/opt\n")
    assert cfg.ignored_broker_keys == ("someVendorSwitch", "brokerIP2", "rocketmqHome")
    assert cfg == StoreConfig()


def test_known_rocketmq_keys_never_shadow_store_keys() -> None:
    from mqstore.config import _OTHER_ROCKETMQ_KEYS, _REFUSED_UNLESS

    assert _OTHER_ROCKETMQ_KEYS.isdisjoint(DEFINITIONS)
    assert set(_REFUSED_UNLESS).isdisjoint(DEFINITIONS)
    assert set(_REFUSED_UNLESS).isdisjoint(_OTHER_ROCKETMQ_KEYS)


def test_broker_conf_snake_case_keys() -> None:
    cfg = StoreConfig.from_broker_conf("flush_disk_type=SYNC_FLUSH\nlock_hold_warn_ms=50\nbroker_name=x\n"
                                       "rocketmq_home=/opt\n")
    assert cfg.is_sync_flush and cfg.lock_hold_warn_ms == 50 and cfg.broker_name == "x"
    assert cfg.ignored_broker_keys == ("rocketmq_home",)


def test_broker_conf_own_keys_in_camel_case() -> None:
    cfg = StoreConfig.from_broker_conf("storeHost=10.0.0.2:10911\ntopicQueueTableSlots=1024\n")
    assert cfg.store_host == "10.0.0.2:10911" and cfg.topic_queue_table_slots == 1024


@pytest.mark.parametrize(("text", "accepted"), [
    ("enableDLegerCommitLog=true\n", False),
    ("enableDLegerCommitLog=false\n", True),
    ("enableDLegerCommitLog=No\n", True),
    ("storeType=defaultRocksDB\n", False),
    ("storeType=default\n", True),
])
def test_broker_conf_format_changing_keys(text: str, accepted: bool) -> None:
    if accepted:
        assert StoreConfig.from_broker_conf(text).ignored_broker_keys == (text.split("=")[0],)
    else:
        with pytest.raises(ConfigError, match="not supported"):
            StoreConfig.from_broker_conf(text)


def test_broker_conf_missing_file() -> None:
    with pytest.raises(ConfigError, match="can not read broker.conf"):
        StoreConfig.from_broker_conf("/nonexistent/broker.conf")
    with pytest.raises(ConfigError, match="can not read broker.conf"):
        StoreConfig.from_broker_conf(Path("/nonexistent/broker.conf"))


def test_broker_conf_encodings(tmp_path: Path) -> None:
    path = tmp_path / "broker.conf"
    path.write_bytes("\ufeffstorePathRootDir=/data/störe\n".encode())
    assert StoreConfig.from_broker_conf(path).store_path_root_dir == "/data/störe"
    path.write_bytes("storePathRootDir=/data/störe\n".encode("latin-1"))
    assert StoreConfig.from_broker_conf(path).store_path_root_dir == "/data/störe"


# ------------------------------------------------------------------------------------------------
# parse_properties (java.util.Properties semantics)


@pytest.mark.parametrize(("text", "expected"), [
    ("a=b", [(1, "a", "b")]),
    ("a = b ", [(1, "a", "b")]),
    ("a:b", [(1, "a", "b")]),
    ("a : b", [(1, "a", "b")]),
    ("a b", [(1, "a", "b")]),
    ("a\tb", [(1, "a", "b")]),
    ("a", [(1, "a", "")]),
    ("a=", [(1, "a", "")]),
    ("a=b=c", [(1, "a", "b=c")]),
    ("a==b", [(1, "a", "=b")]),
    ("a b=c", [(1, "a", "b=c")]),
    (r"a\=b=c", [(1, "a=b", "c")]),
    (r"a\:b:c", [(1, "a:b", "c")]),
    (r"a\ b c", [(1, "a b", "c")]),
    ("# a=b\n! c=d\n  # e=f\n\n   \n", []),
    ("a=1\\\n  2\\\n\t3\nb=4", [(1, "a", "123"), (4, "b", "4")]),
    ("a=1\\\\\nb=2", [(1, "a", "1\\"), (2, "b", "2")]),
    ("# comment \\\nb=2", [(2, "b", "2")]),
    ("a=1\\", [(1, "a", "1")]),
    ("a=1\\\n", [(1, "a", "1")]),
    ("a=1\r\nb=2\rc=3\n", [(1, "a", "1"), (2, "b", "2"), (3, "c", "3")]),
    (r"a=\u0041\u00e9\t|\n|\q", [(1, "a", "Aé\t|\n|q")]),
    (r"k\u0041=v", [(1, "kA", "v")]),
    ("a=1\na=2", [(1, "a", "1"), (2, "a", "2")]),
    ("a=x\\\n# not a comment\n", [(1, "a", "x# not a comment")]),
])
def test_parse_properties(text: str, expected: list[tuple[int, str, str]]) -> None:
    assert parse_properties(text) == expected


def test_duplicate_keys_last_wins() -> None:
    assert StoreConfig.from_broker_conf("fileReservedTime=1\nfileReservedTime=2\n").file_reserved_time == 2


@pytest.mark.parametrize("text", [r"a=\u00", r"a=\uZZZZ", "x=1\n" + r"a=\u12G4"])
def test_malformed_unicode_escape(text: str) -> None:
    with pytest.raises(ConfigError, match=r"malformed \\uXXXX") as info:
        parse_properties(text, source="broker.conf")
    assert f"broker.conf:{text.count(chr(10)) + 1}:" in str(info.value)


def test_value_without_key() -> None:
    with pytest.raises(ConfigError, match="broker.conf:2: a line with a value but no key"):
        parse_properties("a=1\n=2\n", source="broker.conf")


# ------------------------------------------------------------------------------------------------
# docs/config.md


def test_docs_file_is_in_sync() -> None:
    assert DOCS.read_text(encoding="utf-8") == render_config_doc(), (
        "docs/config.md is stale: python -m mqstore.config > docs/config.md")


def test_docs_mention_every_key() -> None:
    doc = render_config_doc()
    for definition in DEFINITIONS.values():
        assert f"| `{definition.name}` |" in doc
        if definition.java_name is not None:
            assert f"`{definition.java_name}`" in doc
    header = "| key | java name | type | default | unit | allowed values | doc |"
    rows = [line for line in doc.splitlines() if line.startswith("| `")]
    assert header in doc and len(rows) == len(DEFINITIONS)
    assert all(row.replace("\\|", "").count("|") == header.count("|") for row in rows)


def test_the_typed_keys_module_is_current():
    """mqstore/_config_keys.py (the annotation of every key, for mypy) is what
    ``python -m mqstore.config --typed-keys`` renders from DEFINITIONS now."""
    from pathlib import Path

    from mqstore import _config_keys
    from mqstore.config import render_typed_keys

    assert Path(_config_keys.__file__).read_text(encoding="utf-8") == render_typed_keys()
    assert list(_config_keys.TypedKeys.__annotations__) == list(DEFINITIONS)


def test_secrets_are_not_printed_and_stay_with_the_stores_owner(tmp_path):
    from mqstore.node.settings import write_config

    cfg = StoreConfig(inner_access_key="ak", inner_secret_key="s3cr3t", tls_server_key_password="pw")
    assert "s3cr3t" not in repr(cfg) and "pw'" not in repr(cfg) and "inner_access_key='ak'" in repr(cfg)
    (tmp_path / "secret").mkdir()
    (tmp_path / "plain").mkdir()
    write_config(str(tmp_path / "secret"), cfg)
    write_config(str(tmp_path / "plain"), StoreConfig(broker_name="b"))
    (secret,), (plain,) = (tmp_path / "secret").iterdir(), (tmp_path / "plain").iterdir()
    assert secret.stat().st_mode & 0o077 == 0
    assert plain.stat().st_mode & 0o044 != 0
