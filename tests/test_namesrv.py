"""The NameServer over real loopback sockets (docs/rocketmq-remoting-spec.md §2.3): registration,
routes in the form each client version reads, refusals naming the cause, a bad frame closing its
connection only, and `mqstore namesrv` as a process."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from typing import Any

from mqstore.remoting._remoting import FrameReader, RemotingCommand
from mqstore.broker.namesrv import NameServer

from helpers_broker import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REGISTER_BODY = json.dumps({"filterServerList": [], "topicConfigSerializeWrapper": {
    "dataVersion": {"counter": 1, "timestamp": 5},
    "topicConfigTable": {"T": {"topicName": "T", "readQueueNums": 4, "writeQueueNums": 4, "perm": 6}}}}).encode()


class Client:
    """A bounded request/response client over one connection (every wait has a timeout)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer, self.frames, self.opaque = reader, writer, FrameReader(), 0

    @classmethod
    async def connect(cls, port: int) -> Client:
        r, w = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 5)
        return cls(r, w)

    async def call(self, code: int, ext: dict[str, str] | None = None, body: bytes = b"", *, version: int = 63,
                   flag: int = 0, timeout: float = 5) -> RemotingCommand | None:
        self.opaque += 1
        cmd = RemotingCommand(code, language="CPP", version=version, opaque=self.opaque, flag=flag,
                              ext_fields=ext, body=body)
        self.writer.write(cmd.encode())
        await self.writer.drain()
        return await self.receive(timeout)

    async def receive(self, timeout: float = 5) -> RemotingCommand | None:
        deadline = time.monotonic() + timeout
        while (got := self.frames.next()) is None:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                data = await asyncio.wait_for(self.reader.read(65536), left)
            except asyncio.TimeoutError:
                return None
            if not data:
                return None
            self.frames.feed(data)
        return got

    def close(self) -> None:
        self.writer.close()


def run(test: Any, **settings: Any) -> None:
    async def main() -> None:
        ns = NameServer("127.0.0.1", 0, **settings)
        await ns.start()
        try:
            await asyncio.wait_for(test(ns), 30)
        finally:
            await ns.close()
    asyncio.run(main())


def register(broker_id: int, addr: str) -> dict[str, str]:
    return {"brokerName": "broker-a", "brokerAddr": addr, "clusterName": "DefaultCluster",
            "haServerAddr": addr.replace("10911", "10912"), "brokerId": str(broker_id), "compressed": "false",
            "bodyCrc32": "0"}


def test_routes_after_registration_in_each_clients_form():
    async def test(ns: NameServer) -> None:
        c = await Client.connect(ns.port)
        r = await c.call(105, {"topic": "T"})
        assert r.code == 17 and r.remark.startswith("No topic route info in name server for the topic: T")
        assert r.is_response and r.opaque == 1
        r = await c.call(103, register(0, "127.0.0.1:10911"), REGISTER_BODY, version=407)
        assert r.code == 0 and r.ext_fields == {} and json.loads(r.body) == {"table": {}}
        r = await c.call(103, register(1, "127.0.0.2:10911"), REGISTER_BODY, version=407)
        assert r.ext_fields == {"haServerAddr": "127.0.0.1:10912", "masterAddr": "127.0.0.1:10911"}
        r = await c.call(105, {"topic": "T"})  # the C++ client: version 63
        assert r.code == 0 and b'"brokerAddrs":{0:"127.0.0.1:10911",1:"127.0.0.2:10911"}' in r.body
        r = await c.call(105, {"topic": "T"}, version=407)  # a 4.9.7 Java client: standard JSON
        route = json.loads(r.body)
        assert route["brokerDatas"][0]["brokerAddrs"] == {"0": "127.0.0.1:10911", "1": "127.0.0.2:10911"}
        assert route["queueDatas"] == [{"brokerName": "broker-a", "perm": 6, "readQueueNums": 4, "topicSysFlag": 0,
                                        "writeQueueNums": 4}]
        r = await c.call(104, {k: v for k, v in register(0, "127.0.0.1:10911").items() if k != "haServerAddr"})
        assert r.code == 0
        r = await c.call(105, {"topic": "T"})
        assert b"127.0.0.1:10911" not in r.body and b"127.0.0.2:10911" in r.body
        c.close()
    run(test)


