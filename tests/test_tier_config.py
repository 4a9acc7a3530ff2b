"""The tiered-storage keys (tiered-storage spec §3): RocketMQ 5's names, validate()'s
combinations, broker.conf, and the object-store credentials kept out of mqstore.config.json."""

from __future__ import annotations

import json

import pytest

from mqstore.config import NOT_SAVED_KEYS, StoreConfig, TieredStorageLevel
from mqstore.errors import ConfigError
from mqstore.node.settings import read_config, write_config

BUCKETED = {"tiered_storage_level": "NOT_IN_DISK", "object_store_bucket": "bkt"}


def test_levels_and_not_in_mem_refused() -> None:
    assert StoreConfig().tiered_storage_level is TieredStorageLevel.DISABLE
    assert StoreConfig(tiered_storage_level="force").tiered_storage_level is TieredStorageLevel.FORCE
    with pytest.raises(ConfigError, match="tiered_storage_level: 'NOT_IN_MEM' is not one of DISABLE, "
                                          "NOT_IN_DISK, FORCE .*NOT_IN_MEM is refused in v1"):
        StoreConfig(tiered_storage_level="NOT_IN_MEM")


def test_rocketmq5_broker_conf_loads() -> None:
    cfg = StoreConfig.from_broker_conf(
        "brokerName=broker-a\n"
        "tieredStorageLevel=NOT_IN_DISK\n"
        "objectStoreEndpoint=https://s3.eu-west-1.amazonaws.com\n"
        "objectStoreBucket=rocketmq-tier\n"
        "objectStoreAccessKey=AKIAEXAMPLE\n"
        "objectStoreSecretKey=s3cr3t\n"
        "tieredStoreFileReservedTime=24\n"
        "tieredStoreDeleteFileEnable=false\n"
        "tieredStoreDeleteFileInterval=60000\n"
        "tieredStoreCrcCheckEnable=true\n"
        "readAheadCacheEnable=false\n"
        "readAheadMessageCountThreshold=1024\n"
        "readAheadMessageSizeThreshold=4194304\n"
        "readAheadCacheExpireDuration=5000\n")
    assert cfg.tiered_storage_level is TieredStorageLevel.NOT_IN_DISK
    assert (cfg.object_store_endpoint, cfg.object_store_bucket) == ("https://s3.eu-west-1.amazonaws.com",
                                                                    "rocketmq-tier")
    assert (cfg.object_store_access_key, cfg.object_store_secret_key) == ("AKIAEXAMPLE", "s3cr3t")
    assert (cfg.tiered_store_file_reserved_time, cfg.tiered_store_delete_file_enable,
            cfg.tiered_store_delete_file_interval) == (24, False, 60000)
    assert (cfg.read_ahead_cache_enable, cfg.read_ahead_message_count_threshold,
            cfg.read_ahead_message_size_threshold, cfg.read_ahead_cache_expire_duration) == (False, 1024, 4194304,
                                                                                             5000)
    assert cfg.ignored_broker_keys == ()
    cfg.validate()
    assert "s3cr3t" not in repr(cfg)
    with pytest.raises(ConfigError, match=r"<broker.conf text>:1: tieredStorageLevel: .*NOT_IN_MEM is refused in v1"):
        StoreConfig.from_broker_conf("tieredStorageLevel=NOT_IN_MEM\n")


@pytest.mark.parametrize("settings, problem", [
    ({"tiered_storage_level": "NOT_IN_DISK"}, "tiered_storage_level=NOT_IN_DISK needs object_store_bucket"),
    ({"tiered_storage_level": "FORCE"}, "tiered_storage_level=FORCE needs object_store_bucket"),
    ({**BUCKETED, "broker_role": "SLAVE"}, "conflicts with broker_role=SLAVE"),
    ({"tiered_store_upload_part_size": 5 * 1024 * 1024 - 1}, "below S3's smallest multipart part"),
    ({"object_store_endpoint": "http://127.0.0.1:9000"}, "is plain http:// and object_store_allow_http is false"),
])
def test_validate_refuses(settings: dict[str, object], problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        StoreConfig(**settings).validate()


def test_validate_accepts() -> None:
    StoreConfig(**BUCKETED).validate()
    StoreConfig(broker_role="SLAVE").validate()  # a slave without tiering is as before
    StoreConfig(**BUCKETED, object_store_endpoint="http://127.0.0.1:9000", object_store_allow_http=True,
                tiered_store_upload_part_size=5 * 1024 * 1024).validate()
    StoreConfig(**BUCKETED, object_store_endpoint="https://s3.example.com").validate()


@pytest.mark.parametrize("key, bad", [
    ("object_store_endpoint", "s3.amazonaws.com"),
    ("object_store_endpoint", "ftp://x"),
    ("object_store_bucket", "Upper_Case"),
    ("object_store_bucket", "ab"),
    ("object_store_prefix", "/lead"),
    ("object_store_prefix", "trail/"),
    ("object_store_prefix", "a//b"),
    ("object_store_region", ""),
    ("tiered_store_upload_concurrency", 0),
    ("tiered_store_upload_max_bytes_per_second", -2),
])
def test_bad_values_are_refused(key: str, bad: object) -> None:
    with pytest.raises(ConfigError, match=key):
        StoreConfig(**{key: bad})


def test_object_store_credentials_are_never_saved(tmp_path) -> None:
    assert NOT_SAVED_KEYS == {"object_store_access_key", "object_store_secret_key"}
    cfg = StoreConfig(**BUCKETED, object_store_access_key="AKIAEXAMPLE", object_store_secret_key="s3cr3t")
    write_config(str(tmp_path), cfg)
    (saved,) = tmp_path.iterdir()
    text = saved.read_text()
    assert "s3cr3t" not in text and "AKIAEXAMPLE" not in text
    assert json.loads(text) == {"tiered_storage_level": "NOT_IN_DISK", "object_store_bucket": "bkt"}
    back = read_config(str(tmp_path))
    assert back.object_store_bucket == "bkt" and back.object_store_secret_key == ""
