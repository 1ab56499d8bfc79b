"""Settings an audit found acting on nothing or failing late, now refused in one line before
a run starts: early stopping or max_valid_sentences on a prepared folder without a validation
split, a parsing split of no sentences, fp16 for the recurrent model on a CPU, and an empty
--out."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import yaml
from training_testkit import TINY, cli, train_args, write_config

from transduce.data.trees import parse_trees
from transduce.errors import UserError
from transduce.training.tasks.parsing import read_split

WORDS = "the a house cat dog runs sees big small red blue green tree river walks over".split()


def _translation_config(folder: Path) -> Path:
    """A tiny translation run of a toy corpus written into ``folder`` (its config file)."""
    rng = random.Random(0)
    src = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 8))) for _ in range(80)]
    (folder / "train.src").write_text("\n".join(src) + "\n")
    (folder / "train.tgt").write_text("\n".join(s.upper() for s in src) + "\n")
    config = {
        "model": {**TINY["model"], "dropout": 0.0},
        "train": {**TINY["train"], "max_steps": 2, "save_every": 2, "device": "cpu"},
        "task": {
            "name": "translation",
            "train_src": str(folder / "train.src"),
            "train_tgt": str(folder / "train.tgt"),
            "vocab_size": 60,
        },
        "decode": {"beam": 1},
    }
    path = folder / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.parametrize(
    "setting,key",
    [
        (["--set", "patience=1", "--set", "eval_every=1"], "train.patience"),
        (["--set", "max_valid_sentences=3"], "task.max_valid_sentences"),
    ],
)
def test_a_prepared_folder_without_validation_refuses_patience_and_max_valid_sentences(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], setting: list[str], key: str
) -> None:
    """They stopped the run at its first validation (none ran: "stopped_by: early_stopping")
    or were ignored, where the files path refuses them without validation files."""
    config = _translation_config(tmp_path)
    folder = tmp_path / "prep"
    code, err = cli(
        capsys,
        "prepare",
        "--config",
        str(config),
        "--out",
        str(folder),
        "--workers",
        "1",
        "--quiet",
    )
    assert code == 0, err
    out = tmp_path / "run"
    code, err = cli(capsys, *train_args(config, out, "--set", f"prepared={folder}", *setting))
    assert code == 2
    assert f"transduce: error: {key} needs validation: {folder} was prepared without a " in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()
    # without them the folder trains as before (no validation: a note, no error)
    code, err = cli(capsys, *train_args(config, out, "--set", f"prepared={folder}"))
    assert code == 0, err


def _parse_folder(folder: Path, train: int, dev: int) -> Path:
    """``train`` and ``dev`` trees of a toy grammar as ``transduce data ptb-sample`` writes
    them (``{split}.words`` and ``{split}.trees``)."""
    rng = random.Random(0)
    folder.mkdir()
    for split, n in (("train", train), ("dev", dev)):
        brackets = "".join(
            f"( (S (NP (DT the) (NN {rng.choice(WORDS)})) (VP (VBD {rng.choice(WORDS)})) (. .)) )\n"
            for _ in range(n)
        )
        trees = parse_trees(brackets)
        (folder / f"{split}.trees").write_text("".join(f"{t}\n" for t in trees))
        (folder / f"{split}.words").write_text("".join(" ".join(t.words()) + "\n" for t in trees))
    return folder


@pytest.mark.parametrize("split", ["train", "dev"])
def test_a_parsing_split_of_no_sentences_is_refused_naming_it(tmp_path: Path, split: str) -> None:
    folder = _parse_folder(tmp_path / "ptb", train=0 if split == "train" else 30, dev=0)
    with pytest.raises(UserError, match=rf"{split}.words and {split}.trees: no sentences; the "):
        read_split(folder, split)


def test_a_parsing_run_with_an_empty_dev_split_is_refused_before_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every parsing run validates on dev: an empty one scored F1 0.0 and early-stopped."""
    folder = _parse_folder(tmp_path / "ptb", train=30, dev=0)
    config = {
        "model": TINY["model"],
        "train": {**TINY["train"], "max_steps": 2, "eval_every": 1, "patience": 1},
        "task": {"name": "parsing", "src_vocab_size": 40, "parse_data": str(folder)},
        "decode": {"beam": 1},
    }
    path = tmp_path / "parse.yaml"
    path.write_text(yaml.safe_dump(config))
    code, err = cli(capsys, *train_args(path, tmp_path / "run"))
    assert code == 2
    assert f"transduce: error: {folder / 'dev.words'} and dev.trees: no sentences" in err
    assert "Traceback" not in err and not (tmp_path / "run").exists()


def test_fp16_for_the_recurrent_model_on_a_cpu_is_refused_the_transformer_trains(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The LSTM failed at the first step with oneDNN's RuntimeError (a traceback, exit 1)."""
    rnn = {"model": {"architecture": "rnn", "n_layers": 1, "d_model": 16}}
    path = tmp_path / "rnn.yaml"
    path.write_text(yaml.safe_dump({**TINY, **rnn}))
    fp16 = ("--set", "precision=fp16", "--set", "device=cpu")
    code, err = cli(capsys, *train_args(path, tmp_path / "rnn", *fp16))
    assert code == 2
    assert "error: precision fp16 with architecture: rnn on a CPU" in err
    assert "Traceback" not in err and not (tmp_path / "rnn").exists()
    code, err = cli(
        capsys, "demo", "--out", str(tmp_path / "demo_rnn"), "--set", "architecture=rnn", *fp16
    )
    assert code == 2 and "error: precision fp16 with architecture: rnn on a CPU" in err
    assert not (tmp_path / "demo_rnn").exists()
    # the Transformer in fp16 on a CPU trains
    config = write_config(tmp_path / "tf.yaml", max_steps=2, save_every=2)
    code, err = cli(capsys, *train_args(config, tmp_path / "tf", *fp16))
    assert code == 0, err
    assert (tmp_path / "tf" / "model.pt").is_file()


@pytest.mark.parametrize("out", ["", "  "])
@pytest.mark.parametrize("command", ["train", "demo", "experiment"])
def test_an_empty_out_is_refused_not_the_current_directory(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    command: str,
    out: str,
) -> None:
    """``--out "$RUN"`` with RUN unset trained into the current directory."""
    config = write_config(tmp_path / "run.yaml", max_steps=2, save_every=2)
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    argv = {
        "train": ["train", "--config", str(config), "--set", "max_steps=2"],
        "demo": ["demo", "--set", "max_steps=2"],
        "experiment": ["experiment", "reversal", "--minutes", "0.1"],
    }[command]
    code, err = cli(capsys, *argv, "--out", out, "--quiet")
    assert code == 2
    assert "transduce: error: --out is empty (an unset variable?)" in err, err
    assert not any(here.iterdir())
