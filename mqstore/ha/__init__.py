"""Master/slave replication (docs/replication.md, docs/rocketmq-remoting-spec.md §4): the
master's HA service (``master.HAService``: slaves connect, the CommitLog streams to them from
where each stands) and the slave's HA client (``slave.HAClient``: appends what its master sends
and reports how far it got), over RocketMQ's own wire format (``mqstore.ha._ha``), after a
handshake in which both sides prove they hold the broker account when it is set
(``auth``: ``inner_access_key`` / ``inner_secret_key``)."""

from __future__ import annotations

import json
import os
from typing import Any

from mqstore.config import StoreConfig
from mqstore.log.directory import replace_file
from mqstore.roles import BrokerRole

__all__ = ["HA_MASTER_FILE", "TRUNCATE_EXIT", "TRUNCATED_FILE", "TRUNCATE_FILE", "ha_role", "read_ha_master",
           "read_truncation", "read_truncation_request", "record_truncation", "request_truncation",
           "write_ha_master"]

#: where a slave broker keeps its master's HA address, learned from the NameServer (in the store
#: directory; the HA client reads it when ha_master_address is empty)
HA_MASTER_FILE = "ha_master"


#: a slave's request to cut its log back to its master's end (JSON: offset, end, master), written
#: by its HA client when the master's log ends before the slave's; the store's owner carries it
#: out while nothing appends or dispatches (at once, or at the next open) and removes it
TRUNCATE_FILE = "ha_truncate"
#: what the last truncation dropped (JSON, mqstore.queue.recovery.Truncation.as_dict plus the
#: master and the time), shown in the HA status
TRUNCATED_FILE = "ha_truncated"
#: the exit status of a node's HA process that asks its owner to truncate (the supervisor stops
#: the other service processes, the owner truncates, and every process starts again)
TRUNCATE_EXIT = 75


def request_truncation(root: str, offset: int, end: int, master: str) -> None:
    replace_file(os.path.join(root, TRUNCATE_FILE),
                 json.dumps({"offset": offset, "end": end, "master": master}) + "\n", fsync=True)


def read_json_object(path: str) -> dict[str, Any] | None:
    """A small JSON file holding an object, or None when it is missing, unreadable or not one."""
    try:
        with open(path, encoding="utf-8") as fh:
            value = json.load(fh)
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def read_truncation_request(root: str) -> dict[str, Any] | None:
    """The pending request_truncation, or None (also for a file that does not parse)."""
    req = read_json_object(os.path.join(root, TRUNCATE_FILE))
    if req is None or not isinstance(req.get("offset"), int) or not isinstance(req.get("end"), int):
        return None
    return req


def record_truncation(root: str, done: dict[str, Any]) -> None:
    """Keep what a truncation dropped (for the status) and remove the request it carried out."""
    replace_file(os.path.join(root, TRUNCATED_FILE), json.dumps(done) + "\n", fsync=True)
    try:
        os.unlink(os.path.join(root, TRUNCATE_FILE))
    except FileNotFoundError:
        pass


def read_truncation(root: str | None) -> dict[str, Any] | None:
    """What the last truncation of this slave dropped, or None."""
    return None if root is None else read_json_object(os.path.join(root, TRUNCATED_FILE))


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
