"""``plot curves`` draws a series of one point (a run stopped after its first log line, or one
validation): as a marker, since a line through one point draws nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import pytest
from plot_helpers import check_png, requires_matplotlib

from transduce.plotting import _figure
from transduce.plotting.curves import plot_curves


def _drawn(fig: Any) -> dict[str, list[tuple[list[float], list[float], bool]]]:
    """Per panel title: each line's x and y data and whether it shows anything (a marker, or
    a line through two points or more)."""
    out: dict[str, list[tuple[list[float], list[float], bool]]] = {}
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        for line in ax.get_lines():
            xs, ys = (list(map(float, d)) for d in line.get_data())
            marker = line.get_marker() not in (None, "None", "none", "", " ")
            visible = marker or (len(xs) > 1 and line.get_linestyle() not in ("None", ""))
            out.setdefault(ax.get_title(), []).append((xs, ys, visible))
    return out


@requires_matplotlib
@pytest.mark.parametrize("x", ["step", "time"])
def test_a_series_of_one_point_is_drawn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, x: Literal["step", "time"]
) -> None:
    run = tmp_path / "run"
    run.mkdir()
    lines = [  # one training line, one validation; and a second run of two points
        {"step": 5, "epoch": 0, "loss": 2.5, "lr": 1e-3, "elapsed": 30.0},
        {"step": 5, "split": "valid", "valid_loss": 2.75},
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    two = tmp_path / "two"
    two.mkdir()
    first = {**lines[0], "step": 1, "elapsed": 6.0}
    (two / "metrics.jsonl").write_text(
        json.dumps(first) + "\n" + json.dumps({**lines[0], "loss": 2.0}) + "\n"
    )
    figures: list[Any] = []
    real_save = _figure.save

    def save(fig: Any, path: Path) -> Path:  # the figure drawn, kept to look at
        figures.append(fig)
        return real_save(fig, path)

    monkeypatch.setattr(_figure, "save", save)
    out = plot_curves([run, two], tmp_path / "curves.png", x=x, metrics=["loss", "lr"])
    check_png(out)
    drawn = _drawn(figures[0])
    at = 5.0 if x == "step" else 0.5  # 30 s of training
    assert ([at], [2.5], True) in drawn["loss"]  # the training point
    assert ([at], [2.75], True) in drawn["loss"]  # the validation point
    assert ([at], [1e-3], True) in drawn["lr"]
    two_at = [1.0, 5.0] if x == "step" else [0.1, 0.5]
    assert (two_at, [2.5, 2.0], True) in drawn["loss"]  # two points: the line as before
    assert all(shown for panel in drawn.values() for _, _, shown in panel), drawn
