"""RecurrentConfig refuses bad settings, naming the field; the model's constructor checks too."""

from __future__ import annotations

import dataclasses

import pytest

from transduce.recurrent import RecurrentConfig, RecurrentSeq2Seq


@pytest.mark.parametrize(
    "field,value",
    [
        ("vocab_size", 3),  # fewer ids than the special tokens
        ("vocab_size", 10.0),
        ("tgt_vocab_size", 0),
        ("embed_dim", 0),
        ("hidden_size", -4),
        ("hidden_size", True),  # a bool is no size
        ("n_layers", 0),
        ("dropout", 1.0),
        ("dropout", -0.1),
        ("dropout", "0.1"),
        ("attention", "dot"),
        ("input_feeding", 1),
        ("tie_embeddings", "yes"),
        ("pad_id", -1),
        ("pad_id", 20),  # not below vocab_size
    ],
)
def test_bad_values_are_refused(field: str, value: object) -> None:
    settings = {**dataclasses.asdict(RecurrentConfig(vocab_size=20)), field: value}
    with pytest.raises(ValueError, match=field):
        RecurrentConfig(**settings)
    with pytest.raises(ValueError, match=field):
        RecurrentSeq2Seq(**settings)


def test_defaults_and_round_trip() -> None:
    cfg = RecurrentConfig(vocab_size=20, tgt_vocab_size=11, attention="additive")
    assert cfg.target_vocab_size == 11 and not cfg.shared_vocab
    assert RecurrentConfig(vocab_size=20).shared_vocab
    model = RecurrentSeq2Seq.from_config(cfg)
    assert model.config == cfg
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.hidden_size = 3  # type: ignore[misc]
