"""conf/plain_acl.yml, RocketMQ 4.9.7's plain ACL (PlainPermissionManager.load,
buildPlainAccessResource, Permission, AclConstants; distribution/conf/plain_acl.yml):

    globalWhiteRemoteAddresses:      # requests from these pass unchecked (address patterns:
      - 10.10.103.*                  #   mqstore.acl.address)
    accounts:
      - accessKey: RocketMQ          # more than 6 characters
        secretKey: 12345678          # more than 6 characters
        whiteRemoteAddress:          # requests of this account from here pass unchecked
        admin: false                 # may send the admin requests (mqstore.acl.validator)
        defaultTopicPerm: DENY       # for a topic not in topicPerms (absent: DENY)
        defaultGroupPerm: SUB        # for a group not in groupPerms (absent: DENY)
        topicPerms:                  # name=PUB | SUB | PUB|SUB | SUB|PUB | DENY
          - topicA=DENY
          - topicB=PUB|SUB
        groupPerms:                  # a group's resource is its retry topic, %RETRY%<group>
          - groupA=DENY

Loading is strict where RocketMQ is lax, so that a mistake is named instead of silently
changing who may do what: an unknown permission word (RocketMQ reads it as DENY), a resource
entry that is not ``name=PERM``, a value of the wrong type, or an address pattern RocketMQ would
match oddly (mqstore.acl.address) is an AclConfigError naming the file, the account and the
entry. As in RocketMQ, a second account with an AccessKey already seen is ignored (with a
warning), other keys of the file (``dataVersion``) are ignored, and an empty file has no
accounts. One file is read (``acl_file``), not RocketMQ's conf/acl/ directory as well.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from mqstore.acl.address import RemoteAddress, remote_address

__all__ = ["ACCESS_KEY_MIN_LENGTH", "ANY", "DENY", "PUB", "RETRY_GROUP_TOPIC_PREFIX", "SECRET_KEY_MIN_LENGTH", "SUB",
           "Account", "AclConfigError", "PlainAcl", "check_permission", "group_of", "is_retry_topic", "load_acl",
           "parse_acl", "parse_perm", "perm_name", "retry_topic"]

log = logging.getLogger("mqstore.acl")

#: Permission's bits
DENY, ANY, PUB, SUB = 1, 2, 4, 8
#: MixAll.RETRY_GROUP_TOPIC_PREFIX: a group's resource is its retry topic
RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"
#: AclConstants: an AccessKey and a SecretKey are longer than this
ACCESS_KEY_MIN_LENGTH = SECRET_KEY_MIN_LENGTH = 6

_PERMS = {"PUB": PUB, "SUB": SUB, "PUB|SUB": PUB | SUB, "SUB|PUB": PUB | SUB, "DENY": DENY}
_ACCOUNT_KEYS = frozenset({"accessKey", "secretKey", "whiteRemoteAddress", "admin", "defaultTopicPerm",
                           "defaultGroupPerm", "topicPerms", "groupPerms"})


class AclConfigError(ValueError):
    """plain_acl.yml cannot be used: ``path`` and ``problem`` (what is wrong, and where)."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem


def parse_perm(text: str) -> int:
    """Permission.parsePermFromString, strict: "PUB", "SUB", "PUB|SUB", "SUB|PUB" or "DENY";
    ValueError for anything else."""
    perm = _PERMS.get(text.strip()) if isinstance(text, str) else None
    if perm is None:
        raise ValueError(f"{text!r} is not a permission: PUB, SUB, PUB|SUB or DENY")
    return perm


def perm_name(perm: int) -> str:
    """"PUB|SUB" for PUB | SUB, and so on."""
    if perm & DENY:
        return "DENY"
    return "|".join(n for n, bit in (("PUB", PUB), ("SUB", SUB)) if perm & bit) or "none"


def check_permission(needed: int, owned: int) -> bool:
    """Permission.checkPermission: DENY owns nothing; ANY needs PUB or SUB; else a common bit."""
    if owned & DENY:
        return False
    if needed & ANY:
        return bool(owned & (PUB | SUB))
    return bool(needed & owned)


