"""The broker over loopback (bench/README.md, "The broker, over loopback").

    python -m pytest bench/test_broker.py --benchmark-columns=median,rounds -q

Each benchmark starts its own broker (``python -m mqstore broker DIR`` in a process of its own,
bench/_broker.py ``BrokerProc``: default settings except 127.0.0.1 and free ports, so 2 front
processes on a 2-CPU machine) and its own redis-server (bench/_peers.py ``RedisServer``: AOF with
``appendfsync everysec``, the durability class of the broker's default ASYNC_FLUSH), and stops
them by pid. Clients are what a user runs: ``mqstore.client`` (asyncio ``Producer`` in this
process's event loop; ``SyncProducer`` in threads, one each, as redis-sync), the
real RocketMQ C++ client (the PyPI ``rocketmq`` wheel, in a worker process, one producer and so
one connection per thread) and redis-py (threads with a client each, or asyncio clients in one
event loop). 100-byte bodies (NUL-free: the wheel cuts bodies at NUL).

1. Sends, with 1, 4 and 16 connections: one message per request (``await producer.send``,
   ``send_sync``, one ``XADD`` per round trip) and batches of 100 (``send_batch``, a pipeline
   of 100 ``XADD``s). msg/s = messages per round / median round. The broker's front processes'
   CPU (``/proc/<pid>/stat``) and this process's CPU over the timed rounds are kept per message.
   Send latency at half the peak: one producer paced at half the rate it reached flat out in
   the same benchmark, every send timed.
2. Consume: ``PullConsumer.pull`` (32 per pull, the topic's 4 queues pulled at once, each
   back to back) and the C++ ``PushConsumer`` over a topic pre-filled with 50k messages; the
   wake-up of a long-polling pull: from the send of a message (by another producer) to the
   answer of the pull held for it, with the pull held well before the put, and with the put
   racing the hold.
3. The header codec: ``RemotingCommand.encode`` / ``decode_frame`` of a SEND_MESSAGE_V2 request
   and its response, JSON against ROCKETMQ.
4. ``front_processes`` 1 against 2, 16 connections, one message per send.
"""

from __future__ import annotations

import asyncio
import base64
import os
import statistics
import threading
import time
from typing import Any

import pytest

from bench._broker import (
    BrokerProc,
    CppWorker,
    SummaryPlugin,
    cpu_s,
    established,
    percentiles,
    redis_async_clients,
    redis_async_round,
    redis_sync_clients,
    redis_sync_round,
    self_cpu_s,
    send_until_routed_sync,
    stop_started,
)
from bench._peers import RedisServer, redis_unavailable

#: 100 bytes, random, NUL-free (the C++ wheel passes bodies as C strings), the same for every client
BODY = base64.b64encode(os.urandom(75))
BODY_STR = BODY.decode()
assert len(BODY) == 100
TOPIC = "BenchTopic"
CONNS = (1, 4, 16)
ROUNDS = 5
N_SINGLE = 3_200          # messages per round, one per request (divisible by 16)
N_BATCH = 32_000          # messages per round in batches of 100 (320 batches)
BATCH = 100
CPP_SMALL_BATCH = 20      # a C++ batch whose encoded body stays under the client's 4 KiB compression threshold
N_LAT_PEAK = 2_000        # flat-out sends that give the peak rate of the latency case
N_LAT = 1_000             # paced sends per round of the latency case
ROUNDS_LAT = 3
N_CONSUME = 50_000        # messages in the consume benchmarks' topic
ROUNDS_CONSUME = 3
N_WAKEUPS = 250           # samples of the long-polling wake-up
N_RACES = 400             # samples of the wake-up when the put races the hold
CODEC_OPS = 20_000
ROUNDS_CODEC = 10

#: what the summary reports besides the benchmarks (cases that could not run, and why)
NOTES: list[str] = []


# -- fixtures -------------------------------------------------------------------------------------
@pytest.fixture(scope="module", autouse=True)
def broker_module(request: pytest.FixtureRequest) -> Any:
    """The broker section of the closing summary; every process this module started is stopped
    by its pid at the end, also after a failure."""
    plugin = SummaryPlugin(NOTES)
    request.config.pluginmanager.register(plugin, "mqstore-broker-summary")
    yield
    stop_started()


@pytest.fixture
def brokers(work_dir: Any) -> Any:
    """Factory: brokers(**settings) -> a started BrokerProc in work_dir; stopped afterwards."""
    started: list[BrokerProc] = []

    def start(**settings: Any) -> BrokerProc:
        root = os.path.join(str(work_dir), f"broker{len(started)}")
        os.makedirs(root)
        b = BrokerProc(root, **settings)
        started.append(b)
        return b

    yield start
    for b in started:
        b.stop()


