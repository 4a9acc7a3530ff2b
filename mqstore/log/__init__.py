"""The CommitLog layer: records, mapped files and their queue, the CommitLog, the checkpoint,
the transient store pool, byte scans, and the store directory's lock (spec §1, §2, §5, §6, §7)."""
