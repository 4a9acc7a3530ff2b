"""ServiceThread: RocketMQ's service loop shape (waitForRunning / wakeup / shutdown).

Waiting and waking go through a channel of the shared-memory control block (a futex pair),
so a waker in any process that maps the block can wake the service.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mqstore.log._shm import Channel, ControlBlock

log = logging.getLogger("mqstore.services")


class ServiceThread:
    """Base class: subclasses implement ``run_once`` and may override ``on_shutdown``."""

    channel: Channel | None = None  # a timed service without wake-ups has none
    #: the CommitLog whose channel it is, for a per-log channel (flush, commit, a log's own dispatch;
    #: docs/parallel-commitlogs.md)
    channel_log: int = 0
    join_timeout_s: float = 30.0

    def __init__(self, name: str, ctl: ControlBlock) -> None:
        self.name = name
        self.ctl = ctl
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None
        #: set by a service that ends its loop to ask for something of its process's owner:
        #: a node's service process exits with it (see mqstore.node.service)
        self.exit_code: int | None = None

    @property
    def is_stopped(self) -> bool:
        return self._stopped.is_set()

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError(f"service {self.name} already started")
        self._thread = threading.Thread(target=self._run, name=f"mqstore-{self.name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stopped.is_set():
                self.run_once()
        except BaseException as exc:  # noqa: BLE001 - kept for the owner to report
            self.error = exc
            log.exception("service %s stopped by an error", self.name)
        finally:
            try:
                self.on_shutdown()
            except BaseException as exc:  # noqa: BLE001
                self.error = self.error or exc
                log.exception("service %s failed while shutting down", self.name)

    def run_once(self) -> None:
        raise NotImplementedError

    def on_shutdown(self) -> None:
        """Last work before the loop ends (e.g. a final flush)."""

    def wait_for_running(self, interval_ms: float) -> bool:
        """Sleep until woken on the service's channel or interval_ms passes."""
        if self.channel is None:
            return self._stopped.wait(interval_ms / 1000)
        return self.ctl.wait_notified(self.channel, interval_ms, log=self.channel_log)

    def sleep(self, interval_ms: float) -> None:
        """Sleep that only shutdown interrupts (timed services ignore wake-ups)."""
        self._stopped.wait(interval_ms / 1000)

    def wakeup(self) -> None:
        if self.channel is not None:
            self.ctl.notify(self.channel, log=self.channel_log)

    def shutdown(self) -> None:
        """Stop the loop, let on_shutdown run, and wait for the thread."""
        self._stopped.set()
        if self.channel is not None:
            self.ctl.notify(self.channel, log=self.channel_log)
        if self._thread is not None:
            self._thread.join(self.join_timeout_s)
            if self._thread.is_alive():
                log.error("service %s did not stop within %.0f s", self.name, self.join_timeout_s)
