"""A local SparkSession set up for mqstore, and the registration of the data source."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from typing import Any

from pyspark.sql import SparkSession


def register(spark: SparkSession) -> None:
    """Register the "mqstore" data source in spark (every session of its JVM sees it)."""
    from mqstore.spark.datasource import MQStoreDataSource

    spark.dataSource.register(MQStoreDataSource)


def session(master: str = "local[2]", app_name: str = "mqstore", **conf: Any) -> SparkSession:
    """A SparkSession for local pipelines over mqstore stores, with the data source registered.

    Sets, unless already set: ``PYSPARK_PYTHON`` to this interpreter (Python workers must
    import mqstore and pyarrow; PySpark otherwise runs ``python3`` from PATH),
    ``SPARK_LOCAL_IP=127.0.0.1``, no UI and no console progress bars, shuffle partitions =
    the cores of master, and warehouse and scratch directories in a temporary directory
    (``mqstore-spark-*`` under $TMPDIR), removed when this Python process exits (or at once
    when a session was running already and is returned as it is).
    ``conf`` adds or overrides Spark settings (dots as in Spark: pass a dict with **)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    scratch = tempfile.mkdtemp(prefix="mqstore-spark-")
    cores = master[master.find("[") + 1:master.find("]")] if "[" in master else "1"
    settings: dict[str, Any] = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": str(os.cpu_count() or 2) if cores == "*" else cores,
        "spark.sql.warehouse.dir": os.path.join(scratch, "warehouse"),
        "spark.local.dir": os.path.join(scratch, "local"),
        "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
    }
    settings.update(conf)
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    running = SparkSession.getActiveSession()
    spark = builder.getOrCreate()
    if running is not None and spark is running:
        shutil.rmtree(scratch, ignore_errors=True)  # the running session keeps its own directories
    else:
        atexit.register(shutil.rmtree, scratch, ignore_errors=True)
    register(spark)
    return spark
