"""Headless progress: without a terminal a run writes one plain line every ``log_every`` steps and
one per validation to stderr; with a terminal the bar; ``--quiet`` (show_progress=False) neither."""

from __future__ import annotations

import io
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from transduce.cli.main import main
from transduce.config import Config, update
from transduce.console import PeriodicLines, duration, is_terminal
from transduce.data.synthetic import make_task
from transduce.model.transformer import make_model
from transduce.training.progress import Progress
from transduce.training.report import eta_seconds, step_line, valid_line
from transduce.training.tasks.synthetic import encode_pairs
from transduce.training.trainer import Trainer

STEP = re.compile(
    r"^step=(\d+) epoch=(\d+) loss=\d+\.\d{4} ppl=\d+\.\d{2} lr=\d\.\d{3}e[-+]\d\d "
    r"gnorm=\d+\.\d{3} tok/s=\d+ "
    r"elapsed=\d+:\d\d:\d\d eta=(\d+:\d\d:\d\d|\?)$"
)
VALID = re.compile(
    r"^valid step=(\d+) loss=\S+ ppl=\S+ seq_accuracy=\S+ token_accuracy=\S+ position_accuracy=\S+$"
)


class FakeStream(io.StringIO):
    def __init__(self, terminal: bool) -> None:
        super().__init__()
        self.terminal = terminal

    def isatty(self) -> bool:
        return self.terminal


def test_step_line_has_the_fields_in_order() -> None:
    line = step_line(
        step=120,
        epoch=2,
        loss=3.45612,
        ppl=31.7,
        lr=1.2345e-4,
        grad_norm=0.81234,
        tokens_per_s=4520.4,
        elapsed=83.2,
        eta=725.0,
    )
    assert line == (
        "step=120 epoch=2 loss=3.4561 ppl=31.70 lr=1.234e-04 gnorm=0.812 tok/s=4520 "
        "elapsed=0:01:23 eta=0:12:05"
    )
    assert step_line(
        step=1, epoch=0, loss=1, ppl=2, lr=0, grad_norm=1, tokens_per_s=0, elapsed=0, eta=None
    ).endswith("elapsed=0:00:00 eta=?")
    assert step_line(
        step=1,
        epoch=0,
        loss=1,
        ppl=2,
        lr=0,
        grad_norm=1,
        tokens_per_s=0,
        elapsed=0,
        eta=None,
        skipped=3,
    ).endswith("eta=? skipped=3")


def test_valid_line_names_loss_ppl_then_the_tasks_metrics() -> None:
    metrics = {
        "valid_loss": 2.88123,
        "valid_nll": 2.5,
        "valid_ppl": 12.0,
        "neg_valid_nll": -2.5,
        "bleu": 21.37,
        "chrf": 45.125,
    }
    assert valid_line(500, metrics) == "valid step=500 loss=2.8812 ppl=12 bleu=21.37 chrf=45.125"
    assert valid_line(3, {"seq_accuracy": 1.0}) == "valid step=3 seq_accuracy=1"


def test_eta_is_the_budget_that_ends_first() -> None:
    t = update(Config(), {"max_steps": 1000, "max_minutes": 10.0}).train
    p = Progress(step=100, elapsed=60.0)
    # 100 steps in 60 s: 900 more take 540 s; the 10 minutes end in 540 s too
    assert eta_seconds(p, t, steps_here=100, seconds_here=60.0) == pytest.approx(540.0)
    assert eta_seconds(p, t, steps_here=100, seconds_here=120.0) == pytest.approx(540.0)
    assert eta_seconds(p, t, steps_here=100, seconds_here=30.0) == pytest.approx(270.0)
    no_minutes = update(Config(), {"max_steps": 1000}).train
    assert eta_seconds(p, no_minutes, steps_here=0, seconds_here=0.0) is None
    resumed = Progress(step=900, elapsed=30.0)  # 10 steps taken by this process in 5 s
    assert eta_seconds(resumed, no_minutes, steps_here=10, seconds_here=5.0) == pytest.approx(50.0)
    assert duration(3725.4) == "1:02:05" and duration(None) == "?"


def test_is_terminal() -> None:
    assert is_terminal(FakeStream(True)) and not is_terminal(FakeStream(False))
    closed = io.StringIO()
    closed.close()  # its isatty raises ValueError
    assert not is_terminal(closed) and not is_terminal(object())  # type: ignore[arg-type]


TINY: dict[str, Any] = {
    "n_layers": 1,
    "d_model": 16,
    "d_ff": 32,
    "n_heads": 2,
    "d_k": 8,
    "d_v": 8,
    "dropout": 0.0,
    "max_tokens": 128,
    "warmup": 10,
    "max_steps": 6,
    "save_every": 100,
    "log_every": 2,
    "eval_every": 3,
    "tensorboard": False,
    "name": "copy",
    "train_size": 60,
    "valid_size": 10,
    "max_length": 4,
    "n_symbols": 4,
    "beam": 1,
}


def _train(tmp_path: Path, stream: FakeStream, show_progress: bool | None) -> list[str]:
    from transduce.training.tasks.synthetic import accuracy_validator

    cfg = update(Config(), TINY)
    task = make_task(cfg.task)
    model = make_model(cfg.model, src_vocab_size=len(task.vocab))
    valid = encode_pairs(task.vocab, task.valid)
    old = sys.stderr
    sys.stderr = stream
    try:
        Trainer(
            cfg,
            model,
            task.vocab,
            encode_pairs(task.vocab, task.train),
            run_dir=tmp_path,
            valid_pairs=valid,
            validator=accuracy_validator(cfg, valid),
            score_key="seq_accuracy",
            show_progress=show_progress,
        ).train()
    finally:
        sys.stderr = old
    return stream.getvalue().splitlines()


