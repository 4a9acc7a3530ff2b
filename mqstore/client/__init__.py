"""A RocketMQ client for asyncio (docs/client.md): a producer and a pull consumer speaking RocketMQ
4.9.7's remoting protocol (docs/rocketmq-remoting-spec.md) to mqstore's broker or any RocketMQ
4.x broker and NameServer, and a blocking producer for programs without asyncio.

    from mqstore.client import Producer, PullConsumer, SyncProducer

It imports nothing from the broker or the store: only the compiled frame and record codecs, and
the request signature (mqstore.acl.signature) its ``credentials`` sign with.
"""

from __future__ import annotations

from mqstore.acl.signature import SessionCredentials
from mqstore.client.consumer import PullConsumer, parse_expression
from mqstore.client.errors import (ClientError, ClientStateError, ConnectFailedError, ConnectionClosedError,
                                   MessageDecodeError, MQClientError, ProtocolError, RemotingConnectionError,
                                   RemotingTimeoutError, RouteError)
from mqstore.client.message import (Message, MessageExt, PullResult, PullStatus, SendResult, SendStatus,
                                    UniqIdGenerator, decode_messages)
from mqstore.client.producer import Producer
from mqstore.client.protocol import RequestCode, ResponseCode
from mqstore.client.remoting import RemotingConnection
from mqstore.client.route import BrokerData, MessageQueue, QueueData, TopicRoute, parse_route_data
from mqstore.client.sync import SyncProducer

__all__ = ["BrokerData", "ClientError", "ClientStateError", "ConnectFailedError", "ConnectionClosedError",
           "MQClientError", "Message", "MessageDecodeError", "MessageExt", "MessageQueue", "ProtocolError",
           "Producer", "PullConsumer", "PullResult", "PullStatus", "QueueData", "RemotingConnection",
           "RemotingConnectionError", "RemotingTimeoutError", "RequestCode", "ResponseCode", "RouteError",
           "SendResult", "SessionCredentials", "SendStatus", "SyncProducer", "TopicRoute", "UniqIdGenerator", "decode_messages",
           "parse_expression", "parse_route_data"]
