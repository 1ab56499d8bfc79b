"""Every subcommand's arguments, fuzzed in-process with hypothesis: whatever the arguments, the
command ends with exit status 0 or 2, never another exception, and a failure is one line on
stderr (``transduce: error: ...``; argparse's usage errors included, see ``cli/main.py``).

Nothing long runs: training, the demo and the server are replaced by stand-ins that return at
once (after the argument checks the real commands make before them), and downloads fail as
without a network. Translation, evaluation, averaging, conversion and export run for real on a
tiny model. Each example runs in a fresh folder holding copies of the fixture files, and values
are drawn so that no path leaves it. ``TRANSDUCE_FUZZ_EXAMPLES`` sets the examples per
subcommand (default 40).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import torch
import yaml

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from inference_testkit import (  # noqa: E402
    save_toy_pair_translator,
    save_toy_parser,
    save_toy_translation_model,
)

from transduce.cli.main import build_parser, main  # noqa: E402

EXAMPLES = int(os.environ.get("TRANSDUCE_FUZZ_EXAMPLES", "40"))

COMMANDS = [
    ("demo",),
    ("train",),
    ("params",),
    ("average",),
    ("convert",),
    ("data", "multi30k"),
    ("translate",),
    ("evaluate",),
    ("serve",),
    ("export", "ctranslate2"),
    ("data", "ptb-sample"),
    ("data", "wmt14"),
    ("parse",),
    ("attention",),
    ("plot", "curves"),
    ("experiment", "reversal"),
    ("prepare",),
    ("vocab",),
]

# Values an argument may take: the fixture files (relative to the example's folder), names of
# things that do not exist, and the edge cases of numbers, devices and keys.
FIXTURES = [
    "fx/model.pt",
    "fx/old.pt",
    "fx/run",
    "fx/in.txt",
    "fx/ref.txt",
    "fx/c.yaml",
    "fx/bad.yaml",
    "fx/empty.txt",
    "fx/dir",
    "fx/run/checkpoints/step_00000001.pt",
    "fx/parser.pt",
    "fx/separate.pt",
    "fx/words.txt",
    "fx/trees.txt",
    "fx/run/metrics.jsonl",
    "out.pt",
    "out",
    "out.safetensors",
    "missing.pt",
    "missing/x.txt",
]
EDGES = [
    "",
    "-",
    "--",
    "0",
    "-1",
    "1",
    "2",
    "3",
    "7",
    "0.5",
    "-0.5",
    "nan",
    "inf",
    "-inf",
    "1e3",
    "10001",
    "99999999999",
    "cpu",
    "cuda",
    "cuda:3",
    "mps",
    "meta",
    "xla",
    "cpu:0",
    "fp32",
    "bf16",
    "fp16",
    "int8",
    "none",
    "en",
    "de",
    "fr",
    "cs",
    "base",
    "big",
    "A1",
    "E",
    "copy",
    "x=1",
    "=",
    "d_model=0",
    "d_model=17",
    "n_heads=0",
    "max_steps=1",
    "train.max_steps=-2",
    "beam=0",
    "dropout=2",
    "name=translation",
    "nokey=1",
    "max_minutes=nan",
    "warmup=1e3",
    "vocab_size=3",
    "tie_embeddings=maybe",
    "device=cuda",
    "precision=fp16",
    "\u00e9\u00e8",
    "\udcff",
    "--set",
    "--model",
    "--help",
    "n" * 300,
    "fx/" + "n" * 300 + ".pt",
]
SAFE_TEXT = st.text(
    alphabet=st.characters(blacklist_characters="/.~\\\x00", blacklist_categories=("Cs",)),
    max_size=8,
)
VALUES = st.one_of(
    st.sampled_from(FIXTURES), st.sampled_from(EDGES), SAFE_TEXT, st.integers(-3, 12).map(str)
)


def _subparser(words: tuple[str, ...]) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = build_parser()
    for word in words:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[word]
    return parser


# likely values of path arguments: mostly the right kind of file, sometimes another
# a parser and a shared_vocab: false translator too, so that parse, attention and alignments
# reach their real paths with two vocabularies
_MODELS = (
    ["fx/model.pt"] * 4
    + ["fx/run"] * 2
    + ["fx/parser.pt"] * 2
    + ["fx/separate.pt"] * 2
    + ["fx/old.pt", "fx/run/checkpoints/step_00000001.pt"]
)
_TEXTS = ["fx/in.txt"] * 4 + ["fx/words.txt"] * 2 + ["fx/ref.txt", "fx/empty.txt"]
_OUTPUTS = ["out.txt", "out", "out.pt", "out.safetensors", "fx/dir", "fx/dir/x"]
PATHS = {
    "model": _MODELS,
    "old": _MODELS,
    "checkpoints": _MODELS,
    "run": ["fx/run"] * 4 + ["fx/dir"],
    "input": _TEXTS,
    "src": _TEXTS,
    "ref": ["fx/ref.txt"] * 4 + ["fx/trees.txt"] * 2 + ["fx/in.txt", "fx/empty.txt"],
    "runs": ["fx/run"] * 4 + ["fx/run/metrics.jsonl", "fx/dir"],
    "config": ["fx/c.yaml"] * 4 + ["fx/bad.yaml", "fx/empty.txt"],
    "output": _OUTPUTS,
    "new": _OUTPUTS,
    "out": _OUTPUTS,
    "dest": _OUTPUTS,
    "from_dir": ["fx/dir", "fx/run"],
}
INTEGERS = st.one_of(st.integers(-3, 12).map(str), st.sampled_from(["0", "-1", "10001"]))
FLOATS = st.one_of(
    st.integers(-3, 12).map(str),
    st.sampled_from(["0.5", "-0.5", "nan", "inf", "-inf", "1e3", "1e-9"]),
)


def _values(action: argparse.Action, draw_junk: bool) -> st.SearchStrategy[str]:
    """Mostly values of the argument's kind (paths, numbers, choices), sometimes anything."""
    if action.choices:
        likely = st.sampled_from([str(c) for c in action.choices])
    elif action.type is int:
        likely = INTEGERS
    elif action.type is float:
        likely = FLOATS
    elif action.dest in PATHS:
        likely = st.sampled_from(PATHS[action.dest])
    elif action.dest == "overrides":
        likely = st.sampled_from([e for e in EDGES if "=" in e])
    else:
        likely = st.sampled_from(EDGES)
    return st.one_of(likely, VALUES) if draw_junk else likely


