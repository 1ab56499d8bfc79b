"""Reading metrics.jsonl back, the step -> epoch/minute maps, and the learning-curve figures."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from plot_helpers import (
    check_png,
    check_vector,
    requires_matplotlib,
    run_records,
    write_run,
)

from transduce.errors import UserError
from transduce.plotting.curves import (
    available_panels,
    panel_series,
    plot_curves,
    run_labels,
    x_map,
)
from transduce.plotting.records import StepMap, epoch_map, minutes_map, read_metrics


def test_read_metrics_splits_and_sorts(make_run):
    train, valid = read_metrics(make_run("a"))
    assert [r.step for r in train] == list(range(10, 201, 10))
    assert [r.step for r in valid] == [50, 100, 150, 200]
    assert train[0].scalar("epoch") == 0.0 and train[-1].scalar("epoch") == 3.0
    assert valid[0].scalar("loss") is None and valid[0].scalar("valid_loss") is not None
    # lists come back as tuples; a list is not a scalar and a number is not a vector
    # step 100: sequence accuracy 100/120, position p 0.05 * (4 - p) above it
    assert valid[1].vector("position_accuracy") == pytest.approx(
        (59 / 60, 56 / 60, 53 / 60, 50 / 60)
    )
    assert valid[1].scalar("position_accuracy") is None and valid[1].vector("seq_accuracy") is None


def test_half_written_last_line_is_skipped(make_run):
    folder = make_run("a", tail='{"step": 210, "epoch": 4, "lo')
    train, valid = read_metrics(folder)
    assert train[-1].step == 200 and len(valid) == 4


def test_corrupt_line_in_the_middle_names_file_and_line(tmp_path):
    lines = [json.dumps(r) for r in run_records()]
    lines[2] = lines[2][:15]
    path = tmp_path / "a" / "metrics.jsonl"
    path.parent.mkdir()
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(UserError, match=re.escape(f"{path}:3: not JSON")):
        read_metrics(path.parent)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("[1, 2]", "expected a JSON object, found list"),
        ('{"epoch": 0, "loss": 1.0}', "expected a non-negative integer 'step', found None"),
        ('{"step": "7"}', "expected a non-negative integer 'step', found '7'"),
    ],
)
def test_bad_records_are_user_errors(tmp_path, line, expected):
    (tmp_path / "metrics.jsonl").write_text(line + "\n" + '{"step": 1}\n')
    with pytest.raises(UserError, match=f"metrics.jsonl:1: {expected}"):
        read_metrics(tmp_path)


def test_missing_folder_or_file(tmp_path):
    with pytest.raises(UserError, match="no such run folder"):
        read_metrics(tmp_path / "nope")
    with pytest.raises(UserError, match="metrics.jsonl: not found"):
        read_metrics(tmp_path)


def test_redone_steps_keep_the_later_line_and_blank_lines_pass(tmp_path):
    lines = [{"step": 10, "loss": 3.0}, {"step": 20, "loss": 2.0}, {"step": 10, "loss": 2.5}]
    write_run(tmp_path, lines, tail="\n\n")
    train, valid = read_metrics(tmp_path / "metrics.jsonl")  # the file itself works too
    assert [(r.step, r.scalar("loss")) for r in train] == [(10, 2.5), (20, 2.0)] and valid == ()


def test_skipped_updates_and_compile_reports_are_not_training_points(tmp_path):
    lines = [
        {"step": 10, "loss": 3.0},
        {"step": 13, "split": "skipped", "loss": 9.5, "bad_in_row": 1, "skipped_updates": 1},
        {"step": 20, "loss": 2.5},
        {"step": 20, "split": "compile", "first_update_s": 4.0},
        {"step": 20, "split": "valid", "bleu": 1.0},
    ]
    write_run(tmp_path, lines)
    train, valid = read_metrics(tmp_path)
    assert [(r.step, r.scalar("loss")) for r in train] == [(10, 3.0), (20, 2.5)]
    assert [r.step for r in valid] == [20] and "first_update_s" not in train[-1].values


def test_runs_with_no_record_are_named(tmp_path):
    pytest.importorskip("matplotlib")
    write_run(tmp_path / "a", [{"step": 3, "split": "compile", "first_update_s": 1.0}])
    with pytest.raises(UserError, match=r"/a: no training or validation record"):
        plot_curves([tmp_path / "a"], tmp_path / "c.png")


def test_epoch_map_by_hand(make_run):
    # 50 steps per epoch, logged every 10: epochs start midway between steps 50|60, 100|110, 150|160
    train, _ = read_metrics(make_run("a"))
    m = epoch_map(train)
    assert m == StepMap((0.0, 55.0, 105.0, 155.0), (0.0, 1.0, 2.0, 3.0))
    assert m([0, 30, 55, 80, 205]) == pytest.approx([0.0, 30 / 55, 1.0, 1.5, 4.0])
    # every logged step falls inside the epoch it was logged in
    assert all(math.floor(m(r.step)) == r.scalar("epoch") for r in train)
    assert m.inverse(m([12.0, 99.0, 230.0])) == pytest.approx([12.0, 99.0, 230.0])


def test_epoch_map_needs_an_epoch_end(make_run):
    train, _ = read_metrics(make_run("a", steps=40))
    assert epoch_map(train) is None


def test_minutes_map_and_series_on_time_axis(make_run):
    run = read_metrics(make_run("a"))  # elapsed = 0.6 s per step
    m = minutes_map(run.train)
    assert m([0, 50, 200, 250]) == pytest.approx([0.0, 0.5, 2.0, 2.5])
    panels = available_panels([run])
    train, valid = panel_series(run, panels["loss"], x_map(run, "time", "a"))
    assert train.split == "train" and valid.split == "valid"
    assert valid.x == pytest.approx([0.5, 1.0, 1.5, 2.0])
    assert valid.y == pytest.approx([2 * math.exp(-s / 60) + 0.5 for s in (50, 100, 150, 200)])


def test_available_panels_follow_the_task(make_run):
    synthetic = available_panels([read_metrics(make_run("a"))])
    assert list(synthetic)[:6] == [
        "loss",
        "ppl",
        "seq_accuracy",
        "token_accuracy",
        "lr",
        "tokens_per_s",
    ]
    assert "bleu" not in synthetic and "epoch" not in synthetic and "valid_loss" in synthetic
    assert synthetic["valid_loss"].label == synthetic["loss"].label
    both = available_panels(
        [read_metrics(make_run("b", task="translation")), read_metrics(make_run("c"))]
    )
    assert {"bleu", "chrf", "seq_accuracy"} <= set(both)
    assert both["bleu"].train_key is None and both["loss"].train_key == "loss"


def test_run_labels_are_folder_names_made_unique():
    assert run_labels([Path("/x/base"), Path("/x/rev")]) == ["base", "rev"]
    assert run_labels([Path("/x/a/run"), Path("/y/a/run")]) == ["x/a/run", "y/a/run"]
    assert run_labels([Path("/x/run/metrics.jsonl"), Path("/y/run")]) == ["x/run", "y/run"]


@requires_matplotlib
def test_plot_curves_png_two_runs(make_run, tmp_path):
    import matplotlib

    before = dict(matplotlib.rcParams)
    runs = [make_run("base"), make_run("big", learn_steps=60.0, seconds_per_step=1.2)]
    out = plot_curves(runs, tmp_path / "figs" / "curves.png")
    assert out == tmp_path / "figs" / "curves.png"
    # six panels (loss, ppl, two accuracies, lr, tokens/s): 3 x 2 of 4.6 x 3.2 in + 0.5 in legend
    check_png(out, size=(round(3 * 4.6 * 110), round((2 * 3.2 + 0.5) * 110)), min_colors=8)
    assert dict(matplotlib.rcParams) == before  # no global style change


@requires_matplotlib
@pytest.mark.parametrize(("suffix", "x"), [(".svg", "epoch"), (".pdf", "time")])
def test_plot_curves_vector_formats(make_run, tmp_path, suffix, x):
    runs = [make_run("base", task="translation")]
    out = plot_curves(runs, tmp_path / f"curves{suffix}", x=x, metrics=["bleu", "loss"])
    text = check_vector(out)
    if suffix == ".svg":
        assert "epoch (passes over the training data)" in text and "BLEU" in text


def test_plot_curves_errors(make_run, tmp_path):
    run = make_run("base")
    with pytest.raises(
        UserError, match=r"unknown metric 'bleu'; these runs have: loss, ppl, seq_accuracy"
    ):
        plot_curves([run], tmp_path / "c.png", metrics=["bleu"])
    with pytest.raises(UserError, match="expected one of .png, .svg, .pdf"):
        plot_curves([run], tmp_path / "c.jpg")
    with pytest.raises(UserError, match="unknown x axis 'wall'"):
        plot_curves([run], tmp_path / "c.png", x="wall")  # type: ignore[arg-type]
    with pytest.raises(UserError, match="short: cannot place the run on the epoch axis"):
        plot_curves([run, make_run("short", steps=40)], tmp_path / "c.png", x="epoch")
    with pytest.raises(UserError, match="no run folders"):
        plot_curves([], tmp_path / "c.png")
    assert not list(tmp_path.glob("c.*"))


def test_step_map_needs_two_anchors():
    with pytest.raises(ValueError):
        StepMap((0.0,), (0.0,))
    assert StepMap((0.0, 10.0), (0.0, 1.0))(np.array([[5.0, -10.0]])).tolist() == [[0.5, -1.0]]


def test_importing_plotting_loads_no_matplotlib_torch_or_model():
    # plotting draws from plain data: it must import without torch, and without matplotlib
    # until a figure is drawn
    code = (
        "import sys, transduce.plotting\n"
        "banned = ('matplotlib', 'torch', 'transduce.model', 'transduce.training',"
        " 'transduce.inference')\n"
        "print([m for m in sys.modules if m.startswith(banned)])"
    )
    src = Path(__file__).resolve().parents[2] / "src"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")]),
    }
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_plot_curves_command(tmp_path: Path, capsys) -> None:
    import json

    from transduce.cli.main import main

    run = tmp_path / "run"
    run.mkdir()
    lines = [
        {
            "step": s,
            "epoch": 0,
            "loss": 5.0 / s,
            "nll": 4.0 / s,
            "ppl": 2.0,
            "lr": 1e-3,
            "tokens_per_s": 1000.0,
            "elapsed": float(s),
        }
        for s in range(1, 30)
    ]
    lines += [
        {"step": 10, "split": "valid", "valid_loss": 1.0, "bleu": 10.0},
        {"step": 20, "split": "valid", "valid_loss": 0.8, "bleu": 14.0},
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    out = tmp_path / "curves.png"
    code = main(
        [
            "--no-malloc-tuning",
            "plot",
            "curves",
            str(run),
            "--metrics",
            "loss,bleu",
            "--x",
            "time",
            "--output",
            str(out),
        ]
    )
    assert code == 0, capsys.readouterr().err
    assert out.stat().st_size > 5_000
    curves = ["--no-malloc-tuning", "plot", "curves", str(run), "--output", str(out)]
    assert main([*curves, "--metrics", "nope"]) == 2 and "nope" in capsys.readouterr().err
    for empty in (",", " , "):  # an empty list would reach the figure's layout (ZeroDivisionError)
        assert main([*curves, "--metrics", empty]) == 2
        assert "names no metric" in capsys.readouterr().err
