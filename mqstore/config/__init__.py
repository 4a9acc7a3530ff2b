"""Store configuration: one object with every knob (spec Appendix A, §6-§9, §13, §14).

Keys are RocketMQ 4.9.7 ``MessageStoreConfig`` field names in snake_case (RocketMQ's own spellings
kept: ``warm_maped_file_enable``), so a RocketMQ ``broker.conf`` maps 1:1 onto
``StoreConfig.from_broker_conf``. Every key is defined once in ``DEFINITIONS`` with its type,
default, unit, allowed values and one line of why it matters (the shape of Kafka's
``LogConfig.define(name, type, default, validator, doc)``); ``docs/config.md`` is rendered from
that table by ``render_config_doc()`` (``python -m mqstore.config > docs/config.md``).

The package: ``rules`` (what a value may be), ``definitions`` (DEFINITIONS), ``store_config``
(StoreConfig and validate()), ``parsing`` (broker.conf text), ``docs`` (docs/config.md and the
typed keys of ``mqstore._config_keys``); this module re-exports the public names.

Values are coerced and checked one key at a time whenever they are set; ``StoreConfig.validate()``
checks combinations of keys and is what a store calls when it opens.
"""

from __future__ import annotations

from mqstore.config.definitions import DEFINITIONS, NOT_SAVED_KEYS, SECRET_KEYS, Definition
from mqstore.config.docs import render_config_doc, render_typed_keys
from mqstore.config.parsing import parse_properties
from mqstore.config.rules import RECORD_HEADROOM, Rule, camel_to_snake, java_key_to_name
from mqstore.config.store_config import _OTHER_ROCKETMQ_KEYS, _REFUSED_UNLESS, StoreConfig
from mqstore.layout import CQ_STORE_UNIT_SIZE, OS_PAGE_SIZE
from mqstore.roles import BrokerRole, FlushDiskType, TieredStorageLevel

__all__ = [
    "NOT_SAVED_KEYS",
    "SECRET_KEYS",
    "java_key_to_name",
    "CQ_STORE_UNIT_SIZE",
    "DEFINITIONS",
    "OS_PAGE_SIZE",
    "RECORD_HEADROOM",
    "BrokerRole",
    "Definition",
    "FlushDiskType",
    "Rule",
    "StoreConfig",
    "TieredStorageLevel",
    "camel_to_snake",
    "parse_properties",
    "render_config_doc",
    "render_typed_keys",
]

