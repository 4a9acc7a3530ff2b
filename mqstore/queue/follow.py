"""Following what other processes build: the one place a store's reads catch up with files and
queues created, extended or deleted by another process.

A store whose dispatcher, allocator and cleaner run in this process (the threads-mode owner)
sees every change as it happens: its reads use ``NOT_FOLLOWING``, whose methods do nothing.
A node's owner (service processes) and an attached store read what other processes wrote, so
before a read they bring their mappings up to what the control block publishes: ``Follower``.
The store picks one when it opens, and no read branches on the mode.
"""

from __future__ import annotations

from typing import Any

from mqstore.log._shm import ControlBlock
from mqstore.log.commitlog import CommitLog
from mqstore.queue.consume_queue import ConsumeQueueTable

__all__ = ["Follower", "NOT_FOLLOWING", "NotFollowing"]


class NotFollowing:
    """This process builds everything it reads: nothing to catch up with."""

    def log(self) -> None:
        """Nothing to map or drop."""

    def queue(self, topic: str, queue_id: int) -> None:
        """Nothing to follow."""

    def index(self) -> None:
        """Nothing to follow."""


NOT_FOLLOWING = NotFollowing()


class Follower(NotFollowing):
    """Reads in a process other than the dispatcher's, the allocator's and the cleaner's.

    commitlog: the store's CommitLog, or every log's of a store with several (by log id): each
    log's files are followed to its own committed position and min offset, and a queue's
    files are cut against its own log's min offset (docs/parallel-commitlogs.md)."""

    def __init__(self, commitlog: CommitLog | list[CommitLog], consume_queues: ConsumeQueueTable, ctl: ControlBlock,
                 index: Any | None = None) -> None:
        self.commitlogs = commitlog if isinstance(commitlog, list) else [commitlog]
        self.commitlog = self.commitlogs[0]
        self.consume_queues = consume_queues
        self.ctl = ctl
        #: every log's index (those that are on)
        indexes = index if isinstance(index, list) else [index]
        self.indexes = [i for i in indexes if i is not None]
        self.index_service = indexes[0]
        # per log: the committed position and min_phy the files were last followed to: a read
        # finds them unchanged most of the time, and then has nothing to map or drop
        self._seen = [(-1, -1)] * len(self.commitlogs)

    def log(self) -> None:
        """Map the CommitLog files other processes created up to the committed position, and
        drop the ones the cleaner deleted (below min_phy); every log's."""
        ctl = self.ctl
        for k, commitlog in enumerate(self.commitlogs):
            seen = (ctl.get("committed", log=k), ctl.get("min_phy", log=k))
            if seen == self._seen[k]:
                continue
            queue = commitlog.queue
            if seen[0] < self._seen[k][0]:
                # the log was cut back (a slave truncated to its master's end): files past the
                # cut were deleted and may be created again
                queue.drop_above(seen[0])
            if queue.mapped_end < seen[0]:
                queue.map_new_files()
            first = queue.first()
            if first is not None and first.file_from + commitlog.file_size <= seen[1]:
                queue.drop_below(seen[1])
            self._seen[k] = seen

    def queue(self, topic: str, queue_id: int) -> None:
        """The log, then the queue up to the unit count the dispatcher published and its min
        offset past what the cleaner deleted."""
        self.log()
        units = self.ctl.table_get_dispatched(topic, queue_id)
        if units is None:
            return
        cq = self.consume_queues.get(topic, queue_id) or self.consume_queues.open_existing(topic, queue_id)
        if cq is None:
            return
        if units != cq.max_offset_in_queue:
            cq.follow(units)
        min_phy = self._seen[cq.log_id][1] if cq.log_id < len(self._seen) else 0
        if min_phy > 0:
            cq.follow_cleaning(min_phy)

    def index(self) -> None:
        """The index files the dispatcher created or the cleaner deleted, then the log."""
        if self.indexes:
            for index in self.indexes:
                index.follow()
            self.log()
