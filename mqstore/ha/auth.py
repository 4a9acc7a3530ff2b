"""The HA link's handshake (docs/replication.md "The handshake"): before a master with
``inner_secret_key`` reads a report, counts an acknowledgement or sends a byte of its CommitLog,
the slave proves it holds the broker account (``inner_access_key`` / ``inner_secret_key``), and
the master proves the same to the slave, so neither side takes anything from an impostor.
RocketMQ 4.9.7 has no such step; a master without ``inner_secret_key`` skips it (any slave).

Every message starts with ``MAGIC`` (10 bytes), the version (1 byte) and its kind (1 byte):

    master -> slave  challenge  MAGIC 1 'C' | nonce (16 random bytes)                   28 bytes
    slave -> master  response   MAGIC 1 'R' | slave nonce (16) | key length (1)
                                | access key (UTF-8) | signature (20)                 49 + key
    master -> slave  answer     MAGIC 1 'A' | status (1: 0 accepted, 1 refused)
                                | signature (20; zeros when refused)                  33 bytes

The slave's signature is HMAC-SHA1 with the secret over ``SLAVE_LABEL`` + the master's nonce +
the slave's nonce + the access key; the master's over ``MASTER_LABEL`` and the same. Both nonces
are fresh per connection (no replay), the labels differ (a side's own signature cannot be
reflected back to it).

Why these bytes: ``MAGIC`` starts with 0xff, so as the first 8 bytes of a frame header it is a
negative CommitLog offset, which no master sends; and the challenge's bytes 8-11 (the header's
bodySize) read as about 1.2 GB, so a RocketMQ slave waits for a body that never comes instead of
appending anything, and the master closes it. A RocketMQ slave's 8-byte offset report is not
``MAGIC``, so the master closes it at once with one line saying why.

The socket work goes through ``recv`` / ``sendall`` / ``settimeout`` only, so a TLS-wrapped
socket does as well as a plain one: with TLS on the HA port (``tls_server_mode``, ``tls_enable``)
the handshake runs inside it, after the TLS handshake and within the same time limit from the
connection on.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import socket
import time

from mqstore.tls import TLS_RECORD_HANDSHAKE

__all__ = ["ACCEPTED", "ANSWER_SIZE", "CHALLENGE_SIZE", "HANDSHAKE_TIMEOUT_S", "HandshakeError", "MAGIC",
           "HandshakeTimeout", "REFUSED", "VERSION", "answer", "authenticate_master", "authenticate_slave", "challenge",
           "is_handshake", "master_signature", "parse_answer", "parse_challenge", "response", "slave_signature"]

MAGIC = b"\xffMQSTOREHA"
VERSION = 1
KIND_CHALLENGE = b"C"
KIND_RESPONSE = b"R"
KIND_ANSWER = b"A"
PREAMBLE_SIZE = len(MAGIC) + 2
NONCE_SIZE = 16
SIGNATURE_SIZE = 20  # HMAC-SHA1
REPORT_SIZE = 8  # a slave's offset report (mqstore.ha._ha.REPORT_SIZE)
CHALLENGE_SIZE = PREAMBLE_SIZE + NONCE_SIZE
ANSWER_SIZE = PREAMBLE_SIZE + 1 + SIGNATURE_SIZE
ACCEPTED = 0
REFUSED = 1
SLAVE_LABEL = b"mqstore HA slave\n"
MASTER_LABEL = b"mqstore HA master\n"
#: the whole handshake must be over within this many seconds of the connection (a peer that
#: sends nothing, or a byte at a time, is closed then)
HANDSHAKE_TIMEOUT_S = 5.0


class HandshakeError(Exception):
    """The handshake failed; the message says why in a few words (for one log line)."""


class HandshakeTimeout(HandshakeError):
    """The peer did not send its part of the handshake in time; ``received``: the bytes it did."""

    def __init__(self, received: int, timeout_s: float) -> None:
        self.received = received
        what = "nothing" if received == 0 else "only part"
        super().__init__(f"sent {what} of the HA handshake within {timeout_s:g} s")


def _preamble(kind: bytes) -> bytes:
    return MAGIC + bytes((VERSION,)) + kind


def is_handshake(data: bytes | bytearray | memoryview) -> bool:
    """Whether data starts like a handshake message (only MAGIC is looked at)."""
    return bytes(data[:len(MAGIC)]) == MAGIC


def _check_preamble(data: bytes, kind: bytes, what: str) -> None:
    if not is_handshake(data):
        raise HandshakeError(f"sent bytes that are not the HA handshake's {what}")
    if data[len(MAGIC)] != VERSION:
        raise HandshakeError(f"speaks version {data[len(MAGIC)]} of the HA handshake, this side {VERSION}")
    if data[len(MAGIC) + 1:PREAMBLE_SIZE] != kind:
        raise HandshakeError(f"sent a handshake message of kind {data[len(MAGIC) + 1:PREAMBLE_SIZE]!r} where its "
                             f"{what} ({kind!r}) belongs")


def _signature(label: bytes, secret_key: str, master_nonce: bytes, slave_nonce: bytes, access_key: str) -> bytes:
    content = label + master_nonce + slave_nonce + access_key.encode("utf-8")
    return hmac.new(secret_key.encode("utf-8"), content, hashlib.sha1).digest()


def slave_signature(secret_key: str, master_nonce: bytes, slave_nonce: bytes, access_key: str) -> bytes:
    return _signature(SLAVE_LABEL, secret_key, master_nonce, slave_nonce, access_key)


def master_signature(secret_key: str, master_nonce: bytes, slave_nonce: bytes, access_key: str) -> bytes:
    return _signature(MASTER_LABEL, secret_key, master_nonce, slave_nonce, access_key)


# -- the codec -------------------------------------------------------------------------------------
def challenge(nonce: bytes) -> bytes:
    if len(nonce) != NONCE_SIZE:
        raise ValueError(f"a nonce is {NONCE_SIZE} bytes, not {len(nonce)}")
    return _preamble(KIND_CHALLENGE) + nonce


def parse_challenge(data: bytes) -> bytes:
    """The master's nonce of a CHALLENGE_SIZE-byte challenge."""
    _check_preamble(data, KIND_CHALLENGE, "challenge")
    return data[PREAMBLE_SIZE:CHALLENGE_SIZE]


