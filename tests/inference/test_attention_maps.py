"""Attention maps of a checkpoint, word alignments from them, and the attention command."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch
from inference_testkit import TOY_BRACKETS, save_toy_pair_translator, save_toy_parser

from transduce import checkpoint
from transduce.cli.main import main
from transduce.config import Config, update
from transduce.data.vocab import SPECIALS, CharVocab, VocabPair
from transduce.errors import UserError
from transduce.inference.attention_maps import (
    AttentionMaps,
    attention_maps,
    draw_attention,
    pharaoh,
    word_alignment,
    word_index,
)
from transduce.inference.translator import Translator
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


def test_two_vocabularies_read_each_side_with_its_own() -> None:
    """A model of two vocabularies (a parser, shared_vocab: false): the source ids are words of
    the source vocabulary, the target ids of the target one, though the ids are the same."""
    source = WordVocab(["▁a", "▁b", "c"])  # ids 4 5 6: words a, bc
    target = WordVocab(["▁x", "y", "▁z"])  # ids 4 5 6: words xy, z
    vocab = VocabPair(source, target)
    cross = torch.tensor(
        [
            [0.6, 0.2, 0.1, 0.1],  # x
            [0.5, 0.2, 0.2, 0.1],  # y -> xy: a 1.1, bc 0.7
            [0.1, 0.5, 0.3, 0.1],  # z: a 0.1, bc 0.8 (read as the target's words ab, c: 0.6, 0.3)
            [0.0, 0.0, 0.0, 1.0],
        ]
    )
    assert word_alignment(_maps(cross, [4, 5, 6], [4, 5, 6]), vocab) == [(0, 0), (1, 1)]


@pytest.fixture(scope="module")
def two_vocab_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """An untrained parser and an untrained shared_vocab: false translator, as checkpoints."""
    d = tmp_path_factory.mktemp("two_vocab")
    decode = {"beam": 2, "max_len_offset": 5}
    return {
        "parser": save_toy_parser(d / "parser.pt", decode),
        "pair": save_toy_pair_translator(d / "pair.pt", decode),
    }


def _text(pieces: list[str]) -> str:
    return "".join(pieces).replace("▁", " ").strip()


@pytest.mark.parametrize(
    "kind,target",
    [("parser", "(S (NP XX )NP (VP XX XX )VP )S"), ("pair", "der hund rennt im park")],
)
def test_maps_of_two_vocabulary_models_label_each_side_with_its_vocabulary(
    two_vocab_models: dict[str, Path], kind: str, target: str
) -> None:
    model, vocab, _ = checkpoint.load_model(two_vocab_models[kind])
    assert isinstance(vocab, VocabPair)
    maps = attention_maps(model, vocab, "the dog runs in the park", target)
    assert maps.source[-1] == "</s>" and _text(maps.source[:-1]) == "the dog runs in the park"
    assert maps.source_ids == vocab.source.encode("the dog runs in the park")
    assert maps.target_ids == vocab.target.encode(target)
    if kind == "parser":
        assert maps.outputs == [*target.split(), "</s>"]
    else:
        assert _text(maps.outputs[:-1]) == target
    assert maps.cross.shape[-2:] == (len(maps.outputs), len(maps.source))
    greedy = attention_maps(model, vocab, "the dog runs")  # the model's output: target tokens
    if kind == "parser":
        assert set(greedy.outputs) <= {*TOY_BRACKETS, "</s>"}


@pytest.mark.parametrize("kind", ["parser", "pair"])
def test_alignments_of_two_vocabulary_models_are_over_each_sides_words(
    two_vocab_models: dict[str, Path], kind: str
) -> None:
    translator = Translator.load(two_vocab_models[kind])
    source = "the dog runs in the park"
    target = "(S (NP XX )NP (VP XX XX )VP )S" if kind == "parser" else "der hund rennt im park"
    (line,) = translator.align([source], [target])
    pairs = [tuple(map(int, p.split("-"))) for p in line.split()]
    assert sorted(j for _, j in pairs) == list(range(len(target.split())))  # each target word
    assert all(0 <= i < len(source.split()) for i, _ in pairs)


def test_translate_alignments_of_a_separate_vocabulary_translator(
    two_vocab_models: dict[str, Path], tmp_path: Path, capsys
) -> None:
    sources = ["the dog runs", "", "a red ball in the park"]
    (tmp_path / "in.txt").write_text("\n".join(sources) + "\n", encoding="utf-8")
    code = main(
        [
            "--no-malloc-tuning",
            "translate",
            "--model",
            str(two_vocab_models["pair"]),
            "--input",
            str(tmp_path / "in.txt"),
            "--alignments",
            "--quiet",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    lines = out.split("\n")[:-1]
    assert len(lines) == 3 and lines[1] == "\t"
    for source, line in zip(sources, lines, strict=True):
        text, alignment = line.split("\t")
        pairs = [tuple(map(int, p.split("-"))) for p in alignment.split()]
        assert sorted(j for _, j in pairs) == list(range(len(text.split())))
        assert all(0 <= i < len(source.split()) for i, _ in pairs)


@pytest.mark.parametrize("kind", ["parser", "pair"])
def test_attention_command_labels_two_vocabulary_models(
    two_vocab_models: dict[str, Path], tmp_path: Path, capsys, kind: str
) -> None:
    out = tmp_path / "attn.html"
    target = "(S XX XX )S" if kind == "parser" else "der hund rennt"
    code = main(
        [
            "--no-malloc-tuning",
            "attention",
            "--model",
            str(two_vocab_models[kind]),
            "--src",
            "the dog runs",
            "--tgt",
            target,
            "--output",
            str(out),
        ]
    )
    assert code == 0, capsys.readouterr().err
    page = out.read_text(encoding="utf-8")
    _, vocab, _ = checkpoint.load_model(two_vocab_models[kind])
    assert isinstance(vocab, VocabPair)
    source_pieces = [vocab.source.id_to_piece(i) for i in vocab.source.encode("the dog runs")]
    target_pieces = [vocab.target.id_to_piece(i) for i in vocab.target.encode(target)]
    assert f"<b>Keys:</b> {' '.join(source_pieces)} &lt;/s&gt;</p>" in page
    assert f"<b>Queries:</b> {' '.join(target_pieces)} &lt;/s&gt;</p>" in page


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
    data = out.read_bytes()
    tokens = ["a", "b", "c", "a", "&lt;/s&gt;"]  # encoder attention: the source both ways
    if suffix == ".png":
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
        assert width > 200 and height > 150  # two heads side by side
    elif suffix == ".svg":  # the tick labels of both axes, both heads' titles
        labels = re.findall(r"<text[^>]*>([^<]*)</text>", data.decode())
        assert all(labels.count(t) >= 2 for t in tokens) and "head 1" in labels
        assert "rotate" in data.decode() and data.count(b"<path") > 8  # the lines drawn
    else:
        page = data.decode()
        assert f"<b>Queries:</b> {' '.join(tokens)}</p>" in page
        assert f"<b>Keys:</b> {' '.join(tokens)}</p>" in page
        assert "<th>head 0</th><th>head 1</th>" in page and page.count("<tr>") == 6
        assert "data:image/png;base64," in page
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


def test_lengths_past_what_the_model_places_or_a_map_shows_are_refused_in_one_line(
    tmp_path: Path, capsys
) -> None:
    """What an audit found: a learned-position model given a source or target longer than its
    positions failed with a traceback, and its own output ran to 50 tokens past the source
    whatever the model's limit; a source of hundreds of words ran for minutes to draw."""
    cfg = update(
        Config(),
        {"n_layers": 1, "d_model": 16, "d_ff": 32, "n_heads": 2, "d_k": 8, "d_v": 8},
    )
    cfg = update(cfg, {"name": "copy", "positional": "learned", "max_positions": 16})
    vocab = CharVocab(list("abcdefgh"))
    torch.manual_seed(0)
    model = make_model(cfg.model, src_vocab_size=len(vocab))
    path = tmp_path / "learned.pt"
    checkpoint.save(
        {"config": cfg.to_dict(), "vocab": vocab.to_dict(), "model": model.state_dict()}, path
    )
    model, vocab, _ = checkpoint.load_model(path)
    maps = attention_maps(model, vocab, "abcdefgh" + "abcdef")  # 14: BOS + at most 15 outputs
    assert len(maps.inputs) <= 16  # its own output clipped to the positions left
    with pytest.raises(UserError, match="leave no room for its output"):
        attention_maps(model, vocab, "abcdefgh" + "abcdefg")  # 15 + EOS: all 16 positions
    assert len(attention_maps(model, vocab, "abcdefgh" + "abcdefg", "ab").inputs) == 3
    with pytest.raises(UserError, match="the source has 16 subword tokens.*place at most 15"):
        attention_maps(model, vocab, "abcdefgh" * 2)
    with pytest.raises(UserError, match="the target has 16 subword tokens"):
        attention_maps(model, vocab, "abc", "abcdefgh" * 2)
    argv = ["--no-malloc-tuning", "attention", "--model", str(path), "--output"]
    assert main([*argv, str(tmp_path / "a.png"), "--src", "abcdefgh" * 2]) == 2
    err = capsys.readouterr().err
    assert err.startswith("transduce: error: the source has 16") and len(err.splitlines()) == 1
    with pytest.raises(UserError, match="a map of more than 256 is unreadable"):
        draw_attention(model, vocab, "a" * 300, tmp_path / "b.png")
