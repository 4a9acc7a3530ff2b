"""Tiered storage (docs/tiering.md; the design: docs/tiered-storage-spec.md): closed CommitLog
files copied to an S3 bucket as self-describing segment objects, so every read still finds them
once local retention deleted the file.

Built so far (each tested on its own; the tierer's service process, read routing in the
store's reads, retention and the commands are not built yet, docs/tiering.md):

``objects``    the object-store client (obstore, the ``tier`` extra): the key layout
               (``prefix_of``, ``segment_key``, ...), single and multipart uploads, ranged
               reads, listing, deletes, conditional creates, Kafka's back-off, errors as
               ``ObjectStoreError`` subclasses naming the operation, key and cause, and
               ``claim_store``'s fencing through ``STORE.json``
``manifest``   the crash-safe local manifest: append-only, CRC-framed, fsynced records of the
               COPY_STARTED → COPY_FINISHED → DELETE_STARTED → DELETE_FINISHED state machine,
               torn tails cut, compaction, the recovery steps, ``copied_upto``
``queues``     the tier queue index (``tier/queues/<topic>/<qid>``: queue offset → segment;
               binary-searched by readers, cut from the front by tier retention)
``_segment``   the compiled ``.mqseg`` segment format (built from one closed CommitLog file and
               streamed in parts with its CRCs computed as they go; trailers and footers parsed,
               ``CorruptSegmentError`` naming the field; lookups by queue offset, time and
               physical offset) and the compacted ``.mqidx`` index objects; shared types in
               ``mqstore.segformat``, the twin ``mqstore.twin.segment``
``service``    the tierer's copy loop (``Tierer``, a library object; not yet a service process):
               per pass claim the prefix, recover crashed or failed uploads, copy at most one
               eligible closed file per log (build → COPY_STARTED → put → read-back check →
               queue index entries → COPY_FINISHED; a failed copy is deleted and redone with a
               new upload id), ``copied_upto`` for the control block's tier_copied_upto_k
``reader``     the tier reader: batch reads of a queue from one segment (``get_messages``),
               look-ups by physical offset and by time (the store's nearest-record rule), min
               offset and earliest time, with the fewest GETs; a footer cache (LRU by bytes) and
               coalescing of concurrent GETs of one range; body CRCs checked
               (``CorruptSegmentError`` naming the record). Not yet called by the store's reads
"""