def retry_topic(group: str) -> str:
    """MixAll.getRetryTopic: the resource a group's permission is kept under."""
    return RETRY_GROUP_TOPIC_PREFIX + group


def is_retry_topic(resource: str | None) -> bool:
    return resource is not None and resource.startswith(RETRY_GROUP_TOPIC_PREFIX)


def group_of(resource: str) -> str:
    """The group of a retry topic."""
    return resource[len(RETRY_GROUP_TOPIC_PREFIX):]


@dataclass(frozen=True, eq=False)
class Account:
    """One account (PlainAccessResource as PlainPermissionManager builds it). ``perms`` holds the
    topics by name and the groups by retry topic, one map as RocketMQ's resourcePermMap (a topic
    entry named like a group's retry topic overrides the group's); ``has_perms`` says whether
    topicPerms or groupPerms listed anything (an admin without either may use every resource)."""

    access_key: str
    secret_key: str = field(repr=False)
    white_remote_address: RemoteAddress
    admin: bool
    default_topic_perm: int
    default_group_perm: int
    perms: Mapping[str, int]
    has_perms: bool
    secret_bytes: bytes = field(repr=False)

    def perm_of(self, resource: str) -> tuple[int, bool]:
        """(the permission the account owns on resource, whether it is listed rather than a default)."""
        perm = self.perms.get(resource)
        if perm is not None:
            return perm, True
        return (self.default_group_perm if is_retry_topic(resource) else self.default_topic_perm), False


@dataclass(frozen=True, eq=False)
class PlainAcl:
    """A loaded plain_acl.yml: the accounts by AccessKey and the global white list."""

    accounts: Mapping[str, Account]
    global_white: tuple[RemoteAddress, ...]
    path: str = ""

    def in_global_white(self, addr: Any) -> bool:
        """Whether a normalize_ip() result matches globalWhiteRemoteAddresses."""
        return any(s.match(addr) for s in self.global_white)


def _text(value: Any, where: str, name: str, *, required: bool = False) -> str | None:
    """A scalar as fastjson turns it into a String (YAML reads 12345678 as a number)."""
    if value is None:
        if required:
            raise ValueError(f"{where}{name} is missing")
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError(f"{where}{name} must be a string, not {value!r}")
    return value if isinstance(value, str) else str(value)


def _perm(value: Any, where: str, name: str) -> int:
    text = _text(value, where, name)
    if text is None:
        return DENY  # parsePermFromString(null)
    try:
        return parse_perm(text)
    except ValueError as exc:
        raise ValueError(f"{where}{name}: {exc}") from None


def _resource_perms(value: Any, where: str, name: str, group: bool, perms: dict[str, int]) -> bool:
    """Permission.parseResourcePerms into perms; whether the list had any entry."""
    if value is None:
        return False
    if not isinstance(value, list):
        raise ValueError(f"{where}{name} must be a list of 'name=PERM' entries, not {value!r}")
    for i, entry in enumerate(value):
        items = [p for p in entry.split("=") if p] if isinstance(entry, str) else []
        if len(items) != 2 or not items[0].strip():
            raise ValueError(f"{where}{name}[{i}] must be 'name=PERM' (like 'topicA=PUB|SUB'), not {entry!r}")
        try:
            perm = parse_perm(items[1])
        except ValueError as exc:
            raise ValueError(f"{where}{name}[{i}] {entry!r}: {exc}") from None
        resource = items[0].strip()
        perms[retry_topic(resource) if group else resource] = perm
    return bool(value)


def _admin(value: Any, where: str) -> bool:
    if value is None:
        return False
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise ValueError(f"{where}admin must be true or false, not {value!r}")


def _address(value: Any, where: str, name: str) -> RemoteAddress:
    try:
        return remote_address(_text(value, where, name))
    except ValueError as exc:
        raise ValueError(f"{where}{name}: {exc}") from None


