"""Live figures of a store, read from its control block (and its HA service's ``ha.json``):
``mqstore stats`` (and the node's status).

Everything comes from ``<store>/mqstore.shm``, attached read-only (``ControlBlock.attach(...,
readonly=True)``: O_RDONLY, PROT_READ), and the small status file a replicating store's HA
service rewrites about every second (``ha.json``, read with ``open``): no store file is
opened, the store's lock is never taken, and the monitor works next to a running owner in
another process. Whether an owner
runs is asked of the kernel (the OFD lock on ``lock``, ``mqstore.log.directory.lock_state``); a
stopped store shows the last values its block holds.

- ``StatsReader(root).snapshot()``: every cell of the block at one instant (``Snapshot``).
  Each open of a store lays out a new block (renamed over the old file), so the reader
  re-attaches when the file was replaced; ``Snapshot.incarnation`` tells blocks apart.
- ``rates(prev, cur)``: what happened between two snapshots (``Rates``), a pure function.
  Counters of a different incarnation (the store was reopened: its counters restarted from
  0) or a counter that went back give no rate (``None``), never a negative one.
- ``figures(prev, cur)``: snapshot and rates as one JSON-ready dict; ``format_lines`` words
  it for people.
- ``render(root, ...)``: the command's loop (a table redrawn in place on a terminal, plain
  blocks otherwise, or one JSON object per line).
- ``replication_figures(snap)`` joins the block's replication cells to what the store's HA
  service last wrote about itself (``ha.json``, mqstore.ha.master.read_ha_status, the one file
  read besides the block) and ``replication_lines`` words that (stats, node status and admin
  status print the same lines).

The statistics are those of ``mq_ctl.h`` (``STAT_NAMES``). The ``*_max`` counters hold the
largest value since the block was laid out; an interval's maximum is known only when it set
a new one (``Rates.*_max_*`` is then that value, else ``None``: at most the since-open max).
"""

from __future__ import annotations

import dataclasses
import json as _json
import os
import shutil
import sys
import textwrap
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, TextIO

from mqstore.log import _shm
from mqstore.errors import MQStoreError
from mqstore.ha.master import read_ha_status
from mqstore.log.directory import lock_state, require_store
from mqstore.layout import CONTROL_BLOCK_NAME, log_of

if TYPE_CHECKING:
    from mqstore.log._shm import CellName

STATE_NAMES = {_shm.STATE_BUILDING: "BUILDING", _shm.STATE_READY: "READY", _shm.STATE_CLOSED: "CLOSED"}
POSITION_NAMES: tuple[CellName, ...] = ("wrote", "committed", "flushed", "dispatched", "confirmed", "min_phy")
TIMESTAMP_NAMES: tuple[CellName, ...] = ("last_store_timestamp", "dispatched_store_timestamp",
                                         "flushed_store_timestamp")
ERROR_CELLS: tuple[CellName, ...] = ("flush_error_count", "flush_last_errno", "alloc_error_count", "alloc_error_errno")
#: statistics that are not counters: no delta, no rate
GAUGES = frozenset({"flush_ns_last"})
#: events shown on every screen, even at zero (others only once they happened)
ALWAYS_SHOWN_EVENTS = ("lock_hold_warns", "lock_takeovers", "page_cache_busy", "flush_timeouts",
                       "service_not_available")
OTHER_EVENTS = ("pool_exhausted", "flush_errors", "alloc_errors", "create_mapped_file_failed", "message_illegal",
                "properties_size_exceeded", "dispatch_errors", "index_errors", "dispatch_skipped_bytes",
                "dispatch_skipped_records")
EVENT_LABELS = {"lock_hold_warns": "lock hold warnings", "page_cache_busy": "page cache busy",
                "service_not_available": "service not available", "pool_exhausted": "transient pool exhausted", "create_mapped_file_failed": "create file failed",
                "dispatch_skipped_bytes": "dispatch skipped bytes",
                "dispatch_skipped_records": "records no queue could take"}


class NoControlBlockError(MQStoreError):
    """The store directory has no control block to read live figures from."""

    hint = "mqstore info and mqstore inspect read what the store's files hold"


