"""The demo: its config file equals the embedded one, and the command runs end to end."""

from __future__ import annotations

import json
from pathlib import Path

from transduce.cli.main import main
from transduce.config import load_config
from transduce.demo import demo_config

ROOT = Path(__file__).resolve().parents[1]


def test_config_file_equals_embedded_demo_config() -> None:
    assert load_config(ROOT / "configs" / "addition.yaml") == demo_config()


def test_demo_command_prints_examples_and_json_summary(tmp_path: Path, capsys) -> None:
    out = tmp_path / "demo"
    overrides = [
        "max_steps=30",
        "train_size=2000",
        "valid_size=50",
        "eval_every=15",
        "save_every=15",
        "d_model=32",
        "d_ff=64",
        "d_k=8",
        "d_v=8",
    ]
    args = ["demo", "--out", str(out), "--quiet"]
    for o in overrides:
        args += ["--set", o]
    assert main(args) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    summary = json.loads(lines[-1])
    assert {"seq_accuracy", "token_accuracy", "seconds"} <= summary.keys()
    assert 0.0 <= summary["seq_accuracy"] <= 1.0
    assert summary["steps"] == 30 and summary["test_examples"] == 50
    assert any(str(out.resolve()) in line for line in lines)
    examples = [line for line in lines if "+" in line and "=" in line]
    assert len(examples) == 8
    assert (out / "model.pt").is_file() and (out / "metrics.jsonl").is_file()


def test_the_demo_prints_the_questions_asked_with_input_reversed(tmp_path: Path, capsys) -> None:
    """With reverse_input the model reads each question reversed; the demo printed it so
    (``03+38 = ... (expected 113)``): the printed question is the one whose sum is expected."""
    small = ["d_model=16", "d_ff=32", "n_heads=2", "d_k=8", "d_v=8", "n_layers=1"]
    sizes = ["max_steps=2", "train_size=200", "valid_size=20", "eval_every=2", "save_every=2"]
    args = ["demo", "--out", str(tmp_path / "demo"), "--quiet", "--set", "reverse_input=true"]
    for o in [*small, *sizes, "max_len_offset=2"]:
        args += ["--set", o]
    assert main(args) == 0
    examples = [line for line in capsys.readouterr().out.splitlines() if "+" in line]
    assert len(examples) == 8
    for line in examples:
        question, rest = (part.strip() for part in line.split("=", 1))
        a, b = (int(n) for n in question.split("+"))
        answer = rest.split()[0] if "ok" in rest else rest.split("expected ")[1].rstrip(")")
        assert a + b == int(answer), line
