"""Pure-Python twins of mqstore's Cython hot paths.

Each module here re-implements, slowly and plainly, the same API as a Cython
extension module, following the RocketMQ 4.9.7 semantics of
``docs/rocketmq-store-spec.md`` as literally as possible. The twins are
test oracles: hypothesis tests feed the same inputs to a twin and to its Cython
counterpart and require identical results (return values, bytes and raised
exception types). They are not meant to be fast and are not used by the store.

- :mod:`mqstore.twin.codec` -- the CommitLog record codec (spec §1, §5.3, Appendix B).
- :mod:`mqstore.twin.consume_queue` -- the ConsumeQueue unit order check of recovery.
- :mod:`mqstore.twin.reput` -- the batch cut and parse of the concurrent dispatch (spec §10.2).
- :mod:`mqstore.twin.conns` -- a broker's connection table (its fronts' counts and caps).
- :mod:`mqstore.twin.segment` -- the tiered segment (``.mqseg``) and compacted index (``.mqidx``)
  objects: builders, parsers, lookups (tiered-storage spec §5.2, §5.3).
"""
