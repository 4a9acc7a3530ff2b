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
from typing import Any

from mqstore.config import StoreConfig
from mqstore.errors import MQStoreError
from mqstore.exit_codes import EXIT_USAGE
from mqstore.layout import CONTROL_BLOCK_NAME
from mqstore.node.settings import read_config
from mqstore.node.supervisor import BACKGROUND_KINDS, BACKGROUND_NICE
from mqstore.parts import StoreParts, open_parts
from mqstore.services import SERVICE_KINDS, process_kind
from mqstore.signals import StopRequest

log = logging.getLogger("mqstore.node")


def _build(name: str, root: str, cfg: StoreConfig, ctl: Any) -> tuple[list[Any], StoreParts]:
    """(services to run, the parts to close afterwards) of one service process: the parts its
    kind needs, mapped in this process (mqstore.parts.open_parts, the role named as the kind;
    a dispatcher process of one CommitLog, ``dispatcher-k``, maps that log's), and the services
    mqstore.services.registry builds over them (the same table the threads-mode owner uses)."""
    from mqstore.services.registry import build_services

    kind, log_id = process_kind(name, cfg)
    parts = open_parts(root, cfg, ctl, kind, log=log_id)
    try:
        return build_services(kind, parts, own_process=True), parts
    except BaseException:
        parts.close()
        raise


def service_main(kind: str, root: str) -> int:
    """Run one service process until SIGTERM or the death of its parent; the exit code is 0
    after a clean stop, 1 when a service failed, or what a service asked its owner for
    (``ServiceThread.exit_code``: a slave's HA client asking for a truncation)."""
    parent = os.getppid()
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {kind}[%(process)d] %(levelname)s %(message)s")
    from mqstore.log import _shm

    stop = StopRequest()
    stop.on_signals((signal.SIGTERM, signal.SIGINT))
    cfg = read_config(root)
    try:
        process_kind(kind, cfg)
    except ValueError as exc:  # a name this store runs no process of (dispatcher-5 of 2 logs)
        sys.stdout.write(f"FAILED ValueError {exc}\n")
        sys.stdout.flush()
        return EXIT_USAGE
    if kind in BACKGROUND_KINDS:
        os.nice(BACKGROUND_NICE)
    ctl = _shm.ControlBlock.attach(os.path.join(root, CONTROL_BLOCK_NAME))
    try:
        services, parts = _build(kind, root, cfg, ctl)
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
    parts.close()
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
    # a kind of SERVICE_KINDS, ha, or dispatcher-k (the dispatcher of CommitLog k; checked
    # against the store's config by service_main)
    parser.add_argument("--service", required=True, metavar="|".join(SERVICE_KINDS + ("ha", "dispatcher-k")))
    parser.add_argument("root")
    args = parser.parse_args(argv)
    return service_main(args.service, os.path.abspath(args.root))


if __name__ == "__main__":
    sys.exit(main())
