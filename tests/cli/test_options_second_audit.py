"""What a second audit of the less central commands found: options that did nothing (--alpha
without a beam to rank, attention's --tgt for encoder self-attention, params' task keys),
inputs read wrongly in silence (attention's unknown pieces, gzipped trees, .safetensors files
given to average and convert), and errors that were tracebacks, misleading or late (a
constrained parse with no room for a tree, a parser's blank lines in score, unknown options,
average's --output, --resume offered where there is none). Each now acts or is refused in
one line."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from cli_testkit import one_error, run_cli

from transduce.cli.main import main
from transduce.data.trees import read_tree_file
from transduce.errors import UserError

_run, _one_error = run_cli, one_error


def test_a_constrained_parse_with_no_room_for_a_tree_is_one_line(
    model_kinds, capsys, tmp_path: Path
) -> None:
    words = tmp_path / "w.txt"
    words.write_text("a\n")  # one piece: 2 tokens at most with EOS, where "(S XX )S" takes 3
    argv = ["parse", "--model", str(model_kinds["parser"]), "--input", str(words), "--quiet"]
    code, out, err = _run([*argv, "--constrained", "--max-len-offset", "0"], capsys)
    _one_error(code, out, err, f"{words}: line 1", "raise max_len_offset")
    code, out, _ = _run([*argv, "--constrained", "--max-len-offset", "8"], capsys)
    assert code == 0 and out.startswith("(")  # room for a tree: one


def test_gzipped_tree_files_are_read_as_plain_ones(tmp_path: Path) -> None:
    text = "(S (NP (DT the) (NN dog)) (VP (VBZ runs)))\n"
    plain, packed = tmp_path / "t.trees", tmp_path / "t.trees.gz"
    plain.write_text(text)
    packed.write_bytes(gzip.compress(text.encode()))
    assert read_tree_file(packed) == read_tree_file(plain)
    (tmp_path / "cut.gz").write_bytes(packed.read_bytes()[:-6])
    with pytest.raises(UserError, match="cut.gz: corrupt gzip file"):
        read_tree_file(tmp_path / "cut.gz")
    (tmp_path / "hidden.trees").write_bytes(packed.read_bytes())
    with pytest.raises(UserError, match="gzip data in a file not named .gz"):
        read_tree_file(tmp_path / "hidden.trees")


def test_attention_warns_of_unknown_input_and_refuses_tgt_for_encoder_attention(
    model_kinds, capsys, tmp_path: Path
) -> None:
    pytest.importorskip("matplotlib")
    model = str(model_kinds["synthetic"])
    out_file = str(tmp_path / "a.html")
    code, _, err = _run(
        ["attention", "--model", model, "--src", "12+ab", "--tgt", "x9", "--output", out_file],
        capsys,
    )
    assert code == 0 and err.splitlines() == [
        "transduce: warning: 2 input characters not in the model's vocabulary (0123456789+), "
        "read as <unk>",
        "transduce: warning: 1 target characters not in the model's vocabulary (0123456789+), "
        "read as <unk>",
    ]
    code, out, err = _run(
        ["attention", "--model", model, "--src", "12", "--kind", "encoder", "--tgt", "3"]
        + ["--output", out_file],
        capsys,
    )
    _one_error(code, out, err, "--tgt", "encoder self-attention")
    for head in ("-1", "99"):  # the error named "heads [99]", not the option
        code, out, err = _run(
            ["attention", "--model", model, "--src", "12", "--head", head, "--output", out_file],
            capsys,
        )
        _one_error(code, out, err, f"--head {head}: the model's heads are 0 to")


def test_average_and_convert_take_safetensors_files(model_kinds, capsys, tmp_path: Path) -> None:
    pytest.importorskip("safetensors")
    shared = str(model_kinds["shared"])
    st = str(tmp_path / "m.safetensors")
    assert _run(["convert", shared, st], capsys)[0] == 0
    code, out, err = _run(
        ["average", "--checkpoints", st, shared, "--output", str(tmp_path / "avg.pt")], capsys
    )
    assert code == 0, err
    assert json.loads(out)["averaged"] == [st, shared]
    code, _, err = _run(["convert", st, str(tmp_path / "back.pt")], capsys)
    assert code == 0, err
    from transduce.checkpoint import load_model

    back, original = load_model(tmp_path / "back.pt")[0], load_model(shared)[0]
    assert all(
        (a == b).all()
        for a, b in zip(back.state_dict().values(), original.state_dict().values(), strict=True)
    )


def test_params_refuses_keys_outside_the_model_section(capsys) -> None:
    code, out, err = _run(["params", "--preset", "base", "--set", "shared_vocab=false"], capsys)
    _one_error(code, out, err, "--set shared_vocab", "model section")
    code, out, _ = _run(["params", "--preset", "base", "--set", "d_model=256"], capsys)
    assert code == 0 and json.loads(out)["parameters"] > 0


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--beam", "1", "--alpha", "1.0"], "greedy search (beam 1) has none"),
        (["--sampling", "--seed", "1", "--alpha", "1.0"], "one sample has no rival"),
    ],
)
def test_alpha_where_nothing_is_ranked_is_refused(
    model_kinds, capsys, extra: list[str], needle: str
) -> None:
    argv = ["translate", "--model", str(model_kinds["shared"]), "--quiet", *extra]
    _one_error(*_run(argv, capsys, stdin="the dog\n"), needle)


def test_alpha_acts_with_a_beam_and_with_n_best_samples(model_kinds, capsys) -> None:
    model = str(model_kinds["shared"])
    for extra in (["--beam", "2"], ["--sampling", "--seed", "1", "--nbest", "2"]):
        argv = ["translate", "--model", model, "--quiet", "--alpha", "1.0", *extra]
        assert _run(argv, capsys, stdin="the dog\n")[0] == 0


def test_alpha_with_greedy_parse_and_evaluate_is_refused(
    model_kinds, capsys, tmp_path: Path
) -> None:
    words = tmp_path / "w.txt"
    words.write_text("the dog\n")
    parser = str(model_kinds["parser"])
    argv = ["parse", "--model", parser, "--input", str(words), "--beam", "1", "--alpha", "2"]
    _one_error(*_run(argv, capsys), "greedy search")
    ref = tmp_path / "r.txt"
    ref.write_text("a dog\n")
    shared = str(model_kinds["shared"])
    argv = ["evaluate", "--model", shared, "--src", str(words), "--ref", str(ref)]
    _one_error(*_run([*argv, "--beam", "1", "--alpha", "2"], capsys), "greedy search")


def test_score_names_a_parsers_blank_line(model_kinds, capsys, tmp_path: Path) -> None:
    words, trees = tmp_path / "w.txt", tmp_path / "t.trees"
    words.write_text("the dog\n\na cat\n")
    trees.write_text("(S (NP (DT the) (NN dog)))\n\n(S (NP (DT a) (NN cat)))\n")
    argv = ["score", "--model", str(model_kinds["parser"]), "--src", str(words)]
    _one_error(*_run([*argv, "--tgt", str(trees)], capsys), f"{words}: line 2 is empty")


def test_alignments_with_an_ensemble_are_refused_in_either_order(model_kinds, capsys) -> None:
    shared, recurrent = str(model_kinds["shared"]), str(model_kinds["recurrent"])
    for first, second in ((shared, recurrent), (recurrent, shared), (shared, shared)):
        argv = ["translate", "--model", first, "--model", second, "--alignments", "--quiet"]
        _one_error(*_run(argv, capsys, stdin="the dog\n"), "give one --model")


@pytest.mark.parametrize(
    ("kind", "layer", "needle"),
    [("recurrent", None, "not the rnn's"), ("shared", "7", "alignment layer 7: this model has")],
)
def test_alignments_are_refused_before_anything_is_translated(
    model_kinds, capsys, monkeypatch: pytest.MonkeyPatch, kind: str, layer: str | None, needle: str
) -> None:
    from transduce.inference.translator import Translator

    def no_decoding(*args: object, **kwargs: object) -> None:
        raise AssertionError("translated before refusing")

    monkeypatch.setattr(Translator, "translate", no_decoding)
    argv = ["translate", "--model", str(model_kinds[kind]), "--alignments", "--quiet"]
    argv += [] if layer is None else ["--alignment-layer", layer]
    _one_error(*_run(argv, capsys, stdin="the dog\n"), needle)


@pytest.mark.parametrize(
    ("argv", "help_of"),
    [
        (["score", "--model", "m", "--src", "a", "--tgt", "b", "--bogus"], "transduce score"),
        (["data", "multi30k", "--dest", "x", "--bogus"], "transduce data multi30k"),
    ],
)
def test_an_unknown_option_names_its_subcommands_help(capsys, argv, help_of: str) -> None:
    with pytest.raises(SystemExit) as e:  # argparse's way out, with argparse's code
        main(["--no-malloc-tuning", *argv])
    out, err = capsys.readouterr()
    _one_error(e.value.code, out, err, "unrecognized arguments: --bogus", f"{help_of} --help")


def test_average_checks_its_output_before_reading_anything(capsys, tmp_path: Path) -> None:
    argv = ["average", "--checkpoints", str(tmp_path / "nope.pt"), "--output", str(tmp_path)]
    _one_error(*_run(argv, capsys), "is a folder; --output names the file")


def test_an_experiment_over_a_run_is_refused_before_its_first_run(tmp_path: Path) -> None:
    from transduce.experiments import reversal

    taken = tmp_path / "rev" / "reversed" / "checkpoints"
    taken.mkdir(parents=True)
    (taken / "step_10.pt").write_bytes(b"")
    with pytest.raises(UserError) as e:
        reversal(tmp_path / "rev", minutes=0.01, show_progress=False)
    assert "already holds a run" in str(e.value) and "--resume continues it" in str(e.value)
    assert not (tmp_path / "rev" / "baseline").exists()  # refused before the first run


def test_the_python_api_refuses_an_ensembles_alignments_too(model_kinds) -> None:
    # the CLI is a shell over it: an ensemble Translator's model is its first member alone
    from transduce.inference.translator import Translator

    shared = model_kinds["shared"]
    ensemble = Translator.load_ensemble([shared, shared])
    with pytest.raises(UserError, match="an ensemble's members attend differently"):
        ensemble.align(["the dog"], ["der hund"])
    assert Translator.load(shared).align(["the dog"], ["der hund"])[0]  # one model: aligned


def test_the_alpha_refusal_names_nbest_only_where_the_command_has_it() -> None:
    # evaluate and parse have no --nbest: their refusal pointed to it all the same
    from transduce.cli.decoding_tools import check_alpha
    from transduce.config import DecodeConfig
    from transduce.errors import UserError

    sampled = DecodeConfig(sampling=True, sampling_seed=1)
    with pytest.raises(UserError, match=r"n-best samples \(--nbest 2 or more\)"):
        check_alpha(1.0, sampled)
    with pytest.raises(UserError, match=r"n-best samples \(this command draws one a sentence\)"):
        check_alpha(1.0, sampled, has_nbest=False)
    check_alpha(1.0, sampled, 2)  # n-best samples: ranked
