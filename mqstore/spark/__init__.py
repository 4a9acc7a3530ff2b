"""mqstore topics in Spark: ``spark.read.format("mqstore").load(store_dir)``.

Install with the extra: ``pip install "mqstore[spark]"`` (pyspark 4.3, pyarrow). Then either
``mqstore.spark.session()`` (a local session set up for it, the source registered) or, in a
session of your own, ``mqstore.spark.register(spark)``. With a non-editable install the
``pyspark_mqstore`` module registers the source automatically (PySpark's lookup of
``pyspark_*`` modules).

The reader and its options: ``mqstore/spark/source.py`` and docs/spark.md.
"""

from __future__ import annotations

try:
    import pyarrow  # noqa: F401
    import pyspark  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(f"mqstore.spark needs pyspark and pyarrow ({exc}); install them with: "
                      "pip install 'mqstore[spark]'") from exc

from mqstore.spark.session import register, session
from mqstore.spark.datasource import MQStoreDataSource
from mqstore.spark.source import COMMITLOG_ID, SCHEMA

__all__ = ["COMMITLOG_ID", "SCHEMA", "MQStoreDataSource", "register", "session"]
