"""Tiered storage (docs/tiering.md; the design: docs/tiered-storage-spec.md): closed CommitLog
files copied to an S3 bucket as self-describing segment objects, so every read still finds them
once local retention deleted the file.

Built so far (each tested on its own; the tierer service that drives them, read routing,
retention and the commands are not built yet, docs/tiering.md):

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
"""
