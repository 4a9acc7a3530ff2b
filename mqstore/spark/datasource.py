"""The "mqstore" PySpark data source: ``format("mqstore")`` for batch and streaming reads and
writes. It only ties the parts together: batch reads (mqstore.spark.source), streaming reads
(mqstore.spark.stream) and writes (mqstore.spark.write), which import one another only
downward (stream and write take the schema, options and the reading core from source).
"""

from __future__ import annotations

from pyspark.sql.datasource import (DataSource, DataSourceReader, DataSourceStreamReader, DataSourceStreamWriter,
                                    DataSourceWriter)
from pyspark.sql.types import StructType

from mqstore.spark.source import SCHEMA, MQStoreBatchReader
from mqstore.spark.stream import MQStoreStreamReader
from mqstore.spark.write import MQStoreBatchWriter, MQStoreStreamWriter

__all__ = ["MQStoreDataSource"]


class MQStoreDataSource(DataSource):
    """``format("mqstore")``: a store directory as a table of messages."""

    @classmethod
    def name(cls) -> str:
        return "mqstore"

    def schema(self) -> StructType:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return MQStoreBatchReader(dict(self.options), schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return MQStoreStreamReader(dict(self.options), schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return MQStoreBatchWriter(dict(self.options), schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return MQStoreStreamWriter(dict(self.options), schema, overwrite)