def _arguments(words: tuple[str, ...]) -> list[argparse.Action]:
    return [a for a in _subparser(words)._actions if not isinstance(a, argparse._HelpAction)]


@st.composite
def argvs(draw: Any, words: tuple[str, ...]) -> list[str]:
    """The subcommand's arguments, each given with some probability (a required one usually),
    with values mostly of its kind; now and then a stray word or a repeated option."""
    argv = list(words)
    for action in _arguments(words):
        if draw(st.integers(0, 9)) >= (9 if action.required or not action.option_strings else 4):
            continue
        n = 0 if action.nargs == 0 else draw(st.integers(1, 3)) if action.nargs == "+" else 1
        values = [draw(_values(action, draw(st.integers(0, 9)) == 0)) for _ in range(n)]
        if action.option_strings:
            argv += [draw(st.sampled_from(action.option_strings)), *values]
        else:
            argv += values
    for _ in range(draw(st.integers(0, 2))):
        if draw(st.integers(0, 9)) == 0:
            argv.insert(draw(st.integers(len(words), len(argv))), draw(VALUES))
    return argv


# a run's metrics.jsonl as the trainer writes it: training lines, then a validation line
METRICS = "".join(
    json.dumps(r) + "\n"
    for r in [
        {"step": 1, "epoch": 0.1, "loss": 4.0, "nll": 3.9, "ppl": 49.4, "lr": 1e-4, "elapsed": 1.0},
        {"step": 2, "epoch": 0.2, "loss": 3.5, "nll": 3.4, "ppl": 30.0, "lr": 2e-4, "elapsed": 2.0},
        {"split": "valid", "step": 2, "loss": 3.6, "bleu": 1.5},
    ]
).encode()


