"""Keys of the other architecture are refused, as keys of another task are: ``architecture: rnn``
with a Transformer key off its default (``n_heads``, ``d_ff``, ``norm: pre``, ...) or a
Transformer with an rnn key (``rnn_attention``, ``input_feeding``) is a one-line UserError
naming the key and the architecture; before, both trained without a word and the key was
ignored. Switching ``architecture`` starts the keys only the old one reads from their defaults
(a Transformer config trained with ``--set architecture=rnn``), and checkpoints that stored
such keys still load."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
import yaml

from transduce import checkpoint
from transduce.architectures import build_model
from transduce.cli.main import main
from transduce.config import (
    ARCHITECTURE_KEYS,
    Config,
    ModelConfig,
    from_dict,
    load_config,
    update,
)
from transduce.data.vocab import CharVocab
from transduce.errors import UserError
from transduce.recurrent import RecurrentSeq2Seq

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
DEFAULTS = {f.name: f.default for f in dataclasses.fields(ModelConfig)}
# a value other than the default, for each key of one architecture only
OTHER_VALUE = {
    "d_ff": 1024,
    "n_heads": 4,
    "d_k": 32,
    "d_v": 32,
    "attention_dropout": 0.1,
    "activation_dropout": 0.1,
    "positional": "learned",
    "max_positions": 512,
    "norm": "pre",
    "position_unit": "word",
    "activation": "swish",
    "output_bias": True,
    "rnn_attention": "additive",
    "input_feeding": True,
}
FOREIGN = [("rnn", key) for key in ARCHITECTURE_KEYS["transformer"]] + [
    ("transformer", key) for key in ARCHITECTURE_KEYS["rnn"]
]


def test_every_model_key_is_shared_or_of_one_architecture() -> None:
    transformer, rnn = set(ARCHITECTURE_KEYS["transformer"]), set(ARCHITECTURE_KEYS["rnn"])
    assert not transformer & rnn
    shared = set(DEFAULTS) - transformer - rnn
    # what build_model hands the recurrent model, and the switch itself
    assert shared == {"architecture", "n_layers", "d_model", "dropout", "tie_embeddings"}
    assert {"n_heads", "d_ff", "norm", "positional", "attention_dropout"} <= transformer
    assert rnn == {"rnn_attention", "input_feeding"}
    assert set(OTHER_VALUE) == transformer | rnn


@pytest.mark.parametrize(("architecture", "key"), FOREIGN)
def test_a_key_of_the_other_architecture_is_refused(architecture: str, key: str) -> None:
    value = OTHER_VALUE[key]
    with pytest.raises(UserError) as python:
        ModelConfig(architecture=architecture, **{key: value})  # type: ignore[arg-type]
    with pytest.raises(UserError) as file:
        from_dict({"model": {"architecture": architecture, key: value}}, source="my.yaml")
    for error in (python, file):
        line = str(error.value)
        assert "\n" not in line and key in line and f"architecture: {architecture}" in line, line
    assert str(file.value).startswith("my.yaml: ")
    with pytest.raises(UserError, match=key):  # on a config of that architecture already
        update(update(Config(), {"architecture": architecture}), {key: value})
    # at its default the key says nothing, and is accepted
    at_default = ModelConfig(architecture=architecture, **{key: DEFAULTS[key]})  # type: ignore
    assert getattr(at_default, key) == DEFAULTS[key]


def test_keys_of_the_own_architecture_are_taken() -> None:
    rnn = update(
        Config(),
        {
            "architecture": "rnn",
            "rnn_attention": "additive",
            "input_feeding": True,
            "n_layers": 2,
            "d_model": 32,
        },
    )
    assert (rnn.model.rnn_attention, rnn.model.input_feeding) == ("additive", True)
    transformer = update(Config(), {"n_heads": 4, "norm": "pre", "positional": "learned"})
    assert transformer.model.norm == "pre"


def test_switching_architecture_starts_the_other_keys_from_their_defaults() -> None:
    # configs/addition.yaml is a Transformer's (d_ff 512, 4 heads): benchmarks/recurrence.py and
    # the README's LSTM parser train such a config with --set architecture=rnn
    transformer = load_config(CONFIGS / "addition.yaml")
    rnn = update(transformer, {"architecture": "rnn", "n_layers": 1})
    assert rnn.model == ModelConfig(architecture="rnn", n_layers=1, d_model=128, dropout=0.0)
    with pytest.raises(UserError, match="d_ff.*architecture: rnn"):
        update(transformer, {"architecture": "rnn", "d_ff": 256})  # given with the switch
    back = update(update(rnn, {"input_feeding": True}), {"architecture": "transformer"})
    assert back.model.input_feeding is False and back.model.d_model == 128
    big = from_dict({"preset": "big", "model": {"architecture": "rnn"}})  # a preset is a base
    assert big.model.d_model == 1024 and big.model.d_ff == DEFAULTS["d_ff"]
    # a preset of the other architecture's keys alone would change nothing: refused
    for row in ("E", "A1", "B1", "C6"):
        with pytest.raises(UserError, match=f"preset {row} sets only .* architecture: rnn"):
            from_dict({"preset": row, "model": {"architecture": "rnn"}})
    assert from_dict({"preset": "C4", "model": {"architecture": "rnn"}}).model.d_model == 256


def test_cli_refuses_a_key_of_the_other_architecture_in_one_line(tmp_path: Path, capsys) -> None:
    config = tmp_path / "lstm.yaml"
    config.write_text(
        yaml.safe_dump(
            {  # a run of seconds, were it taken
                "model": {"architecture": "rnn", "n_heads": 4, "n_layers": 1, "d_model": 16},
                "train": {"max_steps": 1, "max_tokens": 64, "tensorboard": False},
                "task": {"name": "copy", "train_size": 20, "valid_size": 4, "max_length": 3},
            }
        )
    )
    for argv in (
        ["train", "--config", str(config), "--out", str(tmp_path / "r")],
        ["params", "--preset", "base", "--set", "input_feeding=true"],
    ):
        assert main(["--no-malloc-tuning", *argv]) == 2
        out, err = capsys.readouterr()
        lines = err.strip().splitlines()
        assert out == "" and len(lines) == 1 and lines[0].startswith("transduce: error: "), err
    assert not (tmp_path / "r").exists()


def _stored_rnn_config() -> dict:
    """Config.to_dict() of an LSTM trained as the README's `--config configs/ptb_parsing.yaml
    --set architecture=rnn`, as the code before the refusal stored it: the file's Transformer
    keys kept (d_ff 1024, 4 heads, position_unit word), though the LSTM never read them."""
    cfg = load_config(CONFIGS / "ptb_parsing.yaml")
    stored = cfg.to_dict()
    stored["model"].update(architecture="rnn", rnn_attention="additive", n_layers=1, d_model=16)
    stored["task"]["parse_data"] = "data/nowhere"
    return stored


def test_a_checkpoint_that_stored_keys_of_the_other_architecture_loads(tmp_path: Path) -> None:
    stored = _stored_rnn_config()
    assert stored["model"]["d_ff"] == 1024 and stored["model"]["position_unit"] == "word"
    with pytest.raises(UserError, match="architecture: rnn"):
        from_dict(stored)  # a new config is held to the architecture's keys
    cfg = from_dict(stored, stored=True)
    assert cfg.model == ModelConfig(
        architecture="rnn", rnn_attention="additive", n_layers=1, d_model=16, dropout=0.1
    )
    # the file as the old code wrote it: those keys inside, the LSTM's weights
    vocab = CharVocab(list("abcdef"))
    torch.manual_seed(0)
    model = build_model(cfg.model, src_vocab_size=len(vocab))
    path = tmp_path / "model.pt"
    checkpoint.save({"config": stored, "vocab": vocab.to_dict(), "model": model.state_dict()}, path)
    loaded, _, loaded_cfg = checkpoint.load_model(path)
    assert isinstance(loaded, RecurrentSeq2Seq) and loaded_cfg == cfg
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    # and a Transformer whose checkpoint stored an rnn key off its default
    old_transformer = Config().to_dict()
    old_transformer["model"].update(input_feeding=True, n_layers=1, d_model=16)
    assert from_dict(old_transformer, stored=True).model.input_feeding is False
