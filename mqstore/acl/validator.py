"""The check of one request against a plain ACL (PlainAccessValidator.parse and
PlainPermissionManager.validate / checkPerm of RocketMQ 4.9.7), and which request codes need
what.

``check(acl, code, ext_fields, body, remote_ip)`` answers None (allowed) or the refusal's remark
(the broker answers NO_PERMISSION, 16, with it), in validate's order:

1. a remote address in ``globalWhiteRemoteAddresses`` passes;
2. a request without an AccessKey, or with one no account has, is refused;
3. a remote address matching the account's ``whiteRemoteAddress`` passes;
4. a Signature that is not the one the request makes with the account's secretKey is refused
   (mqstore.acl._acl; Java's and the C++ client's signatures alike, mqstore.acl.signature);
5. a send to RMQ_SYS_TRACE_TOPIC (message traces) passes;
6. a request code that needs admin (``needs_admin``) from an account that is not admin is refused;
7. every resource the request uses (``resources``) needs the account's permission: the one
   listed in topicPerms / groupPerms, else defaultTopicPerm / defaultGroupPerm; an admin account
   with neither list may use every resource.

Then one step of mqstore's own, not 4.9.7's: ``offset_refusal(acl, code, ext_fields, remote_ip,
is_member)``, asked after ``check`` by whoever knows the group's consumers (the broker's
controller), for a client's request that sets a consumer group's offsets (``offset_group``:
UPDATE_CONSUMER_OFFSET). It needs an admin account, the group listed in groupPerms with SUB, or
the client to be a live consumer of the group (a heartbeat on its connection registering a
consumer of the group, which the broker still holds); an address that passed above passes. 4.9.7
asks SUB on the group only, defaultGroupPerm included, so any such account moves any group's
offsets. A pull carrying a commit keeps 4.9.7's rule (SUB on its topic and group, defaults
included): consumers whose accounts have their groups by defaultGroupPerm must work.

Which codes need admin. RocketMQ 4.9.7 (Permission.ADMIN_CODE) asks it only for topic and group
creation, change and deletion and broker config changes (``ADMIN_CODES_4_9_7``). Here every request
a plain producer or consumer never sends needs it too: ``needs_admin(code)`` is true for every
code not in ``CLIENT_CODES`` (the Java and C++ clients' own requests), so the consumer lists,
the runtime and config dumps, offset resets and clones, and codes unknown to 4.9.7 are admin.

What each code uses (``resources``): PlainAccessValidator.parse's table, with a group's resource
its retry topic ``%RETRY%group``. Two differences from 4.9.7, both RocketMQ 5's: SEND_BATCH_MESSAGE
is checked as SEND_MESSAGE_V2 (4.9.7 checks no topic for it), and a send to a retry topic whose
request names no group checks the retry topic's own group (4.9.7 checks nothing); a blank
consumer group (the C++ producer's UNREGISTER_CLIENT) is no resource.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from mqstore.acl._acl import signature_matches
from mqstore.acl.address import NO_ADDRESS, normalize_ip
from mqstore.acl.plain import PUB, SUB, Account, PlainAcl, check_permission, group_of, is_retry_topic, retry_topic
from mqstore.acl.signature import ACCESS_KEY

__all__ = ["ADMIN_CODES_4_9_7", "CLIENT_CODES", "RMQ_SYS_TRACE_TOPIC", "SendVerdicts", "check", "describe",
           "needs_admin", "offset_group", "offset_refusal", "resources"]

#: TopicValidator.RMQ_SYS_TRACE_TOPIC: sends to it pass once the signature is checked
RMQ_SYS_TRACE_TOPIC = "RMQ_SYS_TRACE_TOPIC"

#: Permission.ADMIN_CODE of 4.9.7: UPDATE_AND_CREATE_TOPIC, UPDATE_BROKER_CONFIG,
#: DELETE_TOPIC_IN_BROKER, UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, DELETE_SUBSCRIPTIONGROUP
ADMIN_CODES_4_9_7: frozenset[int] = frozenset({17, 25, 215, 200, 207})

#: the requests plain producers and consumers send (Java MQClientAPIImpl's and the C++ client's
#: MQClientAPIImpl's, admin tools left out): the only codes that do not need admin
CLIENT_CODES: Mapping[int, str] = {
    10: "SEND_MESSAGE", 11: "PULL_MESSAGE", 12: "QUERY_MESSAGE", 14: "QUERY_CONSUMER_OFFSET",
    15: "UPDATE_CONSUMER_OFFSET", 29: "SEARCH_OFFSET_BY_TIMESTAMP", 30: "GET_MAX_OFFSET", 31: "GET_MIN_OFFSET",
    32: "GET_EARLIEST_MSG_STORETIME", 33: "VIEW_MESSAGE_BY_ID", 34: "HEART_BEAT", 35: "UNREGISTER_CLIENT",
    36: "CONSUMER_SEND_MSG_BACK", 37: "END_TRANSACTION", 38: "GET_CONSUMER_LIST_BY_GROUP", 41: "LOCK_BATCH_MQ",
    42: "UNLOCK_BATCH_MQ", 46: "CHECK_CLIENT_CONFIG", 105: "GET_ROUTEINFO_BY_TOPIC", 310: "SEND_MESSAGE_V2",
    320: "SEND_BATCH_MESSAGE", 324: "SEND_REPLY_MESSAGE", 325: "SEND_REPLY_MESSAGE_V2",
}
_CLIENT = frozenset(CLIENT_CODES)

SEND_MESSAGE, PULL_MESSAGE, QUERY_MESSAGE, UPDATE_CONSUMER_OFFSET = 10, 11, 12, 15
HEART_BEAT, UNREGISTER_CLIENT, CONSUMER_SEND_MSG_BACK, GET_CONSUMER_LIST_BY_GROUP = 34, 35, 36, 38
SEND_MESSAGE_V2, SEND_BATCH_MESSAGE = 310, 320


def needs_admin(code: int) -> bool:
    """Whether request code needs an admin account: every code but CLIENT_CODES."""
    return code not in _CLIENT


def _topic(out: dict[str, int], topic: str | None, perm: int) -> None:
    if topic is not None:  # addResourceAndPerm skips null
        out[topic] = perm


def _group(out: dict[str, int], group: Any, perm: int) -> None:
    if isinstance(group, str) and group:
        out[retry_topic(group)] = perm


def _send(out: dict[str, int], topic: str | None, group: str | None) -> None:
    if is_retry_topic(topic):
        assert topic is not None
        if group:
            _group(out, group, SUB)
        else:
            out[topic] = SUB
    else:
        _topic(out, topic, PUB)


def _heartbeat(out: dict[str, int], body: bytes | None) -> None:
    """HEART_BEAT: SUB on each consumer's group and each subscription's topic (HeartbeatData JSON)."""
    try:
        data = json.loads(bytes(body or b"").decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ValueError(f"the HEART_BEAT body is not HeartbeatData JSON ({type(exc).__name__})") from None
    if not isinstance(data, dict):
        raise ValueError("the HEART_BEAT body is not a HeartbeatData object")
    consumers = data.get("consumerDataSet") or []
    if not isinstance(consumers, list):
        raise ValueError("the HEART_BEAT body's consumerDataSet is not a list")
    for consumer in consumers:
        if not isinstance(consumer, dict):
            raise ValueError("the HEART_BEAT body's consumerDataSet holds something that is not ConsumerData")
        _group(out, consumer.get("groupName"), SUB)
        subs = consumer.get("subscriptionDataSet") or []
        if not isinstance(subs, list):
            raise ValueError("a ConsumerData's subscriptionDataSet is not a list")
        for sub in subs:
            topic = sub.get("topic") if isinstance(sub, dict) else None
            if isinstance(topic, str):
                out[topic] = SUB


def resources(code: int, fields: Mapping[str, str], body: bytes | None = None) -> dict[str, int]:
    """The resources (topics; groups as their retry topics) request code uses, with the
    permission each needs (PlainAccessValidator.parse). ValueError for a HEART_BEAT body that
    cannot be read."""
    out: dict[str, int] = {}
    get = fields.get
    if code == SEND_MESSAGE_V2 or code == SEND_BATCH_MESSAGE:
        _send(out, get("b"), get("a"))
    elif code == SEND_MESSAGE:
        _send(out, get("topic"), get("group"))
    elif code == PULL_MESSAGE:
        _topic(out, get("topic"), SUB)
        _group(out, get("consumerGroup"), SUB)
    elif code == CONSUMER_SEND_MSG_BACK:
        _group(out, get("group"), SUB)
    elif code == QUERY_MESSAGE:
        _topic(out, get("topic"), SUB)
    elif code == HEART_BEAT:
        _heartbeat(out, body)
    elif code == UNREGISTER_CLIENT or code == GET_CONSUMER_LIST_BY_GROUP:
        _group(out, get("consumerGroup"), SUB)
    elif code == UPDATE_CONSUMER_OFFSET:
        _group(out, get("consumerGroup"), SUB)
        _topic(out, get("topic"), SUB)
    return out


def offset_group(code: int, fields: Mapping[str, str]) -> str | None:
    """The consumer group whose offsets request code sets, for ``offset_refusal``, or
    None: an UPDATE_CONSUMER_OFFSET's consumerGroup. A PULL_MESSAGE carrying a commit
    (PullSysFlag's commit bit and a commitOffset of 0 or more, which the master stores as the
    group's offset) is not one: it keeps 4.9.7's rule, SUB on its topic and group, defaults
    included, so that consumers whose accounts have their groups by defaultGroupPerm work."""
    if code == UPDATE_CONSUMER_OFFSET:
        return fields.get("consumerGroup") or None
    return None


def offset_refusal(acl: PlainAcl, code: int, ext_fields: Mapping[str, str], remote_ip: str,
                   is_member: Callable[[str], bool]) -> str | None:
    """mqstore's step after ``check`` (module docstring), for a request it allowed: None when it
    may set its group's offsets, else the refusal's remark (NO_PERMISSION), naming the group.
    ``is_member(group)`` says whether the requesting client is a live consumer of group (the
    broker's controller answers it: a heartbeat on the client's connection registering a consumer
    of group, which the broker still holds). Allowed: a request that sets no group's offsets
    (``offset_group``), one whose address passed (globalWhiteRemoteAddresses, the account's
    whiteRemoteAddress), one whose account is admin or lists the group in groupPerms with SUB,
    and one from a live consumer of the group."""
    group = offset_group(code, ext_fields)
    if group is None:
        return None
    ip = normalize_ip(remote_ip)
    if acl.global_white and acl.in_global_white(ip):
        return None
    ak = ext_fields.get(ACCESS_KEY)
    account = acl.accounts.get(ak) if ak else None
    if account is not None:
        white = account.white_remote_address
        if (white is not NO_ADDRESS and white.match(ip)) or account.admin:
            return None
        perm, listed = account.perm_of(retry_topic(group))
        if listed and check_permission(SUB, perm):
            return None
    if is_member(group):
        return None
    whose = (f"accessKey={ak} is not admin and does not list {group} in groupPerms with SUB" if account is not None
             else f"the request has no account of the ACL (accessKey={ak})")
    return (f"setting the offsets of group:{group} (request code {code}) refused: this client is not one of "
            f"{group}'s consumers (no heartbeat on its connection registering a consumer of {group} that the "
            f"broker still holds), and {whose} (docs/security.md)")


def describe(resource: str) -> str:
    """PlainAccessResource.printStr: 'topic:T' or 'group:G'."""
    return f"group:{group_of(resource)}" if is_retry_topic(resource) else f"topic:{resource}"


def _check_perms(account: Account, code: int, needed: dict[str, int], admin: bool) -> str | None:
    """PlainPermissionManager.checkPerm."""
    ak = account.access_key
    if admin and not account.admin:
        return f"need admin permission for request code {code}, but accessKey={ak} is not admin"
    if not needed or (account.admin and not account.has_perms):
        return None
    for resource, perm in needed.items():
        owned, listed = account.perm_of(resource)
        if check_permission(perm, owned):
            continue
        what = describe(resource)
        group = is_retry_topic(resource)
        source = ("groupPerms" if group else "topicPerms") if listed else \
            ("defaultGroupPerm" if group else "defaultTopicPerm")
        need = "PUB" if perm == PUB else "SUB"
        if owned & 1:
            return f"{what} is DENY for accessKey={ak} (by its {source}): no {need} permission"
        return f"no {need} permission for {what}: accessKey={ak} has only {_owned(owned)} (by its {source})"
    return None


def _owned(perm: int) -> str:
    return "PUB" if perm == PUB else "SUB" if perm == SUB else "none"


def check(acl: PlainAcl, code: int, ext_fields: Mapping[str, str], body: bytes | None, remote_ip: str, *,
          admin: bool | None = None) -> str | None:
    """None when the request may go on; otherwise the refusal's remark, naming what was missing
    (PlainAccessValidator.validate's order, see the module docstring). remote_ip is the peer's
    address without its port ("10.0.0.1", "::1"). ``admin`` says whether the code needs an admin
    account (the broker's request table says it); None asks ``needs_admin(code)``."""
    if acl.global_white and acl.in_global_white(normalize_ip(remote_ip)):
        return None
    ak = ext_fields.get(ACCESS_KEY)
    if not ak:
        return (f"no AccessKey in the request (code {code}), and {remote_ip} is not in globalWhiteRemoteAddresses: "
                "the client needs credentials")
    account = acl.accounts.get(ak)
    if account is None:
        return f"no acl config for accessKey={ak}: no account of {acl.path or 'the ACL'} has this AccessKey"
    white = account.white_remote_address
    if white is not NO_ADDRESS and white.match(normalize_ip(remote_ip)):
        return None
    fields = ext_fields if isinstance(ext_fields, dict) else dict(ext_fields)
    if not signature_matches(fields, body, account.secret_bytes):
        return (f"check signature failed for accessKey={ak}: the Signature is not the HMAC-SHA1 of the request "
                "with the account's secretKey")
    try:
        needed = resources(code, ext_fields, body)
    except ValueError as exc:
        return f"cannot check the permissions of accessKey={ak}: {exc}"
    if needed.get(RMQ_SYS_TRACE_TOPIC) == PUB:
        return None
    return _check_perms(account, code, needed, needs_admin(code) if admin is None else admin)


class SendVerdicts:
    """check() for the sends, cheaper per request (the broker's hot path): what a send's
    permissions and addresses decided is kept per (ACL version, AccessKey, code, topic, group,
    remote address), so a send like one that passed needs only its signature checked again (or
    nothing, when the address passed without one). A refusal is never kept: check() says why each
    time. A new ACL version (a reload) starts afresh; at most ``limit`` verdicts are kept."""

    _CODES = {SEND_MESSAGE: ("topic", "group"), SEND_MESSAGE_V2: ("b", "a"), SEND_BATCH_MESSAGE: ("b", "a")}

    def __init__(self, limit: int = 10_000) -> None:
        self.limit = limit
        self._acl: PlainAcl | None = None
        self._kept: dict[tuple[Any, ...], Account | None] = {}  # None: passed by address, no signature needed

    def check(self, acl: PlainAcl, code: int, ext_fields: dict[str, str], body: bytes | None, remote_ip: str, *,
              admin: bool | None = None) -> str | None:
        names = self._CODES.get(code)
        if names is None:
            return check(acl, code, ext_fields, body, remote_ip, admin=admin)
        if acl is not self._acl:
            self._acl, self._kept = acl, {}
        ak = ext_fields.get(ACCESS_KEY)
        key = (ak, code, ext_fields.get(names[0]), ext_fields.get(names[1]), remote_ip, admin)
        if key in self._kept:
            kept = self._kept[key]
            if kept is None or signature_matches(ext_fields, body, kept.secret_bytes):
                return None
        refused = check(acl, code, ext_fields, body, remote_ip, admin=admin)
        if refused is None and ak:
            if len(self._kept) >= self.limit:
                self._kept.clear()
            account = acl.accounts.get(ak)
            addr = normalize_ip(remote_ip)
            white = (acl.global_white and acl.in_global_white(addr)) or (
                account is not None and account.white_remote_address.match(addr))
            self._kept[key] = None if white else account
        return refused
