"""The options of ``format("mqstore")``: every name the source and the sink take, Kafka's names
where the meaning is the same, and the one check that refuses an unknown or misspelled option
with the closest known name.

Spark hands a data source its options with lower-cased keys; the names here are the documented
spellings (docs/spark.md), compared lower-cased. Kafka's aliases (``subscribe`` for ``topics``,
``maxOffsetsPerTrigger`` for ``maxRecordsPerTrigger``) are read as the names they stand for.
Offsets JSON takes this source's shape ``{"topic/0": 42}`` and Kafka's ``{"topic": {"0": 42}}``,
with Kafka's sentinels -2 (earliest) and -1 (latest).
"""

from __future__ import annotations

import contextlib
import difflib
import json
import logging
import sys
import traceback
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from mqstore.errors import MQStoreError

#: what Spark itself puts into a source's options (load(path), checkpoints, query names)
SPARK_OPTIONS = ("path", "paths", "checkpointLocation", "queryName")
#: the queues a read picks
SELECT_OPTIONS = ("topics", "subscribe", "subscribePattern", "assign", "queues")
#: where a read starts and ends
RANGE_OPTIONS = ("startingOffsets", "endingOffsets", "startingTimestamp", "endingTimestamp",
                 "startingOffsetsByTimestamp", "endingOffsetsByTimestamp", "startingOffsetsByTimestampStrategy")
#: how rows are made
ROW_OPTIONS = ("maxRowsPerPartition", "minPartitions", "batchRows", "maxBatchBytes", "failOnDataLoss",
               "includeHeaders", "rawBody", "pushFilters")
#: batch reads only
BATCH_READ_OPTIONS = ("mode",)
#: streaming reads only (Kafka's maxOffsetsPerTrigger is maxRecordsPerTrigger)
STREAM_READ_OPTIONS = ("maxRecordsPerTrigger", "maxOffsetsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay")
#: reading or writing a cluster through its NameServers (mqstore.spark.remote)
NETWORK_OPTIONS = ("namesrv", "accessKey", "secretKey", "tls", "tlsCaFile", "namesrvTls", "consumerGroup",
                   "producerGroup", "pullBatchSize", "timeoutMs")
#: writes (mqstore.spark.write, mqstore.spark.sink)
WRITE_OPTIONS = ("queueCount",)
STREAM_WRITE_OPTIONS = ("sinkId",)
#: Kafka's name -> the name it stands for here
ALIASES = {"subscribe": "topics", "maxoffsetspertrigger": "maxrecordspertrigger"}


