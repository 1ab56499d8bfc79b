"""The README's Safety section shows what a run prints and the commands to type: the commands parse
as the CLI reads them, and the lines are the ones the code prints. (What the commands do is tested
in tests/training: test_preemption.py, test_config_change.py, test_guard.py, test_disk_full.py.)"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from transduce.cli.main import build_parser
from transduce.errors import CheckpointNotWritten, Diverged, Preempted
from transduce.training.preemption import resume_command, stopped_message

README = Path(__file__).resolve().parents[1] / "README.md"


def _safety() -> str:
    text = README.read_text(encoding="utf-8")
    return text[text.index("## Safety") : text.index("## Development")]


def _blocks(section: str) -> list[tuple[str, list[str]]]:
    """(language, lines) of each fenced block."""
    found = re.findall(r"```(\w*)\n(.*?)```", section, flags=re.S)
    return [(language, body.strip().splitlines()) for language, body in found]


def test_every_command_in_the_safety_section_parses() -> None:
    commands = [
        line
        for language, lines in _blocks(_safety())
        if language == "bash"
        for line in lines
        if line.startswith("transduce ")
    ]
    assert commands, "the Safety section shows no command"
    for command in commands:
        args = build_parser().parse_args(shlex.split(command)[1:])
        if args.command == "train":
            assert args.resume and args.allow_change == ["lr_factor"]


def test_the_lines_a_stopped_run_prints_are_the_ones_shown() -> None:
    (shown,) = [lines for language, lines in _blocks(_safety()) if language == ""]
    stopped, resume = shown
    checkpoint = "runs/add/checkpoints/step_00000007.pt"
    assert stopped == f"transduce: stopped: {stopped_message('SIGTERM', 7, checkpoint, 1)}"
    command = resume_command(["train", "--config", "configs/addition.yaml", "--out", "runs/add"])
    assert resume == f"transduce: resume with: {command}"


def test_the_exit_codes_in_the_table_are_the_codes() -> None:
    rows = dict(re.findall(r"^\| (\d+) \| (.+?) \|$", _safety(), flags=re.M))
    assert set(rows) == {"0", "2", "3", "74", "143", "130"}
    assert (Diverged.exit_code, CheckpointNotWritten.exit_code, Preempted.exit_code) == (3, 74, 143)
    assert "diverged" in rows["3"] and "written" in rows["74"] and "SIGTERM" in rows["143"]
    assert "bad input" in rows["2"] and "Ctrl-C" in rows["130"]
