"""Standard input is read with the checks of a named file: a NUL byte (a binary file, or UTF-16
read as UTF-8) is refused naming its line, whole or line by line (``--unbuffered``), where it
was translated as text."""

from __future__ import annotations

import io
import sys

import pytest

from transduce.cli.common import read_input
from transduce.cli.decoding_tools import answer_lines
from transduce.errors import UserError


def _stdin(data: bytes) -> io.TextIOWrapper:
    return io.TextIOWrapper(io.BytesIO(data), encoding="utf-8")


def test_a_nul_byte_on_stdin_is_refused_naming_its_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdin", _stdin(b"fine\na\x00b\n"))
    with pytest.raises(UserError, match=r"<stdin>: line 2: NUL byte at character 2"):
        read_input(None)
    monkeypatch.setattr(sys, "stdin", io.StringIO("fine\na\x00b\n"))  # text without bytes
    with pytest.raises(UserError, match=r"<stdin>: line 2: NUL byte"):
        read_input("-")


def test_a_nul_byte_is_refused_line_by_line_too() -> None:
    out = io.StringIO()
    with pytest.raises(UserError, match=r"<stdin>: line 2: NUL byte"):
        answer_lines(lambda lines, i: [lines[0].upper()], stdin=_stdin(b"ok\na\x00\n"), stdout=out)
    assert out.getvalue() == "OK\n"  # the line before it was answered


def test_bare_carriage_returns_on_stdin_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    # lines ending in \r alone (classic Mac OS) would be read as one line
    monkeypatch.setattr(sys, "stdin", _stdin(b"one\rtwo\rthree\r"))
    with pytest.raises(UserError, match=r"<stdin>: line 1: carriage return .* at character 4"):
        read_input(None)
    # CRLF line ends, and a stray \r after line 1, are read as before
    monkeypatch.setattr(sys, "stdin", _stdin(b"one\r\ntw\ro\r\n"))
    assert read_input(None) == ["one", "tw\ro"]
