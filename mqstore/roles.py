"""The enumerated values of settings (flush_disk_type, broker_role, tiered_storage_level): a leaf,
so the typed keys of mqstore._config_keys can name them without importing mqstore.config."""

from __future__ import annotations

from enum import StrEnum

__all__ = ["BrokerRole", "FlushDiskType", "TieredStorageLevel"]


class FlushDiskType(StrEnum):
    """When a put counts as durable (spec §8)."""

    ASYNC_FLUSH = "ASYNC_FLUSH"
    SYNC_FLUSH = "SYNC_FLUSH"


class BrokerRole(StrEnum):
    """Replication role of the store (spec §13)."""

    ASYNC_MASTER = "ASYNC_MASTER"
    SYNC_MASTER = "SYNC_MASTER"
    SLAVE = "SLAVE"


class TieredStorageLevel(StrEnum):
    """When reads go to the object store (tiered-storage spec §3, §6.3; RocketMQ 5's
    tieredStorageLevel). RocketMQ's NOT_IN_MEM (2) is not in v1: it needs a page-cache probe per
    read."""

    DISABLE = "DISABLE"
    NOT_IN_DISK = "NOT_IN_DISK"
    FORCE = "FORCE"