@pytest.fixture
def redis_server(work_dir: Any) -> Any:
    why = redis_unavailable()
    if why:
        pytest.skip(f"the Redis peer needs a redis-server: {why}")
    server = RedisServer(os.path.join(str(work_dir), "redis"))
    yield server
    server.stop()


@pytest.fixture
def cpp_worker(work_dir: Any) -> Any:
    pytest.importorskip("rocketmq.client", reason="the C++ client is the PyPI rocketmq wheel (x86_64 Linux)")
    workers: list[CppWorker] = []

    def start() -> CppWorker:
        w = CppWorker(str(work_dir))
        workers.append(w)
        return w

    yield start
    for w in workers:
        w.stop()


# -- mqstore.client in this process --------------------------------------------------------------
class AsyncClients:
    """K mqstore.client Producers (one connection each) on an event loop of this process."""

    def __init__(self, namesrv: str, conns: int, serialize: str = "JSON") -> None:
        from mqstore.client import Producer, PullConsumer

        self.loop = asyncio.new_event_loop()
        self.namesrv = namesrv
        self.producers = [Producer("PG_BENCH", namesrv, serialize=serialize) for _ in range(conns)]
        self.consumer = PullConsumer("CG_BENCH_CHECK", namesrv)
        #: sends to TOPIC acknowledged so far (SEND_OK: a refused send raises)
        self.acked = 0
        self.run(self._start())

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    async def _start(self) -> None:
        for p in self.producers:
            await p.start()
        await self.consumer.start()
        for p in self.producers:  # the topic exists and every producer has its route and connection
            await send_until_routed(p, TOPIC)
            self.acked += 1

    async def single(self, n: int) -> None:
        per = n // len(self.producers)

        async def one(p: Any) -> None:
            send = p.send
            for _ in range(per):
                await send(TOPIC, BODY)

        await asyncio.gather(*(one(p) for p in self.producers))
        self.acked += per * len(self.producers)

    async def batches(self, n: int, size: int = BATCH) -> None:
        per = n // len(self.producers) // size
        items = [BODY] * size

        async def one(p: Any) -> None:
            for _ in range(per):
                await p.send_batch(TOPIC, items)

        await asyncio.gather(*(one(p) for p in self.producers))
        self.acked += per * size * len(self.producers)

    async def stored(self, topic: str = TOPIC) -> int:
        """Messages in the topic: the sum of its queues' max offsets."""
        from mqstore.client import MQClientError

        for _ in range(300):  # a topic a send has just created reaches the NameServer a moment later
            try:
                queues = await self.consumer.queues(topic)
                break
            except MQClientError:
                await asyncio.sleep(0.1)
        else:
            queues = await self.consumer.queues(topic)
        return sum([await self.consumer.max_offset(mq) for mq in queues])

    def close(self) -> None:
        async def close_all() -> None:
            for p in self.producers:
                await p.close()
            await self.consumer.close()

        try:
            self.run(close_all())
        finally:
            self.loop.close()


class SyncClients:
    """K mqstore.client SyncProducers (one connection each), each sending from its own thread,
    as redis-sync's K clients do (one client in the calling thread)."""

    def __init__(self, namesrv: str, conns: int) -> None:
        from mqstore.client import SyncProducer

        self.producers = [SyncProducer("PG_BENCH", namesrv).start() for _ in range(conns)]
        self.acked = 0
        for p in self.producers:  # the topic exists and every producer has its route and connection
            send_until_routed_sync(p, TOPIC, BODY)
            self.acked += 1

    def _each(self, work: Any) -> None:
        errors: list[BaseException] = []

        def run(p: Any) -> None:
            try:
                work(p)
            except BaseException as exc:  # re-raised below
                errors.append(exc)

        if len(self.producers) == 1:
            run(self.producers[0])
        else:
            threads = [threading.Thread(target=run, args=(p,)) for p in self.producers]
            for t in threads:
                t.start()
            for t in threads:
                t.join(120)
        if errors:
            raise errors[0]

    def single(self, n: int) -> None:
        per = n // len(self.producers)

        def work(p: Any) -> None:
            send = p.send
            for _ in range(per):
                send(TOPIC, BODY)

        self._each(work)
        self.acked += per * len(self.producers)

    def batches(self, n: int, size: int = BATCH) -> None:
        per = n // len(self.producers) // size
        items = [BODY] * size

        def work(p: Any) -> None:
            for _ in range(per):
                p.send_batch(TOPIC, items)

        self._each(work)
        self.acked += per * size * len(self.producers)

    def close(self) -> None:
        for p in self.producers:
            p.close()


