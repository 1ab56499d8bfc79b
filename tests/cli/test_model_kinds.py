"""What each command does with a model of another kind than it is made for: a parser given to
translate or serve, English given to an addition model, --resume on a folder without a run,
`vocab` on a parsing config. Each is refused in one line (exit 2) or said once on stderr."""

from __future__ import annotations

import io
import sys
from pathlib import Path
from unittest import mock

import pytest
import yaml

from transduce.cli.main import main


def _run(
    argv: list[str], capsys: pytest.CaptureFixture[str], stdin: str = ""
) -> tuple[int, str, str]:
    with mock.patch.object(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin.encode()), "utf-8")):
        code = main(["--no-malloc-tuning", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def _one_error(code: int, out: str, err: str, *needles: str) -> None:
    assert code == 2 and not out, (code, out, err)
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("transduce: error: "), err
    assert all(n in lines[0] for n in needles), err


@pytest.mark.parametrize("command", ["translate", "serve"])
def test_a_parser_is_refused_where_text_comes_out(model_kinds, capsys, command: str) -> None:
    if command == "serve":
        pytest.importorskip("fastapi")
    parser = str(model_kinds["parser"])
    argv = [command, "--model", parser] + (["--port", "0"] if command == "serve" else [])
    with mock.patch("transduce.serve.server.serve", lambda *a, **k: pytest.fail("served")):
        code, out, err = _run(argv, capsys, stdin="the dog runs\n")
    _one_error(code, out, err, parser, "parsing model", "transduce parse")


def test_an_addition_model_says_once_what_it_could_not_read(model_kinds, capsys) -> None:
    code, out, err = _run(["translate", "--model", str(model_kinds["synthetic"]), "--quiet"],
                          capsys, stdin="12+34\nthe dog\n\nab+1\n")  # fmt: skip
    assert code == 0 and len(out.splitlines()) == 4
    assert err == ("transduce: warning: 9 input characters not in the model's vocabulary "
                   "(0123456789+), read as <unk>\n")  # "the dog" and "ab"
    code, _, err = _run(["translate", "--model", str(model_kinds["synthetic"]), "--quiet"],
                        capsys, stdin="12+34\n")  # fmt: skip
    assert code == 0 and err == ""


def test_resume_without_a_run_is_refused(tmp_path: Path, capsys) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({
        "model": {"n_layers": 1, "d_model": 16, "d_ff": 32, "n_heads": 2, "d_k": 8, "d_v": 8},
        "train": {"max_steps": 2, "tensorboard": False},
        "task": {"name": "copy", "train_size": 40, "valid_size": 8, "max_length": 4},
    }))  # fmt: skip
    for out in (tmp_path / "new", tmp_path / "empty"):
        if out.name == "empty":
            out.mkdir()
        code, stdout, err = _run(["train", "--config", str(config), "--out", str(out),
                                  "--resume", "--quiet"], capsys)  # fmt: skip
        _one_error(code, stdout, err, f"--resume: {out} holds no checkpoint")
        assert not out.exists() or not any(out.iterdir())  # nothing half-written


def test_vocab_of_a_parsing_config_says_what_to_do(tmp_path: Path, capsys) -> None:
    config = tmp_path / "p.yaml"
    config.write_text(yaml.safe_dump({"task": {"name": "parsing"}}))
    code, out, err = _run(["vocab", "--config", str(config), "--out", str(tmp_path / "v")],
                          capsys)  # fmt: skip
    _one_error(code, out, err, "vocab needs a translation task", "transduce train")
    assert "prepare" not in err and not (tmp_path / "v").exists()
