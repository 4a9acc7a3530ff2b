"""What the broker's guards cost (bench/README.md, "ACL and TLS"): sends per second with the ACL
off and on, and over plain TCP and TLS, in the same run.

    python -m pytest bench/test_security.py --benchmark-columns=median,rounds -q

Each case starts its own broker (``python -m mqstore broker DIR``, bench/_broker.py ``BrokerProc``:
default settings except loopback and free ports; with ``acl_enable`` and a plain_acl.yml whose
account may publish to the topic; with ``tls_server_mode=enforcing`` and certificates made for
the run) and sends as a user does: ``mqstore.client.SyncProducer`` in K threads (one connection
each), each send built from its body (``send``), one message per request and batches of 100
(``send_batch``); with the ACL every request is signed with the account's keys (``credentials``),
with TLS every connection checks the broker's certificate against the run's CA. msg/s = messages
per round / median round; the closing summary gives each guarded case against the plain one, and
against plain rounds run beside its own (each guarded round right after one on a plain broker:
the median of the pairs' ratios, the figure the 2 shared cores' drift between cases cannot move).
"""

from __future__ import annotations

import base64
import os
import ssl
import sys
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from bench._broker import BrokerProc, self_cpu_s, send_until_routed_sync, stop_started

BODY = base64.b64encode(os.urandom(75))
TOPIC = "BenchGuarded"
CONNS = 4
ROUNDS = 9
N_SINGLE = 8_000
N_BATCH = 80_000
BATCH = 100
ACCOUNT = ("benchmark", "bench-secret-key")
ACL = f"""\
accounts:
  - accessKey: {ACCOUNT[0]}
    secretKey: {ACCOUNT[1]}
    admin: false
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms:
      - {TOPIC}=PUB|SUB
"""
CASES = ("plain", "acl", "tls", "acl+tls")
TESTS = str(Path(__file__).resolve().parents[1] / "tests")
RESULTS: dict[tuple[str, str], float] = {}
#: (case, mode) -> (median of the paired rounds' plain/guarded time ratios, the paired plain msg/s)
PAIRED: dict[tuple[str, str], tuple[float, float]] = {}
#: (case, mode) -> (broker CPU us per message, client CPU us per message) over the timed rounds
CPU: dict[tuple[str, str], tuple[float, float]] = {}


@pytest.fixture(scope="module", autouse=True)
def _stop_all() -> Any:
    yield
    stop_started()
    lines = []
    for mode in ("single", "batch100"):
        base = RESULTS.get(("plain", mode))
        for case in CASES[1:]:
            got = RESULTS.get((case, mode))
            if base and got:
                lines.append(f"{mode:8} {case:8} {got:10,.0f} msg/s = {got / base:.3f}x plain ({base:,.0f})")
            paired = PAIRED.get((case, mode))
            if paired:
                lines.append(f"{mode:8} {case:8} paired with plain rounds beside it: {paired[0]:.3f}x "
                             f"(plain beside it {paired[1]:,.0f} msg/s)")
    for (case, mode), (broker_us, client_us) in sorted(CPU.items(), key=lambda kv: (kv[0][1], CASES.index(kv[0][0]))):
        base = CPU.get(("plain", mode))
        extra = (f" = plain +{broker_us - base[0]:.2f} / +{client_us - base[1]:.2f}"
                 if base and case != "plain" else "")
        lines.append(f"{mode:8} {case:8} CPU per message: broker {broker_us:.2f} us, client {client_us:.2f} us{extra}")
    if lines:
        print("\n[ACL and TLS against plain, same run]\n" + "\n".join(lines))


def _pki(work: str) -> Any:
    """A CA and the broker's certificate for the run (tests/helpers_tls.py; the test extra's
    ``cryptography``)."""
    pytest.importorskip("cryptography")
    if TESTS not in sys.path:
        sys.path.insert(0, TESTS)
    from helpers_tls import make_pki

    return make_pki(Path(work) / "pki")


