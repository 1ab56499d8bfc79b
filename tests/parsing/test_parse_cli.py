"""`parse` and a parser's `evaluate` on a tiny untrained parser: blank lines, every option acting
or refused (fast: no training)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from inference_testkit import save_toy_parser, save_toy_translation_model

from transduce.cli.main import main
from transduce.parsing import parser as parser_module

WORDS = ["the dog runs", "a red ball", "the man sits in the park"]
TREES = [
    "(TOP (S (NP (DT the) (NN dog)) (VP (VBZ runs))))",
    "(TOP (NP (DT a) (JJ red) (NN ball)))",
    "(TOP (S (NP (DT the) (NN man)) (VP (VBZ sits) (PP (IN in) (NP (DT the) (NN park))))))",
]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("parse_cli")
    decode = {"beam": 2, "max_len_offset": 6}
    return {
        "parser": save_toy_parser(d / "parser.pt", decode),
        "translator": save_toy_translation_model(d / "translator.pt", decode),
    }


def _write(path: Path, lines: list[str]) -> str:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["--no-malloc-tuning", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_parse_keeps_blank_lines_blank(models, tmp_path, capsys) -> None:
    lines = [WORDS[0], "", WORDS[1], "", ""]
    src = _write(tmp_path / "in.txt", lines)
    code, out, err = _run(
        ["parse", "--model", str(models["parser"]), "--input", src, "--quiet"], capsys
    )
    assert code == 0, err
    trees = out.split("\n")[:-1]
    assert len(trees) == len(lines) and [i for i, t in enumerate(trees) if not t] == [1, 3, 4]
    code, alone, _ = _run(
        [
            "parse",
            "--model",
            str(models["parser"]),
            "--input",
            _write(tmp_path / "two.txt", WORDS[:2]),
            "--quiet",
        ],
        capsys,
    )
    assert code == 0 and [t for t in trees if t] == alone.split("\n")[:-1]
    assert trees[0].startswith("(TOP ") and trees[0].count("(XX ") == 3


def test_evaluate_names_the_blank_line_before_decoding(models, tmp_path, capsys) -> None:
    src = _write(tmp_path / "w.txt", [WORDS[0], "", WORDS[1]])
    ref = _write(tmp_path / "t.txt", TREES[:3])
    code, out, err = _run(
        ["evaluate", "--model", str(models["parser"]), "--src", src, "--ref", ref, "--quiet"],
        capsys,
    )
    assert code == 2 and not out
    assert (
        err == f"transduce: error: {src}: line 2 is empty: every line of a parser's "
        "evaluation needs a sentence (and its gold tree)\n"
    )
    empty = _write(tmp_path / "empty.txt", [])
    code, out, err = _run(
        ["evaluate", "--model", str(models["parser"]), "--src", empty, "--ref", empty, "--quiet"],
        capsys,
    )
    assert code == 2 and not out  # not an F1 of 0 over no sentence
    assert err == f"transduce: error: {empty}: no sentences to parse\n"


def test_a_parsers_evaluate_writes_its_trees(models, tmp_path, capsys) -> None:
    src, ref = _write(tmp_path / "w.txt", WORDS), _write(tmp_path / "t.txt", TREES)
    out_file = tmp_path / "parsed.txt"
    code, out, err = _run(
        [
            "evaluate",
            "--model",
            str(models["parser"]),
            "--src",
            src,
            "--ref",
            ref,
            "--output",
            str(out_file),
            "--quiet",
        ],
        capsys,
    )
    assert code == 0, err
    assert json.loads(out)["sentences"] == 3
    code, parsed, _ = _run(
        ["parse", "--model", str(models["parser"]), "--input", src, "--quiet"], capsys
    )
    assert code == 0 and out_file.read_text(encoding="utf-8") == parsed
    assert len(parsed.splitlines()) == 3


def test_a_parsers_evaluate_takes_precision_and_batch_tokens(
    models, tmp_path, capsys, monkeypatch
) -> None:
    seen: dict[str, Any] = {}
    real = parser_module.evaluate_parser

    def spy(parser: Any, *args: Any, **kwargs: Any) -> Any:
        seen["dtype"] = next(parser.model.parameters()).dtype
        seen["decode"] = args[2]
        return real(parser, *args, **kwargs)

    monkeypatch.setattr(parser_module, "evaluate_parser", spy)
    src, ref = _write(tmp_path / "w.txt", WORDS), _write(tmp_path / "t.txt", TREES)
    code, _, err = _run(
        [
            "evaluate",
            "--model",
            str(models["parser"]),
            "--src",
            src,
            "--ref",
            ref,
            "--precision",
            "bf16",
            "--batch-tokens",
            "7",
            "--quiet",
        ],
        capsys,
    )
    assert code == 0, err
    assert seen["dtype"] == torch.bfloat16 and seen["decode"].batch_tokens == 7


@pytest.mark.parametrize(
    "kind,flag,reason",
    [
        ("parser", "--lowercase", "a parsing model is scored by EVALB"),
        ("translator", "--constrained", "is for a parsing model"),
        ("translator", "--no-constrained", "is for a parsing model"),
    ],
)
def test_evaluate_refuses_an_option_of_the_other_kind(
    models, tmp_path, capsys, kind: str, flag: str, reason: str
) -> None:
    src = _write(tmp_path / "w.txt", WORDS)
    ref = _write(tmp_path / "t.txt", TREES if kind == "parser" else WORDS)
    code, out, err = _run(
        ["evaluate", "--model", str(models[kind]), "--src", src, "--ref", ref, flag, "--quiet"],
        capsys,
    )
    assert code == 2 and not out
    assert err.startswith(f"transduce: error: {flag} ") and reason in err
    assert len(err.splitlines()) == 1


def test_parser_api_names_an_empty_sentence_before_decoding(models, monkeypatch) -> None:
    from transduce.errors import UserError

    parser = parser_module.Parser.load(models["parser"])
    monkeypatch.setattr(parser.translator, "translate", lambda *a, **k: pytest.fail("decoded"))
    with pytest.raises(UserError, match="sentence 2 is empty"):
        parser.parse([WORDS[0].split(), [], WORDS[1].split()])


def test_score_reads_trees_as_the_parser_was_trained(models, tmp_path, capsys) -> None:
    # each tree linearised (not its brackets split on spaces, which read as <unk>): the
    # log-probability a teacher-forced forward gives the linearised tokens and EOS
    from transduce.checkpoint import load_model
    from transduce.data.batching import collate
    from transduce.data.linearise import linearise
    from transduce.data.trees import parse_trees

    words, trees = WORDS[:2], TREES[:2]  # of the toy parser's labels: S, NP, VP
    src, ref = _write(tmp_path / "w.txt", words), _write(tmp_path / "t.txt", trees)
    argv = ["score", "--model", str(models["parser"]), "--src", src]
    code, out, err = _run([*argv, "--tgt", ref], capsys)
    assert code == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    model, vocab, cfg = load_model(models["parser"])
    assert len(rows) == 2
    for sentence, tree, row in zip(words, parse_trees("\n".join(trees)), rows, strict=True):
        tokens = linearise(tree, tags=cfg.task.keep_tags)
        ids = vocab.target.encode(" ".join(tokens))
        assert 3 not in ids and row["tokens"] == len(ids) + 1  # no <unk>; EOS
        b = collate([(vocab.source.encode(sentence), ids)])
        with torch.no_grad():
            logp = model(b.src, b.tgt_in).log_softmax(-1)  # (1, T, V)
        expected = logp[0].gather(1, b.tgt_out[0][:, None]).sum().item()
        assert row["log_prob"] == pytest.approx(expected, abs=1e-4)
    for bad, needle in (
        ("(TOP (S (NP (DT the) (NN dog)) (VP (VBZ runs)))", "line 1"),  # unbalanced
        ("(TOP (S (NP (DT the) (NN dog))))", "tree 1 has 2 words, its sentence 3"),
        ("(TOP (FOO (DT the) (NN dog) (VBZ runs)))", "FOO"),  # a label never seen
    ):
        code, out, err = _run([*argv, "--tgt", _write(tmp_path / "b.txt", [bad, trees[1]])], capsys)
        assert code == 2 and not out and len(err.splitlines()) == 1, err
        assert "b.txt" in err and needle in err, err


def test_lines_named_tells_a_sentence_s_error_as_its_file_line():
    # sentence K of those parsed is line lines[K - 1] + 1 of the file (its blank lines skipped);
    # other errors, and sentences out of range, go through as they are
    from transduce.errors import SentenceError, UserError
    from transduce.parsing.parser import lines_named

    with pytest.raises(UserError, match=r"^in\.txt: line 5 is empty: a tree needs") as e:
        with lines_named("in.txt", [0, 2, 4]):
            raise SentenceError(3, " is empty: a tree needs at least one word")
    assert type(e.value) is UserError
    with pytest.raises(SentenceError, match="^sentence 4 has"):
        with lines_named("in.txt", [0, 2, 4]):
            raise SentenceError(4, " has 9 subword tokens")
    with pytest.raises(UserError, match="^sentence 2 of the config"):  # not about a sentence
        with lines_named("in.txt", [0, 2, 4]):
            raise UserError("sentence 2 of the config")
