"""The "mqstore" PySpark data source: ``format("mqstore")`` for batch and streaming reads and
writes. It only ties the parts together: batch reads (mqstore.spark.source), streaming reads
(mqstore.spark.stream), batch writes (mqstore.spark.write) and streaming writes
(mqstore.spark.sink), which import one another only downward (stream and the writers take the
schema, options and the reading core from source; both writers take rows to messages from
mqstore.spark.rows).
"""

from __future__ import annotations

from pyspark.sql.datasource import (DataSource, DataSourceReader, DataSourceStreamReader, DataSourceStreamWriter,
                                    DataSourceWriter)
from pyspark.sql.types import StructType

from mqstore.spark.options import bool_option, check_options, traceback_logged
from mqstore.spark.remote import wants_network
from mqstore.spark.source import MQStoreBatchReader, MQStorePushdownReader, read_schema
from mqstore.spark.worker import settle_worker

__all__ = ["MQStoreDataSource"]


class MQStoreDataSource(DataSource):
    """``format("mqstore")``: a store directory as a table of messages."""

    @classmethod
    def name(cls) -> str:
        return "mqstore"

    #: whether a batch read pushes filters down unless option pushFilters says otherwise: the
    #: session must have spark.sql.python.filterPushdown.enabled (PySpark fails every query of a
    #: reader with pushFilters otherwise), which register() sets when it registers the subclass
    pushdown_default = False

    def __init__(self, options: dict[str, str]) -> None:
        settle_worker()  # PySpark makes the source in its (reused) planning workers
        super().__init__(options)

    def schema(self) -> StructType:
        return read_schema(dict(self.options))

    def reader(self, schema: StructType) -> DataSourceReader:
        options = dict(self.options)
        with traceback_logged("the batch read's planning"):
            if wants_network(options):
                from mqstore.spark.remote.reader import NetworkBatchReader
                return NetworkBatchReader(options, schema)
            if bool_option(check_options(options, "read"), "pushFilters", self.pushdown_default):
                return MQStorePushdownReader(options, schema)
            return MQStoreBatchReader(options, schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        with traceback_logged("the stream's planning"):
            if wants_network(self.options):
                from mqstore.spark.remote.reader import NetworkStreamReader
                return NetworkStreamReader(dict(self.options), schema)
            from mqstore.spark.stream import MQStoreStreamReader  # each Python worker imports what it needs

            return MQStoreStreamReader(dict(self.options), schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        with traceback_logged("the write's planning"):
            if wants_network(self.options):
                from mqstore.spark.remote.writer import NetworkBatchWriter
                return NetworkBatchWriter(dict(self.options), schema, overwrite)
            check_options(dict(self.options), "write")
            from mqstore.spark.write import MQStoreBatchWriter

            return MQStoreBatchWriter(dict(self.options), schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        with traceback_logged("the streaming write's planning"):
            if wants_network(self.options):
                from mqstore.spark.remote.writer import NetworkStreamWriter
                return NetworkStreamWriter(dict(self.options), schema, overwrite)
            check_options(dict(self.options), "stream-write")
            from mqstore.spark.sink import MQStoreStreamWriter

            return MQStoreStreamWriter(dict(self.options), schema, overwrite)


class MQStorePushdownDataSource(MQStoreDataSource):
    """``format("mqstore")`` as register() registers it: batch reads push filters down (the
    session has spark.sql.python.filterPushdown.enabled)."""

    pushdown_default = True