def response(master_nonce: bytes, slave_nonce: bytes, access_key: str, secret_key: str) -> bytes:
    key = access_key.encode("utf-8")
    if len(key) > 255:
        raise ValueError(f"an access key of {len(key)} bytes is too long for the HA handshake (255 at most)")
    return (_preamble(KIND_RESPONSE) + slave_nonce + bytes((len(key),)) + key
            + slave_signature(secret_key, master_nonce, slave_nonce, access_key))


def answer(status: int, signature: bytes = bytes(SIGNATURE_SIZE)) -> bytes:
    return _preamble(KIND_ANSWER) + bytes((status,)) + signature


def parse_answer(data: bytes) -> tuple[int, bytes]:
    """(status, signature) of an ANSWER_SIZE-byte answer."""
    _check_preamble(data, KIND_ANSWER, "answer")
    return data[PREAMBLE_SIZE], data[PREAMBLE_SIZE + 1:ANSWER_SIZE]


# -- over a socket ---------------------------------------------------------------------------------
class _Deadline:
    """The handshake's one time limit, from the connection on (``started``, a time.monotonic();
    now when None)."""

    def __init__(self, timeout_s: float, started: float | None = None) -> None:
        self.timeout_s = timeout_s
        self.at = (time.monotonic() if started is None else started) + timeout_s
        self.received = 0

    def recv_exact(self, sock: socket.socket, n: int, got: bytes = b"") -> bytes:
        """n bytes (got: the first ones, already read); HandshakeError when the peer closes,
        HandshakeTimeout when the time is up."""
        data = bytearray(got)
        while len(data) < n:
            left = self.at - time.monotonic()
            if left <= 0:
                raise HandshakeTimeout(self.received, self.timeout_s)
            sock.settimeout(left)
            try:
                chunk = sock.recv(n - len(data))
            except TimeoutError:
                raise HandshakeTimeout(self.received, self.timeout_s) from None
            if not chunk:
                raise HandshakeError("closed the connection during the HA handshake")
            data += chunk
            self.received += len(chunk)
        return bytes(data)


