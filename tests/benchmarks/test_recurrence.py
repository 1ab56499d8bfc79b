"""benchmarks/recurrence.py: the table's row of a run (minutes to the target from the logged
clock, best and last validation score, median speed) and the figure, from hand-written
metrics.jsonl files."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest
import torch
from benchmark_testkit import load_benchmark


def _recurrence() -> types.ModuleType:
    return load_benchmark("recurrence", keep=True)


def _run(folder: Path, bleu: list[float], seconds_per_step: float) -> Path:
    """A run folder: training records every 50 steps, validation every 100 with ``bleu``."""
    folder.mkdir(parents=True)
    lines = []
    for i, score in enumerate(bleu, start=1):
        for step in (100 * i - 50, 100 * i):
            lines.append(
                {
                    "step": step,
                    "epoch": 0,
                    "loss": 3.0,
                    "tokens_per_s": 1000.0 + step,
                    "elapsed": step * seconds_per_step,
                }
            )
        lines.append({"step": 100 * i, "split": "valid", "bleu": score, "valid_seconds": 2.0})
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    return folder


def test_row_and_figure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rec = _recurrence()
    monkeypatch.setattr(rec, "load_model", lambda path: (torch.nn.Linear(10, 10), None, None))
    fast = _run(tmp_path / "transformer", [10.0, 31.0, 29.0], seconds_per_step=0.6)
    slow = _run(tmp_path / "rnn", [5.0, 20.0, 25.0], seconds_per_step=1.2)
    row = rec.summarise(fast, "bleu", 30.0, test=33.3)
    assert row["parameters"] == 110
    assert row["updates"] == 300 and row["minutes"] == pytest.approx(3.0)
    assert row["best_valid_bleu"] == 31.0 and row["last_valid_bleu"] == 29.0
    assert row["minutes_to_bleu_30"] == pytest.approx(2.0)  # step 200 at 0.6 s a step
    assert row["tokens_per_s"] == pytest.approx(1175.0)  # the median of the six records
    assert row["valid_seconds"] == 6.0
    other = rec.summarise(slow, "bleu", 30.0, test=None)
    assert other["minutes_to_bleu_30"] is None
    rows = {"transformer": row, "rnn": other}
    text = rec.table(rows)
    assert "| Transformer | 110 |" in text and "| LSTM + attention |" in text
    runs = {"transformer": rec.read_metrics(fast), "rnn": rec.read_metrics(slow)}
    figure = rec.draw(runs, rows, rec.TASKS["multi30k"], tmp_path / "recurrence.png")
    assert figure is None and (tmp_path / "recurrence.png").stat().st_size > 10_000
