"""PySpark finds data sources in top-level ``pyspark_*`` modules that export a
``DefaultSource`` (SPARK-45917): this one makes ``format("mqstore")`` work without a
``register`` call when mqstore is installed (not in editable mode, whose import hook hides
the module from that lookup)."""

from mqstore.spark.datasource import MQStoreDataSource as DefaultSource

__all__ = ["DefaultSource"]
