"""A local SparkSession set up for mqstore, and the registration of the data source."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from typing import Any

from pyspark.sql import SparkSession


#: the driver JVM's options: the serial collector (the least GC work on a few cores) and the
#: JVM's own JIT (tiered, C2 for hot code). The JVM turns every row a Python source yields into
#: a Spark row, and C2's code does that at about half the CPU of C1's once warm (3M rows
#: counted: ~1.1 against ~2.3 CPU-s); C1 alone (-XX:TieredStopAtLevel=1) spends less compiling
#: and suits short sessions, such as a test suite's
DRIVER_JAVA_OPTIONS = "-XX:+UseSerialGC"
#: the environment variable that replaces DRIVER_JAVA_OPTIONS for every session() of a process
#: and of its children (a conf argument still wins)
DRIVER_JAVA_OPTIONS_ENV = "MQSTORE_SPARK_DRIVER_JAVA_OPTIONS"
#: the JVM logger that warns when a source replaces one PySpark found by itself (pyspark_mqstore)
_MANAGER_LOGGER = "org.apache.spark.sql.execution.datasources.DataSourceManager"


def register(spark: SparkSession) -> None:
    """Register the "mqstore" data source in spark (every session of its JVM sees it), with
    filter pushdown: sets spark.sql.python.filterPushdown.enabled in this session (PySpark
    fails every read of a source with pushFilters without it). Replacing the source PySpark
    registered by itself (``pyspark_mqstore``) is expected here, so its warning is not logged
    (Spark's DataSourceManager logger is set to ERROR)."""
    from mqstore.spark.datasource import MQStorePushdownDataSource

    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    try:  # the replacement is the point here: its warning is not for the user (log4j 2, Spark's own)
        jvm = spark.sparkContext._jvm
        assert jvm is not None  # a running session's gateway
        log4j = jvm.org.apache.logging.log4j
        log4j.core.config.Configurator.setLevel(_MANAGER_LOGGER, log4j.Level.ERROR)
    except Exception:  # pragma: no cover - another logging backend: the warning stays
        pass
    spark.dataSource.register(MQStorePushdownDataSource)


def cores_of(master: str) -> int:
    """The cores a master string gives Spark's tasks: local[N], local[N,F] (F retries),
    local[*], local-cluster[E,C,M] (E executors of C cores), else this machine's."""
    import re

    every = os.cpu_count() or 2
    m = re.fullmatch(r"local(?:\[(\*|\d+)(?:,\s*\d+)?\])?", master.strip())
    if m:
        return every if m.group(1) == "*" else int(m.group(1) or 1)
    m = re.fullmatch(r"local-cluster\[\s*(\d+)\s*,\s*(\d+)\s*,\s*\d+\s*\]", master.strip())
    if m:
        return int(m.group(1)) * int(m.group(2))
    return every


def session(master: str = "local[2]", app_name: str = "mqstore", **conf: Any) -> SparkSession:
    """A SparkSession for local pipelines over mqstore stores, with the data source registered.

    Sets, unless already set: ``PYSPARK_PYTHON`` to this interpreter (Python workers must
    import mqstore and pyarrow; PySpark otherwise runs ``python3`` from PATH),
    ``SPARK_LOCAL_IP=127.0.0.1``, the driver JVM's options (DRIVER_JAVA_OPTIONS, or
    $MQSTORE_SPARK_DRIVER_JAVA_OPTIONS), no UI and no console progress bars, shuffle partitions =
    the cores of master (any master string Spark takes: local[N,F], local-cluster[E,C,M],
    spark://...), filter pushdown on (register()), errors of Python workers shown as their one
    line (``spark.sql.execution.pyspark.udf.hideTraceback.enabled``: a UDF's error too; pass it
    as "false" to see tracebacks), and warehouse and scratch directories in a temporary
    directory (``mqstore-spark-*`` under $TMPDIR), removed when this Python process exits (or at once
    when a session was running already and is returned as it is).
    ``conf`` adds or overrides Spark settings (dots as in Spark: pass a dict with **)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    scratch = tempfile.mkdtemp(prefix="mqstore-spark-")
    settings: dict[str, Any] = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": str(cores_of(master)),
        "spark.sql.warehouse.dir": os.path.join(scratch, "warehouse"),
        "spark.local.dir": os.path.join(scratch, "local"),
        "spark.driver.extraJavaOptions": os.environ.get(DRIVER_JAVA_OPTIONS_ENV, DRIVER_JAVA_OPTIONS),
        # an error of a Python worker (a bad option, a store that cannot be read) reaches the
        # user as its one line; mqstore.spark logs the traceback of any unexpected error
        "spark.sql.execution.pyspark.udf.hideTraceback.enabled": "true",
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
