"""Type stubs for the compiled ``mqstore.remoting._remoting`` (ext/mqstore/remoting/_remoting.pyx).

RocketMQ's remoting frame and its JSON and ROCKETMQ header serializations
(docs/rocketmq-remoting-spec.md §1). Twin: mqstore.twin.remoting.
"""

from typing import final

from typing_extensions import Buffer, disjoint_base

JSON: int
ROCKETMQ: int
FRAME_MAX: int
MAX_DEPTH: int
LANGUAGES: tuple[str, ...]

class FrameError(ValueError):
    """A frame or header that cannot be decoded: the connection that sent it is closed."""

@final
class RemotingCommand:
    """One request or response: header fields, extFields (str -> str) and body."""

    code: int
    language: str
    version: int
    opaque: int
    flag: int
    remark: str | None
    ext_fields: dict[str, str]
    body: bytes
    serialize_type: int
    def __init__(self, code: int, *, language: str = "PYTHON", version: int = 407, opaque: int = 0, flag: int = 0,
                 remark: str | None = None, ext_fields: dict[str, str] | None = None, body: bytes = b"",
                 serialize_type: int = 0) -> None: ...
    @property
    def is_response(self) -> bool:
        """Bit 0 of flag (RPC_TYPE)."""
    @property
    def is_oneway(self) -> bool:
        """Bit 1 of flag (RPC_ONEWAY)."""
    def header_tuple(self) -> tuple[int, str, int, int, int, str | None, dict[str, str]]:
        """(code, language, version, opaque, flag, remark, ext_fields), the twin's form."""
    def encode(self, serialize_type: int | None = None) -> bytes:
        """The whole frame (totalLength included), its header in `serialize_type` (default: the
        one the command has)."""

def decode_frame(frame: Buffer) -> RemotingCommand:
    """The command of one whole frame (totalLength included); FrameError naming the problem."""

def decode_header(header: Buffer, serialize_type: int) -> tuple[int, str, int, int, int, str | None, dict[str, str]]:
    """(code, language, version, opaque, flag, remark, ext_fields) of a header alone."""

@disjoint_base
class FrameReader:
    """Frames out of a byte stream: feed() what the socket gave, then next() until None."""

    def feed(self, data: Buffer) -> None: ...
    @property
    def buffered(self) -> int:
        """Bytes received and not yet taken as frames."""
    def next(self) -> RemotingCommand | None:
        """The next whole frame's command, or None until more bytes arrive."""
