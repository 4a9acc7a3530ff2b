"""The composition root of a store's services: which service loops run over which parts (mapped by
``mqstore.parts.open_parts``).

One table, ``build_services(kind, parts, own_process=...)``, is used by both places that start
services: the threads-mode owner (``MessageStore``: every kind, as threads of the opening
process) and a node's service process (``mqstore.node``: one kind per process). What differs
between the two is decided here and only here:

============  =========================================  =========================================
kind          threads of the owner                       a service process of a node
============  =========================================  =========================================
allocator     AllocateMappedFileService (waits for a     ProcessAllocateService (serves requests
              file a put asked for in this process)      from every process via the control block)
flusher       GroupCommitService (SYNC_FLUSH) or         the same, plus CommitRealTimeService when
              FlushRealTimeService, plus                 the transient store pool is on
              CommitRealTimeService with the pool
dispatcher    FlushConsumeQueueService, then             the same
              ReputMessageService
cleaner       CleanService                               CleanService(follow=True): maps what the
                                                         other processes created before cleaning
============  =========================================  =========================================

Services start in SERVICE_KINDS order (and within a kind in list order) and shut down in
reverse: the cleaner stops, dispatch catches up, the ConsumeQueues and the CommitLog are flushed,
the allocator goes last.
"""

from __future__ import annotations

from typing import Any

from mqstore.parts import StoreParts
from mqstore.services.reput import ReputMessageService
from mqstore.services import SERVICE_KINDS
from mqstore.services.allocate import AllocateMappedFileService, ProcessAllocateService
from mqstore.services.base import ServiceThread
from mqstore.services.clean import CleanService
from mqstore.services.flush import (CommitRealTimeService, FlushConsumeQueueService, FlushRealTimeService,
                                    GroupCommitService)

__all__ = ["SERVICE_KINDS", "build_services"]


def _need(parts: StoreParts, kind: str, *names: str) -> list[Any]:
    missing = [n for n in names if getattr(parts, n) is None]
    if missing:
        raise ValueError(f"the {kind} service needs {', '.join(missing)}")
    return [getattr(parts, n) for n in names]


def build_services(kind: str, parts: StoreParts, *, own_process: bool) -> list[ServiceThread]:
    """The service loops of one kind, in start order (see the module docstring).

    own_process: True in a node's service process, False for the threads of an owner."""
    cfg = parts.config
    if parts.log_count > 1:
        return _several_logs(kind, parts, own_process)
    if kind == "allocator":
        (files,) = _need(parts, kind, "log_files")
        warm, least_pages = cfg.warm_maped_file_enable, cfg.flush_least_pages_when_warm_maped_file
        if own_process:
            return [ProcessAllocateService(parts.ctl, files, warm=warm, sync_flush=cfg.is_sync_flush,
                                           warm_flush_least_pages=least_pages)]
        return [AllocateMappedFileService(parts.ctl, files, warm=warm, sync_flush=cfg.is_sync_flush,
                                          warm_flush_least_pages=least_pages,
                                          wait_timeout_ms=cfg.allocate_wait_timeout_ms)]
    if kind == "flusher":
        (commitlog,) = _need(parts, kind, "commitlog")
        flusher: ServiceThread = GroupCommitService(commitlog) if cfg.is_sync_flush else FlushRealTimeService(commitlog)
        # the transient store pool's commit service runs beside the flush (and stops before it)
        return [flusher] if parts.pool is None else [flusher, CommitRealTimeService(commitlog)]
    if kind == "dispatcher":
        queues, dispatcher, checkpoint = _need(parts, kind, "consume_queues", "dispatcher", "checkpoint")
        return [FlushConsumeQueueService(queues, dispatcher, checkpoint, parts.ctl, cfg),
                ReputMessageService(dispatcher)]
    if kind == "cleaner":
        files, queues = _need(parts, kind, "log_files", "consume_queues")
        return [CleanService(parts.ctl, files, queues, parts.index, cfg, parts.root, follow=own_process)]
    if kind == "ha":
        from mqstore.ha import ha_role

        role = ha_role(cfg)
        if role == "master":
            from mqstore.ha.master import HAService

            (files,) = _need(parts, kind, "log_files")
            return [HAService(parts.ctl, files, cfg, follow=own_process, root=parts.root)]
        if role == "slave":
            from mqstore.ha.slave import HAClient

            (commitlog,) = _need(parts, kind, "commitlog")
            return [HAClient(parts.ctl, commitlog, cfg, root=parts.root,
                             truncate=None if own_process else parts.truncate)]
        return []
    raise ValueError(f"unknown service kind {kind!r}; one of {', '.join(SERVICE_KINDS)}, ha")


def _several_logs(kind: str, parts: StoreParts, own_process: bool) -> list[ServiceThread]:
    """The services of a store with several CommitLogs (docs/parallel-commitlogs.md), as threads
    of the owner or in a node's service process (the differences of the table above hold per
    log): an allocator and a flusher per log (each on its log's channels and cells), a
    ConsumeQueue flush per log (its queues, its checkpoint), one reput loop serving every log's
    dispatcher in turn, one cleaner cleaning each log with its queues and index against that
    log's min offset, and replication per log: a master's one HA listener (each slave connection
    follows the log its first report names), a slave's HA client per log."""
    cfg, ctl = parts.config, parts.ctl
    if kind == "allocator":
        warm, least_pages = cfg.warm_maped_file_enable, cfg.flush_least_pages_when_warm_maped_file
        if own_process:
            return [ProcessAllocateService(ctl, files, warm=warm, sync_flush=cfg.is_sync_flush,
                                           warm_flush_least_pages=least_pages) for files in parts.log_queues]
        return [AllocateMappedFileService(ctl, files, warm=warm, sync_flush=cfg.is_sync_flush,
                                          warm_flush_least_pages=least_pages,
                                          wait_timeout_ms=cfg.allocate_wait_timeout_ms)
                for files in parts.log_queues]
    if kind == "flusher":
        return [GroupCommitService(cl) if cfg.is_sync_flush else FlushRealTimeService(cl) for cl in parts.commitlogs]
    if kind == "dispatcher":
        (queues,) = _need(parts, kind, "consume_queues")
        if len(parts.dispatchers) != parts.log_count:
            raise ValueError(f"the dispatcher service needs a dispatcher per CommitLog ({parts.log_count})")
        flushers: list[ServiceThread] = [FlushConsumeQueueService(queues, d, cp, ctl, cfg)
                                         for d, cp in zip(parts.dispatchers, parts.checkpoints)]
        return flushers + [ReputMessageService(parts.dispatchers)]
    if kind == "cleaner":
        (queues,) = _need(parts, kind, "consume_queues")
        first, *more = parts.log_queues
        return [CleanService(ctl, first, queues, parts.indexes[0], cfg, parts.root, follow=own_process,
                             more_logs=list(zip(more, parts.indexes[1:])))]
    if kind == "ha":
        from mqstore.ha import ha_role

        role = ha_role(cfg)
        if role == "master":  # one listener; each slave connection follows the log it names
            from mqstore.ha.master import HAService

            return [HAService(ctl, list(parts.log_queues), cfg, follow=own_process, root=parts.root)]
        if role == "slave":  # a client (a connection) per log
            from mqstore.ha.slave import HAClient

            clients = [HAClient(ctl, cl, cfg, root=parts.root, truncate=None if own_process else parts.truncate)
                       for cl in parts.commitlogs]
            for client in clients:
                client.peers = clients
            return list(clients)
        return []
    raise ValueError(f"unknown service kind {kind!r}; one of {', '.join(SERVICE_KINDS)}, ha")
