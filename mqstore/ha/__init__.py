"""Master/slave replication (docs/replication.md, docs/rocketmq-remoting-spec.md §4): the
master's HA service (``master.HAService``: slaves connect, the CommitLog streams to them from
where each stands) and the slave's HA client (``slave.HAClient``: appends what its master sends
and reports how far it got), over RocketMQ's own wire format (``mqstore._ha``)."""

from __future__ import annotations

import os

from mqstore.config import StoreConfig
from mqstore.log.directory import replace_file
from mqstore.roles import BrokerRole

__all__ = ["HA_MASTER_FILE", "ha_role", "read_ha_master", "write_ha_master"]

#: where a slave broker keeps its master's HA address, learned from the NameServer (in the store
#: directory; the HA client reads it when ha_master_address is empty)
HA_MASTER_FILE = "ha_master"


def write_ha_master(root: str, address: str) -> None:
    """Record the master's HA address for the slave's HA client (atomically; only when it changed)."""
    if read_ha_master(root) == address:
        return
    replace_file(os.path.join(root, HA_MASTER_FILE), address + "\n")


def read_ha_master(root: str) -> str:
    """The master's HA address write_ha_master recorded, or ""."""
    try:
        with open(os.path.join(root, HA_MASTER_FILE), encoding="utf-8") as fh:
            return fh.read().strip()
    except (OSError, UnicodeDecodeError):
        return ""


def ha_role(cfg: StoreConfig) -> str | None:
    """What the store's "ha" service does: "master" (serve slaves: a SYNC_MASTER, or a master
    given ``ha_listen_port``), "slave" (every SLAVE: it follows ``ha_master_address``, or the
    address a broker learned from its NameServer), or None."""
    if cfg.broker_role is BrokerRole.SLAVE:
        return "slave"
    if cfg.broker_role is BrokerRole.SYNC_MASTER or "ha_listen_port" in cfg.explicit_keys:
        return "master"
    return None
