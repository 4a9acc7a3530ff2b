"""What the client raises. Every error names its cause: the response code and remark the broker
or NameServer sent, or the address a connection failed with."""

from __future__ import annotations

from mqstore.client.protocol import code_name, request_name

__all__ = ["ClientError", "ClientStateError", "ConnectFailedError", "ConnectionClosedError", "MQClientError",
           "MessageDecodeError", "ProtocolError", "RemotingConnectionError", "RemotingTimeoutError", "RouteError"]


class ClientError(Exception):
    """Base of every error of ``mqstore.client``."""


class MQClientError(ClientError):
    """A broker or NameServer answered a request with an error code (RocketMQ's
    MQBrokerException / MQClientException): ``code`` (an int; ``code_name`` says which
    ResponseCode), ``remark`` (the server's explanation), ``address`` and ``request`` (the
    request code) when known."""

    def __init__(self, code: int, remark: str | None, *, address: str | None = None,
                 request: int | None = None) -> None:
        self.code = int(code)
        self.remark = remark
        self.address = address
        self.request = request
        where = f" from {address}" if address else ""
        what = f" to {request_name(request)}" if request is not None else ""
        super().__init__(f"{code_name(self.code)}{where}{what}: {remark if remark else '(no remark)'}")

    @property
    def code_name(self) -> str:
        return code_name(self.code)


class RouteError(ClientError):
    """A topic's route cannot be used: unreadable route data, no queue to send to or pull from."""


class ProtocolError(ClientError):
    """A response that lacks a field its request needs, or has one that is not what it must be."""


class ClientStateError(ClientError, RuntimeError):
    """The producer or consumer is not started, or already closed."""


class MessageDecodeError(ClientError):
    """A pull response body that does not hold whole, valid CommitLog records (spec §2.6)."""


class RemotingConnectionError(ClientError, ConnectionError):
    """A connection problem with ``address``: it could not be made, or it closed."""

    def __init__(self, message: str, address: str) -> None:
        super().__init__(message)
        self.address = address


class ConnectFailedError(RemotingConnectionError):
    """The TCP connection to ``address`` could not be made."""


class ConnectionClosedError(RemotingConnectionError):
    """The connection to ``address`` closed (by the peer, by a bad frame, or by ``close()``) while
    a request was in flight or when one was about to be sent."""


class RemotingTimeoutError(ClientError, TimeoutError):
    """No response from ``address`` to a request within ``timeout`` seconds."""

    def __init__(self, message: str, address: str, timeout: float) -> None:
        super().__init__(message)
        self.address = address
        self.timeout = timeout
