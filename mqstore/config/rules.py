"""What a configuration value may be: the checks (Rule) the keys use, and camelCase -> snake_case."""

from __future__ import annotations


import ipaddress
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any




RECORD_HEADROOM = 65536  # spec §1.1: a whole record may be max_message_size + 64 KiB
_INDEX_HEADER_SIZE, _INDEX_SLOT_SIZE, _INDEX_ENTRY_SIZE = 40, 4, 20  # spec §4.1
_HA_SLAVE_READ_BUFFER, _HA_FRAME_HEADER = 4 * 1024 * 1024, 12  # spec §13.1
_CQ_EXT_UNIT_HEADER, _CQ_EXT_UNIT_MAX = 20, 32767  # ConsumeQueueExt.CqExtUnit: short size

_INT_MAX = 2**31 - 1  # RocketMQ keeps most of these in Java ints
_LONG_MAX = 2**63 - 1



# ------------------------------------------------------------------------------------------------
# camelCase -> snake_case

_ACRONYM_BOUNDARY = re.compile(r"([A-Z]+)([A-Z][a-z])")  # "CRCOn" -> "CRC_On"
_WORD_BOUNDARY = re.compile(r"([a-z0-9])([A-Z])")  # "checkCRC" -> "check_CRC"


def camel_to_snake(name: str) -> str:
    """``flushIntervalCommitLog`` -> ``flush_interval_commit_log``; acronyms stay one word
    (``checkCRCOnRecover`` -> ``check_crc_on_recover``); snake_case passes through unchanged."""
    return _WORD_BOUNDARY.sub(r"\1_\2", _ACRONYM_BOUNDARY.sub(r"\1_\2", name)).lower()


def java_key_to_name(key: str) -> str:
    """A broker.conf key as the mqstore key it sets: camel_to_snake, and TlsSystemConfig's dotted
    properties (``tls.server.certPath``) with their dots as underscores."""
    return camel_to_snake(key.replace(".", "_") if key.startswith("tls.") else key)


# ------------------------------------------------------------------------------------------------
# Rules: what values a key accepts


@dataclass(frozen=True)
class Rule:
    """Allowed values of one key: a description (docs, error hints) and the check itself.

    ``check`` gets the coerced value and returns ``None`` or what is wrong with it. ``low``,
    ``high``, ``step`` and ``power_of_two`` describe integer rules for introspection (tests
    generate valid values from them).
    """

    description: str
    check: Callable[[Any], str | None] = field(repr=False, compare=False)
    low: int | None = None
    high: int | None = None
    step: int = 1
    power_of_two: bool = False


def _int_range(low: int, high: int, *, step: int = 1) -> Rule:
    description = f"{low} .. {high}" if step == 1 else f"multiple of {step} in {low} .. {high}"

    def check(value: int) -> str | None:
        if not low <= value <= high:
            return "out of range"
        if value % step:
            return f"not a multiple of {step}"
        return None

    return Rule(description, check, low, high, step)


def _power_of_two(low: int, high: int) -> Rule:
    def check(value: int) -> str | None:
        if not low <= value <= high:
            return "out of range"
        if value & (value - 1):
            return "not a power of two"
        return None

    return Rule(f"power of two in {low} .. {high}", check, low, high, power_of_two=True)


def _no_check(_value: Any) -> None:
    return None


def _enum_rule(enum_type: type[Enum]) -> Rule:
    return Rule(", ".join(member.value for member in enum_type), _no_check)


_BOOL = Rule("true, false (also yes/no, 1/0)", _no_check)
_POSITIVE = _int_range(1, _INT_MAX)
_NON_NEGATIVE = _int_range(0, _INT_MAX)
_PERCENT = _int_range(0, 100)

_DELAY_UNIT_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_DELAY_TOKEN = re.compile(r"(\d+)([smhd])")


def _check_delay_levels(value: str) -> str | None:
    tokens = value.split()
    if not tokens:
        return "empty (at least one level is needed)"
    bad = [token for token in tokens if not _DELAY_TOKEN.fullmatch(token)]
    return f"not a list of delays: {' '.join(bad)!r}" if bad else None


def _check_delete_when(value: str) -> str | None:
    for token in value.split(";"):
        token = token.strip()
        if not (token.isdigit() and len(token) <= 2 and int(token) <= 23):
            return f"not a list of hours: {token!r}"
    return None


_HOST_PORT = re.compile(r"(?:\[(?P<v6>[^\]]+)\]|(?P<v4>[^:\[\]]+)):(?P<port>\d{1,5})")


def _parse_host_port(value: str) -> tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]:
    """``"10.0.0.2:10911"`` / ``"[fe80::2]:10911"`` -> (address, port); ValueError otherwise."""
    match = _HOST_PORT.fullmatch(value)
    if match is None:
        raise ValueError("not host:port (IPv6 is written [::1]:10911)")
    port = int(match["port"])
    if not 1 <= port <= 65535:
        raise ValueError("port out of range 1 .. 65535")
    if match["v6"] is not None:
        return ipaddress.IPv6Address(match["v6"]), port
    return ipaddress.IPv4Address(match["v4"]), port


def _check_store_host(value: str) -> str | None:
    try:
        _parse_host_port(value)
    except ValueError as exc:
        return str(exc)
    return None


