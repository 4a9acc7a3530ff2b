"""open_parts: the one place that maps a store's parts, for every process that needs them.

A store's parts are its CommitLog (the appender over the mapped files, or the files alone),
the ConsumeQueues, the IndexFiles, the checkpoint, the transient store pool and the dispatcher.
Who maps which of them, and how, depends on the process's role; this module is the table of it,
in the shape of Kafka's LogLoader (one loader, whoever opens a log):

=============  ====================================================================================
role           what open_parts maps
=============  ====================================================================================
owner          the CommitLog over the pool the caller created (its files loaded as an open after
               a crash or a clean stop must see them), the checkpoint, the ConsumeQueues and the
               index loaded, ready for recovery (mqstore.queue.recovery); no dispatcher yet.
               With several CommitLogs (commit_log_count): each log's CommitLog, checkpoint
               and index (``commitlogs``, ``checkpoints``, ``indexes``); the other roles
               serve a store with one for now
attached       the CommitLog over the owner's pool (files the owner's allocator made, mapped as
               they appear), the ConsumeQueue table (queues opened as reads need them), a
               following index (reads only, no checkpoint) and a dispatcher that only follows
allocator      the CommitLog files alone (it creates the next ones)
flusher        each CommitLog over its own pool of the owner's, when there are pools
dispatcher     the CommitLog, the ConsumeQueues resumed at what the last dispatcher published,
               the checkpoint, the index, and the dispatcher over them (``log=k``: log k's
               alone and the ConsumeQueues of its queues, for its own dispatcher process)
cleaner        the CommitLog files, the ConsumeQueues following the dispatcher's counts, the
               checkpoint and the index
ha             a slave: the CommitLog (it appends what the master sends); a master: the files
rebuild        (the Spark rebuild of a store's queues) fresh ConsumeQueues, and each log's checkpoint
               and index, under ``root``, which is the rebuild's target directory; no control block
=============  ====================================================================================

The read-only tools and the Spark source read the files through
``mqstore.queue.files.open_commitlog`` and ``queue_dirs``, which neither create nor fix anything.

``StoreParts.close()`` closes what open_parts opened, last opened first; the control block and a
pool the caller passed in stay the caller's. open_parts closes what it opened when it fails.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from mqstore.layout import checkpoint_path, consumequeue_dir
from mqstore.roles import BrokerRole

if TYPE_CHECKING:
    from mqstore.log._shm import ControlBlock
    from mqstore.config import StoreConfig
    from mqstore.log.checkpoint import StoreCheckpoint
    from mqstore.log.commitlog import CommitLog
    from mqstore.log.mapped_file_queue import MappedFileQueue
    from mqstore.queue.consume_queue import ConsumeQueueTable
    from mqstore.queue.dispatch import Dispatcher
    from mqstore.queue.index import IndexService

log = logging.getLogger("mqstore.parts")

ROLES = ("owner", "attached", "allocator", "flusher", "dispatcher", "cleaner", "ha", "rebuild")


@dataclass
class StoreParts:
    """A store's parts as one process mapped them (what services are built over: see
    mqstore.services.registry). Only what the role needs is set."""

    root: str
    config: StoreConfig
    ctl: ControlBlock  # (None in a rebuild, whose parts need none)
    #: the CommitLog files alone (allocator, cleaner, a master's HA service); the CommitLog's own
    #: queue where there is a CommitLog
    log_files: MappedFileQueue | None = None
    commitlog: CommitLog | None = None
    consume_queues: ConsumeQueueTable | None = None
    index: IndexService | None = None
    checkpoint: StoreCheckpoint | None = None
    dispatcher: Dispatcher | None = None
    pool: Any | None = None                    # the transient store pool (log 0's), when enabled
    pools: list[Any] = field(default_factory=list)  # every CommitLog's pool, by log id
    truncate: Callable[[], Any] | None = None  # the owner's truncation of a slave (threads only)
    closers: list[Any] = field(default_factory=list, repr=False)
    #: every CommitLog's parts, by log id, for an owner of a store with several CommitLogs
    #: (docs/parallel-commitlogs.md); the fields above are log 0's
    commitlogs: list[CommitLog] = field(default_factory=list)
    indexes: list[IndexService | None] = field(default_factory=list)
    checkpoints: list[StoreCheckpoint] = field(default_factory=list)
    dispatchers: list[Dispatcher] = field(default_factory=list)
    #: every log's files (a CommitLog's own queue, or the files alone), by log id
    log_queues: list[MappedFileQueue] = field(default_factory=list)

    @property
    def log_count(self) -> int:
        """The CommitLogs these parts hold."""
        return max(1, len(self.log_queues), len(self.commitlogs))

    def _opened(self, obj: Any) -> Any:
        self.closers.append(obj)
        return obj

    def close(self) -> None:
        """Close what open_parts opened, last opened first. Idempotent. An OSError is logged and
        the rest still closed."""
        while self.closers:
            obj = self.closers.pop()
            try:
                obj.close()
            except OSError as exc:
                log.error("closing %r failed: %s", obj, exc)


def open_parts(root: str, config: StoreConfig, ctl: ControlBlock | None, role: str, *,
               pool: Any | None = None, clean: bool = True, log: int | None = None) -> StoreParts:
    """Map the parts of the store at root that a process of ``role`` needs (see the module's
    table). pool: the owner's transient store pool, or its list of one pool per CommitLog
    (role "owner"; other roles attach to the owner's themselves). clean: whether the last owner stopped cleanly (role "owner": an index
    after a crash is loaded for repair). log: role "dispatcher" of one CommitLog
    (dispatch_logs_in_parallel): that log's CommitLog, checkpoint and index, and a table of
    its queues alone."""
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; one of {', '.join(ROLES)}")
    if log is not None and (role != "dispatcher" or not 0 <= log < config.commit_log_count):
        raise ValueError(f"log={log}: only a dispatcher serves one CommitLog, of 0 .. {config.commit_log_count - 1}")
    if role != "rebuild" and ctl is None:
        raise ValueError(f"role {role!r} needs the store's control block")
    parts = StoreParts(root, config, cast("ControlBlock", ctl))
    try:
        _OPENERS[role](parts, pool=pool, clean=clean, **({} if log is None else {"log_id": log}))
    except BaseException:
        parts.close()
        raise
    if parts.commitlog is not None and parts.log_files is None:
        parts.log_files = parts.commitlog.queue
    if not parts.log_queues:
        parts.log_queues = [cl.queue for cl in parts.commitlogs] or ([parts.log_files] if parts.log_files else [])
    return parts


# -- one opener per role ---------------------------------------------------------------------
def _commitlog(parts: StoreParts, pool: Any | None = None, *, map_files: bool = True, log: int = 0) -> CommitLog:
    from mqstore.log.commitlog import CommitLog

    commitlog = parts._opened(CommitLog(parts.root, parts.config, parts.ctl, pool, log=log))
    if map_files:
        commitlog.queue.map_new_files()
    if log == 0:
        parts.commitlog = commitlog
    return commitlog


def _log_files(parts: StoreParts) -> list[MappedFileQueue]:
    """Every log's files alone (no CommitLog); ``log_files`` is log 0's."""
    from mqstore.log.commitlog import commit_log_files

    parts.log_queues = [parts._opened(commit_log_files(parts.root, parts.config, k))
                        for k in range(parts.config.commit_log_count)]
    parts.log_files = parts.log_queues[0]
    return parts.log_queues


def _commitlogs(parts: StoreParts, pools: list[Any] | None = None, *, map_files: bool = True) -> list[CommitLog]:
    """Every log's CommitLog, each over its own transient store pool when there are pools;
    ``commitlog`` is log 0's."""
    count = parts.config.commit_log_count
    if pools and len(pools) != count:
        raise ValueError(f"{len(pools)} transient store pool(s) for {count} CommitLog(s): each log has its own")
    parts.commitlogs = [_commitlog(parts, pools[k] if pools else None, map_files=map_files, log=k)
                        for k in range(count)]
    return parts.commitlogs


