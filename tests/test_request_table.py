"""The request table (mqstore.broker.table) is each server's contract: a front, the controller and
the NameServer build their maps of handlers from it (mqstore.broker.requests.handlers_for), so
every code a server's rows list has its handler there, every handler is a row's, and a code not
in a server's rows is REQUEST_CODE_NOT_SUPPORTED naming it."""

from __future__ import annotations

import inspect
import logging
from typing import Any

import pytest

from mqstore.remoting._remoting import RemotingCommand
from mqstore.broker import link, namesrv
from mqstore.broker.controller import BrokerController
from mqstore.broker.front import Front, _not_a_namesrv
from mqstore.broker.limits import LogLimiter
from mqstore.broker.namesrv import NameServer
from mqstore.broker.requests import handlers_for, route
from mqstore.broker.table import REQUESTS, Server
from mqstore.protocol import RequestCode, ResponseCode

UNKNOWN = 999  # no row of the table


def _rows(*servers: Server) -> dict[int, str]:
    return {code: spec.handler for code, spec in REQUESTS.items() if spec.server in servers}


def _front() -> Front:
    """A Front as far as serving a request goes (no store, no sockets)."""
    front = Front.__new__(Front)
    front.handlers = front._handlers()
    front.guard = None
    front.refusals = LogLimiter(logging.getLogger("test"))
    return front


def _handler_shaped(namespace: dict[str, Any], params: list[str]) -> set[str]:
    """The functions of a class or module that take what a handler takes."""
    return {name for name, f in namespace.items()
            if inspect.isfunction(f) and list(inspect.signature(f).parameters) == params}


def test_the_front_serves_its_rows_forwards_the_controllers_and_refuses_the_namesrvs():
    handlers = _front()._handlers()
    assert set(handlers) == set(_rows(Server.FRONT, Server.CONTROLLER, Server.NAMESRV))
    for code, handler in handlers.items():
        spec = REQUESTS[code]
        if spec.server is Server.FRONT:
            assert handler.__func__ is getattr(Front, spec.handler), spec.name  # type: ignore[attr-defined]
        elif spec.server is Server.CONTROLLER:
            assert handler.__func__ is Front._forward, spec.name  # type: ignore[attr-defined]
        else:
            assert handler is _not_a_namesrv, spec.name


def test_the_controller_serves_its_rows_and_the_links():
    handlers = BrokerController._handlers
    assert set(handlers) == set(_rows(Server.CONTROLLER, Server.LINK))
    for code, handler in handlers.items():
        assert handler is getattr(BrokerController, REQUESTS[code].handler), REQUESTS[code].name


def test_the_namesrv_serves_its_rows():
    handlers = NameServer._handlers
    assert set(handlers) == set(_rows(Server.NAMESRV))
    for code, handler in handlers.items():
        assert handler is getattr(namesrv, REQUESTS[code].handler), REQUESTS[code].name


def test_every_handler_is_a_rows():
    """A handler written but never declared in the table would never be served: every function
    shaped as a handler is named by a row of its server (the few that are not handlers named)."""
    assert _handler_shaped(vars(BrokerController), ["self", "cmd"]) - {"handle"} == \
        set(_rows(Server.CONTROLLER, Server.LINK).values())
    assert _handler_shaped(vars(namesrv), ["conn", "cmd"]) == set(_rows(Server.NAMESRV).values())
    not_handlers = {"dispatch",  # serves a frame through the table
                    "_send_fast",  # the sends' fast path, inside send
                    "_forward"}  # the controller's codes, passed (not a row's)
    assert _handler_shaped(vars(Front), ["self", "conn", "cmd"]) - not_handlers == set(_rows(Server.FRONT).values())
    for code, name in _rows(Server.PUSH).items():  # the front's link client takes these
        assert callable(getattr(Front, name)), REQUESTS[code].name


def test_a_row_whose_handler_is_missing_fails_at_start_naming_it():
    class Empty:
        pass

    with pytest.raises(LookupError, match=r"HEART_BEAT \(34\) on the controller with '_heartbeat', which Empty"):
        handlers_for(Empty, Server.CONTROLLER)
    with pytest.raises(LookupError, match=r"GET_ROUTEINFO_BY_TOPIC \(105\) .* '_route', which a_module"):
        handlers_for({"__name__": "a_module"}, Server.NAMESRV)


def _request(code: int) -> RemotingCommand:
    return RemotingCommand(code, opaque=7, ext_fields={"topic": "T", "queueId": "0"})


def _assert_not_supported(answer: RemotingCommand | None, code: int) -> None:
    assert answer is not None and answer.opaque == 7, code
    assert answer.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED, (code, answer.code, answer.remark)
    assert f"request type {code} not supported" in (answer.remark or ""), answer.remark


@pytest.mark.parametrize("code", [RequestCode.PULL_MESSAGE, RequestCode.SEND_MESSAGE, RequestCode.REGISTER_BROKER,
                                  RequestCode.GET_ROUTEINFO_BY_TOPIC, link.TOPIC_CHANGED, link.NOTIFY, UNKNOWN])
def test_the_controller_answers_a_code_not_in_its_rows_not_supported(code):
    controller = BrokerController.__new__(BrokerController)
    controller.errors = LogLimiter(logging.getLogger("test"))
    _assert_not_supported(controller.handle(_request(code)), code)


@pytest.mark.parametrize("code", [RequestCode.SEND_MESSAGE, RequestCode.HEART_BEAT, RequestCode.UPDATE_AND_CREATE_TOPIC,
                                  link.HELLO, link.TOPIC_CHANGED, UNKNOWN])
def test_the_namesrv_answers_a_code_not_in_its_rows_not_supported(code):
    _assert_not_supported(NameServer("127.0.0.1", 0).handle(_request(code), None), code)  # type: ignore[arg-type]


@pytest.mark.parametrize("code", [link.HELLO, link.TOPIC_FOR_SEND, link.CLOSED, link.TOPIC_CHANGED, link.NOTIFY,
                                  UNKNOWN])
def test_a_front_answers_a_code_not_in_its_rows_not_supported(code):
    front = _front()
    answers: list[RemotingCommand] = []

    class Conn:
        write = answers.append

    front.dispatch(Conn(), _request(code))  # type: ignore[arg-type]
    assert len(answers) == 1
    _assert_not_supported(answers[0], code)
    # and route says the same for every code outside the front's map
    _assert_not_supported(route(_request(code), front.handlers, None), code)
