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
per round / median round; the closing summary gives each guarded case against the plain one.
"""

from __future__ import annotations

import base64
import os
import ssl
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from bench._broker import BrokerProc, send_until_routed_sync, stop_started

BODY = base64.b64encode(os.urandom(75))
TOPIC = "BenchGuarded"
CONNS = 4
ROUNDS = 5
N_SINGLE = 3_200
N_BATCH = 32_000
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


@pytest.mark.parametrize("mode", ["single", "batch100"])
@pytest.mark.parametrize("case", CASES)
def test_sends_with_guards(benchmark: Any, work_dir: Any, case: str, mode: str) -> None:
    from mqstore.client import SyncProducer

    work = os.path.join(str(work_dir), f"{case}-{mode}".replace("+", "_"))
    os.makedirs(work)
    broker_settings, client = _settings(case, work)
    broker = BrokerProc(work, **broker_settings)
    producers = []
    try:
        try:
            producers = [SyncProducer("PG_BENCH", broker.namesrv, **client).start() for _ in range(CONNS)]
        except TypeError as exc:  # a client without TLS
            pytest.skip(f"mqstore.client cannot do this case: {exc}")
        for p in producers:  # the topic exists and every producer has its route and connection
            send_until_routed_sync(p, TOPIC, BODY)
        n = N_SINGLE if mode == "single" else N_BATCH
        per = n // CONNS
        items = [BODY] * BATCH

        def single(p: Any) -> None:
            for _ in range(per):
                p.send(TOPIC, BODY)

        def batches(p: Any) -> None:
            for _ in range(per // BATCH):
                p.send_batch(TOPIC, items)

        work_fn = single if mode == "single" else batches

        def target() -> None:
            _run(producers, work_fn)

        target()  # warm-up
        benchmark.pedantic(target, rounds=ROUNDS, warmup_rounds=0, iterations=1)
        benchmark.extra_info.update(case=case, mode=mode, conns=CONNS, per_round=n)
        stats = getattr(benchmark, "stats", None)
        if stats is not None and not benchmark.disabled:
            rate = n / stats.stats.median
            benchmark.extra_info["msgs_per_s"] = round(rate)
            RESULTS[(case, mode)] = rate
    finally:
        for p in producers:
            p.close()
        broker.stop()
