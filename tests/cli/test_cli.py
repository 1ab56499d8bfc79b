"""The ``transduce`` command: user errors are one line and exit code 2; params; train end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from transduce.cli.main import main

TINY_YAML = {
    "model": {"n_layers": 1, "d_model": 16, "d_ff": 32, "n_heads": 2, "d_k": 8, "d_v": 8},
    "train": {
        "max_tokens": 128,
        "warmup": 10,
        "max_steps": 6,
        "save_every": 3,
        "log_every": 2,
        "eval_every": 3,
        "keep_last": 2,
        "average_last": 2,
    },
    "task": {"name": "copy", "train_size": 60, "valid_size": 10, "max_length": 4, "n_symbols": 4},
    "decode": {"beam": 1},
}


@pytest.fixture
def tiny_config(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(TINY_YAML))
    return path


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    # --no-malloc-tuning: leave this test process's allocator alone
    code = main(["--no-malloc-tuning", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def _assert_user_error(code: int, err: str, *names: str) -> None:
    assert code == 2
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("transduce: error: ")
    for name in names:
        assert name in lines[0], (name, lines[0])


def test_misspelled_config_key(tiny_config: Path, tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bad.yaml"
    data = yaml.safe_load(tiny_config.read_text())
    data["model"]["d_modle"] = 32
    bad.write_text(yaml.safe_dump(data))
    code, out, err = _run(["train", "--config", str(bad), "--out", str(tmp_path / "r")], capsys)
    _assert_user_error(code, err, "d_modle", str(bad))
    assert out == ""
    code, _, err = _run(
        ["train", "--config", str(tiny_config), "--out", str(tmp_path / "r"), "--set", "warmpu=3"],
        capsys,
    )
    _assert_user_error(code, err, "warmpu")
    assert not (tmp_path / "r").exists()


def test_non_integer_set_value(tiny_config: Path, tmp_path: Path, capsys) -> None:
    code, _, err = _run(
        [
            "train",
            "--config",
            str(tiny_config),
            "--out",
            str(tmp_path / "r"),
            "--set",
            "max_steps=ten",
        ],
        capsys,
    )
    _assert_user_error(code, err, "max_steps", "ten")
    code, _, err = _run(["params", "--set", "d_model=1.5"], capsys)
    _assert_user_error(code, err, "d_model", "1.5")
    code, _, err = _run(["params", "--set", "d_model"], capsys)
    _assert_user_error(code, err, "d_model")


def test_missing_checkpoint(tmp_path: Path, capsys) -> None:
    out_file = tmp_path / "x.pt"
    code, _, err = _run(
        ["average", "--checkpoints", "/nonexistent.pt", "--output", str(out_file)], capsys
    )
    _assert_user_error(code, err, "/nonexistent.pt")
    assert not out_file.exists()
    code, _, err = _run(["average", "--run", str(tmp_path), "--output", str(out_file)], capsys)
    _assert_user_error(code, err, str(tmp_path))


def test_missing_config_file(tmp_path: Path, capsys) -> None:
    missing = tmp_path / "nope.yaml"
    code, _, err = _run(["train", "--config", str(missing), "--out", str(tmp_path / "r")], capsys)
    _assert_user_error(code, err, str(missing))


def test_invalid_yaml(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "broken.yaml"
    bad.write_text("model: {n_layers: [1\n")
    code, _, err = _run(["train", "--config", str(bad), "--out", str(tmp_path / "r")], capsys)
    assert code == 2 and "Traceback" not in err
    assert err.startswith("transduce: error: ") and str(bad) in err


def test_empty_task(tiny_config: Path, tmp_path: Path, capsys) -> None:
    code, _, err = _run(
        [
            "train",
            "--config",
            str(tiny_config),
            "--out",
            str(tmp_path / "r"),
            "--set",
            "train_size=0",
        ],
        capsys,
    )
    _assert_user_error(code, err, "train_size")


def test_too_small_task_space(tiny_config: Path, tmp_path: Path, capsys) -> None:
    code, _, err = _run(
        [
            "train",
            "--config",
            str(tiny_config),
            "--out",
            str(tmp_path / "r"),
            "--set",
            "n_symbols=1",
        ],
        capsys,
    )
    _assert_user_error(code, err, "copy")


def test_unknown_preset(capsys) -> None:
    code, out, err = _run(["params", "--preset", "gigantic"], capsys)
    _assert_user_error(code, err, "gigantic")
    assert out == ""


def test_params_base(capsys) -> None:
    code, out, err = _run(["params", "--preset", "base"], capsys)
    assert code == 0, err
    lines = out.strip().splitlines()
    assert len(lines) == 1
    data = json.loads(lines[0])
    assert abs(data["parameters"] - 65e6) / 65e6 < 0.08
    assert data["breakdown"]["total"] == data["parameters"]
    code, out, _ = _run(["params", "--preset", "base", "--set", "n_layers=2"], capsys)
    assert code == 0 and json.loads(out)["parameters"] < data["parameters"]


def test_train_end_to_end(tiny_config: Path, tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    code, out, err = _run(
        [
            "train",
            "--config",
            str(tiny_config),
            "--out",
            str(run),
            "--quiet",
            "--set",
            "max_steps=5",
        ],
        capsys,
    )
    assert code == 0, err
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["step"] == 5 and summary["stopped_by"] == "max_steps"
    assert 0.0 <= summary["seq_accuracy"] <= 1.0
    for name in ("model.pt", "best.pt", "metrics.jsonl", "config.json"):
        assert (run / name).exists(), name
    assert json.loads((run / "config.json").read_text())["train"]["max_steps"] == 5

    # and average the run's checkpoints into a model file
    avg = tmp_path / "avg.pt"
    code, out, err = _run(
        ["average", "--run", str(run), "--last", "2", "--output", str(avg)], capsys
    )
    assert code == 0, err
    assert len(json.loads(out)["averaged"]) == 2
    from transduce.checkpoint import load_model

    load_model(avg)


def _subprocess(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    full_env = dict(os.environ, OMP_NUM_THREADS="1", **env)
    return subprocess.run(
        [sys.executable, "-m", "transduce", *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=300,
    )


def test_subprocess_user_error(tiny_config: Path, tmp_path: Path) -> None:
    # (tests/training/test_trainer.py runs ``python -m transduce train`` to the end, killed and not)
    bad = _subprocess(
        "train",
        "--config",
        str(tiny_config),
        "--out",
        str(tmp_path / "r"),
        "--set",
        "max_steps=many",
    )
    assert bad.returncode == 2
    assert bad.stderr.count("\n") == 1 and bad.stderr.startswith("transduce: error: ")
    assert "max_steps" in bad.stderr and "'many'" in bad.stderr and "Traceback" not in bad.stderr
    assert bad.stdout == ""
    assert not (tmp_path / "r").exists()
