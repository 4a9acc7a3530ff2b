"""What every request handler of the broker needs (docs/rocketmq-remoting-spec.md §2.4, §5):
header fields read as RocketMQ reads them (a missing field, a number that is not one of its Java
type, both named in a SYSTEM_ERROR), the response to a request, and ``route``, the one function
that serves a request through the request table (mqstore.broker.table). Shared by the front
processes, the controller and the NameServer."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from mqstore.remoting._remoting import RemotingCommand
from mqstore.broker.limits import LogLimiter
from mqstore.broker.table import REQUESTS, RequestSpec, Server
from mqstore.protocol import VERSION, ResponseCode

__all__ = ["BadBody", "BadField", "Guard", "Handler", "check_header", "field", "handlers_for", "int_field",
           "not_supported", "parse_number", "response", "route", "wall_ms"]

log = logging.getLogger("mqstore.broker")


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


class BadField(ValueError):
    """A request header field that is missing or not what its type needs (SYSTEM_ERROR naming it)."""

    code: int = ResponseCode.SYSTEM_ERROR


class BadBody(BadField):
    """A send's body that cannot hold what its header says (MESSAGE_ILLEGAL naming why)."""

    code = ResponseCode.MESSAGE_ILLEGAL


def field(fields: dict[str, str], name: str) -> str:
    value = fields.get(name)
    if value is None:
        raise BadField(f"the custom field <{name}> is null")
    return value


_I, _L = 32, 64
#: the Long fields of every request header (any other numeric field is an Integer)
_LONG_FIELDS = frozenset(name for spec in REQUESTS.values() for name, bits in spec.numbers.items() if bits == _L)


def parse_number(name: str, value: str, bits: int | None = None) -> int:
    """A header field's text as Java's Integer.parseInt / Long.parseLong read it (an optional sign,
    then decimal digits, within the type's range); BadField naming the field otherwise."""
    if bits is None:
        bits = _L if name in _LONG_FIELDS else _I
    # the common case first: a few ASCII digits always fit (9 an Integer, 18 a Long)
    if value.isascii() and value.isdigit() and len(value) <= (9 if bits == _I else 18):
        return int(value)
    digits = value[1:] if value[:1] in ("-", "+") else value
    if not digits.isdecimal():
        raise BadField(f"the custom field <{name}> is not a number: {value[:64]!r}")
    # no int() of thousands of digits (Python refuses past 4300): 19 significant digits is the most
    number = int(value) if len(digits.lstrip("0")) <= 19 else 1 << 64
    if not -(1 << (bits - 1)) <= number < 1 << (bits - 1):
        kind = "an Integer (32-bit)" if bits == _I else "a Long (64-bit)"
        raise BadField(f"the custom field <{name}> is out of range for {kind}: {value[:64]!r}")
    return number


def check_header(code: int, fields: dict[str, str]) -> None:
    """The request's header as its table entry (mqstore.broker.table) needs it: every required
    field present, then every numeric field it carries a number of its type (BadField naming the
    first that is not); ``fields`` under the header's long names (``send_fields`` for V2 sends).
    RocketMQ parses every field of a request's header class before serving it, so a value that is
    not a number of its type fails the request whether or not the processor goes on to use it."""
    spec = REQUESTS.get(code)
    if spec is None:
        return
    for name in spec.required:
        if name not in fields:
            raise BadField(f"the custom field <{name}> is null")
    for name, bits in spec.numbers.items():
        value = fields.get(name)
        if value is not None:
            parse_number(name, value, bits)


#: a request handler: (the server's context, e.g. the client's connection, the request) -> the
#: response, or None when it answers by itself (later, or never: a oneway request)
Handler = Callable[[Any, RemotingCommand], "RemotingCommand | None"]
#: the ACL's column: (the request's entry, the request, the context) -> why it is refused, or None
Guard = Callable[[RequestSpec, RemotingCommand, Any], "str | None"]