def _settings(case: str, work: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(broker settings, SyncProducer keywords) of a case."""
    broker: dict[str, Any] = {}
    client: dict[str, Any] = {}
    if "acl" in case:
        path = os.path.join(work, "plain_acl.yml")
        with open(path, "w") as fh:
            fh.write(ACL)
        broker.update(acl_enable="true", acl_file=path)
        client["credentials"] = ACCOUNT
    if "tls" in case:
        pki = _pki(work)
        broker.update(tls_server_mode="enforcing", tls_server_cert_path=pki.server_cert,
                      tls_server_key_path=pki.server_key)
        ctx = ssl.create_default_context(cafile=pki.ca)
        client["tls"] = ctx
        client["namesrv_tls"] = ctx
    return broker, client


def _run(producers: list[Any], work: Any) -> None:
    errors: list[BaseException] = []

    def one(p: Any) -> None:
        try:
            work(p)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(p,)) for p in producers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    if errors:
        raise errors[0]


def _start(work_dir: Any, case: str, mode: str, name: str) -> tuple[Any, list[Any]]:
    """A broker of the case and CONNS producers routed to it and connected."""
    from mqstore.client import SyncProducer

    work = os.path.join(str(work_dir), f"{name}-{mode}".replace("+", "_"))
    os.makedirs(work)
    broker_settings, client = _settings(case, work)
    broker = BrokerProc(work, **broker_settings)
    producers: list[Any] = []
    try:
        producers = [SyncProducer("PG_BENCH", broker.namesrv, **client).start() for _ in range(CONNS)]
        for p in producers:  # the topic exists and every producer has its route and connection
            send_until_routed_sync(p, TOPIC, BODY)
    except BaseException:
        for p in producers:
            p.close()
        broker.stop()
        raise
    return broker, producers


def _round(producers: list[Any], mode: str) -> None:
    """One round: N_SINGLE sends, or N_BATCH messages in batches of BATCH, over the producers."""
    n = N_SINGLE if mode == "single" else N_BATCH
    per = n // CONNS
    items = [BODY] * BATCH

    def single(p: Any) -> None:
        for _ in range(per):
            p.send(TOPIC, BODY)

    def batches(p: Any) -> None:
        for _ in range(per // BATCH):
            p.send_batch(TOPIC, items)

    _run(producers, single if mode == "single" else batches)


@pytest.mark.parametrize("mode", ["single", "batch100"])
@pytest.mark.parametrize("case", CASES)
def test_sends_with_guards(benchmark: Any, work_dir: Any, case: str, mode: str) -> None:
    """The case's rounds; a guarded case's rounds each follow a round on a plain broker of its
    own (pedantic's setup, not timed by it), so each guarded round has a plain one beside it:
    the ratio reported is the median of those pairs' ratios, which the 2 shared cores' drift
    between cases (the plain batch case alone moved 243 k -> 307 k msg/s between runs) does not
    reach."""
    n = N_SINGLE if mode == "single" else N_BATCH
    started: list[tuple[Any, list[Any]]] = []
    try:
        started.append(_start(work_dir, case, mode, case))
        producers = started[0][1]
        plain_times: list[float] = []
        guarded_times: list[float] = []
        setup = None
        if case != "plain":
            started.append(_start(work_dir, "plain", mode, f"plain-beside-{case}"))
            plain = started[1][1]

            def setup() -> None:
                t0 = time.perf_counter()
                _round(plain, mode)
                plain_times.append(time.perf_counter() - t0)

        broker = started[0][0]
        cpu = [0.0, 0.0]  # the timed rounds' broker and client CPU seconds

        def target() -> None:
            b0, c0, t0 = broker.all_cpu(), self_cpu_s(), time.perf_counter()
            _round(producers, mode)
            guarded_times.append(time.perf_counter() - t0)
            cpu[0] += broker.all_cpu() - b0
            cpu[1] += self_cpu_s() - c0

        if setup is not None:
            setup()  # warm-up
        target()
        plain_times.clear()
        guarded_times.clear()
        cpu[:] = [0.0, 0.0]
        benchmark.pedantic(target, setup=setup, rounds=ROUNDS, warmup_rounds=0, iterations=1)
        benchmark.extra_info.update(case=case, mode=mode, conns=CONNS, per_round=n)
        stats = getattr(benchmark, "stats", None)
        if stats is not None and not benchmark.disabled:
            rate = n / stats.stats.median
            benchmark.extra_info["msgs_per_s"] = round(rate)
            RESULTS[(case, mode)] = rate
            per_msg = [round(c / (n * ROUNDS) * 1e6, 2) for c in cpu]
            benchmark.extra_info.update(broker_cpu_us_per_msg=per_msg[0], client_cpu_us_per_msg=per_msg[1])
            CPU[(case, mode)] = (per_msg[0], per_msg[1])
            if plain_times:
                ratio = statistics.median(p / g for p, g in zip(plain_times, guarded_times))
                plain_rate = n / statistics.median(plain_times)
                benchmark.extra_info.update(paired_ratio=round(ratio, 3), paired_plain_msgs_per_s=round(plain_rate))
                PAIRED[(case, mode)] = (ratio, plain_rate)
    finally:
        for _, ps in started:
            for p in ps:
                p.close()
        for broker, _ in started:
            broker.stop()