@dataclass(frozen=True)
class Snapshot:
    """The control block's cells at one instant (read in one pass, counters first, then the
    positions trailing first, so put_bytes <= wrote and flushed <= committed <= wrote hold)."""

    root: str
    mono_ns: int  # time.monotonic_ns() when read: rates divide by differences of this
    wall_ms: int
    status: str  # lock_state: running / crashed / clean / new
    owner_pid: int  # the process that laid out the block (the store's owner, or its last one)
    state: str  # BUILDING (the owner is recovering), READY, CLOSED (shut down)
    generation: int
    created_ms: int
    block_inode: int
    lock_kind: str
    sync_flush: bool
    file_size: int
    queues: int
    positions: dict[str, int]
    timestamps: dict[str, int]
    running_flags: tuple[str, ...]
    lock_holder_pid: int | None  # spin lock only; the mutex kind records none
    lock_begin_ms: int  # wall ms the current put lock hold began, 0 when free
    error_cells: dict[str, int]
    counters: dict[str, int]
    pool_buffers: int = 0  # transient store pool buffers (0: the store has no pool)
    ha_port: int = 0  # the port a master's HA service listens on (0: none)
    ha_slaves: int = 0  # the slaves connected to it
    ha_report_ms: int = 0  # wall ms of the last slave report (0: none since the block was laid out)
    ha: dict[str, Any] | None = None  # the HA service's ha.json (read_ha_status), None when there is none
    #: a store with several CommitLogs: per log (by id) its state, positions and put statistics
    #: (``positions`` above are log 0's); empty for a store with one
    logs: tuple[dict[str, Any], ...] = ()

    @property
    def incarnation(self) -> tuple[int, int, int]:
        """Which block: every open of the store lays out a new one, with counters from 0."""
        return (self.created_ms, self.generation, self.block_inode)

    @property
    def running(self) -> bool:
        return self.status == "running"

    @property
    def dispatch_behind_bytes(self) -> int:
        """Readable end minus the dispatched position (spec §10.1; Dispatcher.behind)."""
        return max(0, self.positions["committed"] - self.positions["dispatched"])

    @property
    def dispatch_lag_ms(self) -> int:
        """Store time of the newest written record minus that of the newest dispatched one
        (Dispatcher.lag_ms); 0 when nothing is behind."""
        done = self.timestamps["dispatched_store_timestamp"]
        if self.dispatch_behind_bytes == 0 or done <= 0:
            return 0
        return max(0, self.timestamps["last_store_timestamp"] - done)

    @property
    def uncommitted_bytes(self) -> int:
        """Bytes in the transient store pools' buffers not yet committed to the files (every
        CommitLog's)."""
        return sum(max(0, p["wrote"] - p["committed"]) for p in self._log_positions())

    @property
    def pool_buffers_in_use(self) -> int:
        """Buffers holding uncommitted bytes or being written (file i of a log uses buffer i mod
        size of the log's own pool), over every CommitLog's pool."""
        if not self.pool_buffers:
            return 0
        fs = self.file_size
        return sum(min(self.pool_buffers, (p["wrote"] - base) // fs - (p["committed"] - base) // fs + 1)
                   for base, p in ((k << 56, p) for k, p in enumerate(self._log_positions())))

    def _log_positions(self) -> list[dict[str, int]]:
        """Each CommitLog's positions, by log id (log 0's alone for a store with one)."""
        return [log["positions"] for log in self.logs] if self.logs else [self.positions]

    @property
    def unflushed_bytes(self) -> int:
        return max(0, self.positions["wrote"] - self.positions["flushed"])

    @property
    def lock_held_ms(self) -> int | None:
        """How long the current put lock holder has held it, None when the lock is free."""
        return max(0, self.wall_ms - self.lock_begin_ms) if self.lock_begin_ms else None


def snapshot_of(ctl: _shm.ControlBlock, *, root: str, status: str, block_inode: int = 0,
                ha: dict[str, Any] | None = None) -> Snapshot:
    """Read every figure of ctl now (loads only: ctl may be attached read-only); ``ha`` is the
    HA service's status (read_ha_status), read by the caller."""
    mono_ns = time.monotonic_ns()
    wall_ms = time.time_ns() // 1_000_000
    counters = ctl.stats()  # before the positions: a put publishes wrote before counting its bytes
    timestamps: dict[str, int] = {name: ctl.get(name) for name in TIMESTAMP_NAMES}
    positions = ctl.positions()
    holder = ctl.lock_holder
    return Snapshot(
        root=root, mono_ns=mono_ns, wall_ms=wall_ms, status=status, owner_pid=ctl.owner_pid,
        state=STATE_NAMES.get(ctl.state, str(ctl.state)), generation=ctl.generation, created_ms=ctl.created_ms,
        block_inode=block_inode, lock_kind=ctl.lock_kind, sync_flush=ctl.sync_flush, file_size=ctl.file_size,
        queues=ctl.table_count, positions={name: positions[name] for name in POSITION_NAMES}, timestamps=timestamps,
        running_flags=tuple(ctl.running_flags()), lock_holder_pid=None if holder is None else holder[0],
        lock_begin_ms=ctl.get("lock_begin_time_ms"), error_cells={name: ctl.get(name) for name in ERROR_CELLS},
        counters=counters, pool_buffers=ctl.pool_buffers, ha_port=ctl.get("ha_port"),
        ha_slaves=ctl.get("ha_slaves"), ha_report_ms=ctl.get("ha_report_ms"), ha=ha, logs=_logs_of(ctl))


def _logs_of(ctl: _shm.ControlBlock) -> tuple[dict[str, Any], ...]:
    """Each CommitLog's figures of a store with several (docs/parallel-commitlogs.md)."""
    if ctl.log_count <= 1:
        return ()
    out = []
    for k in range(ctl.log_count):
        stats = ctl.log_stats(k)
        positions = ctl.positions(k)
        out.append({"log": k, "state": ctl.log_state(k), **stats,
                    "positions": {name: positions[name] for name in POSITION_NAMES},
                    "dispatch_behind_bytes": max(0, positions["committed"] - positions["dispatched"]),
                    "unflushed_bytes": max(0, positions["wrote"] - positions["flushed"]),
                    "ha_slaves": ctl.get("ha_slaves", log=k), "ha_report_ms": ctl.get("ha_report_ms", log=k)})
    return tuple(out)


class StatsReader:
    """Snapshots of one store's control block, attached read-only and re-attached when the
    store was reopened (a new block renamed over the file)."""

    def __init__(self, root: str) -> None:
        self.root = require_store(root)
        self.path = os.path.join(self.root, CONTROL_BLOCK_NAME)
        self._ctl: _shm.ControlBlock | None = None
        self._inode = -1

    def _attached(self) -> tuple[_shm.ControlBlock, int]:
        try:
            inode = os.stat(self.path).st_ino
        except FileNotFoundError:
            raise NoControlBlockError(
                f"{self.root} has no control block ({CONTROL_BLOCK_NAME}): no mqstore process has opened this "
                f"store, so there are no live figures") from None
        if self._ctl is None or inode != self._inode:
            try:
                ctl = _shm.ControlBlock.attach(self.path, readonly=True)
            except ValueError as exc:
                raise NoControlBlockError(f"cannot read the control block: {exc}") from None
            self.close()
            self._ctl, self._inode = ctl, inode
        assert self._ctl is not None
        return self._ctl, self._inode

    def snapshot(self) -> Snapshot:
        ctl, inode = self._attached()
        return snapshot_of(ctl, root=self.root, status=lock_state(self.root)["status"], block_inode=inode,
                           ha=read_ha_status(self.root))

    def close(self) -> None:
        if self._ctl is not None:
            self._ctl.close()
            self._ctl = None

    def __enter__(self) -> StatsReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class Rates:
    """What happened between two snapshots. Every field is None when it cannot be known: the
    snapshots are of different incarnations (``restarted``), a counter went back, or (for
    averages) nothing of the kind happened in the interval."""

    interval_s: float
    restarted: bool
    deltas: dict[str, int | None]  # every counter's change
    puts_per_s: float | None
    messages_per_s: float | None
    bytes_per_s: float | None
    flushes_per_s: float | None
    flush_bytes_per_s: float | None
    flush_avg_ms: float | None
    flush_max_ms: float | None  # the interval's largest flush, when it set a new since-open max
    commits_per_s: float | None  # transient store pool commits
    commit_avg_ms: float | None
    group_commit_waits_per_s: float | None
    group_commit_wait_avg_ms: float | None
    lock_acquires_per_s: float | None
    lock_hold_avg_us: float | None
    lock_hold_max_us: float | None  # likewise
    dispatch_records_per_s: float | None
    allocs_per_s: float | None
    alloc_avg_ms: float | None
    alloc_max_ms: float | None
    roll_waits_per_s: float | None
    roll_wait_avg_ms: float | None
    roll_wait_max_ms: float | None


def rates(prev: Snapshot, cur: Snapshot) -> Rates:
    """Rates, averages and interval maxima from prev to cur (a pure function)."""
    interval_s = (cur.mono_ns - prev.mono_ns) / 1e9
    restarted = prev.incarnation != cur.incarnation
    deltas: dict[str, int | None] = {}
    for name, value in cur.counters.items():
        if name in GAUGES:
            continue
        before = prev.counters.get(name)
        deltas[name] = None if restarted or before is None or value < before else value - before

    def per_s(name: str) -> float | None:
        d = deltas[name]
        return None if d is None or interval_s <= 0 else d / interval_s

    def avg(total: str, count: str, unit_ns: float) -> float | None:
        n, t = deltas[count], deltas[total]
        return None if not n or t is None else t / n / unit_ns

    def interval_max(name: str, unit_ns: float) -> float | None:
        d = deltas[name]
        return cur.counters[name] / unit_ns if d else None

    return Rates(
        interval_s=interval_s, restarted=restarted, deltas=deltas,
        puts_per_s=per_s("put_requests"), messages_per_s=per_s("put_messages"), bytes_per_s=per_s("put_bytes"),
        flushes_per_s=per_s("flush_count"), flush_bytes_per_s=per_s("flush_bytes"),
        flush_avg_ms=avg("flush_ns_total", "flush_count", 1e6), flush_max_ms=interval_max("flush_ns_max", 1e6),
        commits_per_s=per_s("commit_count"), commit_avg_ms=avg("commit_ns_total", "commit_count", 1e6),
        group_commit_waits_per_s=per_s("group_commit_waits"),
        group_commit_wait_avg_ms=avg("flush_wait_ns_total", "group_commit_waits", 1e6),
        lock_acquires_per_s=per_s("lock_acquires"), lock_hold_avg_us=avg("lock_hold_ns_total", "lock_acquires", 1e3),
        lock_hold_max_us=interval_max("lock_hold_ns_max", 1e3), dispatch_records_per_s=per_s("dispatch_records"),
        allocs_per_s=per_s("alloc_count"), alloc_avg_ms=avg("alloc_ns_total", "alloc_count", 1e6),
        alloc_max_ms=interval_max("alloc_ns_max", 1e6), roll_waits_per_s=per_s("roll_waits"),
        roll_wait_avg_ms=avg("roll_wait_ns_total", "roll_waits", 1e6),
        roll_wait_max_ms=interval_max("roll_wait_ns_max", 1e6))


def owner_note(snap: Snapshot) -> str | None:
    """What the reader should know about who writes the figures, or None if a store is
    running normally."""
    if snap.running:
        if snap.state == "BUILDING":
            return "the owner is opening the store (recovery and start-up dispatch): the figures are moving"
        if snap.state == "CLOSED":
            return ("a store holds the lock but the control block is the last run's (CLOSED): the owner is "
                    "starting and has not laid out its block yet")
        return None
    how = {"crashed": "the last run did not shut down cleanly (abort file present)",
           "clean": "it shut down cleanly", "new": "no lock file"}.get(snap.status, snap.status)
    return (f"no owner is running: {how}. The figures are the last values left by pid {snap.owner_pid}, "
            f"counted since it opened the store")


#: an ha.json this old is shown with its age (the service writes it about every second; a slave
#: retrying a master it cannot reach writes it between tries, some seconds apart)
HA_STATUS_STALE_MS = 10_000


def replication_figures(snap: Snapshot) -> dict[str, Any]:
    """The store's replication as one JSON-ready dict: the control block's cells (``ha_port``
    the port a master's HA service listens on, ``ha_slaves`` the slaves connected,
    ``ha_report_ms`` when the last report came, ``confirmed`` the highest offset a slave
    reported holding, and ``fall_behind_bytes``, the log's end minus that: RocketMQ's
    slaveFallBehindMuch) and what the HA service last wrote (``service``: ha.json, with the
    per-slave figures on a master; None when there is none), with its age. ``role`` is
    "master", "slave" or None (the store does not replicate). A store with several CommitLogs
    adds ``logs``, each log's cells (log_replication); the figures above are log 0's."""
    ha = snap.ha
    if ha is not None:
        role = ha.get("role")
    else:
        role = "master" if snap.ha_port > 0 or snap.ha_report_ms > 0 else None
    confirmed = snap.positions["confirmed"]
    written = ha.get("time_ms") if ha is not None else None
    several = {"logs": [log_replication(role, snap.wall_ms, entry["log"], entry["positions"]["wrote"],
                                        entry["positions"]["confirmed"], entry["ha_slaves"], entry["ha_report_ms"])
                        for entry in snap.logs]} if snap.logs else {}
    return {
        "role": role,
        "ha_port": snap.ha_port,
        "ha_slaves": snap.ha_slaves,
        "ha_report_ms": snap.ha_report_ms,
        "last_report_ago_ms": max(0, snap.wall_ms - snap.ha_report_ms) if snap.ha_report_ms > 0 else None,
        "confirmed": confirmed,
        "fall_behind_bytes": max(0, snap.positions["wrote"] - confirmed) if role == "master" else None,
        "service": ha,
        "service_age_ms": max(0, snap.wall_ms - written) if isinstance(written, int) and written > 0 else None,
        **several,
    }


def log_replication(role: str | None, now_ms: int, log: int, wrote: int, confirmed: int, slaves: int,
                    report_ms: int) -> dict[str, Any]:
    """One CommitLog's replication figures of a store with several (``replication_figures``'s
    ``logs``): its cells as the store-wide ones above are log 0's."""
    return {"log": log, "ha_slaves": slaves, "ha_report_ms": report_ms,
            "last_report_ago_ms": max(0, now_ms - report_ms) if report_ms > 0 else None, "confirmed": confirmed,
            "fall_behind_bytes": max(0, wrote - confirmed) if role == "master" else None}


def replication_lines(rep: dict[str, Any]) -> list[str]:
    """Replication figures (``replication_figures``'s shape) in words: a head line, then one
    line per slave on a master (its offset, lag in bytes and ms, transfer rate) or the
    divergence on a slave; [] when the store does not replicate. A store with several
    CommitLogs (``logs`` in the figures, ``logs`` in a slave's ha.json) gets a line per log
    instead: on a master its slaves, ``confirmed`` and fall-behind, then its slaves' lines; on
    a slave its connection and offset."""
    role = rep.get("role")
    if role is None:
        return []
    ha = rep.get("service") or {}
    age = rep.get("service_age_ms")
    stale = f" (ha.json written {age / 1000:,.0f} s ago)" if age is not None and age >= HA_STATUS_STALE_MS else ""
    if role == "master":
        port = rep.get("ha_port") or 0
        where = f"HA port {port}" if port else "HA service not listening"
        logs = rep.get("logs") or []
        if logs:
            agos = [e["last_report_ago_ms"] for e in logs if e.get("last_report_ago_ms") is not None]
            last = f"last report {min(agos):,} ms ago" if agos else "no report yet"
            out = [f"replication: master, {where}, {len(logs)} CommitLogs, {last}{stale}"]
            for e in logs:
                k = e.get("log")
                out.append(f"  CommitLog {k}: {e.get('ha_slaves', 0)} slave(s) connected, confirmed "
                           f"{e.get('confirmed', 0):,} (the highest offset a slave reported), "
                           f"{e.get('fall_behind_bytes') or 0:,} bytes behind its end")
                out += [f"    {_slave_line(s)}" for s in ha.get("slaves", []) if s.get("log", 0) == k]
            return out
        ago = rep.get("last_report_ago_ms")
        last = f"last report {ago:,} ms ago" if ago is not None else "no report yet"
        out = [f"replication: master, {where}, {rep.get('ha_slaves', 0)} slave(s) connected, {last}{stale}",
               f"  confirmed {rep.get('confirmed', 0):,} (the highest offset a slave reported), "
               f"{rep.get('fall_behind_bytes') or 0:,} bytes behind the log's end"]
        out += [f"  {_slave_line(s)}" for s in ha.get("slaves", [])]
        return out
    of = ha.get("master") or "?"
    if ha.get("master_broker"):  # a slave broker's master, as its NameServer named it (admin status)
        of += f" (broker {ha['master_broker']})"
    peers = ha.get("logs") if isinstance(ha.get("logs"), list) else []
    if peers:
        connected = sum(1 for p in peers if isinstance(p, dict) and p.get("connected"))
        out = [f"replication: slave of {of}, {len(peers)} CommitLogs, {connected} connected{stale}"]
        for k, peer in enumerate(p if isinstance(p, dict) else {} for p in peers):
            out.append(f"  CommitLog {k}: offset {peer.get('offset', 0):,}, {_slave_state(peer)}")
            if peer.get("diverged"):
                out.append(f"  CommitLog {k} DIVERGED: {peer['diverged']}")
    else:
        out = [f"replication: slave of {of}, offset {ha.get('offset', 0):,}, {_slave_state(ha)}{stale}"]
        if ha.get("diverged"):
            out.append(f"  DIVERGED: {ha['diverged']}")
    cut = ha.get("truncated")
    if isinstance(cut, dict) and isinstance(cut.get("offset"), int) and isinstance(cut.get("end"), int):
        which = f"CommitLog {log_of(cut['offset'])}" if peers else "the log"
        out.append(f"  last truncation: {which} was cut from {cut['end']:,} back to the master's end "
                   f"{cut['offset']:,} ({cut['end'] - cut['offset']:,} bytes dropped)")
    return out


def _slave_line(s: dict[str, Any]) -> str:
    """A master's line for one slave connection (ha.json's ``slaves``)."""
    ack = s.get("ack_offset", -1)
    at = f"offset {ack:,}" if ack >= 0 else "no report yet"
    return (f"slave {s.get('slave')}: {at}, lag {s.get('lag_bytes', 0):,} bytes / "
            f"{s.get('lag_ms', 0):,} ms, {_bytes(s.get('rate_bytes_per_s', 0))}/s")


def _slave_state(ha: dict[str, Any]) -> str:
    """Whether a slave's connection (its ha.json, or one log's part of it) is up, or why not."""
    if ha.get("connected"):
        return "connected"
    return f"not connected ({ha.get('last_error') or ('connecting' if ha.get('master') else 'no master known')})"


def figures(prev: Snapshot | None, cur: Snapshot) -> dict[str, Any]:
    """cur and the rates since prev (None: no rates yet) as one JSON-ready dict."""
    r = rates(prev, cur) if prev is not None else None
    rate_fields = ({f.name: getattr(r, f.name) for f in dataclasses.fields(r) if f.name not in ("deltas",)}
                   if r is not None else None)
    c = cur.counters
    return {
        "root": cur.root,
        "time": ms_to_iso(cur.wall_ms),
        "wall_ms": cur.wall_ms,
        "status": cur.status,
        "running": cur.running,
        "note": owner_note(cur),
        "owner_pid": cur.owner_pid,
        "state": cur.state,
        "generation": cur.generation,
        "created_ms": cur.created_ms,
        "lock_kind": cur.lock_kind,
        "flush_disk_type": "SYNC_FLUSH" if cur.sync_flush else "ASYNC_FLUSH",
        "file_size": cur.file_size,
        "queues": cur.queues,
        "running_flags": list(cur.running_flags),
        "positions": cur.positions,
        "unflushed_bytes": cur.unflushed_bytes,
        "pool_buffers": cur.pool_buffers,
        "pool_buffers_in_use": cur.pool_buffers_in_use,
        "uncommitted_bytes": cur.uncommitted_bytes,
        "dispatch_behind_bytes": cur.dispatch_behind_bytes,
        "dispatch_lag_ms": cur.dispatch_lag_ms,
        "timestamps": cur.timestamps,
        "lock_holder_pid": cur.lock_holder_pid,
        "lock_held_ms": cur.lock_held_ms,
        "error_cells": cur.error_cells,
        "rates": rate_fields,
        "since_open": {"flush_max_ms": c["flush_ns_max"] / 1e6, "flush_last_ms": c["flush_ns_last"] / 1e6,
                       "lock_hold_max_us": c["lock_hold_ns_max"] / 1e3, "alloc_max_ms": c["alloc_ns_max"] / 1e6,
                       "roll_wait_max_ms": c["roll_wait_ns_max"] / 1e6},
        "counters": c,
        "deltas": r.deltas if r is not None else None,
        "replication": replication_figures(cur),
        **({"logs": list(cur.logs)} if cur.logs else {}),
    }


# -- words for people ---------------------------------------------------------------------
WIDE = 100  # columns of the text when it is not drawn on a terminal (a pipe, a file)
NARROWEST = 40


def format_lines(fig: dict[str, Any], width: int = WIDE, height: int | None = None) -> list[str]:
    """The figures as a screen of text: at most ``width`` columns, wrapped between words (never
    cut inside one), and at most ``height`` lines when given: a short terminal gets the most
    important parts (owner, flags, positions, lag, events, then the rate rows by importance)
    and one last line saying how many were left out."""
    width = max(NARROWEST, width)
    r = fig["rates"]
    over = ("rates: not yet (waiting for a second sample)" if r is None else
            "rates: none (the store was reopened between the samples)" if r["restarted"] else
            f"rates over {r['interval_s']:.2f} s")
    who = "running" if fig["running"] else f"not running ({fig['status']})"
    opened = ms_to_iso(fig["created_ms"]) if fig["created_ms"] > 0 else "never"
    held = fig["lock_held_ms"]
    holder = f" by pid {fig['lock_holder_pid']}" if fig["lock_holder_pid"] is not None else ""
    lock = f"held{holder} for {held:,} ms" if held is not None else "free"

    def wrap(text: str, indent: str = "", more: str = "    ") -> list[str]:
        return textwrap.wrap(text, width, initial_indent=indent, subsequent_indent=more,
                             break_long_words=False, break_on_hyphens=False) or [indent.rstrip()]

    # (priority, lines): lower numbers are kept first when the height is short
    parts: list[tuple[int, list[str]]] = [
        (0, wrap(f"store {fig['root']}  {fig['time']}  {over}")),
        (1, wrap(f"owner: {who}, pid {fig['owner_pid']}; control block {fig['state']}, generation "
                 f"{fig['generation']}", "  ")),
        (6, wrap(f"opened {opened}; {fig['lock_kind']} put lock, {fig['flush_disk_type']}, "
                 f"{_bytes(fig['file_size'])} files, {fig['queues']:,} queue(s)", "    ", "      ")),
        (1, wrap(f"running flags: {', '.join(fig['running_flags']) or 'none'}", "  ")),
    ]
    if fig["note"]:
        parts.append((2, wrap(fig["note"], "  NOTE: ", "        ")))
    parts += _rate_rows(fig, width)
    parts.append((3, _event_lines(fig, width)))
    parts.append((2, _position_lines(fig, width)))
    if fig["pool_buffers"]:
        pools = len(fig.get("logs") or ()) or 1  # a pool per CommitLog
        each = f" ({pools} pools of {fig['pool_buffers']})" if pools > 1 else ""
        parts.append((4, wrap(f"transient store pool: {fig['pool_buffers_in_use']} of {fig['pool_buffers'] * pools} "
                              f"buffers in use{each}, uncommitted {_bytes(fig['uncommitted_bytes'])}", "  ")))
    parts.append((2, wrap(f"unflushed {_bytes(fig['unflushed_bytes'])}; dispatch behind "
                          f"{_bytes(fig['dispatch_behind_bytes'])}, lag {fig['dispatch_lag_ms']:,} ms; put lock {lock}",
                          "  ")))
    for entry in fig.get("logs", ()):
        mean_hold = entry["lock_hold_ns_total"] / entry["puts"] / 1e3 if entry["puts"] else 0.0
        parts.append((3, wrap(f"CommitLog {entry['log']} ({entry['state']}): {entry['puts']:,} puts, "
                              f"{_bytes(entry['bytes'])}; wrote {entry['positions']['wrote']:,}, unflushed "
                              f"{_bytes(entry['unflushed_bytes'])}, dispatch behind "
                              f"{_bytes(entry['dispatch_behind_bytes'])}; lock hold avg {mean_hold:,.2f} us, "
                              f"{entry['lock_waits']:,} waits", "  ", "    ")))
    replication = replication_lines(fig["replication"])
    if replication:
        parts.append((2, wrap(replication[0], "  ")))
        for line in replication[1:]:  # indented as replication_lines nests them (a slave under its log)
            lead = "  " + line[:len(line) - len(line.lstrip())]
            parts.append((3, wrap(line.strip(), lead, lead + "  ")))
    return _fit(parts, height, width)


def _fit(parts: list[tuple[int, list[str]]], height: int | None, width: int) -> list[str]:
    """The parts in order, leaving out the least important ones that do not fit height lines."""
    total = sum(len(lines) for _, lines in parts)
    if height is None or total <= height:
        return [line for _, lines in parts for line in lines]
    budget = max(1, height - 1)  # one line says what was left out
    keep: set[int] = set()
    used = 0
    for i in sorted(range(len(parts)), key=lambda i: (parts[i][0], i)):
        if used + len(parts[i][1]) <= budget:
            keep.add(i)
            used += len(parts[i][1])
    out = [line for i, (_, lines) in enumerate(parts) if i in keep for line in lines]
    hidden = total - used
    return [*out, f"({hidden} more line(s): a taller terminal shows them)"[:width]][:height]


def _rate_rows(fig: dict[str, Any], width: int) -> list[tuple[int, list[str]]]:
    """The rate table: a header and one part per row (with its detail wrapped under it when
    the row does not fit), each row with its importance."""
    r, c, d, since = fig["rates"], fig["counters"], fig["deltas"], fig["since_open"]

    def rate(name: str) -> float | None:
        return None if r is None else r[name]

    def delta(name: str) -> int | None:
        return None if d is None else d[name]

    def maximum(interval_key: str, since_key: str, unit: str, count: str) -> str:
        """The interval's max when it set a new high, else the since-open max (an upper bound)."""
        value = rate(interval_key)
        if value is not None:
            return f"max {value:,.2f} {unit} (a new high)"
        return f"max since open {since[since_key]:,.2f} {unit}" if c[count] else ""

    def detail(avg_key: str, unit: str, max_part: str) -> str:
        avg = rate(avg_key)
        parts = ([f"avg {avg:,.2f} {unit}"] if avg is not None else []) + ([max_part] if max_part else [])
        return ", ".join(parts)

    # (importance, label, per second, interval, total, detail)
    rows: list[tuple[int, str, str, str, str, str]] = [
        (3, "puts", _num(rate("puts_per_s")), _num(delta("put_requests")), _num(c["put_requests"]), ""),
        (3, "messages", _num(rate("messages_per_s")), _num(delta("put_messages")), _num(c["put_messages"]), ""),
        (4, "bytes", _bytes(rate("bytes_per_s")), _bytes(delta("put_bytes")), _bytes(c["put_bytes"]), ""),
        (4, "flushes", _num(rate("flushes_per_s")), _num(delta("flush_count")), _num(c["flush_count"]),
         detail("flush_avg_ms", "ms", maximum("flush_max_ms", "flush_max_ms", "ms", "flush_count"))),
        *([(5, "commits", _num(rate("commits_per_s")), _num(delta("commit_count")), _num(c["commit_count"]),
            detail("commit_avg_ms", "ms", ""))] if fig["pool_buffers"] else []),
        (5, "flushed bytes", _bytes(rate("flush_bytes_per_s")), _bytes(delta("flush_bytes")),
         _bytes(c["flush_bytes"]), ""),
        (5, "group-commit waits", _num(rate("group_commit_waits_per_s")), _num(delta("group_commit_waits")),
         _num(c["group_commit_waits"]), detail("group_commit_wait_avg_ms", "ms", "")),
        (5, "lock acquires", _num(rate("lock_acquires_per_s")), _num(delta("lock_acquires")),
         _num(c["lock_acquires"]), detail("lock_hold_avg_us", "us held",
                                          maximum("lock_hold_max_us", "lock_hold_max_us", "us", "lock_acquires"))),
        (4, "dispatched records", _num(rate("dispatch_records_per_s")), _num(delta("dispatch_records")),
         _num(c["dispatch_records"]), ""),
        (6, "file allocations", _num(rate("allocs_per_s")), _num(delta("alloc_count")), _num(c["alloc_count"]),
         detail("alloc_avg_ms", "ms", maximum("alloc_max_ms", "alloc_max_ms", "ms", "alloc_count"))),
        (6, "roll waits", _num(rate("roll_waits_per_s")), _num(delta("roll_waits")), _num(c["roll_waits"]),
         detail("roll_wait_avg_ms", "ms", maximum("roll_wait_max_ms", "roll_wait_max_ms", "ms", "roll_waits"))),
    ]
    headers = ("", "PER SECOND", "INTERVAL", "TOTAL")
    widths = [max(len(h), *(len(str(row[i + 1])) for row in rows)) for i, h in enumerate(headers)]
    numbers_end = 4 + sum(widths) + 2 * 3
    narrow = numbers_end > width  # drop the INTERVAL column
    columns = (0, 1, 3) if narrow else (0, 1, 2, 3)

    def line(cells: tuple[str, ...]) -> str:
        return ("    " + cells[0].ljust(widths[0])
                + "".join("  " + cells[i].rjust(widths[i]) for i in columns[1:])).rstrip()

    out: list[tuple[int, list[str]]] = [(3, [line(headers)])]
    for importance, label, per_s, interval, total, text in rows:
        head = line((label, per_s, interval, total))
        if not text:
            out.append((importance, [head]))
        elif len(head) + 2 + len(text) <= width:
            out.append((importance, [head + "  " + text]))
        else:
            indent = " " * 6
            out.append((importance, [head, *textwrap.wrap(text, width, initial_indent=indent,
                                                          subsequent_indent=indent, break_long_words=False)]))
    return out


def _position_lines(fig: dict[str, Any], width: int) -> list[str]:
    """POSITION headers over their values, in as many rows of columns as the width needs."""
    values = [f"{fig['positions'][name]:,}" for name in POSITION_NAMES]
    widths = [max(len(name), len(v)) for name, v in zip(POSITION_NAMES, values)]
    lines: list[str] = []
    start = 0
    prefix = "  positions  "
    while start < len(values):
        end, used = start, len(prefix)
        while end < len(values) and (end == start or used + 2 + widths[end] <= width):
            used += widths[end] + (2 if end > start else 0)
            end += 1
        lead = prefix if start == 0 else " " * len(prefix)
        lines.append(lead + "  ".join(n.upper().rjust(w) for n, w in zip(POSITION_NAMES[start:end], widths[start:end])))
        lines.append(" " * len(prefix) + "  ".join(v.rjust(w) for v, w in zip(values[start:end], widths[start:end])))
        start = end
    return lines


def _event_lines(fig: dict[str, Any], width: int) -> list[str]:
    """'label interval/total' of the failure and warning counters: the usual ones always,
    the others once they happened, wrapped between items."""
    c, d = fig["counters"], fig["deltas"]
    names = [*ALWAYS_SHOWN_EVENTS, *(n for n in OTHER_EVENTS if c[n])]
    shown = [f"{EVENT_LABELS.get(n, n.replace('_', ' '))} {_num(None if d is None else d[n])}/{c[n]:,}"
             for n in names]
    cells = fig["error_cells"]
    if cells["flush_error_count"]:
        shown.append(f"last flush errno {cells['flush_last_errno']} ({os.strerror(cells['flush_last_errno'])})")
    if cells["alloc_error_count"]:
        shown.append(f"last allocation errno {cells['alloc_error_errno']} ({os.strerror(cells['alloc_error_errno'])})")
    lines, current = [], "  events (interval/total):"
    for part in shown:
        if len(current) + len(part) + 2 > width:
            lines.append(current + ",")
            current = "   "
        current += (" " if current.endswith(":") or current == "   " else ", ") + part
    return [*lines, current]


def _num(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if abs(value) >= 100 or float(value).is_integer() else f"{value:,.1f}"


def _bytes(value: float | None) -> str:
    if value is None:
        return "-"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(value) >= size:
            return f"{value / size:,.1f} {unit}"
    return f"{value:,.0f} B"


def ms_to_iso(ms: int) -> str:
    """A wall-clock ms time as UTC ISO 8601 with ms."""
    try:
        return datetime.fromtimestamp(ms / 1000, timezone.utc).isoformat(timespec="milliseconds")
    except (OverflowError, OSError, ValueError):
        return "out of range"


# -- the command's loop -------------------------------------------------------------------
class Screen:
    """A block of lines redrawn in place on a terminal with ANSI escapes (cursor up to the
    block's first line, clear to the end of the screen); lines are cut to the terminal width
    so none wraps and the block's height stays what was drawn."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.height = 0

    def size(self) -> tuple[int, int]:
        """(columns, lines) of the terminal: text fits one column less (no wrap at the edge)
        and one line less (the cursor's line after the block)."""
        size = shutil.get_terminal_size()
        return size.columns - 1, size.lines - 1

    def draw(self, lines: list[str]) -> None:
        width, height = self.size()
        lines = [line[:width] for line in lines[:height]]  # a safety net: format_lines already fits them
        text = "".join(line + "\n" for line in lines)
        self.out.write((f"\x1b[{self.height}F\x1b[J" if self.height else "") + text)
        self.out.flush()
        self.height = len(lines)


def render(root: str, *, once: bool = False, interval: float = 1.0, json: bool = False, count: int | None = None,
           out: TextIO | None = None) -> int:
    """Print the figures of the store at root: ``count`` times (``once``: one), each with the
    rates over ``interval`` seconds; forever when neither is given, until interrupted.

    ``json``: one JSON object per line (``figures``). Otherwise a table, redrawn in place when
    ``out`` is a terminal (shown at once, rates from the next sample on), plain blocks of text
    separated by a blank line when it is not. Returns the exit code (0)."""
    out = sys.stdout if out is None else out
    if interval <= 0:
        raise ValueError(f"interval must be > 0 seconds, not {interval}")
    limit = 1 if once else count
    screen = Screen(out) if out.isatty() and not json and not once else None
    with StatsReader(root) as reader:
        prev = reader.snapshot()
        if screen is not None:
            screen.draw(format_lines(figures(None, prev), *screen.size()))
        done = 0
        due = time.monotonic() + interval
        try:
            while limit is None or done < limit:
                time.sleep(max(0.0, due - time.monotonic()))
                due += interval
                cur = reader.snapshot()
                fig = figures(prev, cur)
                if json:
                    out.write(_json.dumps(fig) + "\n")
                elif screen is not None:
                    screen.draw(format_lines(fig, *screen.size()))
                else:
                    out.write(("\n" if done else "") + "\n".join(format_lines(fig)) + "\n")
                out.flush()
                prev = cur
                done += 1
        except KeyboardInterrupt:  # Ctrl-C ends a refreshing screen: not an error
            pass
    return 0