def handlers_for(owner: Any, *served: Server, passed: Mapping[Server, Handler] | None = None) -> dict[int, Handler]:
    """A server's map of handlers, built from the request table once, when it starts: every code
    whose row says one of ``served`` serves it, with the handler the row names, looked up on
    ``owner`` (an object or a class by attribute, a namespace such as ``globals()`` by key); and
    every code of a server in ``passed`` with the one handler given for that server (a front
    forwards the controller's codes and refuses the NameServer's). A row whose handler ``owner``
    lacks is a LookupError naming the row, so a map cannot drift from the table."""
    out: dict[int, Handler] = {}
    for code, spec in REQUESTS.items():
        if spec.server in served:
            try:
                out[code] = owner[spec.handler] if isinstance(owner, Mapping) else getattr(owner, spec.handler)
            except (KeyError, AttributeError):
                name = (owner.get("__qualname__") or owner.get("__name__") if isinstance(owner, Mapping)
                        else getattr(owner, "__name__", None))  # a class body's namespace, a module's
                raise LookupError(f"the request table serves {spec.name} ({code}) on the {spec.server.value} with "
                                  f"{spec.handler!r}, which {name or type(owner).__name__} does not have") from None
        elif passed is not None and spec.server in passed:
            out[code] = passed[spec.server]
    return out


def not_supported(cmd: RemotingCommand, why: str = "") -> RemotingCommand:
    return response(cmd, ResponseCode.REQUEST_CODE_NOT_SUPPORTED, f" request type {cmd.code} not supported{why}")


def route(cmd: RemotingCommand, handlers: Mapping[int, Handler], ctx: Any, *, guard: Guard | None = None,
          errors: LogLimiter | None = None) -> RemotingCommand | None:
    """The one way every server of the broker serves a request (docs/security.md): a code this
    server has no handler for is REQUEST_CODE_NOT_SUPPORTED; the header is checked as its table
    entry says (unless the handler checks it); the guard (the ACL) may refuse it with
    NO_PERMISSION naming what is missing; then its handler serves it. Every error becomes a
    response: a bad field or body its code and text, anything else SYSTEM_ERROR naming it (logged,
    within ``errors``' budget). A response frame is dropped (None)."""
    if cmd.is_response:
        return None
    code = cmd.code
    handler = handlers.get(code)
    if handler is None:
        return not_supported(cmd)
    spec = REQUESTS[code]
    try:
        if not spec.checked_by_handler:
            check_header(code, cmd.ext_fields)
        if guard is not None:
            refused = guard(spec, cmd, ctx)
            if refused is not None:
                return response(cmd, ResponseCode.NO_PERMISSION, refused)
        return handler(ctx, cmd)
    except BadField as exc:
        return response(cmd, exc.code, str(exc))
    except ValueError as exc:
        return response(cmd, ResponseCode.SYSTEM_ERROR, str(exc))
    except Exception as exc:  # one request's failure answers that request, never the connection
        if errors is not None:
            errors.exception("request %d (%s) failed", code, spec.name)
        else:
            log.exception("request %d (%s) failed", code, spec.name)
        return response(cmd, ResponseCode.SYSTEM_ERROR, f"{type(exc).__name__}: {exc}")


def int_field(fields: dict[str, str], name: str, default: int | None = None) -> int:
    value = fields.get(name)
    if value is None:
        if default is not None:
            return default
        raise BadField(f"the custom field <{name}> is null")
    return parse_number(name, value)


def response(request: RemotingCommand, code: int, remark: str | None = None, *,
             ext_fields: dict[str, str] | None = None, body: bytes = b"") -> RemotingCommand:
    """The response to `request`: its opaque, the response flag, in its serialization."""
    return RemotingCommand(code, language="JAVA", version=VERSION, opaque=request.opaque, flag=1, remark=remark,
                           ext_fields=ext_fields, body=body, serialize_type=request.serialize_type)
