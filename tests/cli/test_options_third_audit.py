"""What a third audit of the commands found: ``--output`` replaced what it named (a symbolic
link, a pipe, a device) by a regular file, and wrote a ``.GZ`` output uncompressed; a closed
stdin or stdout was a traceback; sampling errors named ``decode.--temperature``; ``--precision
int8`` on the recurrent model advised a setting that then failed; '-' as a model file wrote a
file named '-'; ``params`` took keys that change no count; data errors named Python arguments.
Each now acts or is refused in one line."""

from __future__ import annotations

import gzip
import io
import os
import stat
import sys
import threading
from pathlib import Path

import pytest
from cli_testkit import one_error, run_cli

from transduce.cli.main import main

_run, _one_error = run_cli, one_error


def _translate(model: Path, src: Path, output: Path | str) -> list[str]:
    return ["translate", "--model", str(model), "--input", str(src), "--output", str(output)]


def test_output_through_a_symbolic_link_writes_its_target(
    model_kinds, capsys, tmp_path: Path
) -> None:
    src = tmp_path / "in.txt"
    src.write_text("a b\nc\n")
    target, link = tmp_path / "target.txt", tmp_path / "link.txt"
    target.write_text("old\n")
    link.symlink_to(target)
    code, _, err = _run([*_translate(model_kinds["shared"], src, link), "--quiet"], capsys)
    assert code == 0, err
    assert link.is_symlink() and len(target.read_text().splitlines()) == 2


def test_output_into_a_pipe_is_read_by_its_reader(model_kinds, capsys, tmp_path: Path) -> None:
    src = tmp_path / "in.txt"
    src.write_text("a b\nc\n")
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    code, _, err = _run([*_translate(model_kinds["shared"], src, fifo), "--quiet"], capsys)
    reader.join(timeout=30)
    assert code == 0, err
    assert stat.S_ISFIFO(fifo.lstat().st_mode)  # still a pipe, not replaced by a file
    assert got and len(got[0].decode().splitlines()) == 2


def test_an_upper_case_gz_output_is_compressed(model_kinds, capsys, tmp_path: Path) -> None:
    src = tmp_path / "in.txt"
    src.write_text("a b\nc\n")
    out = tmp_path / "OUT.GZ"
    code, _, err = _run([*_translate(model_kinds["shared"], src, out), "--quiet"], capsys)
    assert code == 0, err
    assert len(gzip.decompress(out.read_bytes()).decode().splitlines()) == 2
    code, out_text, err = _run(["translate", "--model", str(model_kinds["shared"]),
                                "--input", str(out), "--quiet"], capsys)  # fmt: skip
    assert code == 0 and len(out_text.splitlines()) == 2, err


@pytest.mark.parametrize("closed", ["stdin", "stdout"])
@pytest.mark.parametrize("unbuffered", [False, True])
def test_a_closed_stream_is_one_line(
    model_kinds, capsys, monkeypatch, closed: str, unbuffered: bool
) -> None:
    argv = ["--no-malloc-tuning", "translate", "--model", str(model_kinds["shared"]), "--quiet"]
    if unbuffered:
        argv = [a for a in argv if a != "--quiet"] + ["--unbuffered"]
    stdin = io.TextIOWrapper(io.BytesIO(b"a b\n"), "utf-8")
    monkeypatch.setattr(sys, "stdin", stdin)
    monkeypatch.setattr(sys, closed, None)
    code = main(argv)
    monkeypatch.undo()
    out, err = capsys.readouterr()
    _one_error(code, out, err, f"{closed} is closed")


def test_a_parse_of_a_closed_stdin_is_one_line(model_kinds, capsys, monkeypatch) -> None:
    monkeypatch.setattr(sys, "stdin", None)
    code = main(["--no-malloc-tuning", "parse", "--model", str(model_kinds["parser"])])
    monkeypatch.undo()
    out, err = capsys.readouterr()
    _one_error(code, out, err, "stdin is closed")


