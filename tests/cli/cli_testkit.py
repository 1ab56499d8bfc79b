"""Running ``transduce`` in the test's process, for the command-line tests of this folder."""

from __future__ import annotations

import io
import sys
from unittest import mock

import pytest

from transduce.cli.main import main


def run_cli(
    argv: list[str], capsys: pytest.CaptureFixture[str], stdin: str = ""
) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``transduce --no-malloc-tuning ARGV`` with ``stdin``."""
    with mock.patch.object(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin.encode()), "utf-8")):
        code = main(["--no-malloc-tuning", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def one_error(code: int, out: str, err: str, *needles: str) -> None:
    """Exit code 2, nothing on stdout, one ``transduce: error:`` line holding ``needles``."""
    assert code == 2 and not out, (code, out, err)
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("transduce: error: "), err
    assert all(n in lines[0] for n in needles), err