def authenticate_slave(sock: socket.socket, access_key: str, secret_key: str,
                       timeout_s: float = HANDSHAKE_TIMEOUT_S, *, started: float | None = None) -> str:
    """The master's side: challenge the slave, check its access key (this broker's
    ``access_key``) and signature, prove this side holds the secret too. Returns the slave's
    access key; HandshakeError (why, in a few words) when it does not belong. The time limit
    counts from ``started`` (a time.monotonic(): the connection, when a TLS handshake came
    first), else from now. The socket is left blocking (no timeout)."""
    deadline = _Deadline(timeout_s, started)
    master_nonce = secrets.token_bytes(NONCE_SIZE)
    sock.sendall(challenge(master_nonce))
    first = deadline.recv_exact(sock, REPORT_SIZE)  # what a slave without the handshake sends first
    if first[0] == TLS_RECORD_HANDSHAKE:
        raise HandshakeError("started a TLS handshake on a connection this master serves in plain (tls_server_mode "
                             "disabled, or permissive and its ClientHello came late)")
    if first != MAGIC[:REPORT_SIZE]:
        raise HandshakeError("sent no HA handshake (an 8-byte offset report: a slave without inner_access_key / "
                             "inner_secret_key, or a RocketMQ slave, which a master with inner_secret_key does "
                             "not serve)")
    head = deadline.recv_exact(sock, PREAMBLE_SIZE + NONCE_SIZE + 1, first)
    _check_preamble(head, KIND_RESPONSE, "response")
    slave_nonce = head[PREAMBLE_SIZE:PREAMBLE_SIZE + NONCE_SIZE]
    rest = deadline.recv_exact(sock, head[-1] + SIGNATURE_SIZE)
    try:
        their_key = rest[:head[-1]].decode("utf-8")
    except UnicodeDecodeError:
        raise HandshakeError("sent an access key that is not UTF-8") from None
    if not hmac.compare_digest(their_key.encode("utf-8"), access_key.encode("utf-8")):
        sock.sendall(answer(REFUSED))
        raise HandshakeError(f"gave the access key {their_key!r}, not this broker's inner_access_key")
    expected = slave_signature(secret_key, master_nonce, slave_nonce, access_key)
    if not hmac.compare_digest(rest[head[-1]:], expected):
        sock.sendall(answer(REFUSED))
        raise HandshakeError(f"signed with another secret than this broker's inner_secret_key (access key "
                             f"{their_key!r})")
    sock.sendall(answer(ACCEPTED, master_signature(secret_key, master_nonce, slave_nonce, access_key)))
    sock.settimeout(None)
    return their_key


def authenticate_master(sock: socket.socket, access_key: str, secret_key: str,
                        timeout_s: float = HANDSHAKE_TIMEOUT_S) -> None:
    """The slave's side: answer the master's challenge with the broker account and check the
    master's proof that it holds the same secret. HandshakeError (why, in a few words, of the
    master) when the master does not ask, refuses, or cannot prove it. The socket is left
    blocking (no timeout)."""
    deadline = _Deadline(timeout_s)
    try:
        data = deadline.recv_exact(sock, CHALLENGE_SIZE)
    except HandshakeTimeout as exc:
        if exc.received == 0:
            raise HandshakeError(f"did not start the HA handshake within {timeout_s:g} s (a master without "
                                 "inner_secret_key, or a RocketMQ master: a slave with inner_secret_key follows only "
                                 "a master that proves it holds it)") from None
        raise
    master_nonce = parse_challenge(data)
    slave_nonce = secrets.token_bytes(NONCE_SIZE)
    sock.sendall(response(master_nonce, slave_nonce, access_key, secret_key))
    status, signature = parse_answer(deadline.recv_exact(sock, ANSWER_SIZE))
    if status != ACCEPTED:
        raise HandshakeError("refused this slave's inner_access_key / inner_secret_key (the master has another "
                             "broker account)")
    if not hmac.compare_digest(signature, master_signature(secret_key, master_nonce, slave_nonce, access_key)):
        raise HandshakeError("could not prove it holds this slave's inner_secret_key: not following it")
    sock.settimeout(None)