@pytest.fixture(scope="module")
def fixture_files(tmp_path_factory) -> dict[str, bytes | None]:
    """Relative path -> bytes (None: a folder), written afresh for every example."""
    d = tmp_path_factory.mktemp("fuzz_fixtures")
    model = save_toy_translation_model(d / "model.pt", {"beam": 2, "max_len_offset": 5})
    parser = save_toy_parser(d / "parser.pt", {"beam": 2, "max_len_offset": 5})
    separate = save_toy_pair_translator(d / "separate.pt", {"beam": 2, "max_len_offset": 5})
    data = torch.load(model, weights_only=True)
    del data["format"]
    torch.save(data, d / "old.pt")
    config = {
        "model": {"n_layers": 1, "d_model": 16, "d_ff": 32, "n_heads": 2, "d_k": 8, "d_v": 8},
        "train": {"max_steps": 2, "tensorboard": False},
        "task": {
            "name": "copy",
            "train_size": 40,
            "valid_size": 8,
            "max_length": 4,
            "n_symbols": 4,
        },
    }
    model_bytes = model.read_bytes()
    return {
        "fx/model.pt": model_bytes,
        "fx/old.pt": (d / "old.pt").read_bytes(),
        "fx/run/model.pt": model_bytes,
        "fx/run/checkpoints/step_00000001.pt": model_bytes,
        "fx/run/checkpoints/step_00000002.pt": model_bytes,
        "fx/parser.pt": parser.read_bytes(),
        "fx/separate.pt": separate.read_bytes(),
        "fx/run/metrics.jsonl": METRICS,
        "fx/in.txt": b"the dog runs\n\na red ball\n",
        "fx/words.txt": b"the dog runs\na red ball\n",
        "fx/trees.txt": b"(TOP (S (NP (DT the) (NN dog)) (VP (VBZ runs))))\n"
        b"(TOP (NP (DT a) (JJ red) (NN ball)))\n",
        "fx/ref.txt": b"der hund rennt\n\nein roter ball\n",
        "fx/empty.txt": b"",
        "fx/c.yaml": yaml.safe_dump(config).encode(),
        "fx/bad.yaml": b"model: [unclosed\n",
        "fx/dir": None,
    }


def _fake_train(
    cfg: Any, out: Any, *, resume: bool = False, show_progress: Any = None, **kwargs: Any
) -> dict[str, Any]:
    return {"stopped_by": "fuzz", "step": 0}


def _fake_demo(out: Any, overrides: dict[str, str] | None = None, **kwargs: Any) -> dict[str, Any]:
    from transduce.config import update
    from transduce.demo import demo_config

    update(demo_config(), overrides or {})  # the checks the real demo makes first
    return {"task": "addition"}


def _no_network(url: str, *args: Any, **kwargs: Any) -> None:
    from transduce.errors import UserError

    raise UserError(f"cannot download {url}: no network in this test")


def _fake_reversal(out: Any, **kwargs: Any) -> dict[str, Any]:
    return {"fuzz": True}


def _no_server(*args: Any, **kwargs: Any) -> None:
    return None


class _Counter:
    n = 0


