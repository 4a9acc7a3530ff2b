"""A service process of the node: attaches to the control block, maps what its kind needs, runs
the services mqstore.services.registry builds for it, prints READY, and stops on SIGTERM or when
its parent (the owner) dies. A service that cannot start for a reason the user must act on (an
MQStoreError: the HA port taken) prints ``FAILED <error class> <message>`` instead, and the
supervisor raises that error in the owner (one line from the command, no traceback here)."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from typing import Any

from mqstore.config import StoreConfig
from mqstore.errors import MQStoreError
from mqstore.exit_codes import EXIT_USAGE
from mqstore.layout import CONTROL_BLOCK_NAME
from mqstore.node.settings import read_config
from mqstore.node.supervisor import BACKGROUND_KINDS, BACKGROUND_NICE
from mqstore.services import SERVICE_KINDS

log = logging.getLogger("mqstore.node")


def _build(kind: str, root: str, cfg: StoreConfig, ctl: Any) -> tuple[list[Any], list[Any]]:
    """(services to run, objects to close afterwards) of one service process: the parts its
    kind needs, mapped in this process, and the services mqstore.services.registry builds
    over them (the same table the threads-mode owner uses)."""
    from mqstore.log.checkpoint import StoreCheckpoint
    from mqstore.log.commitlog import CommitLog, allocate_step_of
    from mqstore.log.mapped_file_queue import MappedFileQueue
    from mqstore.services.registry import ServiceParts, build_services

    if kind not in SERVICE_KINDS + ("ha",):
        raise ValueError(f"unknown service kind {kind!r}; one of {', '.join(SERVICE_KINDS)}, ha")
    parts = ServiceParts(root, cfg, ctl)
    closers: list[Any] = []
    if kind == "allocator":
        parts.log_files = MappedFileQueue(cfg.commit_log_dir(root), cfg.mapped_file_size_commit_log)
        parts.log_files.allocate_step = allocate_step_of(cfg)
        closers = [parts.log_files]
    elif kind == "flusher":
        from mqstore.log.pool import attach_pool

        parts.pool = attach_pool(root, ctl)
        parts.commitlog = CommitLog(root, cfg, ctl, parts.pool)
        parts.commitlog.queue.map_new_files()
        closers = [parts.commitlog] if parts.pool is None else [parts.commitlog, parts.pool]
    elif kind == "dispatcher":
        from mqstore.queue.consume_queue import ConsumeQueueTable
        from mqstore.queue.dispatch import Dispatcher
        from mqstore.queue.index import IndexService

        commitlog = CommitLog(root, cfg, ctl)
        commitlog.queue.map_new_files()
        queues = ConsumeQueueTable(os.path.join(root, "consumequeue"), cfg.mapped_file_size_consume_queue)
        queues.load()
        for cq in queues:
            units = ctl.table_get_dispatched(cq.topic, cq.queue_id)
            if units is None:
                cq.recover()
            else:
                dropped = cq.resume_at(units)
                if dropped:
                    log.warning("ConsumeQueue %s/%d: dropped %d unit(s) past the published %d (a dispatcher "
                                "died writing them); dispatch rebuilds them", cq.topic, cq.queue_id, dropped, units)
        checkpoint = StoreCheckpoint(os.path.join(root, "checkpoint"))
        index = None
        if cfg.message_index_enable:
            index = IndexService(root, cfg, checkpoint)
            index.load(True)
        queues.publish_to(ctl)
        parts.commitlog, parts.consume_queues, parts.index, parts.checkpoint = commitlog, queues, index, checkpoint
        parts.dispatcher = Dispatcher.from_config(commitlog, queues, index, ctl, cfg)
        closers = [commitlog, queues, checkpoint]
        if index is not None:
            closers.insert(0, index)
    elif kind == "ha":
        from mqstore.ha import ha_role

        if ha_role(cfg) == "slave":
            parts.commitlog = CommitLog(root, cfg, ctl)
            parts.commitlog.queue.map_new_files()
            closers = [parts.commitlog]
        else:  # a master's HA service reads the files, mapping new ones as it needs them
            parts.log_files = MappedFileQueue(cfg.commit_log_dir(root), cfg.mapped_file_size_commit_log)
            parts.log_files.map_new_files()
            closers = [parts.log_files]
    else:  # the cleaner
        from mqstore.queue.consume_queue import ConsumeQueueTable
        from mqstore.queue.index import IndexService

        files = MappedFileQueue(cfg.commit_log_dir(root), cfg.mapped_file_size_commit_log)
        files.map_new_files()
        queues = ConsumeQueueTable(os.path.join(root, "consumequeue"), cfg.mapped_file_size_consume_queue)
        queues.load()
        for cq in queues:  # read-only positions: the dispatcher process appends
            units = ctl.table_get_dispatched(cq.topic, cq.queue_id)
            if units is not None:
                cq.follow(units)
        checkpoint = StoreCheckpoint(os.path.join(root, "checkpoint"))
        if cfg.message_index_enable:
            parts.index = IndexService(root, cfg, checkpoint)
            parts.index.load(True)
        parts.log_files, parts.consume_queues = files, queues
        closers = [files, queues, checkpoint]
    return build_services(kind, parts, own_process=True), closers


def service_main(kind: str, root: str) -> int:
    """Run one service process until SIGTERM or the death of its parent; the exit code is 0
    after a clean stop, 1 when a service failed, or what a service asked its owner for
    (``ServiceThread.exit_code``: a slave's HA client asking for a truncation)."""
    parent = os.getppid()
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {kind}[%(process)d] %(levelname)s %(message)s")
    from mqstore import _shm

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    cfg = read_config(root)
    if kind in BACKGROUND_KINDS:
        os.nice(BACKGROUND_NICE)
    ctl = _shm.ControlBlock.attach(os.path.join(root, CONTROL_BLOCK_NAME))
    try:
        services, closers = _build(kind, root, cfg, ctl)
    except MQStoreError as exc:
        ctl.close()
        sys.stdout.write(f"FAILED {type(exc).__name__} {' '.join(str(exc.args[0]).split())}\n")
        sys.stdout.flush()
        return EXIT_USAGE
    for service in services:
        service.start()
    sys.stdout.write("READY\n")
    sys.stdout.flush()
    while not stop.wait(0.2):
        if os.getppid() != parent:
            # the node died without a clean stop: stop the way it did (no catch-up, no final
            # flush); the next open recovers, a restarted dispatcher cuts its queues back to
            # what it had published. (Not PR_SET_PDEATHSIG: it fires when the *thread* that
            # started the process ends, e.g. the supervisor's restart thread at shutdown.)
            log.error("the node (pid %d) is gone; exiting", parent)
            os._exit(1)
        if any(s.error is not None or s.exit_code is not None for s in services):
            break
    for service in reversed(services):
        service.shutdown()
    failed = [s for s in services if s.error is not None]
    for obj in closers:
        try:
            obj.close()
        except OSError as exc:
            log.error("closing %r failed: %s", obj, exc)
    ctl.close()
    for s in failed:
        log.error("service %s failed: %r", s.name, s.error)
    if failed:
        return 1
    asked = [s.exit_code for s in services if s.exit_code is not None]
    return asked[0] if asked else 0


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m mqstore.node.service",
                                     description="Run one service process of an mqstore node.")
    parser.add_argument("--service", choices=SERVICE_KINDS + ("ha",), required=True)
    parser.add_argument("root")
    args = parser.parse_args(argv)
    return service_main(args.service, os.path.abspath(args.root))


if __name__ == "__main__":
    sys.exit(main())