@contextlib.contextmanager
def traceback_logged(what: str) -> Iterator[None]:
    """Errors that are not mqstore's own (a bug rather than a bad option or store) get their
    traceback written to the Python worker's stderr, which is Spark's log, before they go on:
    mqstore.spark.session() has Spark show users one line per error (hideTraceback)."""
    try:
        yield
    except MQStoreError:
        raise
    except Exception:
        print(f"mqstore.spark: {what} failed:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
        raise


class OptionError(MQStoreError, ValueError):
    """A read or write option that is not understood or asks for what the store does not hold."""

    hint = "see the options in docs/spark.md"


_KINDS = {"read": "batch reads", "stream": "streaming reads", "write": "batch writes",
          "stream-write": "streaming writes"}


def known_for(kind: str) -> tuple[str, ...]:
    """The option names of a batch "read", a "stream" read, a "write" or a "stream-write"."""
    common = SPARK_OPTIONS + NETWORK_OPTIONS
    if kind == "read":
        return common + SELECT_OPTIONS + RANGE_OPTIONS + ROW_OPTIONS + BATCH_READ_OPTIONS
    if kind == "stream":
        return common + SELECT_OPTIONS + RANGE_OPTIONS + ROW_OPTIONS + STREAM_READ_OPTIONS
    if kind == "write":
        return common + WRITE_OPTIONS
    if kind == "stream-write":
        return common + WRITE_OPTIONS + STREAM_WRITE_OPTIONS
    raise ValueError(kind)


def check_options(options: Mapping[str, str], kind: str) -> dict[str, str]:
    """options with lower-cased keys, Kafka's aliases read as the names they stand for; an
    unknown option is an OptionError naming it and the closest known name, and so is an alias
    given beside the name it stands for."""
    names = known_for(kind)
    by_lower = {n.lower(): n for n in names}
    out: dict[str, str] = {}
    given_as: dict[str, str] = {}
    for key, value in options.items():
        low = key.lower()
        if low not in by_lower:
            other = [k for k in _KINDS if low in {n.lower() for n in known_for(k)}]
            if other:
                raise OptionError(f"option {key!r} does not apply to {_KINDS[kind]} (only to "
                                  f"{' and '.join(_KINDS[k] for k in other)})")
            every = {n.lower(): n for k in _KINDS for n in known_for(k)}
            close = difflib.get_close_matches(low, list(every), n=1, cutoff=0.6)
            raise OptionError(f"unknown option {key!r} for format(\"mqstore\")"
                              + (f"; did you mean {every[close[0]]!r}?" if close else ""))
        target = ALIASES.get(low, low)
        if target in out:
            first, second = sorted((by_lower[low], given_as[target]))
            raise OptionError(f"options {first!r} and {second!r} mean the same; give one")
        out[target] = value
        given_as[target] = by_lower[low]
    return out


def int_option(options: Mapping[str, str], name: str, default: int, low: int = 1) -> int:
    raw = options.get(name.lower())
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise OptionError(f"option {name}={raw!r} is not an integer") from None
    if value < low:
        raise OptionError(f"option {name}={value} must be >= {low}")
    return value


def bool_option(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = options.get(name.lower())
    if raw is None:
        return default
    low = raw.strip().lower()
    if low not in ("true", "false"):
        raise OptionError(f"option {name}={raw!r}: expected true or false")
    return low == "true"


def duration_ms_option(options: Mapping[str, str], name: str, default: int) -> int:
    """Kafka's durations ("15m", "30s", "500ms", "1h", or a number of ms) in milliseconds."""
    raw = options.get(name.lower())
    if raw is None:
        return default
    text = raw.strip().lower().replace(" ", "")
    for suffix, scale in (("ms", 1), ("s", 1000), ("m", 60_000), ("min", 60_000), ("h", 3_600_000), ("d", 86_400_000)):
        if text.endswith(suffix) and text[:-len(suffix)].isdigit():
            return int(text[:-len(suffix)]) * scale
    if text.isdigit():
        return int(text)
    raise OptionError(f"option {name}={raw!r}: expected a duration such as 500ms, 30s, 5m or 1h")


def list_option(options: Mapping[str, str], name: str) -> list[str] | None:
    raw = options.get(name.lower())
    if raw is None or not raw.strip():
        return None
    return [p.strip() for p in raw.split(",") if p.strip()]


#: Kafka's sentinels in offsets JSON
EARLIEST, LATEST = -2, -1


def per_queue_json(options: Mapping[str, str], name: str, what: str) -> dict[str, int] | None:
    """A JSON option that gives a number per queue, as {"topic/0": n} or Kafka's
    {"topic": {"0": n}}: {"topic/0": n}; None when the option is not given."""
    raw = options.get(name.lower())
    if raw is None:
        return None
    try:
        parsed: Any = json.loads(raw)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        raise OptionError(f'option {name}={raw!r}: expected JSON like {{"topic/0": {what}}} or '
                          f'{{"topic": {{"0": {what}}}}}')
    out = {}
    for key, value in parsed.items():
        if isinstance(value, dict):
            for queue, n in value.items():
                out[f"{key}/{_queue_id(name, queue)}"] = _number(name, n)
        elif isinstance(key, str) and "/" in key:
            topic, _, queue = key.rpartition("/")
            out[f"{topic}/{_queue_id(name, queue)}"] = _number(name, value)
        else:
            raise OptionError(f'option {name}: {key!r} is neither "topic/queueId" nor a topic with '
                              f'{{"queueId": {what}}}')
    return out


def _queue_id(name: str, raw: object) -> int:
    try:
        value = int(str(raw))
    except ValueError:
        raise OptionError(f"option {name}: queue id {raw!r} is not an integer") from None
    if value < 0:
        raise OptionError(f"option {name}: queue id {value} is negative")
    return value


def _number(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise OptionError(f"option {name}: {value!r} is not an integer")
    return value


def offsets_option(options: Mapping[str, str], name: str, default: str, *,
                   allow: Iterable[str] = ("earliest", "latest")) -> str | dict[str, int]:
    """earliest / latest (those in allow) or per-queue JSON offsets (-2 earliest, -1 latest)."""
    raw = options.get(name.lower(), default).strip()
    allowed = tuple(allow)
    if raw in ("earliest", "latest"):
        if raw not in allowed:
            raise OptionError(f"option {name}={raw} is not valid here ({' or '.join(allowed)} or JSON offsets)")
        return raw
    if not raw.startswith("{"):
        raise OptionError(f'option {name}={raw!r}: expected {", ".join(allowed)} or JSON like {{"topic/0": 42}} '
                          f'or {{"topic": {{"0": 42}}}} (-2 earliest, -1 latest)')
    parsed = per_queue_json({name.lower(): raw}, name, "42")
    assert parsed is not None
    for key, value in parsed.items():
        if value == EARLIEST and "earliest" not in allowed:
            raise OptionError(f"option {name}: -2 (earliest) is not valid for {key} here")
        if value < EARLIEST:
            raise OptionError(f"option {name}: offset {value} for {key} is negative (-2 earliest, -1 latest)")
    return parsed
