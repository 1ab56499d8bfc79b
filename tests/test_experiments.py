"""The input-reversal experiment: two runs that differ only in the order of the input."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from transduce.cli.main import main
from transduce.config import SyntheticTaskConfig
from transduce.data.synthetic import make_task
from transduce.experiments import reversal_config


def test_the_two_runs_differ_only_in_the_input_order() -> None:
    base, rev = (reversal_config("addition", 2.0, reverse_input=r) for r in (False, True))
    assert dataclasses.replace(rev, task=base.task) == base
    assert dataclasses.replace(rev.task, reverse_input=False) == base.task
    assert isinstance(base.task, SyntheticTaskConfig) and isinstance(rev.task, SyntheticTaskConfig)
    plain, reversed_ = make_task(base.task), make_task(rev.task)
    for (s, t), (rs, rt) in zip(plain.train[:200], reversed_.train[:200], strict=True):
        assert rs == s[::-1] and rt == t  # the same pairs, the source reversed


def test_reversal_command_writes_figure_and_summary(tmp_path: Path, capsys) -> None:
    out = tmp_path / "rev"
    code = main(
        [
            "--no-malloc-tuning",
            "experiment",
            "reversal",
            "--task",
            "copy",
            "--minutes",
            "0.08",
            "--out",
            str(out),
            "--quiet",
        ]
    )
    assert code == 0, capsys.readouterr().err
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert json.loads((out / "summary.json").read_text()) == summary
    assert (out / "reversal.png").stat().st_size > 10_000
    for run in ("baseline", "reversed"):
        assert {"final_seq_accuracy", "steps_to_threshold"} <= set(summary[run])
        valid = [json.loads(x) for x in (out / run / "metrics.jsonl").read_text().splitlines()]
        valid = [r for r in valid if r.get("split") == "valid"]
        assert valid and all(isinstance(r["position_accuracy"], list) for r in valid)
