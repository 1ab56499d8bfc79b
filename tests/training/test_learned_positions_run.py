"""A run of a Transformer with learned positions checks, before training, that its pairs fit the
table: training pairs by max_len, the validator's decoding by decode.max_len_offset; validation
pairs that cannot be placed are left out of the validation loss, and said so."""

from __future__ import annotations

from pathlib import Path

import pytest

from transduce.config import Config, update
from transduce.data.vocab import CharVocab
from transduce.errors import UserError
from transduce.training.fit import RunOptions, TaskData, fit

MODEL = {"n_layers": 1, "d_model": 16, "d_ff": 32, "n_heads": 2, "d_k": 8, "d_v": 8}


def _cfg(**train: object) -> Config:
    return update(
        Config(),
        {
            **MODEL,
            "positional": "learned",
            "max_positions": 8,
            "max_len": 8,
            "max_steps": 2,
            "max_tokens": 64,
            "eval_every": 0,
            "tensorboard": False,
            "max_len_offset": 2,
            **train,
        },
    )


def _data(valid: list, validator: object = None) -> TaskData:
    vocab = CharVocab(list("ab"))
    train = [([4, 5, 4], [5, 4, 5])] * 8
    return TaskData(vocab, train, valid_pairs=valid, validator=validator)  # type: ignore[arg-type]


def test_unplaceable_validation_pairs_are_left_out_and_said(tmp_path: Path) -> None:
    said: list[str] = []
    valid = [([4, 5], [5, 4]), ([4], [5] * 8)]  # the second's BOS + 8 tokens: 9 positions
    summary = fit(
        _cfg(), tmp_path / "r", _data(valid), RunOptions(show_progress=False), log=said.append
    )
    assert summary["step"] == 2, summary
    assert said == [
        "valid: 1 pairs longer than max_positions=8 tokens left out of the validation loss"
    ]


def test_what_cannot_be_placed_is_refused_before_training(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"train.max_len=9 is more than the 8 learned positions"):
        fit(_cfg(max_len=9), tmp_path / "a", _data([]), RunOptions(show_progress=False))
    assert not (tmp_path / "a").exists()
    # a 5-token source (+ EOS) decodes into up to 7 tokens: BOS + 7 = 8 positions, then EOS's
    # step at position 8 is one too many
    valid = [([4] * 5, [5])]
    with pytest.raises(UserError, match="needs 9 learned positions; model.max_positions is 8"):
        fit(_cfg(), tmp_path / "b", _data(valid, lambda m: {}), RunOptions(show_progress=False))
    fit(
        _cfg(),
        tmp_path / "c",
        _data([([4] * 4, [5])], lambda m: {}),
        RunOptions(show_progress=False),
    )
