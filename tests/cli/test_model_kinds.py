"""What each command does with a model of another kind than it is made for: a parser given to
translate or serve, English given to an addition model, --resume on a folder without a run,
`vocab` on a parsing config. Each is refused in one line (exit 2) or said once on stderr."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from unittest import mock

import pytest
import yaml
from cli_testkit import one_error, run_cli

_run, _one_error = run_cli, one_error


@pytest.mark.parametrize("command", ["translate", "serve"])
def test_a_parser_is_refused_where_text_comes_out(model_kinds, capsys, command: str) -> None:
    if command == "serve":
        pytest.importorskip("fastapi")
    parser = str(model_kinds["parser"])
    argv = [command, "--model", parser] + (["--port", "0"] if command == "serve" else [])
    with mock.patch("transduce.serve.server.serve", lambda *a, **k: pytest.fail("served")):
        code, out, err = _run(argv, capsys, stdin="the dog runs\n")
    _one_error(code, out, err, parser, "parsing model", "transduce parse")


def test_an_addition_model_says_once_what_it_could_not_read(
    model_kinds, capsys, tmp_path: Path
) -> None:
    code, out, err = _run(
        ["translate", "--model", str(model_kinds["synthetic"]), "--quiet"],
        capsys,
        stdin="12+34\nthe dog\n\nab+1\n",
    )
    assert code == 0 and len(out.splitlines()) == 4
    assert err == (
        "transduce: warning: 9 input characters not in the model's vocabulary "
        "(0123456789+), read as <unk>\n"
    )  # "the dog" and "ab"
    code, _, err = _run(
        ["translate", "--model", str(model_kinds["synthetic"]), "--quiet"], capsys, stdin="12+34\n"
    )
    assert code == 0 and err == ""
    # line by line, each line's warning as it is answered
    code, out, err = _run(
        ["translate", "--model", str(model_kinds["synthetic"]), "--unbuffered"],
        capsys,
        stdin="12+34\nthe dog\n\nab+1\n",
    )
    assert code == 0 and len(out.splitlines()) == 4
    assert err.splitlines() == [
        f"transduce: warning: line {n}: {k} input characters not in the model's vocabulary "
        "(0123456789+), read as <unk>"
        for n, k in ((2, 7), (4, 2))
    ]
    src, ref = tmp_path / "src.txt", tmp_path / "ref.txt"
    src.write_text("1+1\nab+1\n", encoding="utf-8")
    ref.write_text("2\n2\n", encoding="utf-8")
    code, out, err = _run(
        [
            "evaluate",
            "--model",
            str(model_kinds["synthetic"]),
            "--src",
            str(src),
            "--ref",
            str(ref),
            "--quiet",
        ],
        capsys,
    )
    assert code == 0 and '"bleu"' in out
    assert err == (
        "transduce: warning: 2 input characters not in the model's vocabulary "
        "(0123456789+), read as <unk>\n"
    )


def test_resume_without_a_run_is_refused(tmp_path: Path, capsys) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "model": {
                    "n_layers": 1,
                    "d_model": 16,
                    "d_ff": 32,
                    "n_heads": 2,
                    "d_k": 8,
                    "d_v": 8,
                },
                "train": {"max_steps": 2, "tensorboard": False},
                "task": {"name": "copy", "train_size": 40, "valid_size": 8, "max_length": 4},
            }
        )
    )
    for out in (tmp_path / "new", tmp_path / "empty"):
        if out.name == "empty":
            out.mkdir()
        code, stdout, err = _run(
            ["train", "--config", str(config), "--out", str(out), "--resume", "--quiet"], capsys
        )
        _one_error(code, stdout, err, f"--resume: {out} holds no checkpoint")
        assert not out.exists() or not any(out.iterdir())  # nothing half-written


def test_vocab_of_a_parsing_config_says_what_to_do(tmp_path: Path, capsys) -> None:
    config = tmp_path / "p.yaml"
    config.write_text(yaml.safe_dump({"task": {"name": "parsing"}}))
    code, out, err = _run(["vocab", "--config", str(config), "--out", str(tmp_path / "v")], capsys)
    _one_error(code, out, err, "vocab needs a translation task", "transduce train")
    assert "prepare" not in err and not (tmp_path / "v").exists()


# -- the README's table of commands and kinds of model ------------------------------------------

README = Path(__file__).resolve().parents[2] / "README.md"
COLUMNS = ("synthetic", "shared", "separate", "parser", "recurrent")  # the table's, in order
# what a refusal the table names says
REASONS = {
    "use `parse`": "transduce parse",
    "not a parsing model": "not a parsing model",
    "Transformer": "Transformer",
    "one vocabulary only": "one vocabulary shared",
    "SentencePiece vocabulary": "needs a SentencePiece vocabulary",
}


def _readme_table() -> dict[str, list[str]]:
    """Command (as the table writes it, without backticks) -> its cells, one per kind."""
    text = README.read_text(encoding="utf-8")
    section = text.split("### Which command takes which model", 1)[1].split("\n### ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    table = {}
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        table[cells[0].strip("`")] = cells[1:]
    return table


def _argv(command: str, model: Path, kind: str, folder: Path) -> list[str]:
    words = folder / "words.txt"
    words.write_text("the dog runs\na red ball\n", encoding="utf-8")
    ref = folder / "ref.txt"
    ref.write_text(
        "(TOP (S (NP (DT the) (NN dog)) (VP (VBZ runs))))\n(TOP (NP (DT a) (JJ red) (NN ball)))\n"
        if kind == "parser"
        else "der hund rennt\nein roter ball\n",
        encoding="utf-8",
    )
    return {
        "translate": ["translate", "--model", str(model), "--input", str(words), "--quiet"],
        "translate --alignments": [
            "translate",
            "--model",
            str(model),
            "--input",
            str(words),
            "--alignments",
            "--quiet",
        ],
        "evaluate": [
            "evaluate",
            "--model",
            str(model),
            "--src",
            str(words),
            "--ref",
            str(ref),
            "--quiet",
        ],
        "parse": ["parse", "--model", str(model), "--input", str(words), "--quiet"],
        "attention": [
            "attention",
            "--model",
            str(model),
            "--src",
            "the dog",
            "--output",
            str(folder / "a.png"),
        ],
        "serve": ["serve", "--model", str(model), "--port", "0"],
        "score": ["score", "--model", str(model), "--src", str(words), "--tgt", str(ref)],
        "export huggingface": [
            "export",
            "huggingface",
            "--model",
            str(model),
            "--output",
            str(folder / "hf"),
        ],
        "export ctranslate2": [
            "export",
            "ctranslate2",
            "--model",
            str(model),
            "--output",
            str(folder / "ct2"),
        ],
    }[command]


def test_the_readme_table_of_commands_and_models_holds(model_kinds, tmp_path, capsys) -> None:
    table = _readme_table()
    assert set(table) == {
        "translate",
        "translate --alignments",
        "evaluate",
        "parse",
        "attention",
        "serve",
        "export ctranslate2",
        "score",
        "export huggingface",
    }
    for command, cells in table.items():
        if command == "serve" and importlib.util.find_spec("fastapi") is None:
            continue
        if command == "export ctranslate2" and importlib.util.find_spec("ctranslate2") is None:
            continue
        if command == "export huggingface" and importlib.util.find_spec("transformers") is None:
            continue
        assert len(cells) == len(COLUMNS), (command, cells)
        for kind, cell in zip(COLUMNS, cells, strict=True):
            folder = tmp_path / f"{command.replace(' ', '_')}_{kind}"
            folder.mkdir()
            with mock.patch("transduce.serve.server.serve", lambda *a, **k: None):
                code, out, err = _run(_argv(command, model_kinds[kind], kind, folder), capsys)
            if cell.startswith("refused"):
                needles = [v for k, v in REASONS.items() if k in cell]
                assert len(needles) == 1, cell
                _one_error(code, out, err, *needles)
            else:
                assert cell.startswith("acts") and code == 0, (command, kind, err)


@pytest.mark.parametrize("command", ["translate", "parse", "evaluate"])
def test_a_binary_input_is_one_line_and_writes_nothing(
    model_kinds, tmp_path, capsys, command: str
) -> None:
    binary = tmp_path / "data.bin"
    binary.write_bytes(b"the dog\n\x00\x01\xff\xfe\x80 runs\n")
    model = model_kinds["parser" if command != "translate" else "shared"]
    out = tmp_path / "out.txt"
    argv = {
        "translate": ["translate", "--input", str(binary)],
        "parse": ["parse", "--input", str(binary)],
        "evaluate": ["evaluate", "--src", str(binary), "--ref", str(binary)],
    }[command]
    code, stdout, err = _run([*argv, "--model", str(model), "--output", str(out)], capsys)
    _one_error(code, stdout, err, str(binary), "line 2")
    assert not out.exists()


@pytest.mark.parametrize("command", ["translate", "parse", "evaluate", "score"])
@pytest.mark.parametrize("where", ["a folder", "in no folder"])
def test_an_output_that_cannot_be_written_is_refused_before_any_work(
    model_kinds, tmp_path, capsys, command: str, where: str
) -> None:
    """--output naming a folder, or a file in a folder that does not exist, is refused before
    the model is loaded or the input read (it failed only after decoding everything)."""
    words = tmp_path / "words.txt"
    words.write_text("the dog runs\n", encoding="utf-8")
    output = tmp_path if where == "a folder" else tmp_path / "nowhere" / "out.txt"
    model = tmp_path / "no-such-model.pt"  # never reached: the output is checked first
    argv = {
        "translate": ["translate", "--input", str(words)],
        "parse": ["parse", "--input", str(words)],
        "evaluate": ["evaluate", "--src", str(words), "--ref", str(words)],
        "score": ["score", "--src", str(words), "--tgt", str(words)],
    }[command]
    code, out, err = _run([*argv, "--model", str(model), "--output", str(output)], capsys)
    _one_error(code, out, err, str(output), "is a folder" if where == "a folder" else "no such")
    assert "no-such-model" not in err


def test_score_of_empty_files_says_so(model_kinds, tmp_path, capsys) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_text("", encoding="utf-8")
    argv = [
        "score",
        "--model",
        str(model_kinds["shared"]),
        "--src",
        str(empty),
        "--tgt",
        str(empty),
    ]
    code, out, err = _run(argv, capsys)
    assert code == 0 and out == ""
    assert err.strip() == f"transduce: warning: {empty}: no lines to score"


def test_parse_names_the_input_line_past_blank_lines(model_kinds, tmp_path, capsys) -> None:
    """Blank lines are not parsed (they stay blank), so the parser's "sentence K" was not the
    input's line K; and a word holding a bracket failed only after all the decoding, unnamed."""
    words = tmp_path / "words.txt"
    words.write_text("the dog\n\n\nx ( y\n", encoding="utf-8")
    argv = ["parse", "--model", str(model_kinds["parser"]), "--input", str(words), "--quiet"]
    code, out, err = _run(argv, capsys)
    _one_error(code, out, err, f"{words}: line 4: word '('")
    words.write_text("the dog\n\n\n" + "dog " * 5000 + "\n", encoding="utf-8")
    code, out, err = _run(argv, capsys)
    _one_error(code, out, err, f"{words}: line 4 has 10000 subword tokens")  # 2 a word
    ref = tmp_path / "ref.txt"
    ref.write_text("(TOP (NP (DT the) (NN dog)))\n(TOP (NP (NN x) (NN y)))\n", encoding="utf-8")
    words.write_text("the dog\nx )\n", encoding="utf-8")
    argv = ["evaluate", "--model", str(model_kinds["parser"]), "--src", str(words)]
    code, out, err = _run([*argv, "--ref", str(ref), "--quiet"], capsys)
    _one_error(code, out, err, f"{words}: line 2: word ')'")


