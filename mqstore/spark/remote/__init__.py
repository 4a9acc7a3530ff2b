"""``format("mqstore")`` over the network: with option ``namesrv`` ("host:9876;host2:9876") the
source reads and the sink writes a RocketMQ cluster (mqstore's brokers or any speaking RocketMQ
4.9's remoting protocol) through its NameServers, instead of a store directory; executors may
run anywhere that reaches the brokers. docs/spark.md, "Reading and writing a cluster over the
network".

- ``cluster``: the options that say how to reach the cluster, and a blocking face over
  ``mqstore.client.PullConsumer`` (queues, offsets, time lookups, raw pulls);
- ``reader``: the batch and streaming readers (partitions: offset ranges of each broker's queues);
- ``writer``: the batch and streaming writers (``mqstore.client.SyncProducer``; the streaming one
  exactly-once through records it keeps in the cluster).
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["wants_network"]


def wants_network(options: Mapping[str, str]) -> bool:
    """Whether a read or write names a cluster (option namesrv) rather than a store directory."""
    return any(key.lower() == "namesrv" for key in options)
