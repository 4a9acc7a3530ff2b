"""Master/slave replication (docs/replication.md, docs/rocketmq-remoting-spec.md §4): the
master's HA service (``master.HAService``: slaves connect, the CommitLog streams to them from
where each stands) and the slave's HA client (``slave.HAClient``: appends what its master sends
and reports how far it got), over RocketMQ's own wire format (``mqstore._ha``)."""

from __future__ import annotations

from mqstore.config import StoreConfig
from mqstore.roles import BrokerRole

__all__ = ["ha_role"]


def ha_role(cfg: StoreConfig) -> str | None:
    """What the store's "ha" service does: "master" (serve slaves: a SYNC_MASTER, or a master
    given ``ha_listen_port``), "slave" (a SLAVE with ``ha_master_address``), or None."""
    if cfg.broker_role is BrokerRole.SLAVE:
        return "slave" if cfg.ha_master_address else None
    if cfg.broker_role is BrokerRole.SYNC_MASTER or "ha_listen_port" in cfg.explicit_keys:
        return "master"
    return None
