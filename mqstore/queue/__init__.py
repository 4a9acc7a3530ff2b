"""The queue layer over the CommitLog: ConsumeQueues, the index, dispatch, reads, recovery,
following other processes and read-only snapshots of the files (spec §3, §4, §5, §10, §11)."""
