"""Certificates for TLS tests, made by the test (the ``cryptography`` package): a CA, a server
certificate for 127.0.0.1 / localhost signed by it, a client certificate, and a second CA that
signed nothing the servers trust."""

from __future__ import annotations

import datetime
import ipaddress
import socket
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from mqstore.remoting._remoting import FrameReader, RemotingCommand


@dataclass(frozen=True)
class Pki:
    ca: str  # PEM paths
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str
    other_ca: str  # a CA that signed none of the above


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write(path: Path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _ca(cn: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(_name(cn)).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    return cert, key


def _leaf(cn: str, ca: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey,
          server: bool) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(ca.subject).public_key(key.public_key())
               .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
               .not_valid_after(now + datetime.timedelta(days=30)))
    if server:
        builder = builder.add_extension(x509.SubjectAlternativeName([
            x509.DNSName("localhost"), x509.IPAddress(ipaddress.IPv4Address("127.0.0.1"))]), critical=False)
    return builder.sign(ca_key, hashes.SHA256()), key


def make_pki(directory: Path) -> Pki:
    directory.mkdir(parents=True, exist_ok=True)
    ca, ca_key = _ca("mqstore test CA")
    server, server_key = _leaf("mqstore test broker", ca, ca_key, server=True)
    client, client_key = _leaf("mqstore test client", ca, ca_key, server=False)
    other, _ = _ca("another CA")
    pem = serialization.Encoding.PEM
    return Pki(ca=_write(directory / "ca.pem", ca.public_bytes(pem)),
               server_cert=_write(directory / "server.pem", server.public_bytes(pem)),
               server_key=_write(directory / "server.key", _key_pem(server_key)),
               client_cert=_write(directory / "client.pem", client.public_bytes(pem)),
               client_key=_write(directory / "client.key", _key_pem(client_key)),
               other_ca=_write(directory / "other-ca.pem", other.public_bytes(pem)))


def exchange(sock: socket.socket, cmd: RemotingCommand) -> RemotingCommand | None:
    """cmd over sock (plain or TLS); its answer, or None when the server closed the connection."""
    sock.sendall(cmd.encode())
    frames = FrameReader()
    while (answer := frames.next()) is None:
        try:
            data = sock.recv(65536)
        except (ConnectionError, ssl.SSLError):
            return None
        if not data:
            return None
        frames.feed(data)
    return answer
