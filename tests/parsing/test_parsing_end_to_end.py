"""Parsing as translation through the CLI, on a small treebank made here (so nothing is skipped
for want of the Penn Treebank sample): data, a tiny parser trained a few hundred steps to a known
F1 that is far above the same model trained zero steps, parse and evaluate."""

from __future__ import annotations

import json
import random
import shutil
import zipfile
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
        "n_layers": 1,
        "d_model": 64,
        "d_ff": 128,
        "n_heads": 4,
        "d_k": 16,
        "d_v": 16,
        "dropout": 0.0,
    },
    "train": {
        "max_tokens": 1000,
        "warmup": 50,
        "lr_factor": 0.5,
        "label_smoothing": 0.0,
        "max_steps": 300,
        "eval_every": 300,
        "save_every": 300,
        "keep_last": 1,
        "log_every": 100,
        "valid_beam": 1,
        "tensorboard": False,
        "precision": "fp32",
    },
    "task": {"name": "parsing", "src_vocab_size": 100},
    "decode": {"beam": 2, "alpha": 0.3, "max_len_offset": 60},
}

# A toy grammar whose words decide the tree: a verb says whether an object follows, a
# preposition opens a PP, a determiner an NP (with an adjective or not), a name an NP alone
NOUNS = ("cat", "dog", "man", "park", "ball", "bird")
ADJECTIVES, DETERMINERS = ("big", "small", "red"), ("the", "a")
NAMES, PREPOSITIONS = ("John", "Mary"), ("in", "on")
INTRANSITIVE, TRANSITIVE = ("sat", "slept"), ("saw", "took")


def _noun_phrase(rng: random.Random) -> str:
    if rng.random() < 0.2:
        return f"(NP (NNP {rng.choice(NAMES)}))"
    adjective = f" (JJ {rng.choice(ADJECTIVES)})" if rng.random() < 0.4 else ""
    return f"(NP (DT {rng.choice(DETERMINERS)}){adjective} (NN {rng.choice(NOUNS)}))"


def _sentence(rng: random.Random) -> str:
    """One tree as a .mrg file holds it (an unlabelled outer bracket)."""
    if rng.random() < 0.5:
        verb = f"(VBD {rng.choice(TRANSITIVE)}) {_noun_phrase(rng)}"
    else:
        verb = f"(VBD {rng.choice(INTRANSITIVE)})"
    if rng.random() < 0.4:
        verb += f" (PP (IN {rng.choice(PREPOSITIONS)}) {_noun_phrase(rng)})"
    return f"( (S {_noun_phrase(rng)} (VP {verb}) (. .)) )"


@pytest.fixture(scope="module")
def ptb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """200 training and 20 dev and test sentences of the toy grammar, as a treebank.zip of .mrg
    files split by file number as the sample is (wsj_0001 train, 0160 dev, 0180 test), prepared
    by `transduce data ptb-sample --from`."""
    rng = random.Random(0)
    source = tmp_path_factory.mktemp("treebank")
    with zipfile.ZipFile(source / "treebank.zip", "w") as z:
        for name, n in (("wsj_0001.mrg", 200), ("wsj_0160.mrg", 20), ("wsj_0180.mrg", 20)):
            trees = "".join(_sentence(rng) + "\n" for _ in range(n))
            z.writestr(f"treebank/combined/{name}", trees)
    prepared = tmp_path_factory.mktemp("ptb")
    assert (
        main(
            [
                "--no-malloc-tuning",
                "data",
                "ptb-sample",
                "--dest",
                str(prepared),
                "--from",
                str(source),
            ]
        )
        == 0
    )
    assert len((prepared / "test.trees").read_text().splitlines()) == 20
    return prepared


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
    summary = _train(ptb, tmp_path / "run", 300, capsys)
    assert summary["step"] == 300 and "f1" in summary
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
    assert trained["sentences"] == 20
    # 300 updates: test F1 81.6, 15 of the 20 trees exact (the untrained model: 0)
    assert trained["f1"] >= 60.0 and trained["exact_match"] >= 50.0, (trained, untrained)
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
    summary = _train(ptb, tmp_path / "run", 300, capsys, slot_pieces=True)
    assert summary["step"] == 300
    trained = _evaluate(tmp_path / "run" / "model.pt", ptb, capsys, "--beam", "1")
    # 300 updates: test F1 96, 19 of the 20 trees exact
    assert trained["sentences"] == 20 and trained["f1"] >= 70.0, trained
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


@pytest.mark.parametrize("edit", ["shift", "blank"])
def test_words_out_of_line_with_their_trees_are_refused(
    ptb: Path, tmp_path: Path, edit: str
) -> None:
    from transduce.errors import UserError
    from transduce.training.tasks.parsing import read_split

    folder = tmp_path / "ptb"
    shutil.copytree(ptb, folder)
    lines = (folder / "train.words").read_text().splitlines()
    if edit == "shift":  # a line lost near the top and one added at the end: counts agree
        lines = lines[1:] + ["extra words here"]
    else:
        lines[2] = ""
    (folder / "train.words").write_text("\n".join(lines) + "\n")
    line = 1 if edit == "shift" else 3
    with pytest.raises(UserError, match=rf"train.words: line {line}: the words differ from tree"):
        read_split(folder, "train")
    assert len(read_split(ptb, "train")[0]) == 200  # the folder as prepared: in line
