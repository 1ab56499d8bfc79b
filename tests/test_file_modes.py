"""Model files and checkpoints get the mode a plain open() gives under the umask (0666 & ~umask),
like config.json beside them: a server under another uid, or a colleague on shared storage, can
read what a training run wrote (tempfile.mkstemp alone would leave them 0600)."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import yaml

from transduce import checkpoint
from transduce.cli.main import main
from transduce.config import Config, update
from transduce.data.vocab import CharVocab
from transduce.model.transformer import make_model

TINY = {"n_layers": 1, "d_model": 16, "d_ff": 32, "n_heads": 2, "d_k": 8, "d_v": 8, "dropout": 0.0}


@pytest.fixture(params=[0o022, 0o077, 0o027, 0o002])
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _model_file() -> dict:
    cfg = update(Config(), TINY)
    vocab = CharVocab(list("abcde"))
    model = make_model(cfg.model, src_vocab_size=len(vocab))
    return {"config": cfg.to_dict(), "vocab": vocab.to_dict(), "model": model.state_dict()}


def test_every_writer_gives_the_umask_mode(umask: int, tmp_path: Path) -> None:
    want = 0o666 & ~umask
    plain = tmp_path / "plain.json"
    plain.write_text("{}")  # what open() gives, as config.json is written
    assert _mode(plain) == want
    state = _model_file()
    checkpoint.save(state, tmp_path / "model.pt")
    checkpoint.save_atomic({"a": torch.arange(3)}, tmp_path / "sub" / "raw.pt")
    checkpoint.convert(tmp_path / "model.pt", tmp_path / "converted.pt")
    written = ["model.pt", "sub/raw.pt", "converted.pt"]
    if checkpoint.safetensors_available():
        checkpoint.save_safetensors(state, tmp_path / "model.safetensors")
        written.append("model.safetensors")
    for name in written:
        assert _mode(tmp_path / name) == want, (name, oct(_mode(tmp_path / name)), oct(want))
    checkpoint.save(state, tmp_path / "model.pt")  # over an existing file: the same
    assert _mode(tmp_path / "model.pt") == want


def test_a_training_run_writes_every_file_with_the_umask_mode(tmp_path: Path, capsys) -> None:
    config = tmp_path / "tiny.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "model": TINY,
                "train": {
                    "max_tokens": 128,
                    "warmup": 10,
                    "max_steps": 4,
                    "save_every": 2,
                    "eval_every": 4,
                    "keep_last": 2,
                    "average_last": 2,
                    "tensorboard": False,
                },
                "task": {
                    "name": "copy",
                    "train_size": 40,
                    "valid_size": 8,
                    "max_length": 4,
                    "n_symbols": 4,
                },
                "decode": {"beam": 1},
            }
        )
    )
    run = tmp_path / "run"
    old = os.umask(0o027)
    try:
        code = main(
            ["--no-malloc-tuning", "train", "--config", str(config), "--out", str(run), "--quiet"]
        )
    finally:
        os.umask(old)
    out, err = capsys.readouterr()
    assert code == 0, err
    assert json.loads(out.strip().splitlines()[-1])["step"] == 4
    files = [p for p in run.rglob("*") if p.is_file()]
    names = {p.relative_to(run).as_posix() for p in files}
    assert {"config.json", "model.pt", "best.pt"} <= names
    assert any(n.startswith("checkpoints/step_") for n in names), names
    modes = {p.relative_to(run).as_posix(): oct(_mode(p)) for p in files}
    assert set(modes.values()) == {oct(0o640)}, modes