def _account(obj: Any, where: str) -> Account:
    if not isinstance(obj, dict):
        raise ValueError(f"{where[:-2]} must be a mapping of accessKey, secretKey, ..., not {obj!r}")
    access_key = _text(obj.get("accessKey"), where, "accessKey", required=True)
    assert access_key is not None
    where = f"{where[:-2]} (accessKey {access_key!r}): "
    secret_key = _text(obj.get("secretKey"), where, "secretKey", required=True)
    assert secret_key is not None
    if len(access_key) <= ACCESS_KEY_MIN_LENGTH:
        raise ValueError(f"{where}accessKey must be longer than {ACCESS_KEY_MIN_LENGTH} characters")
    if len(secret_key) <= SECRET_KEY_MIN_LENGTH:
        raise ValueError(f"{where}secretKey must be longer than {SECRET_KEY_MIN_LENGTH} characters")
    unknown = sorted(str(k) for k in obj if k not in _ACCOUNT_KEYS)
    if unknown:
        log.warning("%signored key(s) %s: an account has %s", where, ", ".join(unknown), ", ".join(sorted(_ACCOUNT_KEYS)))
    perms: dict[str, int] = {}
    listed = _resource_perms(obj.get("groupPerms"), where, "groupPerms", True, perms)
    listed = _resource_perms(obj.get("topicPerms"), where, "topicPerms", False, perms) or listed
    return Account(access_key=access_key, secret_key=secret_key,
                   white_remote_address=_address(obj.get("whiteRemoteAddress"), where, "whiteRemoteAddress"),
                   admin=_admin(obj.get("admin"), where),
                   default_topic_perm=_perm(obj.get("defaultTopicPerm"), where, "defaultTopicPerm"),
                   default_group_perm=_perm(obj.get("defaultGroupPerm"), where, "defaultGroupPerm"),
                   perms=perms, has_perms=listed, secret_bytes=secret_key.encode("utf-8"))


def parse_acl(data: Any, path: str = "plain_acl.yml") -> PlainAcl:
    """The ACL a parsed plain_acl.yml (its YAML document) describes; AclConfigError naming path
    and the entry that is wrong."""
    if data is None:
        return PlainAcl({}, (), path)
    if not isinstance(data, dict):
        raise AclConfigError(path, f"the file must be a mapping with accounts and globalWhiteRemoteAddresses, not "
                                   f"{type(data).__name__}")
    try:
        white = data.get("globalWhiteRemoteAddresses")
        if white is not None and not isinstance(white, list):
            raise ValueError(f"globalWhiteRemoteAddresses must be a list of address patterns, not {white!r}")
        global_white = tuple(_address(p, "", f"globalWhiteRemoteAddresses[{i}]") for i, p in enumerate(white or ()))
        raw = data.get("accounts")
        if raw is not None and not isinstance(raw, list):
            raise ValueError(f"accounts must be a list of accounts, not {raw!r}")
        accounts: dict[str, Account] = {}
        for i, obj in enumerate(raw or ()):
            account = _account(obj, f"accounts[{i}]: ")
            if account.access_key in accounts:
                log.warning("%s: accounts[%d]: accessKey %r is repeated; the first account with it is used", path, i,
                            account.access_key)
                continue
            accounts[account.access_key] = account
    except ValueError as exc:
        raise AclConfigError(path, str(exc)) from None
    return PlainAcl(accounts, global_white, path)


def _loader() -> type[yaml.SafeLoader]:
    return getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's when PyYAML has it


def load_acl(path: str | os.PathLike[str]) -> PlainAcl:
    """Read and parse plain_acl.yml; AclConfigError naming the file and what is wrong (missing,
    unreadable, not YAML, or an entry that is not valid)."""
    name = os.fspath(path)
    try:
        with open(name, "rb") as fh:
            raw = fh.read()
    except FileNotFoundError:
        raise AclConfigError(name, "no such file: write the accounts there (RocketMQ's plain_acl.yml format), "
                                   "or point acl_file at the file") from None
    except OSError as exc:
        raise AclConfigError(name, f"cannot be read: {exc.strerror or exc}") from None
    try:
        data = yaml.load(raw, Loader=_loader())  # noqa: S506 (a safe loader)
    except yaml.YAMLError as exc:
        raise AclConfigError(name, f"is not valid YAML: {exc}") from None
    return parse_acl(data, name)
