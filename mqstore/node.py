"""The multi-process node (design.md "Processes and shared memory"): the owner of a store
directory runs the allocate, flush and dispatch services as supervised OS processes.

The owner (a ``MessageStore`` opened with ``service_mode="processes"``, which is what
``mqstore node`` runs) takes the ``lock`` file, recovers, rebuilds the control block, writes
its configuration next to it (``mqstore.config.json``) and starts one process per service::

    python -c "...mqstore.node.main..." --service allocator|flusher|dispatcher STORE_DIR

Each service process attaches to the control block, maps the files it needs, runs the same
service loops the threaded mode runs (``mqstore.services``), prints ``READY`` once it is
serving, and stops on SIGTERM; it exits at once when its parent dies (the parent pid is
checked every 0.2 s). The supervisor (a thread of the owner) restarts a service process that died;
shutdown stops them in order (dispatch catches up, then the CommitLog is flushed, then the
allocator goes), after which the owner writes the checkpoint and removes ``abort``.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import IO, Any

from mqstore.layout import CONFIG_NAME, CONTROL_BLOCK_NAME
from mqstore.config import StoreConfig
from mqstore.errors import MQStoreError
from mqstore.services import SERVICE_KINDS

log = logging.getLogger("mqstore.node")

READY_TIMEOUT_S = 60.0
# what a service process runs (``python -m mqstore.node`` would import this module twice)
_SERVICE_ENTRY = "import sys; from mqstore.node import main; sys.exit(main(sys.argv[1:]))"
STOP_TIMEOUT_S = 30.0
RESTART_BACKOFF_S = (0.05, 0.2, 0.5, 1.0, 2.0)
#: services whose work runs well ahead of need (the allocator prepares the next and the
#: next-next file; the cleaner runs every 10 s) yield the CPU to writers, the flusher and the
#: dispatcher: populating a new 64 MiB file is ~60 ms of zeroing pages, which on a 2-core
#: machine otherwise pushes the dispatcher off a core while writers run flat out
BACKGROUND_KINDS = ("allocator", "cleaner")
BACKGROUND_NICE = 10


# -- the owner's configuration, shared with service processes and attached stores ------------
def write_config(root: str, config: StoreConfig) -> None:
    """Write config where service processes and attaching processes read it (atomically).
    Nothing is written when the file already says the same (a store reopened on a full disk
    with its own settings needs no new block for it)."""
    path = os.path.join(root, CONFIG_NAME)
    text = json.dumps(config.to_dict(changed_only=True), indent=1, sort_keys=True)
    try:
        with open(path, encoding="utf-8") as fh:
            if fh.read() == text:
                return
    except (OSError, UnicodeDecodeError):
        pass
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    os.replace(tmp, path)


def read_config(root: str) -> StoreConfig:
    """The configuration the owner of root wrote (StoreConfig defaults where it changed nothing)."""
    with open(os.path.join(root, CONFIG_NAME), encoding="utf-8") as fh:
        return StoreConfig.from_dict(json.load(fh)).validate()


# -- the supervisor (in the owner) ------------------------------------------------------------
@dataclass
class ServiceProcess:
    kind: str
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    exits: list[int] = field(default_factory=list)
    recent: list[float] = field(default_factory=list)  # monotonic times of recent exits

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc is not None else -1

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class ServiceStartError(MQStoreError, RuntimeError):
    """A service process did not report READY (its log says why)."""

    hint = "see the service's log lines on stderr"


class Supervisor:
    """Starts one process per service kind, restarts one that dies, stops them in order."""

    def __init__(self, root: str, kinds: tuple[str, ...] = SERVICE_KINDS, *, log_dir: str | None = None) -> None:
        self.root = root
        self.kinds = kinds
        self.log_dir = log_dir
        self.services = {kind: ServiceProcess(kind) for kind in kinds}
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.restarts = 0

    def start(self) -> None:
        for kind in self.kinds:
            self._spawn(self.services[kind])
        self._thread = threading.Thread(target=self._watch, name="mqstore-supervisor", daemon=True)
        self._thread.start()

    def _spawn(self, sp: ServiceProcess) -> None:
        stderr: IO[bytes] | None = None
        if self.log_dir is not None:
            os.makedirs(self.log_dir, exist_ok=True)
            stderr = open(os.path.join(self.log_dir, f"{sp.kind}.log"), "ab")
        try:
            # a process group of its own: Ctrl-C in a terminal signals the foreground group, and
            # only the owner must get it (it stops the services in order); a service that died
            # of it while starting failed the node's start, one killed mid-run left `abort`
            proc = subprocess.Popen([sys.executable, "-c", _SERVICE_ENTRY, "--service", sp.kind, self.root],
                                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr,
                                    process_group=0)
        finally:
            if stderr is not None:
                stderr.close()
        assert proc.stdout is not None
        line = _read_line(proc.stdout, READY_TIMEOUT_S)
        if line != b"READY":
            proc.kill()
            proc.wait()
            raise ServiceStartError(f"the {sp.kind} process did not start (exit {proc.returncode}, said {line!r}); "
                                    f"see its log" + (f" in {self.log_dir}" if self.log_dir else " on stderr"))
        sp.proc = proc
        sp.starts += 1
        log.info("service %s running as pid %d", sp.kind, proc.pid)

    def _watch(self) -> None:
        while not self._stopping.wait(0.05):
            for sp in self.services.values():
                with self._lock:
                    if self._stopping.is_set() or sp.proc is None or sp.proc.poll() is None:
                        continue
                    code = sp.proc.returncode
                    sp.exits.append(code)
                    now = time.monotonic()
                    # back off when it keeps dying: by the number of exits in the last 10 s
                    sp.recent = [t for t in sp.recent if now - t < 10.0] + [now]
                    log.error("service %s (pid %d) died (exit %s); restarting", sp.kind, sp.proc.pid, code)
                    delay = RESTART_BACKOFF_S[min(len(sp.recent), len(RESTART_BACKOFF_S)) - 1]
                    try:
                        sp.proc.stdout.close()  # type: ignore[union-attr]
                    except OSError:
                        pass
                    sp.proc = None
                if self._stopping.wait(delay):
                    return
                with self._lock:
                    if self._stopping.is_set():
                        return
                    try:
                        self._spawn(sp)
                        self.restarts += 1
                    except (OSError, ServiceStartError) as exc:
                        log.error("restarting %s failed: %s", sp.kind, exc)

    def stop(self) -> dict[str, int]:
        """Stop every service process, last started first; returns their exit codes."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()
        codes = {}
        with self._lock:
            for kind in reversed(self.kinds):
                sp = self.services[kind]
                if sp.proc is None:
                    continue
                sp.proc.send_signal(signal.SIGTERM)
                try:
                    codes[kind] = sp.proc.wait(STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    log.error("service %s did not stop within %.0f s; killing it", kind, STOP_TIMEOUT_S)
                    sp.proc.kill()
                    codes[kind] = sp.proc.wait()
                if sp.proc.stdout is not None:
                    sp.proc.stdout.close()
        return codes

    def pids(self) -> dict[str, int]:
        return {kind: sp.pid for kind, sp in self.services.items()}


def _read_line(stream: IO[bytes], timeout_s: float) -> bytes:
    """The first line of a child's stdout, or b"" at EOF / after the timeout."""
    out: list[bytes] = []
    reader = threading.Thread(target=lambda: out.append(stream.readline()), daemon=True)
    reader.start()
    reader.join(timeout_s)
    return out[0].strip() if out else b""


# -- a service process ------------------------------------------------------------------------
def _build(kind: str, root: str, cfg: StoreConfig, ctl: Any) -> tuple[list[Any], list[Any]]:
    """(services to run, objects to close afterwards) of one service process: the parts its
    kind needs, mapped in this process, and the services mqstore.services.registry builds
    over them (the same table the threads-mode owner uses)."""
    from mqstore.log.checkpoint import StoreCheckpoint
    from mqstore.log.commitlog import CommitLog
    from mqstore.log.mapped_file_queue import MappedFileQueue
    from mqstore.services.registry import ServiceParts, build_services

    if kind not in SERVICE_KINDS:
        raise ValueError(f"unknown service kind {kind!r}; one of {', '.join(SERVICE_KINDS)}")
    parts = ServiceParts(root, cfg, ctl)
    closers: list[Any] = []
    if kind == "allocator":
        parts.log_files = MappedFileQueue(cfg.commit_log_dir(root), cfg.mapped_file_size_commit_log)
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
    after a clean stop, 1 when a service failed."""
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
    services, closers = _build(kind, root, cfg, ctl)
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
        if any(s.error is not None for s in services):
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
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m mqstore.node", description=__doc__.split("\n\n")[0])
    parser.add_argument("--service", choices=SERVICE_KINDS, required=True)
    parser.add_argument("root")
    args = parser.parse_args(argv)
    return service_main(args.service, os.path.abspath(args.root))


if __name__ == "__main__":
    sys.exit(main())
