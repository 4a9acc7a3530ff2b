"""Helpers of the broker benchmarks (bench/test_broker.py): a broker in a process of its own, the
real RocketMQ C++ client in a worker process, Redis load generators, CPU and connection counts
from /proc, and the closing summary.

- ``BrokerProc``: ``python -m mqstore broker ROOT --set ...`` on 127.0.0.1 with free ports (the
  broker's own ``listen_port=0`` / ``namesrv_listen_port=0``), every other setting its default
  unless a benchmark names it. Its front processes are found in /proc (children of the broker
  whose command line runs ``mqstore.broker.front``); ``stop()`` sends SIGTERM to the broker's pid
  and waits for it and its children (SIGKILL after a timeout).
- ``CppWorker``: ``python -m bench._broker cpp`` in a child process with HOME set to a scratch
  directory (the C++ client writes its logs under ``$HOME/logs/rocketmq-cpp``). It holds K
  producers of the PyPI ``rocketmq`` wheel (librocketmq, the C++ client 1.2.x), each with its own
  instance name and so its own TCP connection to the broker, and runs one command at a time from
  stdin (JSON lines): ``start``, ``send`` (K threads, one producer each, ``send_sync`` or
  ``send_batch``), ``paced`` (one producer at a fixed rate, per-send latencies), ``push`` (a
  PushConsumer of a new group reading a pre-filled topic) and ``push_stop``. Answers go to stdout prefixed ``@@ ``.
  The child exits when the benchmark process is gone, and every command has a deadline.
- ``redis_sync_round`` / ``redis_async_round``: XADD through redis-py, one message per round
  trip or pipelines of 100, over K connections (K threads with a client each, or K asyncio
  clients in one event loop).
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
ENV.pop("NAMESRV_ADDR", None)  # the C++ client would read it
LOOPBACK = "127.0.0.1"
_SERVING = re.compile(r"serving on (?P<addr>\S+) \((?P<fronts>\d+) front processes\), NameServer (?P<ns>\S+)")
_ANSWER = "@@ "

#: every process a benchmark starts, by pid, so a failing benchmark still stops them
_STARTED: dict[int, subprocess.Popen[Any]] = {}


def _stop_popen(proc: subprocess.Popen[Any], timeout: float, sig: int = signal.SIGTERM) -> int:
    if proc.poll() is None:
        try:
            os.kill(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
    _STARTED.pop(proc.pid, None)
    return int(proc.returncode)


def stop_started() -> None:
    """Stop every process still running that this module started (by pid)."""
    for pid, proc in list(_STARTED.items()):
        _stop_popen(proc, 10)


# -- /proc ---------------------------------------------------------------------------------------
def _stat_fields(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rsplit(")", 1)[1].split()


def _alive(pid: int) -> bool:
    try:
        return _stat_fields(pid)[0] != "Z"
    except OSError:
        return False


def children(pid: int) -> dict[int, list[str]]:
    """The direct children of pid: {child pid: its argv}."""
    out: dict[int, list[str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if int(_stat_fields(int(entry))[1]) != pid:
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                out[int(entry)] = [a.decode(errors="replace") for a in fh.read().split(b"\0") if a]
        except (OSError, IndexError, ValueError):
            continue
    return out


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads) so far; 0 once it is gone."""
    try:
        f = _stat_fields(pid)
    except OSError:
        return 0.0
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def self_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def established(pid: int, remote_port: int) -> int:
    """TCP connections of process pid in state ESTABLISHED to 127.0.0.1:remote_port."""
    inodes = set()
    fd_dir = f"/proc/{pid}/fd"
    for fd in os.listdir(fd_dir):
        try:
            target = os.readlink(os.path.join(fd_dir, fd))
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    n = 0
    with open(f"/proc/{pid}/net/tcp") as fh:
        next(fh)
        for line in fh:
            parts = line.split()
            rem_port = int(parts[2].rsplit(":", 1)[1], 16)
            if parts[3] == "01" and rem_port == remote_port and parts[9] in inodes:
                n += 1
    return n


def loadavg() -> str:
    try:
        with open("/proc/loadavg") as fh:
            return " ".join(fh.read().split()[:3])
    except OSError:
        return "?"


