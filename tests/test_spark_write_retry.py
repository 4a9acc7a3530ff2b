"""Issue 26: Spark retries a batch-write task whose Python worker was SIGKILLed while putting,
and every row is stored exactly once (before, each retry put its rows again).

The shared session of tests/conftest.py is ``local[2]``, where Spark never retries a task, so
this test runs a driver of its own with ``local[2,4]`` (4 attempts per task) in a subprocess.
Its writer is the real one with one hook: attempt 0 of partition 1 writes its pid to a file once
it has put 2,048 of its rows and waits; the test kills that worker with SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from mqstore import MessageStore
from mqstore.spark.rows import TASK_PROPERTY

pytestmark = pytest.mark.spark

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

DRIVER = r"""
import os, sys, time
from mqstore import MessageStore
from mqstore.spark import session
from mqstore.spark.datasource import MQStoreDataSource
from mqstore.spark.write import MQStoreBatchWriter

root, signal_file, rows = sys.argv[1], sys.argv[2], int(sys.argv[3])


class KilledOnceWriter(MQStoreBatchWriter):
    def on_put(self, partition, attempt, put):
        if partition == 1 and attempt == 0 and put >= 2048:
            with open(signal_file + ".tmp", "w") as f:
                f.write(str(os.getpid()))
            os.rename(signal_file + ".tmp", signal_file)
            time.sleep(300)  # the test kills this worker
            raise RuntimeError("the test did not kill this task's worker within 300 s")


class KilledOnce(MQStoreDataSource):
    @classmethod
    def name(cls):
        return "mqstore_killed_once"

    def writer(self, schema, overwrite):
        return KilledOnceWriter(dict(self.options), schema, overwrite)


spark = session("local[2,4]", **{"spark.sql.shuffle.partitions": "2"})
spark.sparkContext.setLogLevel("FATAL")
spark.dataSource.register(KilledOnce)
with MessageStore(root, mapped_file_size_commit_log=1 << 20):
    df = spark.range(0, 2 * rows, numPartitions=2).selectExpr("'Retry' as topic", "cast(id as string) as body",
                                                              "concat('k', id) as keys")
    df.write.format("mqstore_killed_once").mode("append").save(root)
spark.stop()
print("written")
"""


def test_spark_retries_a_task_killed_while_putting_and_every_row_is_stored_once(tmp_path):
    root, signal_file, rows = str(tmp_path / "store"), str(tmp_path / "killme"), 5000
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {**os.environ, "TMPDIR": str(scratch), "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    with open(tmp_path / "driver.out", "w") as out, open(tmp_path / "driver.err", "w") as err:
        driver = subprocess.Popen([sys.executable, "-c", DRIVER, root, signal_file, str(rows)], stdout=out,
                                  stderr=err, env=env)
    try:
        deadline = time.monotonic() + 300
        while not os.path.exists(signal_file):
            assert driver.poll() is None, (tmp_path / "driver.err").read_text()[-3000:]
            assert time.monotonic() < deadline, "the task never reached its 2,048th put"
            time.sleep(0.05)
        worker = int(open(signal_file).read())
        assert "python" in open(f"/proc/{worker}/cmdline", "rb").read().decode(errors="replace")
        os.kill(worker, signal.SIGKILL)
        assert driver.wait(timeout=300) == 0, (tmp_path / "driver.err").read_text()[-3000:]
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    assert (tmp_path / "driver.out").read_text().strip().endswith("written")
    # the retry counted what the killed attempt had put and put only the rest (the worker's log)
    assert ":1 was interrupted after" in (tmp_path / "driver.err").read_text()
    with MessageStore(root, mapped_file_size_commit_log=1 << 20) as store:
        store.wait_dispatched()
        bodies, tasks = [], {}
        for q in range(4):
            offset = 0
            while (got := store.read_messages("Retry", q, offset)).status.name == "FOUND":
                for m in got:
                    rec = m.decode()
                    bodies.append(rec.body)
                    task = rec.properties[TASK_PROPERTY].rsplit(":", 1)[1]
                    tasks[task] = tasks.get(task, 0) + 1
                offset = got.next_begin_offset
    assert len(bodies) == len(set(bodies)) == 2 * rows
    assert set(bodies) == {b"%d" % i for i in range(2 * rows)}
    assert tasks == {"0": rows, "1": rows}
    assert os.listdir(os.path.join(root, "config", "spark_writes")) == []