@pytest.mark.parametrize(
    ("flag", "value"), [("--temperature", "nan"), ("--temperature", "inf"), ("--top-p", "nan")]
)
def test_sampling_errors_name_the_flag(
    model_kinds, capsys, tmp_path: Path, flag: str, value: str
) -> None:
    src = tmp_path / "in.txt"
    src.write_text("a b\n")
    argv = ["translate", "--model", str(model_kinds["shared"]), "--input", str(src)]
    code, out, err = _run([*argv, "--sampling", "--seed", "1", flag, value], capsys)
    _one_error(code, out, err, f"{flag} must be")
    assert "decode." not in err, err


@pytest.mark.parametrize("command", ["translate", "evaluate", "score"])
def test_int8_on_the_recurrent_model_names_the_model_not_the_cpu(
    model_kinds, capsys, tmp_path: Path, monkeypatch, command: str
) -> None:
    """Whatever the CPU (forced or not), the recurrent model is refused for what it is."""
    src = tmp_path / "in.txt"
    src.write_text("a b\n")
    rnn = str(model_kinds["recurrent"])
    argv = {
        "translate": ["translate", "--model", rnn, "--input", str(src)],
        "evaluate": ["evaluate", "--model", rnn, "--src", str(src), "--ref", str(src)],
        "score": ["score", "--model", rnn, "--src", str(src), "--tgt", str(src)],
    }[command]
    for forced in ("0", "1"):
        monkeypatch.setenv("TRANSDUCE_FORCE_INT8", forced)
        quiet = [] if command == "score" else ["--quiet"]
        code, out, err = _run([*argv, "--precision", "int8", *quiet], capsys)
        _one_error(code, out, err, rnn, "precision int8 is for Transformer models")


def test_int8_on_an_ensemble_names_its_recurrent_member(
    model_kinds, capsys, tmp_path: Path, monkeypatch
) -> None:
    src = tmp_path / "in.txt"
    src.write_text("a b\n")
    shared, rnn = str(model_kinds["shared"]), str(model_kinds["recurrent"])
    monkeypatch.setenv("TRANSDUCE_FORCE_INT8", "1")
    argv = ["translate", "--model", shared, "--model", rnn, "--input", str(src)]
    code, out, err = _run([*argv, "--precision", "int8", "--quiet"], capsys)
    _one_error(code, out, err, rnn, "RecurrentSeq2Seq")


def test_a_model_file_or_folder_is_never_written_to_a_file_named_dash(
    model_kinds, capsys, tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)
    model = str(model_kinds["shared"])
    for argv in (
        ["convert", model, "-"],
        ["average", "--output", "-", "--checkpoints", model],
        ["import", "huggingface", str(tmp_path), "--output", "-"],
        ["export", "ctranslate2", "--model", model, "--output", "-"],
        ["export", "huggingface", "--model", model, "--output", "-"],
    ):
        code, out, err = _run(argv, capsys)
        if code == 2 and "pip install" in err:  # an extra this machine lacks: refused first
            continue
        _one_error(code, out, err, "(not -)")
        assert not (tmp_path / "-").exists()


@pytest.mark.parametrize(
    "key", ["dropout=0.5", "attention_dropout=0.2", "activation=swish", "max_positions=64"]
)
def test_params_refuses_keys_no_count_depends_on(capsys, key: str) -> None:
    code, out, err = _run(["params", "--preset", "base", "--set", key], capsys)
    _one_error(code, out, err, f"--set {key.split('=')[0]}", "leave it out")


def test_params_takes_max_positions_with_learned_positions(capsys) -> None:
    counts = []
    for n in (64, 128):
        argv = ["params", "--set", "positional=learned", "--set", f"max_positions={n}"]
        code, out, err = _run(argv, capsys)
        assert code == 0, err
        counts.append(int(out.split('"parameters": ')[1].split(",")[0]))
    assert counts[1] - counts[0] == 2 * 64 * 512  # one table each side, d_model 512