def percentiles(values: list[float], qs: tuple[float, ...] = (0.5, 0.9, 0.99, 0.999)) -> dict[str, float]:
    """Nearest-rank quantiles of values, keyed p50, p90, p99, p99.9, plus max."""
    s = sorted(values)
    out: dict[str, float] = {}
    if not s:
        return out
    for q in qs:
        key = f"p{q * 100:g}"
        out[key] = s[min(len(s) - 1, max(0, int(round(q * len(s))) - 1))]
    out["max"] = s[-1]
    return out


# -- the broker ----------------------------------------------------------------------------------
class BrokerProc:
    """``mqstore broker ROOT`` on loopback with free ports, in a process of its own."""

    def __init__(self, root: str, **settings: Any) -> None:
        self.root = root
        base = {"listen_port": 0, "namesrv_listen_port": 0, "bind_address": LOOPBACK, "broker_ip1": LOOPBACK}
        base.update(settings)
        self.settings = base
        argv = [sys.executable, "-m", "mqstore", "broker", os.path.join(root, "store")]
        for key, value in base.items():
            argv += ["--set", f"{key}={value}"]
        self.log_path = os.path.join(root, "broker.log")
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self._log, env=ENV, text=True)
        _STARTED[self.proc.pid] = self.proc
        got: list[str] = []
        reader = threading.Thread(target=lambda: got.append(self.proc.stdout.readline()),  # type: ignore[union-attr]
                                  daemon=True)
        reader.start()
        reader.join(60)
        match = _SERVING.search(got[0]) if got else None
        if match is None:
            self.stop()
            raise RuntimeError(f"mqstore broker did not start: {got!r}; log:\n{self.log_tail()}")
        self.address = match["addr"]
        self.port = int(self.address.rsplit(":", 1)[1])
        self.namesrv = match["ns"]
        kids = children(self.proc.pid)
        #: front processes by name (front0, front1, ...): argv is python -c ENTRY ROOT INDEX PORT LINK
        self.fronts = {f"front{argv[4]}": pid for pid, argv in kids.items()
                       if len(argv) > 4 and "mqstore.broker.front" in argv[2]}
        self.others = {pid: argv for pid, argv in kids.items() if pid not in self.fronts.values()}
        if len(self.fronts) != int(match["fronts"]):
            raise RuntimeError(f"found {len(self.fronts)} front processes, the broker said {match['fronts']}")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def front_cpu(self) -> dict[str, float]:
        return {name: cpu_s(pid) for name, pid in self.fronts.items()}

    def all_cpu(self) -> float:
        """CPU seconds of the broker process and all its children (fronts, node services)."""
        return cpu_s(self.pid) + sum(cpu_s(p) for p in self.fronts.values()) + sum(cpu_s(p) for p in self.others)

    def log_tail(self, n: int = 4000) -> str:
        try:
            with open(self.log_path, "rb") as fh:
                return fh.read()[-n:].decode(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        """SIGTERM to the broker (it stops its fronts and services), wait; then make sure every
        child it had is gone (SIGKILL to a child still alive after 10 s)."""
        kids = list(children(self.proc.pid)) if self.proc.poll() is None else []
        _stop_popen(self.proc, 60)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(_alive(p) for p in kids):
            time.sleep(0.02)
        for pid in kids:
            if _alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._log.close()


# -- the C++ client's worker process -----------------------------------------------------------
class CppWorker:
    """The C++ client in a child process (see the module docstring). ``call(op, **args)`` sends
    one command and returns its answer; a command that overruns its deadline kills the child."""

    def __init__(self, workdir: str) -> None:
        self.home = tempfile.mkdtemp(prefix="cpp-home-", dir=workdir)
        env = {**ENV, "HOME": self.home}
        self._out = open(os.path.join(self.home, "worker.out"), "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "bench._broker", "cpp"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._out, env=env, cwd=self.home, text=True)
        _STARTED[self.proc.pid] = self.proc
        self._answers: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(_ANSWER):
                self._answers.put(line[len(_ANSWER):])
        self._answers.put(None)

    def call(self, op: str, timeout_s: float = 120.0, **args: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self.proc.stdin.flush()
        try:
            line = self._answers.get(timeout=timeout_s)
        except queue.Empty:
            self.stop(kill=True)
            raise TimeoutError(f"the C++ client worker did not answer {op} within {timeout_s} s; "
                               f"log:\n{self.log_tail()}") from None
        if line is None:
            raise RuntimeError(f"the C++ client worker exited ({self.proc.wait(5)}) during {op}; "
                               f"log:\n{self.log_tail()}")
        answer: dict[str, Any] = json.loads(line)
        if "fatal" in answer:
            raise RuntimeError(f"C++ client worker, {op}: {answer['fatal']}\n{self.log_tail()}")
        return answer

    def log_tail(self, n: int = 3000) -> str:
        """The worker's stderr and the end of the C++ client's own log (errors only)."""
        out = ""
        try:
            with open(os.path.join(self.home, "worker.out"), "rb") as fh:
                out += fh.read()[-n:].decode(errors="replace")
        except OSError:
            pass
        for path in sorted(Path(self.home, "logs", "rocketmq-cpp").glob("*")) if os.path.isdir(
                os.path.join(self.home, "logs", "rocketmq-cpp")) else []:
            with open(path, "rb") as fh:
                errors = [ln for ln in fh.read().decode(errors="replace").splitlines() if "(error)" in ln]
            out += "\n" + "\n".join(errors[-8:])
        return out

    def cpp_errors(self) -> list[str]:
        """The C++ client's logged error lines (the broker's remark of a refused send is there)."""
        lines: list[str] = []
        logs = Path(self.home, "logs", "rocketmq-cpp")
        for path in sorted(logs.glob("*")) if logs.is_dir() else []:
            with open(path, "rb") as fh:
                lines += [ln for ln in fh.read().decode(errors="replace").splitlines() if "(error)" in ln]
        return lines

    def stop(self, kill: bool = False) -> None:
        if self.proc.poll() is None and not kill:
            try:
                self.call("quit", timeout_s=30)
            except (TimeoutError, RuntimeError, BrokenPipeError, OSError):
                pass
        _stop_popen(self.proc, 10, signal.SIGKILL if kill else signal.SIGTERM)
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
        self._out.close()


def _cpp_main() -> None:
    """The worker (python -m bench._broker cpp): commands from stdin, answers to stdout."""
    import ctypes

    from rocketmq.client import Message, Producer, PushConsumer
    from rocketmq.ffi import dll

    parent = os.getppid()

    def watchdog() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(3)

    threading.Thread(target=watchdog, daemon=True).start()
    out = sys.stdout
    producers: list[Any] = []
    state: dict[str, Any] = {}

    def answer(**fields: Any) -> None:
        out.write(_ANSWER + json.dumps(fields) + "\n")
        out.flush()

    def message(topic: str, body: str) -> Any:
        msg = Message(topic)
        msg.set_body(body)
        return msg

    def start(cmd: dict[str, Any]) -> dict[str, Any]:
        topic, body = cmd["topic"], cmd["body"]
        state.update(topic=topic, body=body)
        for i in range(cmd["producers"]):
            p = Producer(cmd.get("group", "PID_BENCH_CPP"), timeout=cmd.get("timeout_ms", 3000))
            dll.SetProducerInstanceName(p._handle, f"bench{i}".encode())  # its own client, its own connection
            p.set_namesrv_addr(cmd["namesrv"])
            p.start()
            producers.append(p)
        deadline = time.monotonic() + 30
        for p in producers:  # every producer has the route and its connection before any timing
            while True:
                try:
                    p.send_sync(message(topic, body))
                    break
                except Exception as exc:
                    if time.monotonic() > deadline:
                        return {"fatal": f"no send succeeded within 30 s: {type(exc).__name__}: {exc}"}
                    time.sleep(0.2)
        return {"warm_sends": len(producers)}

    def send(cmd: dict[str, Any]) -> dict[str, Any]:
        topic, body = state["topic"], state["body"]
        threads, n, batch = cmd["threads"], cmd["n"], cmd.get("batch", 0)
        per = n // threads
        sent = [0] * threads
        errors = [0] * threads
        first: list[str] = []
        deadline = time.monotonic() + cmd.get("deadline_s", 120)

        def run(i: int) -> None:
            p = producers[i]
            if batch:
                for _ in range(per // batch):
                    if time.monotonic() > deadline:
                        return
                    try:
                        p.send_batch([message(topic, body) for _ in range(batch)])
                        sent[i] += batch
                    except Exception as exc:
                        errors[i] += batch
                        if not first:
                            first.append(f"{type(exc).__name__}: {exc}")
            else:
                for _ in range(per):
                    if time.monotonic() > deadline:
                        return
                    try:
                        p.send_sync(message(topic, body))
                        sent[i] += 1
                    except Exception as exc:
                        errors[i] += 1
                        if not first:
                            first.append(f"{type(exc).__name__}: {exc}")

        workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
        t0 = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        return {"elapsed": time.perf_counter() - t0, "sent": sum(sent), "errors": sum(errors),
                "first_error": first[0] if first else None}

    def paced(cmd: dict[str, Any]) -> dict[str, Any]:
        topic, body = state["topic"], state["body"]
        p = producers[0]
        n, interval = cmd["n"], 1.0 / cmd["rate"]
        lat: list[float] = []
        sched: list[float] = []
        clock = time.perf_counter
        t0 = clock()
        for i in range(n):
            due = t0 + i * interval
            now = clock()
            if now < due:
                time.sleep(due - now)
            s = clock()
            p.send_sync(message(topic, body))
            e = clock()
            lat.append(e - s)
            sched.append(e - max(due, t0))
        return {"elapsed": clock() - t0, "lat": lat, "from_schedule": sched}

    def push(cmd: dict[str, Any]) -> dict[str, Any]:
        n, lock = cmd["n"], threading.Lock()
        seen = [0]
        first = [0.0]
        last = [0.0]
        done = threading.Event()
        consumer = PushConsumer(cmd["group"])
        consumer.set_namesrv_addr(cmd["namesrv"])

        def on_message(msg: Any) -> None:
            _ = msg.body  # what a consumer reads: the body, as bytes
            now = time.perf_counter()
            with lock:
                if not seen[0]:
                    first[0] = now
                seen[0] += 1
                last[0] = now
                if seen[0] >= n:
                    done.set()

        consumer.subscribe(cmd["topic"], on_message, "*")
        t0 = time.perf_counter()
        consumer.start()
        done.wait(cmd.get("timeout_s", 60))
        t_done = time.perf_counter()
        state["consumer"] = consumer
        with lock:
            got = seen[0]
        return {"count": got, "start_to_first": first[0] - t0 if got else None,
                "start_to_last": last[0] - t0 if got else None, "first_to_last": last[0] - first[0] if got else None,
                "waited": t_done - t0}

    def push_stop(cmd: dict[str, Any]) -> dict[str, Any]:
        consumer = state.pop("consumer", None)
        t0 = time.perf_counter()
        if consumer is not None:
            consumer.shutdown()
        return {"shutdown_s": time.perf_counter() - t0}

    ops = {"start": start, "send": send, "paced": paced, "push": push, "push_stop": push_stop}
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "quit":
            break
        try:
            answer(**ops[cmd["op"]](cmd))
        except Exception as exc:  # the benchmark reports it; the worker goes on
            answer(fatal=f"{type(exc).__name__}: {exc}")
    for p in producers:
        try:
            p.shutdown()
        except Exception:
            pass
    answer(bye=True)
    out.flush()
    del ctypes
    os._exit(0)  # no interpreter teardown: the wheel's __del__ would shut the clients down again


# -- Redis load --------------------------------------------------------------------------------
REDIS_STREAM = "bench"


def redis_sync_clients(port: int, k: int) -> list[Any]:
    import redis

    clients = [redis.Redis(host=LOOPBACK, port=port) for _ in range(k)]
    for c in clients:
        c.ping()  # one connection each, made now
    return clients


def redis_sync_round(clients: list[Any], n: int, pipeline: int, body: bytes) -> None:
    """n XADDs over the clients, one thread per client: one per round trip (pipeline 0) or
    pipelines of `pipeline` (transaction=False: plain pipelining, no MULTI/EXEC)."""
    per = n // len(clients)
    errors: list[BaseException] = []

    def run(c: Any) -> None:
        try:
            if pipeline:
                for _ in range(per // pipeline):
                    p = c.pipeline(transaction=False)
                    for _ in range(pipeline):
                        p.xadd(REDIS_STREAM, {"b": body})
                    p.execute()
            else:
                xadd = c.xadd
                for _ in range(per):
                    xadd(REDIS_STREAM, {"b": body})
        except BaseException as exc:  # re-raised below
            errors.append(exc)

    if len(clients) == 1:
        run(clients[0])
    else:
        threads = [threading.Thread(target=run, args=(c,)) for c in clients]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    if errors:
        raise errors[0]


async def redis_async_clients(port: int, k: int) -> list[Any]:
    import redis.asyncio as aredis

    clients = [aredis.Redis(host=LOOPBACK, port=port) for _ in range(k)]
    for c in clients:
        await c.ping()
    return clients


async def redis_async_round(clients: list[Any], n: int, pipeline: int, body: bytes) -> None:
    per = n // len(clients)

    async def run(c: Any) -> None:
        if pipeline:
            for _ in range(per // pipeline):
                p = c.pipeline(transaction=False)
                for _ in range(pipeline):
                    p.xadd(REDIS_STREAM, {"b": body})
                await p.execute()
        else:
            for _ in range(per):
                await c.xadd(REDIS_STREAM, {"b": body})

    await asyncio.gather(*(run(c) for c in clients))


# -- the closing summary -------------------------------------------------------------------------
def _rate(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v / 1e6:.2f} M" if v >= 1e6 else f"{v / 1e3:.1f} k"


def summary_lines(benchmarks: list[Any]) -> list[str]:
    """The broker section of the closing summary: every broker case's figure, then the targets."""
    infos = [b.extra_info for b in benchmarks if "broker_case" in b.extra_info]
    if not infos:
        return []
    by = {i["broker_case"]: i for i in infos}
    lines = []
    w = max(len(c) for c in by)
    for case, info in by.items():
        if "msgs_per_s" in info:
            parts = [f"{label} {info[key]:.1f}" for key, label in (
                ("front_cpu_us_per_msg", "fronts"), ("client_cpu_us_per_msg", "client"),
                ("redis_cpu_us_per_msg", "redis-server")) if key in info]
            extra = f"  CPU us/msg: {', '.join(parts)}" if parts else ""
            lines.append(f"{case:<{w}}  {_rate(info['msgs_per_s']):>9} msg/s{extra}")
        elif "lat_ms" in info:
            lat = info["lat_ms"]
            lines.append(f"{case:<{w}}  p50 {lat['p50']:.2f} ms  p99 {lat['p99']:.2f} ms  p99.9 {lat['p99.9']:.2f} ms"
                         f"  max {lat['max']:.2f} ms" + (f"  (at {info['rate']:,.0f}/s, half of {info['peak_msgs_per_s']:,}/s;"
                                                          f" from the due time p99 {info['from_schedule_ms']['p99']:.2f} ms)"
                                                          if "rate" in info else ""))
        elif "ns_per_op" in info:
            lines.append(f"{case:<{w}}  {info['ns_per_op']:.0f} ns/op ({info['frame_bytes']} B frame)")
    lines.append("")
    lines += target_lines(by)
    return lines


def _best_redis(by: dict[str, dict[str, Any]], mode: str, conns: int) -> tuple[str, float] | None:
    got = [(c, by[c]["msgs_per_s"]) for c in (f"redis-sync/{mode}/{conns}c", f"redis-async/{mode}/{conns}c")
           if c in by and "msgs_per_s" in by[c]]
    return max(got, key=lambda x: x[1]) if got else None


def target_lines(by: dict[str, dict[str, Any]]) -> list[str]:
    out = []

    def verdict(ok: bool) -> str:
        return "met" if ok else "NOT MET"

    for mode, peer_mode, target in (("single", "single", 1.0), ("batch100", "pipe100", 3.0)):
        for case, info in by.items():
            parts = case.split("/")
            if parts[0] in ("redis-sync", "redis-async") or parts[0].startswith("fronts-") or len(parts) != 3 \
                    or parts[1] != mode:
                continue
            if "msgs_per_s" not in info:
                continue
            conns = int(parts[2].rstrip("c"))
            best = _best_redis(by, peer_mode, conns)
            if best is None:
                continue
            ratio = info["msgs_per_s"] / best[1]
            out.append(f"{case} / {best[0]} = {ratio:.2f}x (target >= {target:g}x): {verdict(ratio >= target)}")
    for case, info in by.items():
        if case.startswith("latency/") and "lat_ms" in info:
            p99 = info["lat_ms"]["p99"]
            out.append(f"{case}: send p99 {p99:.2f} ms at half the peak (target <= 2 ms): {verdict(p99 <= 2.0)}")
        if case.startswith("consume/") and "msgs_per_s" in info:
            r = info["msgs_per_s"]
            out.append(f"{case}: {_rate(r)} msg/s (target >= 300 k): {verdict(r >= 300_000)}")
        if case.startswith("wakeup/") and "lat_ms" in info:
            p99 = info["lat_ms"]["p99"]
            late = f"; {info['late']} of {info['samples']} answered after >= 100 ms" if "late" in info else ""
            out.append(f"{case}: wake-up p99 {p99:.2f} ms (target <= 5 ms): {verdict(p99 <= 5.0)}{late}")
    codec = {c: i["ns_per_op"] for c, i in by.items() if c.startswith("codec/")}
    if codec:
        per = {}
        for st in ("JSON", "ROCKETMQ"):
            keys = [k for k in codec if k.startswith(f"codec/{st}/")]
            if len(keys) == 4:
                per[st] = sum(codec[k] for k in keys)
        if len(per) == 2:
            ratio = per["JSON"] / per["ROCKETMQ"]
            out.append(f"codec: a send's request + response, encode + decode: JSON {per['JSON']:.0f} ns, ROCKETMQ "
                       f"{per['ROCKETMQ']:.0f} ns = {ratio:.2f}x cheaper (target >= 3x): {verdict(ratio >= 3)}")
    cpu = {st: by.get(f"mqstore-{st}/single/16c", {}).get("front_cpu_us_per_msg") for st in ("JSON", "ROCKETMQ")}
    if all(cpu.values()):
        out.append(f"broker CPU per send under load (16 connections, fronts): JSON {cpu['JSON']:.1f} us, ROCKETMQ "
                   f"{cpu['ROCKETMQ']:.1f} us ({cpu['JSON'] / cpu['ROCKETMQ']:.2f}x)")  # type: ignore[operator]
    f1, f2 = by.get("fronts-1/single/16c"), by.get("fronts-2/single/16c")
    if f1 and f2 and "msgs_per_s" in f1 and "msgs_per_s" in f2:
        out.append(f"front_processes 2 / 1 (16 connections, single sends): {_rate(f2['msgs_per_s'])} / "
                   f"{_rate(f1['msgs_per_s'])} = {f2['msgs_per_s'] / f1['msgs_per_s']:.2f}x")
    return out


class SummaryPlugin:
    """Registered by bench/test_broker.py: prints the broker section at the end of the run;
    ``notes`` are lines the benchmarks add (cases that could not be measured, and why)."""

    def __init__(self, notes: list[str] | None = None) -> None:
        self.notes = notes if notes is not None else []

    def pytest_terminal_summary(self, terminalreporter: Any, config: Any) -> None:
        session = getattr(config, "_benchmarksession", None)
        lines = summary_lines(getattr(session, "benchmarks", []) or [])
        if not lines and not self.notes:
            return
        tr = terminalreporter
        tr.section("mqstore broker over loopback (medians of rounds, the peer in the same run)", sep="-")
        for line in lines + self.notes:
            tr.write_line(line)
        tr.write_line(f"load average at the end: {loadavg()} ({os.cpu_count()} CPUs; on 2 shared cores every "
                      "client, broker process and redis-server compete for the same CPUs: figures are noisy)")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "cpp":
        _cpp_main()
    else:
        sys.exit("usage: python -m bench._broker cpp  (the C++ client worker of bench/test_broker.py)")


def send_until_routed_sync(producer: Any, topic: str, body: bytes, deadline_s: float = 30.0) -> None:
    """One SyncProducer send; the first send to a new topic may meet TOPIC_NOT_EXIST while the
    broker creates it and registers it with the NameServer, so retry for a while."""
    from mqstore.client import MQClientError

    deadline = time.monotonic() + deadline_s
    while True:
        try:
            producer.send(topic, body)
            return
        except MQClientError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