async def send_until_routed(producer: Any, topic: str, deadline_s: float = 30.0) -> None:
    """One send; the first send to a new topic may meet TOPIC_NOT_EXIST while the broker creates
    it and registers it with the NameServer, so retry for a while."""
    from mqstore.client import MQClientError

    deadline = time.monotonic() + deadline_s
    while True:
        try:
            await producer.send(topic, BODY)
            return
        except MQClientError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


def queues_of(clients: AsyncClients, consumer: Any, topic: str, deadline_s: float = 30.0) -> list[Any]:
    """The topic's queues; a topic a send has just created reaches the NameServer a moment later."""
    from mqstore.client import MQClientError

    deadline = time.monotonic() + deadline_s
    while True:
        try:
            return list(clients.run(consumer.queues(topic)))
        except MQClientError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def wait_stored(clients: AsyncClients, expected: int, topic: str = TOPIC, timeout_s: float = 30.0) -> int:
    """The topic's message count once it reaches `expected` (dispatch may trail the sends)."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = clients.run(clients.stored(topic))
        if got >= expected or time.monotonic() > deadline:
            return got
        time.sleep(0.05)


# -- recording ------------------------------------------------------------------------------------
def record(benchmark: Any, case: str, n: int, **extra: Any) -> None:
    info = benchmark.extra_info
    info.update(broker_case=case, per_round=n, **extra)
    stats = getattr(benchmark, "stats", None)
    if benchmark.disabled or stats is None:
        return
    info["msgs_per_s"] = round(n / stats.stats.median)
    info["msgs_per_s_mean"] = round(n / stats.stats.mean)


class CpuWindow:
    """CPU from start() to stop(), per message: the broker's fronts (each, and all its processes),
    this process (the client, unless `client_pid` names the client's process) and any `peers`
    (name -> pid, e.g. the redis-server)."""

    def __init__(self, broker: BrokerProc | None, client_pid: int | None = None,
                 peers: dict[str, int] | None = None) -> None:
        self.broker = broker
        self.client_pid = client_pid
        self.peers = peers or {}

    def _client(self) -> float:
        return self_cpu_s() if self.client_pid is None else cpu_s(self.client_pid)

    def start(self) -> None:
        self.f0 = self.broker.front_cpu() if self.broker else {}
        self.a0 = self.broker.all_cpu() if self.broker else 0.0
        self.c0 = self._client()
        self.p0 = {k: cpu_s(v) for k, v in self.peers.items()}

    def stop(self, messages: int) -> dict[str, Any]:
        f1 = self.broker.front_cpu() if self.broker else {}
        out: dict[str, Any] = {"client_cpu_us_per_msg": round((self._client() - self.c0) / messages * 1e6, 2)}
        for k, pid in self.peers.items():
            out[f"{k}_cpu_us_per_msg"] = round((cpu_s(pid) - self.p0[k]) / messages * 1e6, 2)
        if self.broker:
            per = {k: f1[k] - self.f0[k] for k in f1}
            out["front_cpu_s"] = {k: round(v, 2) for k, v in per.items()}
            out["front_cpu_us_per_msg"] = round(sum(per.values()) / messages * 1e6, 2)
            out["broker_all_cpu_us_per_msg"] = round((self.broker.all_cpu() - self.a0) / messages * 1e6, 2)
        return out


# -- 1. sends -------------------------------------------------------------------------------------
CLIENTS_SINGLE = ("mqstore-JSON", "mqstore-ROCKETMQ", "mqstore-sync", "cpp", "redis-sync", "redis-async")
CLIENTS_BATCH = ("mqstore-JSON", "mqstore-ROCKETMQ", "mqstore-sync", "cpp", f"cpp-batch{CPP_SMALL_BATCH}", "redis-sync",
                 "redis-async")
SEND_CASES = ([("single", c, k) for k in CONNS for c in CLIENTS_SINGLE]
              + [("batch100", c, k) for k in CONNS for c in CLIENTS_BATCH])


@pytest.mark.parametrize("mode,client,conns", SEND_CASES, ids=[f"{m}-{c}-{k}c" for m, c, k in SEND_CASES])
def test_send(benchmark: Any, request: pytest.FixtureRequest, mode: str, client: str, conns: int) -> None:
    benchmark.group = f"broker 1: {'one message per send' if mode == 'single' else 'batches of 100'}, " \
                      f"{conns} connection{'s' if conns > 1 else ''} (msg/s = msgs per round / median)"
    n = N_SINGLE if mode == "single" else N_BATCH
    if client.startswith("redis"):
        run_redis(benchmark, request.getfixturevalue("redis_server"), client, mode, conns, n)
    elif client.startswith("cpp"):
        run_cpp(benchmark, request.getfixturevalue("brokers")(), request.getfixturevalue("cpp_worker")(),
                client, mode, conns, n)
    else:
        run_mqstore(benchmark, request.getfixturevalue("brokers")(), client, mode, conns, n)


def run_mqstore(benchmark: Any, broker: BrokerProc, client: str, mode: str, conns: int, n: int,
                case: str | None = None) -> None:
    serialize = client.split("-", 1)[1]
    clients: AsyncClients | SyncClients
    if serialize == "sync":
        clients = sync = SyncClients(broker.namesrv, conns)
        sync_work = sync.single if mode == "single" else sync.batches

        def target() -> None:
            sync_work(n)
    else:
        clients = aio = AsyncClients(broker.namesrv, conns, serialize)
        work = aio.single if mode == "single" else aio.batches

        def target() -> None:
            aio.run(work(n))
    try:
        # SyncClients: one connection each, and no NameServer connection left open once routed
        assert established(os.getpid(), broker.port) == conns

        target()  # warm-up, untimed
        cpu = CpuWindow(broker)
        cpu.start()
        benchmark.pedantic(target, rounds=ROUNDS, warmup_rounds=0, iterations=1)
        timed = n * (1 if benchmark.disabled else ROUNDS)
        extra = cpu.stop(timed)
        expected = clients.acked
        checker = clients if isinstance(clients, AsyncClients) else AsyncClients(broker.namesrv, 0)
        try:
            got = wait_stored(checker, expected)
        finally:
            if checker is not clients:
                checker.close()
        assert got == expected, f"the broker holds {got} messages of {TOPIC}, {expected} were acknowledged"
        record(benchmark, case or f"{client}/{mode}/{conns}c", n, connections=conns, fronts=len(broker.fronts),
               **extra)
    finally:
        clients.close()


def run_cpp(benchmark: Any, broker: BrokerProc, worker: CppWorker, client: str, mode: str, conns: int, n: int) -> None:
    batch = 0 if mode == "single" else (CPP_SMALL_BATCH if client != "cpp" else BATCH)
    case = f"{client}/{mode}/{conns}c"
    worker.call("start", namesrv=broker.namesrv, producers=conns, topic=TOPIC, body=BODY_STR)
    assert established(worker.proc.pid, broker.port) == conns
    if batch:
        probe = worker.call("send", threads=1, n=batch, batch=batch)
        if probe["errors"]:
            remark = next((ln.split("remark:", 1)[1].split("[processSendResponse")[0]
                           for ln in reversed(worker.cpp_errors()) if "remark:" in ln), probe["first_error"])
            NOTES.append(f"{case}: every send_batch of {batch} x 100 B failed ({probe['first_error']}); the broker "
                         f"answered: {remark.strip()}")
            pytest.fail(f"C++ send_batch of {batch} messages refused by the broker: {remark.strip()[:300]}")
    if client == "cpp":
        client_case = case
    else:
        client_case = f"cpp-batch{batch}/batch/{conns}c"
        n = n // batch * batch
    results: list[dict[str, Any]] = []

    def target() -> None:
        results.append(worker.call("send", threads=conns, n=n, batch=batch))

    cpu = CpuWindow(broker, client_pid=worker.proc.pid)
    target()
    cpu.start()
    benchmark.pedantic(target, rounds=ROUNDS, warmup_rounds=0, iterations=1)
    extra = cpu.stop(n * (len(results) - 1))
    bad = [r for r in results if r["errors"] or r["sent"] != n]
    assert not bad, f"C++ sends failed: {bad[0]}\n{worker.log_tail()}"
    worker_rates = sorted(r["sent"] / r["elapsed"] for r in results[1:])
    record(benchmark, client_case, n, connections=conns, batch=batch, fronts=len(broker.fronts),
           worker_msgs_per_s_median=round(statistics.median(worker_rates)), **extra)


def run_redis(benchmark: Any, server: RedisServer, client: str, mode: str, conns: int, n: int) -> None:
    pipeline = 0 if mode == "single" else BATCH
    peer_mode = "single" if mode == "single" else "pipe100"
    case = f"{client}/{peer_mode}/{conns}c"
    own = established(os.getpid(), server.port)  # RedisServer's control connection
    if client == "redis-sync":
        clients = redis_sync_clients(server.port, conns)
        assert established(os.getpid(), server.port) - own == conns

        def target() -> None:
            redis_sync_round(clients, n, pipeline, BODY)

        try:
            cpu = CpuWindow(None, peers={"redis": server.pid})
            target()
            cpu.start()
            benchmark.pedantic(target, rounds=ROUNDS, warmup_rounds=0, iterations=1)
            extra = cpu.stop(n * (1 if benchmark.disabled else ROUNDS))
        finally:
            for c in clients:
                c.close()
    else:
        loop = asyncio.new_event_loop()
        aclients = loop.run_until_complete(redis_async_clients(server.port, conns))
        assert established(os.getpid(), server.port) - own == conns

        def target() -> None:
            loop.run_until_complete(redis_async_round(aclients, n, pipeline, BODY))

        try:
            cpu = CpuWindow(None, peers={"redis": server.pid})
            target()
            cpu.start()
            benchmark.pedantic(target, rounds=ROUNDS, warmup_rounds=0, iterations=1)
            extra = cpu.stop(n * (1 if benchmark.disabled else ROUNDS))
        finally:
            for c in aclients:
                loop.run_until_complete(c.aclose())
            loop.close()
    stored = server.client.xlen("bench")
    expected = n * (2 if benchmark.disabled else ROUNDS + 1)
    assert stored == expected, f"redis holds {stored} entries, {expected} were sent"
    record(benchmark, case, n, connections=conns, redis=server.version(), **extra)


# -- 1b. send latency at half the peak rate --------------------------------------------------------
@pytest.mark.parametrize("client", ["mqstore-JSON", "cpp"])
def test_send_latency(benchmark: Any, request: pytest.FixtureRequest, brokers: Any, client: str) -> None:
    """One producer, one connection: the peak (N_LAT_PEAK sends flat out), then rounds of N_LAT
    sends paced at half that rate (time.sleep until each send's due time), each send timed from
    its call to its result. Also kept: the time from the send's due time to its result (the
    schedule-corrected latency, which counts the wait behind a slow predecessor)."""
    benchmark.group = "broker 1b: send latency at half the peak rate, 1 connection (round = N_LAT paced sends)"
    broker = brokers()
    lat: list[float] = []
    sched: list[float] = []
    if client == "cpp":
        worker = request.getfixturevalue("cpp_worker")()
        worker.call("start", namesrv=broker.namesrv, producers=1, topic=TOPIC, body=BODY_STR)
        peak_r = worker.call("send", threads=1, n=N_LAT_PEAK, batch=0)
        assert not peak_r["errors"], peak_r
        peak = peak_r["sent"] / peak_r["elapsed"]
        rate = peak / 2

        def target() -> None:
            r = worker.call("paced", n=N_LAT, rate=rate)
            lat.extend(r["lat"])
            sched.extend(r["from_schedule"])

        try:
            benchmark.pedantic(target, rounds=ROUNDS_LAT, warmup_rounds=0, iterations=1)
        finally:
            pass
    else:
        clients = AsyncClients(broker.namesrv, 1, "JSON")
        producer = clients.producers[0]
        try:
            t0 = time.perf_counter()
            clients.run(clients.single(N_LAT_PEAK))
            peak = N_LAT_PEAK / (time.perf_counter() - t0)
            rate = peak / 2

            async def paced() -> None:
                clock, interval, send = time.perf_counter, 1.0 / rate, producer.send
                start = clock()
                for i in range(N_LAT):
                    due = start + i * interval
                    now = clock()
                    if now < due:
                        time.sleep(due - now)  # blocks the loop on purpose: nothing else is due on it
                    s = clock()
                    await send(TOPIC, BODY)
                    e = clock()
                    lat.append(e - s)
                    sched.append(e - max(due, start))

            def target() -> None:
                clients.run(paced())

            benchmark.pedantic(target, rounds=ROUNDS_LAT, warmup_rounds=0, iterations=1)
        finally:
            clients.close()
    ms = percentiles([x * 1e3 for x in lat])
    record(benchmark, f"latency/{client}/single/1c", N_LAT, peak_msgs_per_s=round(peak), rate=round(rate),
           lat_ms={k: round(v, 3) for k, v in ms.items()},
           from_schedule_ms={k: round(v * 1e3, 3) for k, v in percentiles(sched).items()}, samples=len(lat))
    benchmark.extra_info.pop("msgs_per_s", None)  # a round is paced: its rate is the pace, not a result
    benchmark.extra_info.pop("msgs_per_s_mean", None)


# -- 2. consume -----------------------------------------------------------------------------------
CONSUME_TOPIC = "ConsumeTopic"


def prefill(broker: BrokerProc, n: int) -> AsyncClients:
    """n messages in CONSUME_TOPIC (batches of 100 over its queues, untimed), dispatched."""
    clients = AsyncClients(broker.namesrv, 1, "JSON")
    p = clients.producers[0]

    async def fill() -> int:
        await send_until_routed(p, CONSUME_TOPIC)
        queues = await p.queues(CONSUME_TOPIC)
        per_q = n // BATCH // len(queues)
        items = [BODY] * BATCH

        async def one(q: Any) -> None:
            for _ in range(per_q):
                await p.send_batch(CONSUME_TOPIC, items, queue_id=q.queue_id)

        await asyncio.gather(*(one(q) for q in queues))
        return 1 + per_q * BATCH * len(queues)

    total = clients.run(fill())
    got = wait_stored(clients, total, CONSUME_TOPIC)
    assert got == total, f"{got} of {total} messages dispatched"
    return clients


@pytest.mark.parametrize("client", ["mqstore-pull", "cpp-push"])
def test_consume(benchmark: Any, request: pytest.FixtureRequest, brokers: Any, client: str) -> None:
    """Every message of a pre-filled topic (4 queues) once per round. mqstore-pull: a
    PullConsumer pulls each queue back to back (32 per pull, the queues at once) from offset 0
    and decodes every message (MessageExt). cpp-push: a C++ PushConsumer of a new group per
    round (it starts at offset 0, RocketMQ's first-consume rule), the Python callback reading
    each body; the round runs from start() to the last message (route, rebalance and the
    first pulls included); the consumer is shut down before the next round, untimed. No
    warm-up round for it: each round is a new consumer anyway."""
    benchmark.group = f"broker 2: consume a pre-filled topic of {N_CONSUME:,} x 100 B (msg/s = msgs / median round)"
    broker = brokers()
    clients = prefill(broker, N_CONSUME)
    total = clients.run(clients.stored(CONSUME_TOPIC))
    try:
        if client == "mqstore-pull":
            from mqstore.client import PullConsumer

            consumer = PullConsumer("CG_BENCH_PULL", broker.namesrv)
            clients.run(consumer.start())
            queues = queues_of(clients, consumer, CONSUME_TOPIC)
            counts: list[int] = []

            async def read_all() -> int:
                async def one(mq: Any) -> int:
                    offset, got = 0, 0
                    for _ in range(N_CONSUME):  # bounded: at least one message per pull until the end
                        r = await consumer.pull(mq, offset, 32)
                        if not r.messages:
                            break
                        for m in r.messages:
                            _ = m.body
                        got += len(r.messages)
                        offset = r.next_begin_offset
                    return got

                return sum(await asyncio.gather(*(one(mq) for mq in queues)))

            def target() -> None:
                counts.append(clients.run(read_all()))

            try:
                cpu = CpuWindow(broker)
                target()
                cpu.start()
                benchmark.pedantic(target, rounds=ROUNDS_CONSUME, warmup_rounds=0, iterations=1)
                extra = cpu.stop(total * ROUNDS_CONSUME)
            finally:
                clients.run(consumer.close())
            assert set(counts) == {total}, f"rounds read {counts}, the topic holds {total}"
            record(benchmark, f"consume/{client}/{len(queues)}q", total, queues=len(queues), **extra)
        else:
            worker = request.getfixturevalue("cpp_worker")()
            answers: list[dict[str, Any]] = []
            stops: list[dict[str, Any]] = []

            def stop_consumer() -> None:  # the previous round's consumer, untimed
                if len(stops) < len(answers):
                    stops.append(worker.call("push_stop", timeout_s=60))

            def target() -> None:
                answers.append(worker.call("push", timeout_s=180, namesrv=broker.namesrv, topic=CONSUME_TOPIC,
                                           group=f"CID_BENCH_{len(answers)}", n=total))

            cpu = CpuWindow(broker, client_pid=worker.proc.pid)
            cpu.start()
            benchmark.pedantic(target, setup=stop_consumer, rounds=ROUNDS_CONSUME, warmup_rounds=0, iterations=1)
            extra = cpu.stop(total * len(answers))
            stop_consumer()
            assert len(stops) == len(answers)
            short = [a for a in answers if a["count"] < total]
            assert not short, f"a push consumer got {short[0]['count']} of {total}: {short[0]}\n{worker.log_tail()}"
            timed = answers
            record(benchmark, f"consume/{client}/4q", total, **extra,
                   start_to_last_s=[round(a["start_to_last"], 3) for a in timed],
                   start_to_first_s=[round(a["start_to_first"], 3) for a in timed],
                   first_to_last_msgs_per_s=round(statistics.median(total / a["first_to_last"] for a in timed)),
                   shutdown_s=[round(a["shutdown_s"], 2) for a in stops])
    finally:
        clients.close()


def test_long_poll_wakeup(benchmark: Any, brokers: Any) -> None:
    """A pull with suspend_ms=5000 at the end of queue 0 is held by the broker; 4 ms later
    another producer (its own connection) sends one message to that queue. Sample = from the
    send's call to the held pull's answer (the pull's future done), so the send's own trip to
    the broker is included. N_WAKEUPS samples; the round of the table is one sample plus the
    event loop's turn-around."""
    benchmark.group = "broker 2b: long-polling pull wake-up (round = one sample)"
    from mqstore.client import PullConsumer

    broker = brokers()
    clients = AsyncClients(broker.namesrv, 1, "JSON")
    producer = clients.producers[0]
    consumer = PullConsumer("CG_BENCH_WAKE", broker.namesrv)
    clients.run(consumer.start())
    mq = next(q for q in queues_of(clients, consumer, TOPIC) if q.queue_id == 0)
    state: dict[str, Any] = {"offset": clients.run(consumer.max_offset(mq))}
    from_send: list[float] = []
    from_ack: list[float] = []
    early: list[int] = []

    def setup() -> None:
        async def hold() -> Any:
            task = asyncio.ensure_future(consumer.pull(mq, state["offset"], 32, suspend_ms=5000))
            task.add_done_callback(lambda _t: state.__setitem__("done_at", time.perf_counter()))
            await asyncio.sleep(0.004)
            return task

        state["task"] = clients.run(hold())

    def target() -> None:
        async def sample() -> None:
            task = state["task"]
            if task.done():  # answered before any message: not held (counted, not a sample)
                early.append(1)
                state["offset"] = task.result().next_begin_offset
                return
            t0 = time.perf_counter()
            await producer.send(TOPIC, BODY, queue_id=0)
            t_ack = time.perf_counter()
            result = await asyncio.wait_for(task, 10)
            assert result.messages, result
            from_send.append(state["done_at"] - t0)
            from_ack.append(state["done_at"] - t_ack)
            state["offset"] = result.next_begin_offset

        clients.run(sample())

    try:
        benchmark.pedantic(target, setup=setup, rounds=N_WAKEUPS, warmup_rounds=0, iterations=1)
    finally:
        clients.run(consumer.close())
        clients.close()
    assert not early, f"{len(early)} pulls were answered before their message was sent"
    ms = percentiles([x * 1e3 for x in from_send])
    record(benchmark, "wakeup/mqstore-pull/1c", 1, samples=len(from_send),
           lat_ms={k: round(v, 3) for k, v in ms.items()},
           from_ack_ms={k: round(v * 1e3, 3) for k, v in percentiles(from_ack).items()})
    benchmark.extra_info.pop("msgs_per_s", None)
    benchmark.extra_info.pop("msgs_per_s_mean", None)


def test_long_poll_put_while_holding(benchmark: Any, brokers: Any) -> None:
    """The same wake-up when the put races the hold: one message is sent to queue 0 (the send
    acknowledged), then, after a random 0-1.5 ms (the dispatcher's 1 ms poll and its publish
    fall anywhere around the pull's arrival), a pull with suspend_ms=5000 asks for it. Sample =
    from the send's call to the pull's answer. A pull that reads the queue just before the
    message is dispatched is held; it should be answered at the dispatcher's publish like any
    held pull. `late` counts answers after 100 ms or more."""
    benchmark.group = "broker 2b: long-polling pull wake-up (round = one sample)"
    import random

    from mqstore.client import PullConsumer

    broker = brokers(front_processes=1)  # the pull and the send meet in one front
    clients = AsyncClients(broker.namesrv, 1, "JSON")
    producer = clients.producers[0]
    consumer = PullConsumer("CG_BENCH_RACE", broker.namesrv)
    clients.run(consumer.start())
    mq = next(q for q in queues_of(clients, consumer, TOPIC) if q.queue_id == 0)
    state: dict[str, Any] = {"offset": clients.run(consumer.max_offset(mq))}
    lat: list[float] = []
    rng = random.Random(7)

    def target() -> None:
        async def sample() -> None:
            gap = rng.uniform(0, 0.0015)
            t0 = time.perf_counter()
            await producer.send(TOPIC, BODY, queue_id=0)
            t_ack = time.perf_counter()
            while time.perf_counter() - t_ack < gap:  # a gap below the event loop's timer resolution
                pass
            result = await consumer.pull(mq, state["offset"], 32, suspend_ms=5000)
            lat.append(time.perf_counter() - t0)
            assert result.messages, result
            state["offset"] = result.next_begin_offset

        clients.run(sample())

    def pause() -> None:
        clients.run(asyncio.sleep(0.003))

    try:
        benchmark.pedantic(target, setup=pause, rounds=N_RACES, warmup_rounds=0, iterations=1)
    finally:
        clients.run(consumer.close())
        clients.close()
    ms = percentiles([x * 1e3 for x in lat])
    record(benchmark, "wakeup/put-while-holding/1c", 1, samples=len(lat),
           lat_ms={k: round(v, 3) for k, v in ms.items()}, late=sum(x >= 0.1 for x in lat))
    benchmark.extra_info.pop("msgs_per_s", None)
    benchmark.extra_info.pop("msgs_per_s_mean", None)


# -- 3. the header codec --------------------------------------------------------------------------
def _send_commands(serialize: int) -> dict[str, Any]:
    """A SEND_MESSAGE_V2 request as mqstore.client builds it (one-letter names, 100 B body) and
    the front's SUCCESS response to it."""
    from mqstore.remoting._remoting import RemotingCommand
    from mqstore.client.producer import V2_NAMES

    fields = {"producerGroup": "PG_BENCH", "topic": TOPIC, "defaultTopic": "TBW102", "defaultTopicQueueNums": "4",
              "queueId": "3", "sysFlag": "0", "bornTimestamp": str(int(time.time() * 1000)), "flag": "0",
              "properties": "UNIQ_KEY\x017F00000100003A9C1B2C0000000000012345\x02WAIT\x01true\x02",
              "reconsumeTimes": "0", "unitMode": "false", "batch": "false"}
    request = RemotingCommand(310, language="PYTHON", version=407, opaque=123456,
                              ext_fields={V2_NAMES[k]: v for k, v in fields.items()}, body=BODY,
                              serialize_type=serialize)
    response = RemotingCommand(0, language="JAVA", version=407, opaque=123456, flag=1, ext_fields={
        "msgId": "7F00000100002A9F00000000001E8480", "queueId": "3", "queueOffset": "123456",
        "MSG_REGION": "DefaultRegion", "TRACE_ON": "true"}, serialize_type=serialize)
    return {"request": request, "response": response}


CODEC_CASES = [(s, k, op) for s in ("JSON", "ROCKETMQ") for k in ("request", "response") for op in ("encode", "decode")]


@pytest.mark.parametrize("serialize,kind,op", CODEC_CASES, ids=["-".join(c) for c in CODEC_CASES])
def test_codec(benchmark: Any, serialize: str, kind: str, op: str) -> None:
    """mqstore.remoting._remoting: CODEC_OPS x RemotingCommand.encode() / decode_frame(frame) of a send's
    request (with its 100 B body) or response, per round."""
    benchmark.group = f"broker 3: header codec, {CODEC_OPS:,} ops per round"
    from mqstore.remoting._remoting import JSON, ROCKETMQ, decode_frame

    cmd = _send_commands(JSON if serialize == "JSON" else ROCKETMQ)[kind]
    frame = cmd.encode()
    decoded = decode_frame(frame)
    assert decoded.ext_fields == cmd.ext_fields and decoded.body == cmd.body

    if op == "encode":
        encode = cmd.encode

        def target() -> None:
            for _ in range(CODEC_OPS):
                encode()
    else:
        def target() -> None:
            for _ in range(CODEC_OPS):
                decode_frame(frame)

    benchmark.pedantic(target, rounds=ROUNDS_CODEC, warmup_rounds=1, iterations=1)
    info = benchmark.extra_info
    info.update(broker_case=f"codec/{serialize}/{kind}/{op}", frame_bytes=len(frame))
    if not benchmark.disabled:
        info["ns_per_op"] = round(benchmark.stats.stats.median / CODEC_OPS * 1e9, 1)


# -- 4. front processes ---------------------------------------------------------------------------
@pytest.mark.parametrize("fronts", [1, 2])
def test_front_processes(benchmark: Any, brokers: Any, fronts: int) -> None:
    """mqstore.client, JSON headers, 16 connections, one message per send, against a broker with
    front_processes=1 and =2 (SO_REUSEPORT spreads the connections; the split is in front_cpu_s)."""
    benchmark.group = "broker 4: front_processes 1 vs 2, 16 connections, one message per send"
    run_mqstore(benchmark, brokers(front_processes=fronts), "mqstore-JSON", "single", 16, N_SINGLE,
                case=f"fronts-{fronts}/single/16c")