def _check_commit_log_path(value: str) -> str | None:
    if "," in value:
        return "a comma-separated multi-path list (RocketMQ 4.9 MultiPathMappedFileQueue), not supported"
    return None


def _check_commit_log_paths(value: str) -> str | None:
    if not value:
        return None
    paths = [p.strip() for p in value.split(";")]
    if any(not p for p in paths):
        return "an empty path in the list"
    if any("," in p for p in paths):
        return "a comma in a path (RocketMQ's comma-separated multi-path), not supported"
    if len(set(paths)) != len(paths):
        return "a path named twice (each CommitLog needs its own directory)"
    return None


_COMMIT_LOG_PATHS_RULE = Rule('"" or ";"-separated distinct paths, one per CommitLog', _check_commit_log_paths)
_ROOT_DIR_RULE = Rule('"" or the directory passed to open', _no_check)
_COMMIT_LOG_PATH_RULE = Rule('one path (no commas); "" = ROOT/commitlog', _check_commit_log_path)
_DELAY_RULE = Rule("Ns, Nm, Nh or Nd, space-separated, at least one", _check_delay_levels)
_DELETE_WHEN_RULE = Rule('";"-separated hours 0 .. 23', _check_delete_when)
_SERVICE_MODE_RULE = Rule("threads, processes", lambda v: None if v in ("threads", "processes") else "unknown mode")
_STORE_HOST_RULE = Rule("IPv4:port or [IPv6]:port, port 1 .. 65535", _check_store_host)




def _check_ipv4(value: str) -> str | None:
    try:
        ipaddress.IPv4Address(value)
    except ValueError:
        return "not an IPv4 address"
    return None


def _check_name(value: str) -> str | None:
    # TopicValidator's pattern: a broker's and a cluster's names are topics too
    return None if re.fullmatch(r"[a-zA-Z0-9_-]{1,127}", value) else "not 1 .. 127 of a-z A-Z 0-9 _ -"


def _check_namesrv(value: str) -> str | None:
    for part in filter(None, value.split(";")):
        host, sep, port = part.strip().rpartition(":")
        if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
            return f"{part!r} is not host:port"
    return None


_IPV4_RULE = Rule("an IPv4 address", _check_ipv4)
_BIND_RULE = Rule('"" or an IPv4 address', lambda v: None if v == "" else _check_ipv4(v))
_TLS_MODE_RULE = Rule("disabled, permissive, enforcing",
                      lambda v: None if v in ("disabled", "permissive", "enforcing") else "unknown TLS mode")
_TLS_AUTH_RULE = Rule("none, optional, require",
                      lambda v: None if v in ("none", "optional", "require") else "unknown client-auth mode")
_ANY_TEXT = Rule("any text", _no_check)
_NAME_RULE = Rule("1 .. 127 of a-z A-Z 0-9 _ -", _check_name)
_NAMESRV_RULE = Rule('"" or host:port, several separated by ";"', _check_namesrv)
def _check_ha_master(value: str) -> str | None:
    if not value:
        return None
    if ";" in value:
        return "one master address, not a list"
    return _check_namesrv(value)


_HA_MASTER_RULE = Rule('"" or host:port', _check_ha_master)
_SERIALIZE_RULE = Rule("JSON, ROCKETMQ", lambda v: None if v in ("JSON", "ROCKETMQ") else "unknown serialization")


# --- tiered storage (tiered-storage spec §3) -----------------------------------------------------

_S3_PART_MIN = 5 * 1024 * 1024  # S3's smallest part of a multipart upload (except the last)
_S3_PART_MAX = 5 * 1024 * 1024 * 1024  # S3's largest part


def _check_endpoint(value: str) -> str | None:
    if value and not re.fullmatch(r"https?://[^\s/?#]+(/[^\s?#]*)?", value):
        return "not an http:// or https:// URL"
    return None


def _check_bucket(value: str) -> str | None:
    # S3's bucket naming rules (3 .. 63 of a-z 0-9 . -, starting and ending with a letter or digit)
    if value and not re.fullmatch(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]", value):
        return "not an S3 bucket name (3 .. 63 of a-z 0-9 . -, a letter or digit at both ends)"
    return None


def _check_region(value: str) -> str | None:
    return None if re.fullmatch(r"[a-z0-9-]{1,64}", value) else "not a region name (a-z 0-9 -)"


def _check_prefix(value: str) -> str | None:
    if value.startswith("/") or value.endswith("/") or "//" in value:
        return "a key prefix without leading, trailing or doubled slashes"
    return None


_TIER_LEVEL_RULE = Rule("DISABLE, NOT_IN_DISK, FORCE (RocketMQ's NOT_IN_MEM is refused in v1: it needs a "
                        "page-cache probe per read)", _no_check)
_ENDPOINT_RULE = Rule('"" or an http:// or https:// URL', _check_endpoint)
_BUCKET_RULE = Rule('"" or an S3 bucket name', _check_bucket)
_REGION_RULE = Rule("a region name (a-z 0-9 -)", _check_region)
_PREFIX_RULE = Rule('"" or a key prefix (no leading, trailing or doubled "/")', _check_prefix)
