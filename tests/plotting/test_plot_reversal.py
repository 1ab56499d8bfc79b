"""The input-reversal figure: its summaries, its curves and shared limits, and the written file."""

from __future__ import annotations

import numpy as np
import pytest
from plot_helpers import check_png, requires_matplotlib, run_records, write_run

from transduce.errors import UserError
from transduce.plotting.records import Record, read_metrics
from transduce.plotting.reversal import (
    plot_reversal,
    reversal_curves,
    reversal_figure,
    reversal_summary,
)


def test_summary_by_hand(make_run):
    # sequence accuracy min(1, step / 120) at steps 50..200; 0.6 s per step
    summary = reversal_summary(read_metrics(make_run("base")))
    assert summary == {
        "final_step": 200,
        "final_seq_accuracy": 1.0,
        "final_token_accuracy": 1.0,
        "final_position_accuracy": [1.0, 1.0, 1.0, 1.0],
        "threshold": 0.99,
        "steps_to_threshold": 150,
        "seconds_to_threshold": pytest.approx(90.0),
    }
    fast = reversal_summary(read_metrics(make_run("fast", learn_steps=60.0, seconds_per_step=0.25)))
    assert fast["steps_to_threshold"] == 100 and fast["seconds_to_threshold"] == pytest.approx(25.0)
    # 0.8 is first reached at step 100 (100/120 = 0.83)
    assert (
        reversal_summary(read_metrics(make_run("base")), threshold=0.8)["steps_to_threshold"] == 100
    )


def test_summary_when_never_reached_or_no_clock(make_run):
    slow = read_metrics(make_run("slow", learn_steps=400.0))
    summary = reversal_summary(slow)
    assert summary["steps_to_threshold"] is None and summary["seconds_to_threshold"] is None
    assert summary["final_seq_accuracy"] == pytest.approx(0.5)
    assert summary["final_position_accuracy"] == pytest.approx([0.65, 0.6, 0.55, 0.5])
    # without 'elapsed' the step is known, the seconds are not
    valid = [Record(100, {"seq_accuracy": 1.0})]
    assert reversal_summary(((), valid))["steps_to_threshold"] == 100
    assert reversal_summary(((), valid))["seconds_to_threshold"] is None


def test_translation_run_is_a_user_error(make_run, tmp_path):
    with pytest.raises(UserError, match="no validation line holds seq_accuracy"):
        reversal_summary(read_metrics(make_run("wmt", task="translation")))
    with pytest.raises(
        UserError, match=r"^input reversed \(wmt\): no validation line holds seq_accuracy"
    ):
        plot_reversal(make_run("base"), tmp_path / "wmt", tmp_path / "r.png")


def test_curves_positions_and_epochs(tmp_path):
    lines = run_records(positions=3)
    lines[-1]["position_accuracy"] = [0.5, 0.25]  # a last validation with one position fewer
    curves = reversal_curves(read_metrics(write_run(tmp_path / "r", lines)))
    assert curves.valid_steps.tolist() == [50, 100, 150, 200]
    assert curves.position_accuracy.shape == (4, 3)
    # step 50: sequence accuracy 50/120, position p is 0.05 * (3 - p) above it
    assert curves.position_accuracy[0] == pytest.approx([50 / 120 + 0.1, 50 / 120 + 0.05, 50 / 120])
    assert curves.position_accuracy[3, :2].tolist() == [0.5, 0.25] and np.isnan(
        curves.position_accuracy[3, 2]
    )
    assert len(curves.train_steps) == 20 and curves.valid_loss_steps.tolist() == [50, 100, 150, 200]
    # step -> epoch from the training lines: 50 steps per epoch, starts estimated at 55, 105, 155
    assert curves.epochs(np.array([55.0, 130.0])) == pytest.approx([1.0, 2.5])


@requires_matplotlib
def test_figure_shares_limits_and_shows_epochs(make_run):
    base = read_metrics(make_run("base", steps=300))
    reversed_input = read_metrics(make_run("rev", learn_steps=60.0, steps=200))
    rows = [
        (name, reversal_summary(r), reversal_curves(r))
        for name, r in (("a", base), ("b", reversed_input))
    ]
    fig = reversal_figure(rows)  # limits are set while drawing the panels: no rendering needed
    axes = [[ax for ax in sub.axes if ax.get_label() != "<colorbar>"] for sub in fig.subfigs]
    main = [[ax for ax in row if ax.get_xlabel() == "training step"] for row in axes]
    assert [len(row) for row in main] == [3, 3]
    for top, bottom in zip(*main):
        assert top.get_ylim() == bottom.get_ylim() and top.get_xlim() == bottom.get_xlim()
    assert main[0][0].get_xlim() == main[0][2].get_xlim()
    # each panel has its epoch axis on top
    assert all(len(ax.child_axes) == 1 for row in main for ax in row)
    assert "99% sequence accuracy at step 150 (1.5 min)" in fig.subfigs[0]._suptitle.get_text()


@requires_matplotlib
def test_plot_reversal_png(make_run, tmp_path):
    base, rev = make_run("base"), make_run("rev", learn_steps=60.0, positions=10)
    out = plot_reversal(base, rev, tmp_path / "reversal.png")
    check_png(out, size=(13 * 110, round(2 * 3.6 * 110)), min_colors=12)
    with pytest.raises(UserError, match="expected one of .png, .svg, .pdf"):
        plot_reversal(base, rev, tmp_path / "reversal.html")
