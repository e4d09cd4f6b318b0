"""`laya-grpc decide --questions` takes inline JSON as well as a file, and says plainly when no
gateway listens (no gateway is started here: the call fails after parsing its input)."""
from __future__ import annotations

import socket

from laya_grpc.cli.main import main

Q = '{"angry": {"type": "noul", "instructions": "Is the customer angry?"}}'


def _dead_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return "127.0.0.1:%d" % s.getsockname()[1]


def test_inline_questions_are_parsed_and_a_missing_gateway_is_named(capsys):
    address = _dead_address()
    rc = main(["decide", "My phone arrived broken.", "--questions", Q, "--address", address, "--timeout", "0.5"])
    err = capsys.readouterr().err
    assert rc == 1 and "no gateway answered at %s" % address in err and "retry shortly" not in err, err


def test_inline_questions_that_are_not_json_are_a_usage_error(capsys):
    rc = main(["decide", "x", "--questions", '{"angry": ', "--address", _dead_address()])
    assert rc == 2 and "laya-grpc decide:" in capsys.readouterr().err
