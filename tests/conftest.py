"""Shared fixtures: stores on real files under tmp_path, checked after every test."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

from mqstore import MessageStore
from mqstore.tools.checker import check_store

settings.register_profile("ci", max_examples=60, deadline=None,
                          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
settings.register_profile("dev", max_examples=30, deadline=None,
                          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
settings.load_profile("ci" if os.environ.get("CI") else "dev")

#: every Spark session of the run, this process's and the examples' and jobs' it starts: the
#: driver JVM on C1 alone (mqstore.spark.session's default leaves C2 on, which the many small
#: queries of a test would pay for in compiling, ~1-2 min of a CI run)
os.environ.setdefault("MQSTORE_SPARK_DRIVER_JAVA_OPTIONS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")

SMALL = {"mapped_file_size_commit_log": 64 * 1024, "max_message_size": 16 * 1024}


@pytest.fixture
def store_dir(tmp_path):
    return str(tmp_path / "store")


@pytest.fixture
def open_store(store_dir):
    """Factory: open_store(**config) -> MessageStore on store_dir (small files by default).
    Every store it opened is shut down and the directory checked at the end of the test."""
    opened: list[MessageStore] = []

    def factory(path: str | None = None, **overrides):
        cfg = {**SMALL, **overrides}
        store = MessageStore(path or store_dir, **cfg)
        opened.append(store)
        return store

    yield factory
    for store in opened:
        store.shutdown()
    for root, config in {s.root: s.config for s in opened}.items():
        check_store(root, config=config).raise_if_failed()


@pytest.fixture(scope="session")
def spark():
    """One local Spark session for the whole run (the JVM takes ~8 s to start): local[2], no
    UI, the mqstore data source registered (mqstore.spark.session)."""
    from mqstore.spark import session

    spark = session("local[2]")  # C1 only (MQSTORE_SPARK_DRIVER_JAVA_OPTIONS above)
    spark.sparkContext.setLogLevel("FATAL")
    yield spark
    spark.stop()


#: the files that take longest (minutes each on 2 cores): run first, so that with pytest-xdist's
#: --dist loadfile the short files fill the end of the run instead of one long file running
#: alone on one worker while the other idles (it did: ~7 minutes of a CI run). xdist itself would
#: run the files with most tests first, which puts these one-or-two-test files last:
#: --no-loadscope-reorder (pyproject addopts) keeps this order.
#: (from a CI run's --durations; a file's place here is what its tests take together)
LONGEST_FILES = ("test_spark_remote_cluster.py", "test_examples.py", "test_spark_limits.py", "test_hostile_files.py",
                 "test_node.py", "test_spark.py", "test_spark_options.py", "test_ha_kill.py", "test_broker_cpp.py",
                 "test_broker_cluster.py", "test_spark_remote.py", "test_attacks.py", "test_spark_write_retry.py")
_HEAVY = ("spark", "slow", "multiprocess")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that uses the Spark session is marked ``spark`` (the fast subset leaves it out).
    Files then run longest first: LONGEST_FILES, then by how many spark/slow/multiprocess tests
    they hold, each file's tests in their own order (the same order on every xdist worker)."""
    heavy: dict[str, int] = {}
    for item in items:
        if "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.spark)
        name = item.path.name
        heavy[name] = heavy.get(name, 0) + any(item.get_closest_marker(m) for m in _HEAVY)

    def rank(pair: tuple[int, pytest.Item]) -> tuple[int, int, int]:
        at, item = pair
        name = item.path.name
        first = LONGEST_FILES.index(name) if name in LONGEST_FILES else len(LONGEST_FILES)
        return first, -heavy[name], at

    items[:] = [item for _, item in sorted(enumerate(items), key=rank)]
