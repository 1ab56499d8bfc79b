"""benchmarks/train_gap.py: `transduce train` against its own update on the same data. Its step
measure covers one epoch's pairs exactly, its diagnosis runs, the command's steady rate is read
from metrics.jsonl as gpu_check.sh reads it, and the ratio is the two rates'."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest
import torch
import yaml
from benchmark_testkit import load_benchmark

from transduce.config import Config, update
from transduce.data.synthetic import make_task
from transduce.training.tasks.synthetic import encode_pairs

TINY = {
    "model": {"n_layers": 1, "d_model": 32, "d_ff": 64, "n_heads": 2, "d_k": 16, "d_v": 16},
    "train": {"device": "cpu", "precision": "fp32", "max_tokens": 256, "warmup": 50,
              "eval_every": 0, "save_every": 100000, "tensorboard": False},
    "task": {"name": "reverse", "train_size": 300, "valid_size": 10, "min_length": 2,
             "max_length": 7, "n_symbols": 10},
}  # fmt: skip


def _gap() -> types.ModuleType:
    return load_benchmark("train_gap")


def _config(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(TINY))
    return path


def test_both_measures_and_their_ratio(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    result = _gap().main(
        ["--config", str(_config(tmp_path)), "--updates", "40", "--passes", "2", "--diagnose",
         "--out", str(tmp_path / "gap")]
    )  # fmt: skip
    flat = {k: v for section in TINY.values() for k, v in section.items()}
    task = make_task(update(Config(), flat).task)
    # a pass is the first epoch: every training pair's target tokens (+ EOS) once
    assert result["tokens_a_pass"] == sum(
        len(t) + 1 for _, t in encode_pairs(task.vocab, task.train)
    )
    assert len(result["pass_s"]) == 2 and result["reads_late"] is False  # the Trainer reads at once
    for key in ("step_tokens_per_s", "reader_tokens_per_s", "reader_launched_tokens_per_s",
                "epochs_tokens_per_s",
                "epochs_read_tokens_per_s", "read_alone_tokens_per_s",
                "cli_tokens_per_s"):  # fmt: skip
        assert isinstance(result[key], int) and result[key] > 0, key
    # the reader alone over epochs of the same pairs: its time an update agrees with its rate
    per_update_s = result["read_alone_ms_an_update"] / 1000
    assert per_update_s > 0
    assert result["read_alone_tokens_per_s"] == pytest.approx(
        result["tokens_a_pass"] / (per_update_s * result["updates_a_pass"]), rel=0.2
    )
    assert result["cli_over_step"] == round(
        result["cli_tokens_per_s"] / result["step_tokens_per_s"], 3
    )
    assert result["updates"] == 40 and result["windows"] == 4  # a log line every 10 updates
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == result


def test_the_steady_rate_leaves_out_the_first_two_windows(tmp_path: Path) -> None:
    lines = [
        {"step": 10, "tokens_per_s": 1.0},
        {"step": 20, "tokens_per_s": 2.0},
        {"step": 20, "split": "valid", "tokens_per_s": 99.0},  # not a training window
        {"step": 30, "tokens_per_s": 30.0},
        {"step": 40, "tokens_per_s": 50.0},
        {"step": 50, "tokens_per_s": 40.0},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    rate = _gap().steady_rate(tmp_path)
    assert rate == {"windows": 5, "cli_tokens_per_s": 40, "updates": 50}
    compiled = {"step": 1, "split": "compile", "first_update_s": 9.5, "compile_s": 8.0,
                "compiled_graphs": 2}  # fmt: skip
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write(json.dumps(compiled) + "\n")
    assert _gap().steady_rate(tmp_path) == {
        **rate,
        "first_update_s": 9.5,
        "compile_s": 8.0,
        "compiled_graphs": 2,
    }  # gpu_check.sh's compiled runs read by the same rule


def test_a_used_folder_and_bad_counts_are_refused(tmp_path: Path) -> None:
    gap = _gap()
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "x").write_text("")
    with pytest.raises(SystemExit, match="not empty"):
        gap.main(["--config", str(_config(tmp_path)), "--out", str(tmp_path / "used")])
    with pytest.raises(SystemExit):
        gap.parse_args(["--config", "c.yaml", "--passes", "0"])


def test_the_step_is_measured_under_the_trainers_attention_backends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The command trains under training_attention (on CUDA without cuDNN's attention or the
    flash kernel): the step it is held against must too, or the ratio compares two attention
    kernels."""
    from collections.abc import Iterator
    from contextlib import contextmanager

    import transduce.kernels

    entered: list[str] = []

    @contextmanager
    def recording(device: torch.device) -> Iterator[None]:
        entered.append(device.type)
        yield

    monkeypatch.setattr(transduce.kernels, "training_attention", recording)
    gap = _gap()
    result = gap.measure_step(str(_config(tmp_path)), [], tmp_path / "step", 1)
    assert entered == ["cpu"] and result["tokens_a_pass"] > 0


@pytest.mark.parametrize("early", [True, False])
def test_the_diagnosis_reads_ahead_as_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, early: bool
) -> None:
    """``_read(early=False)`` starts each next read through the Trainer's hook, as the Trainer
    would (``reader_launched_*``); ``early`` True as each group is handed out."""
    from training_testkit import tiny_trainer

    from transduce.data.read_ahead import ReadAhead

    gap = _gap()
    started: list[int] = []
    start = ReadAhead.start
    monkeypatch.setattr(
        ReadAhead, "start", lambda self, key: (started.append(key), start(self, key))[1]
    )
    trainer = tiny_trainer(tmp_path / "run", max_steps=1)
    tokens = gap._update_all(trainer, gap._read(trainer, 0, early=early))
    assert tokens > 0 and len(started) > 1  # one start an update but the last
    assert trainer.reading.__name__ == "_nothing"  # restored