@pytest.mark.parametrize(("corpus", "needle"), [("multi30k", "--from"), ("ptb-sample", "--from")])
def test_data_errors_name_the_option(capsys, tmp_path: Path, corpus: str, needle: str) -> None:
    argv = ["data", corpus, "--dest", str(tmp_path / "o"), "--from", str(tmp_path / "none")]
    code, out, err = _run(argv, capsys)
    _one_error(code, out, err, needle, "no such folder")
    assert "from_dir," not in err and "from_folder," not in err


@pytest.mark.parametrize("beam", ["1", "2"])
def test_a_constrained_parse_with_no_room_for_a_tree_is_one_line_greedy_too(
    model_kinds, capsys, tmp_path: Path, beam: str
) -> None:
    """Greedy search under the tree constraint with no room for a tree took the argmax of a
    row of NaN and returned an empty, repaired parse; beam search said so. Both say so."""
    words = tmp_path / "w.txt"
    words.write_text("a\n")  # one piece: 2 tokens at most with EOS, where "(S XX )S" takes 3
    argv = ["parse", "--model", str(model_kinds["parser"]), "--input", str(words), "--quiet"]
    argv += ["--constrained", "--beam", beam]
    code, out, err = _run([*argv, "--max-len-offset", "0"], capsys)
    _one_error(code, out, err, f"{words}: line 1", "raise max_len_offset")
    code, out, _ = _run([*argv, "--max-len-offset", "8"], capsys)
    assert code == 0 and out.startswith("(")


def test_score_takes_a_model_whose_beam_is_wider_than_its_vocabulary(
    capsys, tmp_path: Path
) -> None:
    """score searches nothing, and has no --beam: the decode section's beam 50 against a
    45-piece target vocabulary refused it; translate still refuses that beam, naming --beam."""
    from inference_testkit import save_toy_pair_translator

    model = str(save_toy_pair_translator(tmp_path / "wide.pt", {"beam": 50}))
    (tmp_path / "s").write_text("a b\n", encoding="utf-8")
    (tmp_path / "t").write_text("c d\n", encoding="utf-8")
    argv = ["score", "--model", model, "--src", str(tmp_path / "s"), "--tgt", str(tmp_path / "t")]
    code, out, err = _run(argv, capsys)
    assert code == 0, err
    assert len(out.strip().splitlines()) == 1 and '"log_prob"' in out
    code, out, err = _run(["translate", "--model", model, "--input", str(tmp_path / "s")], capsys)
    _one_error(code, out, err, "--beam (50) must not exceed the vocabulary size")


@pytest.mark.parametrize(
    ("command", "flag", "value", "said"),
    [
        ("translate", "--alpha", "nan", "--alpha must be a finite number"),
        ("translate", "--alpha", "-1", "--alpha must not be negative"),
        ("translate", "--beam", "0", "--beam must be positive"),
        ("translate", "--max-len-offset", "-1", "--max-len-offset must not be negative"),
        ("translate", "--batch-tokens", "0", "--batch-tokens must be positive"),
        ("score", "--alpha", "inf", "--alpha must be a finite number"),
        ("evaluate", "--beam", "0", "--beam must be positive"),
    ],
)
def test_search_flag_errors_name_the_flag(
    model_kinds, capsys, tmp_path: Path, command: str, flag: str, value: str, said: str
) -> None:
    """They named the config key (decode.alpha, beam, ...), where the sampling flags' errors
    named the flag."""
    src = tmp_path / "s"
    src.write_text("a b\n", encoding="utf-8")
    io_args = {
        "translate": ["--input", str(src)],
        "score": ["--src", str(src), "--tgt", str(src)],
        "evaluate": ["--src", str(src), "--ref", str(src)],
    }[command]
    argv = [command, "--model", str(model_kinds["shared"]), *io_args, f"{flag}={value}"]
    code, out, err = _run(argv, capsys)
    _one_error(code, out, err, said)
