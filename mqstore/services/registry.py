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
dispatcher    FlushConsumeQueueService, then             the same (with dispatch_logs_in_parallel
              ReputMessageService                        and several CommitLogs: a process per
                                                         log, ``dispatcher`` for log 0 and
                                                         ``dispatcher-k`` for log k, each over
                                                         its log's parts alone)
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
from mqstore.services import SERVICE_KINDS, parallel_dispatch
from mqstore.services.allocate import AllocateMappedFileService, ProcessAllocateService
from mqstore.services.base import ServiceThread
from mqstore.services.clean import CleanService
from mqstore.services.flush import (CommitRealTimeService, FlushConsumeQueueService, FlushRealTimeService,
                                    GroupCommitService)

__all__ = ["SERVICE_KINDS", "build_services"]


def _need(parts: StoreParts, kind: str, *names: str) -> list[Any]:
    missing = [n for n in names if getattr(parts, n) is None or getattr(parts, n) == []]
    if missing:
        raise ValueError(f"the {kind} service needs {', '.join(missing)}")
    return [getattr(parts, n) for n in names]


def build_services(kind: str, parts: StoreParts, *, own_process: bool) -> list[ServiceThread]:
    """The service loops of one kind, in start order (see the module docstring).

    With several CommitLogs (docs/parallel-commitlogs.md) the table above holds per log: an
    allocator and a flusher per log (each on its log's channels and cells), a ConsumeQueue flush
    per log (its queues, its checkpoint), a reput per log (``dispatch_logs_in_parallel``; else
    one reput loop serving every log's dispatcher in turn),
    one cleaner cleaning each log with its queues and index against that log's min offset, and
    replication per log: a master's one HA listener (each slave connection follows the log its
    first report names), a slave's HA client per log.

    own_process: True in a node's service process, False for the threads of an owner."""
    cfg, ctl = parts.config, parts.ctl
    if kind == "allocator":
        (logs,) = _need(parts, kind, "log_queues")
        warm, least_pages = cfg.warm_maped_file_enable, cfg.flush_least_pages_when_warm_maped_file
        if own_process:
            return [ProcessAllocateService(ctl, files, warm=warm, sync_flush=cfg.is_sync_flush,
                                           warm_flush_least_pages=least_pages) for files in logs]
        return [AllocateMappedFileService(ctl, files, warm=warm, sync_flush=cfg.is_sync_flush,
                                          warm_flush_least_pages=least_pages,
                                          wait_timeout_ms=cfg.allocate_wait_timeout_ms)
                for files in logs]
    if kind == "flusher":
        (commitlogs,) = _need(parts, kind, "commitlogs")
        flushers: list[ServiceThread] = [GroupCommitService(cl) if cfg.is_sync_flush else FlushRealTimeService(cl)
                                         for cl in commitlogs]
        # the transient store pool's commit service runs beside the flush (and stops before it)
        return flushers if parts.pool is None else flushers + [CommitRealTimeService(cl) for cl in commitlogs]
    if kind == "dispatcher":
        queues, dispatchers, checkpoints = _need(parts, kind, "consume_queues", "dispatchers", "checkpoints")
        if len(dispatchers) != parts.log_count or len(checkpoints) != parts.log_count:
            raise ValueError(f"the dispatcher service needs a dispatcher and a checkpoint per CommitLog "
                             f"({parts.log_count})")
        cq_flushers: list[ServiceThread] = [FlushConsumeQueueService(queues, d, cp, ctl, cfg)
                                            for d, cp in zip(dispatchers, checkpoints)]
        if not parallel_dispatch(cfg):
            return cq_flushers + [ReputMessageService(dispatchers)]
        # dispatch_logs_in_parallel: a reput per log (a node's dispatcher process of one log
        # holds that log's dispatcher alone)
        return cq_flushers + [ReputMessageService(d, own_log=True) for d in dispatchers]
    if kind == "cleaner":
        logs, queues, indexes = _need(parts, kind, "log_queues", "consume_queues", "indexes")
        first, *more = logs
        return [CleanService(ctl, first, queues, indexes[0], cfg, parts.root, follow=own_process,
                             more_logs=list(zip(more, indexes[1:])))]
    if kind == "ha":
        from mqstore.ha import ha_role

        role = ha_role(cfg)
        if role == "master":  # one listener; each slave connection follows the log it names
            from mqstore.ha.master import HAService

            (logs,) = _need(parts, kind, "log_queues")
            return [HAService(ctl, list(logs), cfg, follow=own_process, root=parts.root)]
        if role == "slave":  # a client (a connection) per log
            from mqstore.ha.slave import HAClient

            (commitlogs,) = _need(parts, kind, "commitlogs")
            clients = [HAClient(ctl, cl, cfg, root=parts.root, truncate=None if own_process else parts.truncate)
                       for cl in commitlogs]
            for client in clients:
                client.peers = clients
            return list(clients)
        return []
    raise ValueError(f"unknown service kind {kind!r}; one of {', '.join(SERVICE_KINDS)}, ha")
