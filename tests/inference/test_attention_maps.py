"""Attention maps of a checkpoint, word alignments from them, and the attention command."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

from transduce import checkpoint
from transduce.cli.main import main
from transduce.config import Config, update
from transduce.data.vocab import SPECIALS, CharVocab
from transduce.inference.attention_maps import (
    AttentionMaps,
    attention_maps,
    pharaoh,
    word_alignment,
    word_index,
)
from transduce.model import make_model


class WordVocab:
    """Pieces as in SentencePiece: '▁' starts a word."""

    def __init__(self, pieces: Sequence[str]) -> None:
        self.pieces = [*SPECIALS, *pieces]

    def __len__(self) -> int:
        return len(self.pieces)

    def encode(self, text: str) -> list[int]:
        return [self.pieces.index(p) for p in text.split("|")]

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(self.pieces[i] for i in ids if i >= len(SPECIALS)).replace("▁", " ").strip()


def _maps(cross: torch.Tensor, src: list[int], tgt: list[int]) -> AttentionMaps:
    empty = torch.zeros(0)
    return AttentionMaps([], [], [], src, tgt, empty, empty, cross[None, None])


def test_word_index_follows_the_detokenized_words() -> None:
    vocab = WordVocab(["▁the", "▁sun", "ny", "▁day", "!"])
    assert word_index(vocab, [4, 5, 6, 7, 8]) == [0, 1, 1, 2, 2]


def test_each_target_word_takes_the_source_word_with_the_most_attention() -> None:
    vocab = WordVocab(["▁a", "▁b", "c", "▁x", "▁y", "z"])
    src, tgt = [4, 5, 6], [7, 8, 9]  # source words: a, bc; target words: x, yz
    # rows: target pieces then EOS; columns: source pieces then EOS (neither EOS counts)
    cross = torch.tensor(
        [
            [0.1, 0.4, 0.4, 0.1],  # x: a 0.1, bc 0.8
            [0.5, 0.3, 0.0, 0.2],  # y
            [0.4, 0.0, 0.5, 0.1],  # z -> yz: a 0.9, bc 0.8
            [0.0, 0.0, 0.0, 1.0],
        ]
    )
    pairs = word_alignment(_maps(cross, src, tgt), vocab)
    assert pairs == [(1, 0), (0, 1)]
    assert pharaoh(pairs) == "0-1 1-0"


@pytest.fixture(scope="module")
def char_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An untrained model of a character task saved as a checkpoint."""
    cfg = update(
        Config(),
        {
            "n_layers": 2,
            "d_model": 16,
            "d_ff": 32,
            "n_heads": 2,
            "d_k": 8,
            "d_v": 8,
            "name": "copy",
        },
    )
    vocab = CharVocab(list("abcdefgh"))
    torch.manual_seed(0)
    model = make_model(cfg.model, src_vocab_size=len(vocab))
    path = tmp_path_factory.mktemp("char") / "model.pt"
    checkpoint.save(
        {"config": cfg.to_dict(), "vocab": vocab.to_dict(), "model": model.state_dict()}, path
    )
    return path


def test_maps_of_a_checkpoint_have_every_layer_head_and_token(char_model: Path) -> None:
    model, vocab, cfg = checkpoint.load_model(char_model)
    maps = attention_maps(model, vocab, "abcd", "dcb")
    assert maps.source == ["a", "b", "c", "d", "</s>"]
    assert maps.inputs == ["<s>", "d", "c", "b"] and maps.outputs == ["d", "c", "b", "</s>"]
    assert maps.cross.shape == (2, 2, 4, 5) and maps.encoder.shape == (2, 2, 5, 5)
    assert maps.decoder.shape == (2, 2, 4, 4)
    greedy = attention_maps(model, vocab, "abcd")  # without a target: the model's own output
    assert greedy.cross.shape[-1] == 5 and greedy.outputs[-1] == "</s>"


@pytest.mark.parametrize("suffix,style", [(".png", "grid"), (".svg", "lines"), (".html", "grid")])
def test_attention_command_draws_a_file(
    char_model: Path, tmp_path: Path, capsys, suffix: str, style: str
) -> None:
    out = tmp_path / f"attn{suffix}"
    code = main(
        [
            "--no-malloc-tuning",
            "attention",
            "--model",
            str(char_model),
            "--src",
            "abca",
            "--kind",
            "encoder",
            "--style",
            style,
            "--output",
            str(out),
        ]
    )
    assert code == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out)["output"] == str(out)
    assert out.stat().st_size > 1000
    code = main(
        [
            "--no-malloc-tuning",
            "attention",
            "--model",
            str(char_model),
            "--src",
            "ab",
            "--layer",
            "5",
            "--output",
            str(out),
        ]
    )
    assert code == 2 and "layer" in capsys.readouterr().err
