"""Parsing as translation through the CLI: data, a tiny parser trained a few hundred steps whose
F1 is far above the same model trained zero steps, parse and evaluate."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import yaml

from transduce.checkpoint import load_model
from transduce.cli.main import main
from transduce.data.trees import parse_trees
from transduce.parsing.parser import word_units

TINY = {
    "model": {
        "n_layers": 2,
        "d_model": 96,
        "d_ff": 192,
        "n_heads": 4,
        "d_k": 24,
        "d_v": 24,
        "dropout": 0.1,
    },
    "train": {
        "max_tokens": 2500,
        "warmup": 100,
        "lr_factor": 1.0,
        "label_smoothing": 0.0,
        "max_steps": 400,
        "eval_every": 400,
        "save_every": 400,
        "keep_last": 1,
        "log_every": 100,
        "valid_beam": 1,
        "tensorboard": False,
        "precision": "fp32",
    },
    "task": {"name": "parsing", "src_vocab_size": 600},
    "decode": {"beam": 2, "alpha": 0.3, "max_len_offset": 60},
}


@pytest.fixture(scope="module")
def ptb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sample split by `transduce data ptb-sample`, cut to 1000 training and 40 dev/test
    sentences of at most 20 words for speed."""
    root = os.environ.get("TRANSDUCE_DATA")
    if not root:
        pytest.skip("TRANSDUCE_DATA is not set (folder holding ptb-sample/)")
    full = tmp_path_factory.mktemp("ptb_full")
    assert (
        main(
            [
                "--no-malloc-tuning",
                "data",
                "ptb-sample",
                "--dest",
                str(full),
                "--from",
                str(Path(root) / "ptb-sample"),
            ]
        )
        == 0
    )
    small = tmp_path_factory.mktemp("ptb")
    for split, n in (("train", 1000), ("dev", 40), ("test", 40)):
        words = (full / f"{split}.words").read_text().splitlines()
        trees = (full / f"{split}.trees").read_text().splitlines()
        keep = [i for i, w in enumerate(words) if len(w.split()) <= 20][:n]
        (small / f"{split}.words").write_text("".join(words[i] + "\n" for i in keep))
        (small / f"{split}.trees").write_text("".join(trees[i] + "\n" for i in keep))
    return small


def _train(
    ptb: Path, out: Path, steps: int, capsys, model: dict | None = None, **task: object
) -> dict:
    cfg = {
        **TINY,
        "task": {**TINY["task"], "parse_data": str(ptb), **task},
        "train": {**TINY["train"], "max_steps": steps},
        "model": {**TINY["model"], **(model or {})},
    }
    (out.parent / f"{out.name}.yaml").write_text(yaml.safe_dump(cfg))
    code = main(
        [
            "--no-malloc-tuning",
            "train",
            "--config",
            str(out.parent / f"{out.name}.yaml"),
            "--out",
            str(out),
            "--quiet",
        ]
    )
    assert code == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def _evaluate(model: Path, ptb: Path, capsys, *extra: str) -> dict:
    code = main(
        [
            "--no-malloc-tuning",
            "evaluate",
            "--model",
            str(model),
            "--src",
            str(ptb / "test.words"),
            "--ref",
            str(ptb / "test.trees"),
            "--quiet",
            *extra,
        ]
    )
    assert code == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def test_a_trained_parser_beats_an_untrained_one(ptb: Path, tmp_path: Path, capsys) -> None:
    summary = _train(ptb, tmp_path / "run", 400, capsys)
    assert summary["step"] == 400 and "f1" in summary
    untrained = _train(ptb, tmp_path / "zero", 1, capsys)
    trained = _evaluate(tmp_path / "run" / "model.pt", ptb, capsys)
    zero = _evaluate(tmp_path / "zero" / "model.pt", ptb, capsys)
    assert {
        "precision",
        "recall",
        "f1",
        "exact_match",
        "le40_f1",
        "well_formed",
        "repairs",
        "sentences",
    } <= set(trained)
    assert trained["sentences"] == 40
    assert trained["f1"] > zero["f1"] + 10, (trained, zero, untrained)
    _check_constrained_and_parse(tmp_path / "run" / "model.pt", ptb, tmp_path, capsys)


def _check_constrained_and_parse(model: Path, ptb: Path, tmp_path: Path, capsys) -> None:
    """``evaluate --constrained`` is well-formed without repairs; ``parse`` writes a TOP tree
    over each input line's words with an XX preterminal around every word."""
    constrained = _evaluate(model, ptb, capsys, "--constrained")
    assert constrained["well_formed"] == 1.0 and constrained["repairs"] == 0
    out = tmp_path / "trees.txt"
    code = main(
        [
            "--no-malloc-tuning",
            "parse",
            "--model",
            str(model),
            "--input",
            str(ptb / "test.words"),
            "--output",
            str(out),
            "--quiet",
        ]
    )
    assert code == 0
    words = (ptb / "test.words").read_text().splitlines()
    trees = parse_trees(out.read_text())
    assert len(trees) == len(words)
    for tree, line in zip(trees, words, strict=True):
        assert tree.label == "TOP" and tree.words() == line.split()
        assert set(tree.tags()) == {"XX"}  # a preterminal around every word


def test_slot_pieces_parser(ptb: Path, tmp_path: Path, capsys) -> None:
    """Word slots spelled as each word's first source piece: trained, its output read back into
    trees over the input words, tagged XX; the constraint keeps it well-formed."""
    summary = _train(ptb, tmp_path / "run", 100, capsys, slot_pieces=True)
    assert summary["step"] == 100
    trained = _evaluate(tmp_path / "run" / "model.pt", ptb, capsys, "--beam", "1")
    assert trained["sentences"] == 40 and 0 <= trained["f1"] <= 100
    _check_constrained_and_parse(tmp_path / "run" / "model.pt", ptb, tmp_path, capsys)


def test_a_parser_with_positions_counted_in_words(ptb: Path, tmp_path: Path, capsys) -> None:
    """``position_unit: word``: trained through the CLI, its word units saved in the model file
    (as ``word_units`` makes them from its vocabularies), its constrained output well-formed."""
    summary = _train(ptb, tmp_path / "run", 100, capsys, model={"position_unit": "word"})
    assert summary["step"] == 100
    model, vocab, _ = load_model(tmp_path / "run" / "model.pt")
    starts, slots = word_units(vocab)
    assert starts.any() and slots.any()
    assert torch.equal(model.encoder.word_start, starts)
    assert torch.equal(model.decoder.word_slot, slots)
    _check_constrained_and_parse(tmp_path / "run" / "model.pt", ptb, tmp_path, capsys)