def test_refusals_name_the_cause_and_a_bad_frame_closes_only_its_connection():
    async def test(ns: NameServer) -> None:
        c = await Client.connect(ns.port)
        r = await c.call(99)
        assert r.code == 3 and r.remark == " request type 99 not supported"
        r = await c.call(105, {})
        assert r.code == 1 and r.remark == "the custom field <topic> is null"
        r = await c.call(103, register(0, "h:1"), REGISTER_BODY[:-3])
        assert r.code == 1 and "not JSON" in r.remark
        r = await c.call(103, {**register(0, "h:1"), "bodyCrc32": "1"}, REGISTER_BODY)
        assert r.code == 1 and r.remark == "crc32 not match"
        assert await c.call(105, {"topic": "T"}, flag=2, timeout=0.3) is None, "a oneway request gets no answer"
        bad = await Client.connect(ns.port)
        bad.writer.write(struct.pack(">i", 0))  # a frame length of 0: RocketMQ closes the channel
        await bad.writer.drain()
        assert await asyncio.wait_for(bad.reader.read(), 5) == b"", "the bad connection is closed"
        r = await c.call(105, {"topic": "T"})
        assert r is not None and r.code == 17, "the other connection still works"
        c.close()
    run(test)


def test_an_expired_broker_leaves_the_route():
    now = [0]

    async def test(ns: NameServer) -> None:
        c = await Client.connect(ns.port)
        assert (await c.call(103, register(0, "h:10911"), REGISTER_BODY)).code == 0
        assert (await c.call(105, {"topic": "T"})).code == 0
        now[0] = 120_001
        deadline = time.monotonic() + 5
        while (await c.call(105, {"topic": "T"})).code == 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert (await c.call(105, {"topic": "T"})).code == 17
        c.close()
    run(test, clock_ms=lambda: now[0], scan_interval_ms=20)


def test_mqstore_namesrv_runs_as_a_process_until_sigterm():
    port = free_port()
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, "-m", "mqstore", "namesrv", "--host", "127.0.0.1", "--listen-port",
                             str(port)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert proc.poll() is None, proc.communicate()
                assert time.monotonic() < deadline, "the NameServer did not listen within 20 s"
                time.sleep(0.05)

        async def ask() -> RemotingCommand | None:
            c = await Client.connect(port)
            try:
                return await c.call(105, {"topic": "T"})
            finally:
                c.close()
        r = asyncio.run(ask())
        assert r is not None and r.code == 17
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
    assert proc.returncode == 0, err
    assert f"listening on 127.0.0.1:{port}" in err


def test_fuzzed_frames_never_stop_the_name_server():
    """Random bytes, and well-framed commands with random codes, headers and bodies: each
    connection gets answers or is closed, and the server keeps answering new connections."""
    import random

    from mqstore.twin import remoting as twin

    rng = random.Random(1234)

    async def test(ns: NameServer) -> None:
        for i in range(60):
            c = await Client.connect(ns.port)
            if i % 2:
                c.writer.write(rng.randbytes(rng.randrange(1, 200)))
            else:
                fields = {rng.choice(["topic", "brokerName", "brokerId", "x"]): rng.choice(["", "T", "1", "zz"])
                          for _ in range(rng.randrange(4))}
                h = (rng.choice([103, 104, 105, 0, 99, -1]), "JAVA", rng.randrange(500), i, rng.choice([0, 1, 2]),
                     None, fields)
                c.writer.write(twin.encode_frame(h, rng.randbytes(rng.randrange(50)), rng.choice([0, 1])))
            await c.writer.drain()
            await c.receive(timeout=0.2)
            c.close()
            ok = await Client.connect(ns.port)
            r = await ok.call(105, {"topic": "T"})
            assert r is not None and r.code == 17, f"the server stopped answering after input {i}"
            ok.close()
    run(test)