def _indexes(parts: StoreParts, *, with_checkpoint: bool = True, clean: bool = True) -> list[IndexService | None]:
    """Every log's index (None where the index is off), each with its log's checkpoint;
    ``index`` is log 0's."""
    parts.indexes = [_index(parts, with_checkpoint=with_checkpoint, clean=clean, log=k,
                            checkpoint=parts.checkpoints[k] if with_checkpoint else None)
                     for k in range(parts.config.commit_log_count)]
    return parts.indexes


def _checkpoints(parts: StoreParts) -> list[StoreCheckpoint]:
    parts.checkpoints = [_checkpoint(parts, k) for k in range(parts.config.commit_log_count)]
    return parts.checkpoints


def _queues(parts: StoreParts, *, load: bool = True, only_log: int | None = None) -> ConsumeQueueTable:
    from mqstore.queue.consume_queue import ConsumeQueueTable

    queues = parts._opened(ConsumeQueueTable(consumequeue_dir(parts.root), parts.config.mapped_file_size_consume_queue,
                                             parts.config.commit_log_count, only_log))
    if load:
        queues.load()
    parts.consume_queues = queues
    return queues


def _checkpoint(parts: StoreParts, log: int = 0) -> StoreCheckpoint:
    from mqstore.log.checkpoint import StoreCheckpoint

    checkpoint = parts._opened(StoreCheckpoint(checkpoint_path(parts.root, log)))
    if log == 0:
        parts.checkpoint = checkpoint
    return checkpoint


