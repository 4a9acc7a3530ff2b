"""The supervisor, a thread of the node's owner: one process per service kind, started in order,
restarted when one dies (with a back-off), stopped in order at shutdown."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO

from mqstore.errors import MQStoreError, PortInUseError
from mqstore.services import SERVICE_KINDS

log = logging.getLogger("mqstore.node")

READY_TIMEOUT_S = 60.0
# what a service process runs (``python -m mqstore.node.service`` would import that module twice)
_SERVICE_ENTRY = "import sys; from mqstore.node.service import main; sys.exit(main(sys.argv[1:]))"
STOP_TIMEOUT_S = 30.0
RESTART_BACKOFF_S = (0.05, 0.2, 0.5, 1.0, 2.0)
#: services whose work runs well ahead of need (the allocator prepares the next and the
#: next-next file; the cleaner runs every 10 s) yield the CPU to writers, the flusher and the
#: dispatcher: populating a new 64 MiB file is ~60 ms of zeroing pages, which on a 2-core
#: machine otherwise pushes the dispatcher off a core while writers run flat out
BACKGROUND_KINDS = ("allocator", "cleaner")
BACKGROUND_NICE = 10


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


#: the errors a service process reports in its FAILED line that the owner raises as they are
#: (mqstore.node.service); any other is a ServiceStartError carrying its message
_REPORTED_ERRORS: dict[str, type[MQStoreError]] = {"PortInUseError": PortInUseError}


def _start_error(kind: str, code: int | None, line: bytes, where: str) -> MQStoreError:
    """What a service process that did not say READY failed of: the error its FAILED line
    names, or a ServiceStartError with its exit code and what it said."""
    if line.startswith(b"FAILED "):
        name, _, message = line[7:].decode("utf-8", "replace").partition(" ")
        error = _REPORTED_ERRORS.get(name)
        if error is not None:
            return error(message)
        return ServiceStartError(f"the {kind} process did not start: {message}")
    return ServiceStartError(f"the {kind} process did not start (exit {code}, said {line!r}); see its log{where}")


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
        #: called (kind, exit code) when a service process exited, before it is started again,
        #: with the supervisor's lock held (it may call restart_around)
        self.on_exit: Callable[[str, int], None] | None = None

    def start(self) -> None:
        for kind in self.kinds:
            self._spawn(self.services[kind])
        self._thread = threading.Thread(target=self._watch, name="mqstore-supervisor", daemon=True)
        self._thread.start()

    def argv(self, kind: str) -> list[str]:
        """The command line of the process of ``kind`` (a subclass runs other processes the same way)."""
        return [sys.executable, "-c", _SERVICE_ENTRY, "--service", kind, self.root]

    def pass_fds(self, kind: str) -> tuple[int, ...]:
        """File descriptors the process of ``kind`` inherits (a front: the broker's listening socket)."""
        return ()

    def _spawn(self, sp: ServiceProcess) -> None:
        stderr: IO[bytes] | None = None
        if self.log_dir is not None:
            os.makedirs(self.log_dir, exist_ok=True)
            stderr = open(os.path.join(self.log_dir, f"{sp.kind}.log"), "ab")
        try:
            # a process group of its own: Ctrl-C in a terminal signals the foreground group, and
            # only the owner must get it (it stops the services in order); a service that died
            # of it while starting failed the node's start, one killed mid-run left `abort`
            proc = subprocess.Popen(self.argv(sp.kind),
                                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr,
                                    process_group=0, pass_fds=self.pass_fds(sp.kind))
        finally:
            if stderr is not None:
                stderr.close()
        assert proc.stdout is not None
        line = _read_line(proc.stdout, READY_TIMEOUT_S)
        if line != b"READY":
            proc.kill()
            proc.wait()
            raise _start_error(sp.kind, proc.returncode, line, f" in {self.log_dir}" if self.log_dir else " on stderr")
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
                    if self.on_exit is not None:
                        try:
                            self.on_exit(sp.kind, code)
                        except Exception:  # noqa: BLE001 - the service is restarted all the same
                            log.exception("handling the exit of service %s failed", sp.kind)
                if self._stopping.wait(delay):
                    return
                with self._lock:
                    if self._stopping.is_set():
                        return
                    try:
                        self._spawn(sp)
                        self.restarts += 1
                    except (OSError, MQStoreError) as exc:
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
                if sp.proc is not None:
                    codes[kind] = self._terminate(sp)
        return codes

    def _terminate(self, sp: ServiceProcess) -> int:
        """SIGTERM one service process and wait for it (SIGKILL after STOP_TIMEOUT_S)."""
        assert sp.proc is not None
        sp.proc.send_signal(signal.SIGTERM)
        try:
            code = sp.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            log.error("service %s did not stop within %.0f s; killing it", sp.kind, STOP_TIMEOUT_S)
            sp.proc.kill()
            code = sp.proc.wait()
        if sp.proc.stdout is not None:
            sp.proc.stdout.close()
        return code

    def restart_around(self, between: Callable[[], None]) -> None:
        """From on_exit (the lock held): stop every running service process, last started first,
        call between() (the owner changes the files with nothing else at work), and start them
        again in order. The process whose exit called on_exit is started by the watcher."""
        stopped = []
        for kind in reversed(self.kinds):
            sp = self.services[kind]
            if sp.proc is not None:
                code = self._terminate(sp)
                if code != 0:
                    log.warning("service %s exited with %s when stopped", kind, code)
                sp.proc = None
                stopped.append(sp)
        try:
            between()
        finally:
            for sp in reversed(stopped):
                self._spawn(sp)

    def pids(self) -> dict[str, int]:
        return {kind: sp.pid for kind, sp in self.services.items()}


def _read_line(stream: IO[bytes], timeout_s: float) -> bytes:
    """The first line of a child's stdout, or b"" at EOF / after the timeout."""
    out: list[bytes] = []
    reader = threading.Thread(target=lambda: out.append(stream.readline()), daemon=True)
    reader.start()
    reader.join(timeout_s)
    return out[0].strip() if out else b""