def _run_example(base: Path, files: dict[str, bytes | None], argv: list[str]) -> int:
    _Counter.n += 1
    work = base / f"example{_Counter.n}"
    for rel, content in files.items():
        path = work / rel
        if content is None:
            path.mkdir(parents=True, exist_ok=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content)
    out, err = io.StringIO(), io.StringIO()
    stdin = io.TextIOWrapper(io.BytesIO(b"the dog runs\na cat\n"), encoding="utf-8")
    threads = torch.get_num_threads()
    with contextlib.ExitStack() as stack:
        stack.enter_context(contextlib.chdir(work))
        stack.enter_context(contextlib.redirect_stdout(out))
        stack.enter_context(contextlib.redirect_stderr(err))
        stack.enter_context(mock.patch.object(sys, "stdin", stdin))
        stack.enter_context(mock.patch("transduce.training.run.train", _fake_train))
        stack.enter_context(mock.patch("transduce.demo.run_demo", _fake_demo))
        stack.enter_context(mock.patch("transduce.serve.server.serve", _no_server))
        stack.enter_context(mock.patch("transduce.data.multi30k.download", _no_network))
        stack.enter_context(mock.patch("transduce.data.ptb.download", _no_network))
        stack.enter_context(mock.patch("transduce.data.wmt14._fetch", _no_network))
        stack.enter_context(mock.patch("transduce.experiments.reversal", _fake_reversal))
        try:
            code = main(["--no-malloc-tuning", *argv])
        except SystemExit as e:  # argparse: --help (0) or a usage error (2)
            code = e.code
        finally:
            torch.set_num_threads(threads)  # serve --threads N
    shutil.rmtree(work, ignore_errors=True)
    text = err.getvalue()
    assert code in (0, 2), (argv, code, text)
    assert "Traceback" not in text, (argv, text)
    if code == 2:
        lines = text.strip().splitlines()
        assert len(lines) == 1, (argv, text)
        assert lines[0].startswith("transduce: error: "), (argv, text)
    return int(code or 0)


@pytest.mark.parametrize("words", COMMANDS, ids=" ".join)
def test_no_arguments_make_a_traceback(words: tuple[str, ...], fixture_files, tmp_path) -> None:
    if words == ("serve",):
        pytest.importorskip("fastapi")
    if words == ("export", "ctranslate2"):
        pytest.importorskip("ctranslate2")

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(argv=argvs(words))
    def check(argv: list[str]) -> None:
        _run_example(tmp_path, fixture_files, argv)

    check()


def test_the_fuzz_reaches_the_commands(fixture_files, tmp_path) -> None:
    """The stand-ins are in place and valid arguments succeed (so the fuzz explores more than
    argparse's errors)."""
    for argv in (
        ["train", "--config", "fx/c.yaml", "--out", "run2"],
        ["demo", "--set", "max_steps=3"],
        ["translate", "--model", "fx/model.pt", "--input", "fx/in.txt", "--beam", "2"],
        ["evaluate", "--model", "fx/run", "--src", "fx/in.txt", "--ref", "fx/ref.txt"],
        ["average", "--run", "fx/run", "--last", "2", "--output", "avg.pt"],
        ["convert", "fx/old.pt", "new.pt"],
        ["params", "--preset", "big"],
        ["serve", "--model", "fx/model.pt", "--port", "0"],
        ["parse", "--model", "fx/parser.pt", "--input", "fx/in.txt"],
        ["evaluate", "--model", "fx/parser.pt", "--src", "fx/words.txt", "--ref", "fx/trees.txt"],
        ["translate", "--model", "fx/separate.pt", "--input", "fx/in.txt", "--alignments"],
        ["attention", "--model", "fx/separate.pt", "--src", "the dog", "--output", "a.html"],
        ["attention", "--model", "fx/parser.pt", "--src", "the dog", "--output", "a.svg"],
        ["plot", "curves", "fx/run", "--output", "curves.png"],
    ):
        assert _run_example(tmp_path, fixture_files, argv) == 0, argv


def test_system_errors_are_one_line(fixture_files, tmp_path) -> None:
    """What the operating system refuses (a name longer than it allows) is one line, exit 2."""
    long_name = "n" * 5000
    for argv in (
        ["translate", "--model", long_name],
        ["train", "--config", long_name, "--out", "run"],
        ["evaluate", "--model", "fx/model.pt", "--src", long_name, "--ref", long_name],
        ["average", "--checkpoints", long_name, "--output", "avg.pt"],
        ["translate", "--model", "fx/model.pt", "--input", long_name],
        ["translate", "--model", "fx/model.pt", "--input", "fx/in.txt", "--output", long_name],
    ):
        assert _run_example(tmp_path, fixture_files, argv) == 2, argv