def _index(parts: StoreParts, *, clean: bool = True, with_checkpoint: bool = True, log: int = 0,
           checkpoint: StoreCheckpoint | None = None) -> IndexService | None:
    """The IndexService (of CommitLog log) when message_index_enable; a follower's
    (with_checkpoint=False) only maps and reads, it never touches the checkpoint, and is loaded
    by following."""
    from mqstore.queue.index import IndexService

    if not parts.config.message_index_enable:
        return None
    checkpoint = (checkpoint or parts.checkpoint) if with_checkpoint else None
    index = parts._opened(IndexService(parts.root, parts.config, checkpoint, log=log))  # type: ignore[arg-type]
    if with_checkpoint:
        index.load(clean)
    if log == 0:
        parts.index = index
    return index


def _owner(parts: StoreParts, *, pool: Any | None, clean: bool) -> None:
    """Every CommitLog with its checkpoint and index (log 0 alone for a store with one), and the
    ConsumeQueues of all."""
    from mqstore.queue.recovery import commitlog_file_was_cut

    parts.pools = pools = pool if isinstance(pool, list) else ([pool] if pool is not None else [])
    parts.pool = pools[0] if pools else None
    _checkpoints(parts)
    for commitlog in _commitlogs(parts, pools, map_files=False):
        commitlog.queue.load(commitlog_file_was_cut)
    _queues(parts)
    _indexes(parts, clean=clean)


def _attach_pool(parts: StoreParts) -> list[Any]:
    """The owner's transient store pools (one per CommitLog), for a process that attaches to the
    store (empty without a pool)."""
    from mqstore.log.pool import attach_pools

    parts.pools = [parts._opened(pool) for pool in attach_pools(parts.root, parts.ctl)]
    parts.pool = parts.pools[0] if parts.pools else None
    return parts.pools


def _attached(parts: StoreParts, **_: Any) -> None:
    from mqstore.queue.dispatch import Dispatcher

    commitlogs = _commitlogs(parts, _attach_pool(parts))
    queues = _queues(parts, load=False)
    _indexes(parts, with_checkpoint=False)
    parts.dispatchers = [Dispatcher(cl, queues, None, parts.ctl) for cl in commitlogs]
    parts.dispatcher = parts.dispatchers[0]


def _allocator(parts: StoreParts, **_: Any) -> None:
    from mqstore.log.commitlog import allocate_step_of

    for files in _log_files(parts):
        files.allocate_step = allocate_step_of(parts.config)


def _flusher(parts: StoreParts, **_: Any) -> None:
    _commitlogs(parts, _attach_pool(parts))


def _dispatcher(parts: StoreParts, *, log_id: int | None = None, **_: Any) -> None:
    """Every log's parts, or log ``log_id``'s alone (its dispatcher process: the other logs'
    queues are not even loaded, as their own dispatchers append to them)."""
    from mqstore.queue.dispatch import Dispatcher

    ctl = parts.ctl
    if log_id is None:
        commitlogs = _commitlogs(parts)
    else:
        parts.commitlogs = commitlogs = [_commitlog(parts, log=log_id)]
    queues = _queues(parts, only_log=log_id)
    for cq in queues:
        units = ctl.table_get_dispatched(cq.topic, cq.queue_id)
        if units is None:
            cq.recover()
        else:
            dropped = cq.resume_at(units)
            if dropped:
                log.warning("ConsumeQueue %s/%d: dropped %d unit(s) past the published %d (a dispatcher "
                            "died writing them); dispatch rebuilds them", cq.topic, cq.queue_id, dropped, units)
    if log_id is None:
        _checkpoints(parts)
        indexes = _indexes(parts)
    else:
        parts.checkpoints = [_checkpoint(parts, log_id)]
        parts.indexes = indexes = [_index(parts, log=log_id, checkpoint=parts.checkpoints[0])]
    queues.publish_to(ctl)
    parts.dispatchers = [Dispatcher.from_config(cl, queues, indexes[k], ctl, parts.config)
                         for k, cl in enumerate(commitlogs)]
    parts.dispatcher = parts.dispatchers[0]


def _cleaner(parts: StoreParts, **_: Any) -> None:
    ctl = parts.ctl
    for files in _log_files(parts):
        files.map_new_files()
    queues = _queues(parts)
    for cq in queues:  # read-only positions: the dispatcher process appends
        units = ctl.table_get_dispatched(cq.topic, cq.queue_id)
        if units is not None:
            cq.follow(units)
    _checkpoints(parts)
    _indexes(parts)


def _ha(parts: StoreParts, **_: Any) -> None:
    if parts.config.broker_role is BrokerRole.SLAVE:
        _commitlogs(parts)  # (every log's: a client per log appends into it)
    else:  # a master's HA service reads the files, mapping new ones as it needs them
        for files in _log_files(parts):
            files.map_new_files()


def _rebuild(parts: StoreParts, **_: Any) -> None:
    _queues(parts)
    _checkpoints(parts)
    _indexes(parts)  # every log's (``index``, index-k), each with its log's checkpoint


_OPENERS: dict[str, Callable[..., None]] = {
    "owner": _owner, "attached": _attached, "allocator": _allocator, "flusher": _flusher,
    "dispatcher": _dispatcher, "cleaner": _cleaner, "ha": _ha, "rebuild": _rebuild,
}
