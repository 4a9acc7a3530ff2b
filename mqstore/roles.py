"""The enumerated values of two settings (flush_disk_type, broker_role): a leaf, so the typed
keys of mqstore._config_keys can name them without importing mqstore.config."""

from __future__ import annotations

from enum import StrEnum

__all__ = ["BrokerRole", "FlushDiskType"]


class FlushDiskType(StrEnum):
    """When a put counts as durable (spec §8)."""

    ASYNC_FLUSH = "ASYNC_FLUSH"
    SYNC_FLUSH = "SYNC_FLUSH"


class BrokerRole(StrEnum):
    """Replication role of the store (spec §13)."""

    ASYNC_MASTER = "ASYNC_MASTER"
    SYNC_MASTER = "SYNC_MASTER"
    SLAVE = "SLAVE"
