"""Checkpoints of every kind of model, for the command-line tests of this folder."""

from __future__ import annotations

from pathlib import Path

import pytest
from inference_testkit import (
    save_toy_pair_translator,
    save_toy_parser,
    save_toy_synthetic,
    save_toy_translation_model,
)

# the kinds of model a command may be given
KINDS = ("synthetic", "shared", "separate", "parser", "recurrent")


@pytest.fixture(scope="session")
def model_kinds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Kind -> an untrained tiny checkpoint (seconds to make): an addition model, a translation
    model with one shared vocabulary, one with shared_vocab: false, a parser and the recurrent
    baseline."""
    d = tmp_path_factory.mktemp("model_kinds")
    decode = {"beam": 2, "max_len_offset": 5}
    two = {"n_layers": 2}  # so that a layer option has a layer other than the last to name
    return {
        "synthetic": save_toy_synthetic(d / "synthetic.pt", decode, two),
        "shared": save_toy_translation_model(d / "shared.pt", decode, two),
        "separate": save_toy_pair_translator(d / "separate.pt", decode, two),
        "parser": save_toy_parser(d / "parser.pt", decode, two),
        "recurrent": save_toy_translation_model(
            d / "recurrent.pt", decode, {**two, "architecture": "rnn"}
        ),
    }