def test_without_a_terminal_a_line_per_log_every_steps_and_per_validation(tmp_path: Path) -> None:
    lines = _train(tmp_path, FakeStream(terminal=False), show_progress=None)
    steps = [int(m.group(1)) for line in lines if (m := STEP.match(line))]
    valids = [int(m.group(1)) for line in lines if (m := VALID.match(line))]
    assert steps == [2, 4, 6]
    assert valids == [3, 6]
    assert all(STEP.match(line).group(3) != "?" for line in lines if STEP.match(line))
    assert not any("\r" in line or "it/s" in line for line in lines)  # no bar
    assert lines[0].startswith("transduce: training on")  # the start-up line as before
    order = [
        line.split()[0].split("=")[0] for line in lines if STEP.match(line) or VALID.match(line)
    ]
    assert order == ["step", "valid", "step", "step", "valid"]  # as they happen


def test_quiet_silences_the_lines_and_a_terminal_gets_the_bar(tmp_path: Path) -> None:
    quiet = _train(tmp_path / "q", FakeStream(terminal=False), show_progress=False)
    assert not any(STEP.match(x) or VALID.match(x) for x in quiet)
    terminal = FakeStream(terminal=True)
    lines = _train(tmp_path / "t", terminal, show_progress=None)
    assert not any(STEP.match(x) or VALID.match(x) for x in lines)
    assert "train:" in terminal.getvalue()  # tqdm's bar, described "train"


def test_cli_train_reports_headless_and_quiet(tmp_path: Path, capsys) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "model": {
                    k: TINY[k] for k in ("n_layers", "d_model", "d_ff", "n_heads", "d_k", "d_v")
                },
                "train": {
                    k: TINY[k]
                    for k in (
                        "max_tokens",
                        "warmup",
                        "max_steps",
                        "save_every",
                        "log_every",
                        "eval_every",
                        "tensorboard",
                    )
                },
                "task": {
                    k: TINY[k]
                    for k in ("name", "train_size", "valid_size", "max_length", "n_symbols")
                },
            }
        )
    )
    assert (
        main(["--no-malloc-tuning", "train", "--config", str(config), "--out", str(tmp_path / "a")])
        == 0
    )
    err = capsys.readouterr().err.splitlines()
    assert [int(STEP.match(x).group(1)) for x in err if STEP.match(x)] == [2, 4, 6]
    assert [x.split()[1] for x in err if VALID.match(x)] == ["step=3", "step=6"]
    assert (
        main(
            [
                "--no-malloc-tuning",
                "train",
                "--config",
                str(config),
                "--out",
                str(tmp_path / "b"),
                "--quiet",
            ]
        )
        == 0
    )
    err = capsys.readouterr().err.splitlines()
    assert not any(STEP.match(x) or VALID.match(x) for x in err)


def test_periodic_lines_only_for_long_work() -> None:
    now = [0.0]

    def run(seconds_per_update: float, updates: int) -> list[str]:
        stream = FakeStream(terminal=False)
        lines = PeriodicLines(
            "translate",
            5 * updates,
            unit="sentences",
            every_s=30,
            stream=stream,
            clock=lambda: now[0],
        )
        for _ in range(updates):
            now[0] += seconds_per_update
            lines.update(5)
        lines.close()
        return stream.getvalue().splitlines()

    assert run(1.0, 10) == []  # 10 s of work: silent
    assert run(5.0, 14) == [
        "translate done=30/70 sentences/s=1.0 elapsed=0:00:30 eta=0:00:40",
        "translate done=60/70 sentences/s=1.0 elapsed=0:01:00 eta=0:00:10",
        "translate done=70/70 sentences/s=1.0 elapsed=0:01:10 eta=0:00:00",  # at the end
    ]
    assert run(5.0, 12) == [
        "translate done=30/60 sentences/s=1.0 elapsed=0:00:30 eta=0:00:30",
        "translate done=60/60 sentences/s=1.0 elapsed=0:01:00 eta=0:00:00",  # no repeat
    ]


def test_translation_without_a_terminal_reports_every_interval(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    """translate and evaluate: the same lines for work that takes minutes (here every 0 s)."""
    import functools

    from inference_testkit import save_toy_translation_model, toy_sentences

    import transduce.inference.translator as translator_module

    model = save_toy_translation_model(tmp_path / "m.pt", {"beam": 1, "max_len_offset": 3})
    translator = translator_module.Translator.load(model)
    monkeypatch.setattr(
        translator_module, "PeriodicLines", functools.partial(PeriodicLines, every_s=0.0)
    )
    small_batches = translator.decode_config(batch_tokens=8)
    translator.translate(toy_sentences(6), small_batches, show_progress=None)
    lines = capsys.readouterr().err.splitlines()
    assert lines and all(
        re.fullmatch(r"translate done=\d+/6 sentences/s=\S+ elapsed=\S+ eta=\S+", line)
        for line in lines
    ), lines
    assert lines[-1].startswith("translate done=6/6")
    translator.translate(toy_sentences(6), small_batches, show_progress=False)  # --quiet
    assert capsys.readouterr().err == ""
