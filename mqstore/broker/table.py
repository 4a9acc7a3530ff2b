"""Every request code the broker's fronts, its controller and the NameServer serve, declared once
(docs/rocketmq-remoting-spec.md §2.4, docs/security.md): who serves it, the handler that serves
it there, the header fields it cannot do without, its numeric fields with their Java type's
width, and what the ACL asks of the caller. ``mqstore.broker.requests.route`` reads this table
to route a request, check its header and its permission, and turn every error into a response
code; each server builds its map of handlers from this table once
(``mqstore.broker.requests.handlers_for``), so a server serves exactly its rows.

Field names are SendMessageRequestHeader's for the three send codes (a V2 or batch send's
one-letter names are read under them, ``codes.send_fields``).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from mqstore.broker import link
from mqstore.protocol import RequestCode as R

__all__ = ["Access", "REQUESTS", "RequestSpec", "Server", "spec"]


class Server(enum.Enum):
    """Where a request is served."""

    FRONT = "front"  # a front process, from the store it is attached to
    CONTROLLER = "controller"  # the broker's controller (a front forwards it over the link)
    NAMESRV = "namesrv"  # a NameServer
    LINK = "link"  # the controller, asked by its fronts over the link: never a client's
    PUSH = "push"  # a front, told by the controller over the link (Front._pushed): never a client's


class Access(enum.Enum):
    """What the ACL asks of the caller (docs/security.md)."""

    CLIENT = "client"  # a producer's or consumer's request: PUB / SUB on the topics and groups it names
    ADMIN = "admin"  # an account with admin: true
    BROKER = "broker"  # a broker's own account (a NameServer's registrations)
    ANY = "any"  # anyone who reaches the port (a NameServer's route look-ups)
    INTERNAL = "internal"  # refused from clients


_I, _L = 32, 64  # Java's Integer and Long


@dataclass(frozen=True)
class RequestSpec:
    """One request code: who serves it and with what, what its header must hold, who may send it."""

    code: int
    server: Server
    access: Access
    #: the name of its handler on its server: a method of Front or of BrokerController, a
    #: function of mqstore.broker.namesrv; called as handler(context, request)
    handler: str
    required: tuple[str, ...] = ()  # checked in this order: the first missing one is named
    numbers: Mapping[str, int] = field(default_factory=dict)  # field -> bits (32 Integer, 64 Long)
    #: the handler checks the header itself (the sends: their fast path is the check)
    checked_by_handler: bool = False

    @property
    def name(self) -> str:
        try:
            return R(self.code).name
        except ValueError:
            return f"LINK_{self.code}"


_SEND_NUMBERS = {"defaultTopicQueueNums": _I, "queueId": _I, "sysFlag": _I, "bornTimestamp": _L, "flag": _I,
                 "reconsumeTimes": _I, "maxReconsumeTimes": _I}


def _send(code: int) -> RequestSpec:
    return RequestSpec(code, Server.FRONT, Access.CLIENT, "send", ("producerGroup", "topic", "queueId"), _SEND_NUMBERS,
                       checked_by_handler=True)


def _queue(code: int) -> RequestSpec:
    return RequestSpec(code, Server.FRONT, Access.CLIENT, "_read", ("topic", "queueId"), {"queueId": _I})


def _broker(code: int, handler: str) -> RequestSpec:
    return RequestSpec(code, Server.NAMESRV, Access.BROKER, handler,
                       ("clusterName", "brokerAddr", "brokerName", "brokerId"), {"brokerId": _L})


_F, _C, _N, _K, _P = Server.FRONT, Server.CONTROLLER, Server.NAMESRV, Server.LINK, Server.PUSH
_CLIENT, _ADMIN = Access.CLIENT, Access.ADMIN

_TABLE = (
    # -- a front serves these from the store --------------------------------------------------------
    _send(R.SEND_MESSAGE),
    _send(R.SEND_MESSAGE_V2),
    _send(R.SEND_BATCH_MESSAGE),
    # SUB on the topic and the group, defaults included (4.9.7's rule), for a commit it carries too
    RequestSpec(R.PULL_MESSAGE, _F, _CLIENT, "_pull",
                required=("consumerGroup", "topic", "queueId", "queueOffset", "maxMsgNums", "sysFlag"),
                numbers={"queueId": _I, "queueOffset": _L, "maxMsgNums": _I, "sysFlag": _I, "commitOffset": _L,
                         "suspendTimeoutMillis": _L, "subVersion": _L}),
    RequestSpec(R.QUERY_MESSAGE, _F, _CLIENT, "_read", required=("topic", "key", "maxNum"),
                numbers={"maxNum": _I, "beginTimestamp": _L, "endTimestamp": _L}),
    _queue(R.GET_MAX_OFFSET),
    _queue(R.GET_MIN_OFFSET),
    _queue(R.GET_EARLIEST_MSG_STORETIME),
    RequestSpec(R.SEARCH_OFFSET_BY_TIMESTAMP, _F, _CLIENT, "_read", required=("topic", "queueId", "timestamp"),
                numbers={"queueId": _I, "timestamp": _L}),
    RequestSpec(R.VIEW_MESSAGE_BY_ID, _F, _CLIENT, "_read", required=("offset",), numbers={"offset": _L}),
    # -- the controller serves these (forwarded by a front) -----------------------------------------
    RequestSpec(R.HEART_BEAT, _C, _CLIENT, "_heartbeat"),
    RequestSpec(R.UNREGISTER_CLIENT, _C, _CLIENT, "_unregister_client"),
    RequestSpec(R.GET_CONSUMER_LIST_BY_GROUP, _C, _CLIENT, "_consumer_list", required=("consumerGroup",)),
    RequestSpec(R.QUERY_CONSUMER_OFFSET, _C, _CLIENT, "_query_offset", required=("consumerGroup", "topic", "queueId"),
                numbers={"queueId": _I}),
    # CLIENT's check in the front (SUB on the group and the topic, as 4.9.7), then the membership
    # check in the controller's handler (BrokerController._offset_membership_refusal: with the ACL
    # on, an admin account, the group in the account's groupPerms, or a live consumer of the group;
    # docs/security.md "Offsets are the group's"). A pull's commit keeps 4.9.7's rule (PULL_MESSAGE).
    RequestSpec(R.UPDATE_CONSUMER_OFFSET, _C, _CLIENT, "_update_offset",
                required=("consumerGroup", "topic", "queueId", "commitOffset"),
                numbers={"queueId": _I, "commitOffset": _L}),
    RequestSpec(R.CONSUMER_SEND_MSG_BACK, _C, _CLIENT, "_send_back", required=("group", "offset"),
                numbers={"offset": _L, "delayLevel": _I, "maxReconsumeTimes": _I}),
    RequestSpec(R.LOCK_BATCH_MQ, _C, _CLIENT, "_lock"),
    RequestSpec(R.UNLOCK_BATCH_MQ, _C, _CLIENT, "_unlock"),
    RequestSpec(R.UPDATE_AND_CREATE_TOPIC, _C, _ADMIN, "_update_topic", required=("topic",),
                numbers={"readQueueNums": _I, "writeQueueNums": _I, "perm": _I, "topicSysFlag": _I}),
    RequestSpec(R.GET_ALL_TOPIC_CONFIG, _C, _ADMIN, "_all_topics"),
    RequestSpec(R.GET_ALL_CONSUMER_OFFSET, _C, _ADMIN, "_all_offsets"),
    RequestSpec(R.GET_ALL_SUBSCRIPTIONGROUP_CONFIG, _C, _ADMIN, "_all_groups"),
    RequestSpec(R.GET_ALL_DELAY_OFFSET, _C, _ADMIN, "_all_delay_offsets"),
    RequestSpec(R.GET_BROKER_RUNTIME_INFO, _C, _ADMIN, "_runtime_info"),
    RequestSpec(R.GET_CONSUMER_CONNECTION_LIST, _C, _ADMIN, "_consumer_connections", required=("consumerGroup",)),
    # -- a NameServer ---------------------------------------------------------------------------------
    RequestSpec(R.GET_ROUTEINFO_BY_TOPIC, _N, Access.ANY, "_route", required=("topic",)),
    _broker(R.REGISTER_BROKER, "_register"),
    _broker(R.UNREGISTER_BROKER, "_unregister"),
    # -- the link's own (link.py): a front asks the controller --------------------------------------
    RequestSpec(link.HELLO, _K, Access.INTERNAL, "_hello"),
    RequestSpec(link.TOPIC_FOR_SEND, _K, Access.INTERNAL, "_topic_for_send", required=("topic",),
                numbers={"defaultTopicQueueNums": _I, "sysFlag": _I}),
    RequestSpec(link.GROUP, _K, Access.INTERNAL, "_group", required=("group",)),
    RequestSpec(link.CLOSED, _K, Access.INTERNAL, "_link_closed", required=("conn",)),
    RequestSpec(link.SUBSCRIPTION, _K, Access.INTERNAL, "_subscription", required=("group", "topic")),
    # -- ... and the controller tells a front (taken by the front's link client, not routed) ---------
    RequestSpec(link.TOPIC_CHANGED, _P, Access.INTERNAL, "_pushed"),
    RequestSpec(link.NOTIFY, _P, Access.INTERNAL, "_pushed"),
)

REQUESTS: Mapping[int, RequestSpec] = MappingProxyType({int(s.code): s for s in _TABLE})
"""code -> its RequestSpec, for every code served anywhere."""


def spec(code: int) -> RequestSpec | None:
    return REQUESTS.get(code)