@pytest.mark.parametrize("command", ["translate", "evaluate", "serve"])
def test_graphs_on_a_cpu_and_on_a_parser_are_refused(model_kinds, tmp_path, capsys, command):
    # --graphs on: CUDA graphs off CUDA (every command), the parser's word positions (evaluate)
    if command == "serve":
        pytest.importorskip("fastapi")
    src = tmp_path / "src.txt"
    src.write_text("the dog runs\n", encoding="utf-8")
    extra = {
        "translate": ["--input", str(src)],
        "evaluate": ["--src", str(src), "--ref", str(src)],
        "serve": ["--port", "0"],
    }[command]
    model = str(model_kinds["shared"])
    argv = [command, "--model", model, *extra, "--graphs", "on"]
    with mock.patch("transduce.serve.server.serve", lambda *a, **k: pytest.fail("served")):
        code, out, err = _run(argv, capsys)
    _one_error(code, out, err, "CUDA graphs needs a CUDA device, not cpu")
    if command == "evaluate":
        parser = str(model_kinds["parser"])
        argv = [command, "--model", parser, *extra, "--graphs", "on"]
        code, out, err = _run(argv, capsys)
        _one_error(code, out, err, "--graphs on is for translation models")


def test_graphs_reaches_the_translator(model_kinds, tmp_path, capsys, monkeypatch) -> None:
    # --graphs off / on / auto -> graphs=False / True / None, through each way a command loads
    from transduce.inference.translator import Translator

    pytest.importorskip("fastapi")
    seen: list[object] = []  # the graphs each command asked for (not load's own of_model)
    depth = [0]
    for name in ("load", "of_model"):
        original = getattr(Translator, name).__func__

        def spy(cls, *args, _original=original, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
            if depth[0] == 0:
                seen.append(kwargs.get("graphs"))
            depth[0] += 1
            try:  # a CPU: never graphs
                return _original(cls, *args, **{**kwargs, "graphs": False})
            finally:
                depth[0] -= 1

        monkeypatch.setattr(Translator, name, classmethod(spy))
    src = tmp_path / "src.txt"
    src.write_text("der hund\n", encoding="utf-8")
    model = str(model_kinds["shared"])
    runs = {
        "translate": ["translate", "--model", model, "--input", str(src)],
        "evaluate": ["evaluate", "--model", model, "--src", str(src), "--ref", str(src)],
        "ensemble": ["evaluate", "--model", model, "--model", model, "--src", str(src)]
        + ["--ref", str(src)],
        "serve": ["serve", "--model", model, "--port", "0"],
    }
    with mock.patch("transduce.serve.server.serve", lambda *a, **k: None):
        for flag, want in (("off", False), ("on", True), ("auto", None)):
            for argv in runs.values():
                seen.clear()
                code, _, err = _run([*argv, "--graphs", flag], capsys)
                assert code == 0, err
                assert seen and set(seen) == {want}, (argv, flag, seen)


def test_a_sentence_too_long_is_named_by_its_file_and_line(model_kinds, tmp_path, capsys):
    # "sentence K" of the Python API said as the line of the file (translate, line by line,
    # evaluate, score: source and target)
    from transduce.inference import text_inputs

    with mock.patch.object(text_inputs, "MAX_SENTENCE_TOKENS", 12):
        model = str(model_kinds["shared"])
        src, long = tmp_path / "src.txt", "der hund rennt " * 6
        src.write_text(f"der hund\n\n{long}\n", encoding="utf-8")
        tgt = tmp_path / "tgt.txt"
        tgt.write_text(f"{long}\nder\nder\n", encoding="utf-8")
        code, out, err = _run(["translate", "--model", model, "--input", str(src)], capsys)
        _one_error(code, out, err, f"{src}: line 3 has ")
        argv = ["translate", "--model", model, "--unbuffered"]
        code, out, err = _run(argv, capsys, stdin=f"der\n{long}\n")
        assert code == 2 and err.splitlines()[-1].startswith(
            "transduce: error: <stdin>: line 2 has "
        )
        argv = ["evaluate", "--model", model, "--src", str(src), "--ref", str(src)]
        code, out, err = _run(argv, capsys)
        _one_error(code, out, err, f"{src}: line 3 has ")
        argv = ["score", "--model", model, "--src", str(src), "--tgt", str(src)]
        code, out, err = _run(argv, capsys)
        _one_error(code, out, err, f"{src}: line 3 has ")
        argv = ["score", "--model", model, "--src", str(tgt), "--tgt", str(src)]
        code, out, err = _run(argv, capsys)
        _one_error(code, out, err, f"{tgt}: line 1 has ")


@pytest.mark.parametrize("kind", ["synthetic", "shared", "separate", "parser", "recurrent"])
def test_attention_names_text_that_is_not_utf8(model_kinds, tmp_path, capsys, kind) -> None:
    # bytes of another encoding arrive in argv as lone surrogates: a traceback in the tokenizer
    base = ["attention", "--model", str(model_kinds[kind]), "--output", str(tmp_path / "a.png")]
    for option, texts in (
        ("--src", ["--src", "the \udcff dog"]),
        ("--tgt", ["--src", "the dog", "--tgt", "der \udcfe"]),
    ):
        code, out, err = _run([*base, *texts], capsys)
        _one_error(code, out, err, f"{option}: character 5 is not text (bytes that are not UTF-8")


def test_attention_reads_a_parsers_target_as_a_tree(model_kinds, tmp_path, capsys) -> None:
    base = ["attention", "--model", str(model_kinds["parser"]), "--src", "the dog"]
    base += ["--output", str(tmp_path / "a.png")]
    code, _, err = _run([*base, "--tgt", "(S (NP (DT the) (NN dog)))"], capsys)
    assert code == 0 and "<unk>" not in err, err  # linearised: (S (NP XX XX )NP )S
    for tree, said in (
        ("(S (NP (DT the)))", "--tgt: tree 1 has 1 words, its sentence 2"),
        ("(S (NP (DT the) (NN dog))", "--tgt: line 1"),
        ("(S (NP (DT the))) (S (NP (NN dog)))", "--tgt: a parser's target is one bracketed tree"),
    ):
        code, out, err = _run([*base, "--tgt", tree], capsys)
        _one_error(code, out, err, said)


def test_samples_beyond_the_cap_are_refused_before_decoding(model_kinds, capsys) -> None:
    # K samples decode as K rows at once: 10,000,000 filled a 24 GB machine
    base = ["translate", "--model", str(model_kinds["shared"]), "--sampling", "--seed", "1"]
    code, out, err = _run([*base, "--nbest", "1001"], capsys, stdin="the dog runs\n")
    _one_error(code, out, err, "nbest (1001): at most 1000 samples a sentence are drawn at once")
    code, out, err = _run([*base, "--nbest", "3"], capsys, stdin="the dog runs\n")
    assert code == 0 and len(out.splitlines()) == 3, (out, err)


@pytest.mark.parametrize("kind", ["synthetic", "shared", "separate", "recurrent"])
def test_an_output_named_gz_is_gzip_as_inputs_so_named_are_read(
    model_kinds, tmp_path, capsys, kind
) -> None:
    import gzip

    from transduce.data.parallel import read_lines

    source = "1+2\n2+2\n" if kind == "synthetic" else "the dog runs\na cat\n"
    plain, packed = tmp_path / "out.txt", tmp_path / "out.txt.gz"
    for out in (plain, packed):
        argv = ["translate", "--model", str(model_kinds[kind]), "--output", str(out)]
        code, _, err = _run(argv, capsys, stdin=source)
        assert code == 0, err
    assert gzip.decompress(packed.read_bytes()).decode("utf-8") == plain.read_text("utf-8")
    assert read_lines(packed) == read_lines(plain) and len(read_lines(plain)) == 2
