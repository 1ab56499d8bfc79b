"""Learning curves: the metrics of one or more runs against steps, epochs or wall-clock minutes.

``plot_curves`` draws one panel per metric (training values solid, validation dashed with dots;
a training series of one point as a dot), one colour per run. Computing the points
(``panel_series``) is separate from drawing them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np

from transduce.errors import UserError
from transduce.plotting import _figure
from transduce.plotting.records import (
    Record,
    RunMetrics,
    StepMap,
    epoch_map,
    minutes_map,
    read_metrics,
    series,
)

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = [
    "Panel",
    "Series",
    "available_panels",
    "panel_series",
    "plot_curves",
    "read_metrics",
    "run_labels",
    "x_map",
]

XAxis = Literal["step", "epoch", "time"]
Split = Literal["train", "valid"]
X_LABELS = {
    "step": "training step (updates)",
    "epoch": "epoch (passes over the training data)",
    "time": "wall clock (minutes of training)",
}


@dataclass(frozen=True)
class Panel:
    """A metric panel: the training and/or validation field it shows and its y-axis label."""

    name: str
    train_key: str | None
    valid_key: str | None
    label: str
    log_y: bool = False


# The panels known by name, in the order they are drawn; their first eight are the default set.
KNOWN_PANELS = (
    Panel("loss", "loss", "valid_loss", "loss (nats/token, label-smoothed)"),
    Panel("ppl", "ppl", "valid_ppl", "perplexity", log_y=True),
    Panel("bleu", None, "bleu", "BLEU"),
    Panel("chrf", None, "chrf", "chrF"),
    Panel("seq_accuracy", None, "seq_accuracy", "sequence accuracy (exact match)"),
    Panel("token_accuracy", None, "token_accuracy", "token accuracy"),
    Panel("lr", "lr", None, "learning rate"),
    Panel("tokens_per_s", "tokens_per_s", None, "throughput (target tokens/s)"),
    Panel("nll", "nll", "valid_nll", "NLL (nats/token)"),
    Panel("loss_scale", "loss_scale", None, "fp16 loss scale", log_y=True),
    Panel("valid_seconds", None, "valid_seconds", "validation time (s)"),
)
DEFAULT_PANELS = tuple(p.name for p in KNOWN_PANELS[:8])
_AXIS_FIELDS = ("epoch", "elapsed")  # x axes, not metrics


@dataclass(frozen=True)
class Series:
    """The points of one run's training or validation values in a panel: x and y arrays (N,)."""

    split: Split
    x: np.ndarray
    y: np.ndarray


def _keys(records: Sequence[Record]) -> set[str]:
    return {k for r in records for k, v in r.values.items() if isinstance(v, float)}


def available_panels(runs: Sequence[RunMetrics]) -> dict[str, Panel]:
    """The panels the runs have data for, by name: the known panels first (in their order), then
    one per other numeric field (e.g. ``valid_loss`` alone, ``neg_valid_nll``)."""
    train_keys = set().union(*(_keys(r.train) for r in runs)) - set(_AXIS_FIELDS)
    valid_keys = set().union(*(_keys(r.valid) for r in runs))
    panels: dict[str, Panel] = {}
    labels: dict[str, str] = {}
    for p in KNOWN_PANELS:
        train = p.train_key if p.train_key in train_keys else None
        valid = p.valid_key if p.valid_key in valid_keys else None
        labels.update({k: p.label for k in (p.train_key, p.valid_key) if k})
        if train or valid:
            panels[p.name] = Panel(p.name, train, valid, p.label, p.log_y)
    for key in sorted(train_keys | valid_keys):
        if key not in panels:
            train = key if key in train_keys else None
            valid = key if key in valid_keys else None
            panels[key] = Panel(key, train, valid, labels.get(key, key))
    return panels


def x_map(run: RunMetrics, x: XAxis, name: str) -> StepMap | None:
    """The step -> x map of a run (None for x = step); a UserError when the run cannot give one."""
    if x == "step":
        return None
    found = epoch_map(run.train) if x == "epoch" else minutes_map(run.train)
    if found is None:
        what = "no epoch has ended" if x == "epoch" else "no training line holds 'elapsed'"
        raise UserError(f"{name}: cannot place the run on the {x} axis ({what}); try x=step")
    return found


def panel_series(run: RunMetrics, panel: Panel, to_x: StepMap | None) -> list[Series]:
    """The training and validation points of ``run`` in ``panel`` (those it has), x mapped from
    steps by ``to_x`` (None: x is the step). Empty series are left out."""
    out = []
    parts: tuple[tuple[Split, Sequence[Record], str | None], ...] = (
        ("train", run.train, panel.train_key),
        ("valid", run.valid, panel.valid_key),
    )
    for split, records, key in parts:
        if key is None:
            continue
        steps, values = series(records, key)
        if len(steps):
            out.append(Series(split, steps if to_x is None else to_x(steps), values))
    return out


def run_labels(run_dirs: Sequence[Path]) -> list[str]:
    """Legend names: each run's folder name, with as many parent folders as make them unique."""
    parts = [Path(p).resolve().parts for p in run_dirs]
    parts = [p[:-1] if p[-1] == "metrics.jsonl" else p for p in parts]
    depth = 1
    while depth < max(len(p) for p in parts):
        labels = ["/".join(p[-depth:]) for p in parts]
        if len(set(labels)) == len(labels):
            return labels
        depth += 1
    return ["/".join(p[-depth:]) for p in parts]


def _choose(panels: dict[str, Panel], metrics: Sequence[str] | None) -> list[Panel]:
    if metrics is None:
        chosen = [panels[n] for n in DEFAULT_PANELS if n in panels]
        if not chosen:
            raise UserError(
                "the runs hold none of the default metrics: " + ", ".join(DEFAULT_PANELS)
            )
        return chosen
    unknown = [m for m in metrics if m not in panels]
    if unknown:
        raise UserError(
            f"unknown metric {', '.join(map(repr, unknown))}; these runs have: "
            + (", ".join(panels) or "(no metrics)")
        )
    return [panels[m] for m in metrics]


def plot_curves(
    run_dirs: Sequence[Path],
    output: Path,
    x: XAxis = "step",
    metrics: Sequence[str] | None = None,
) -> Path:
    """Draws the learning curves of the runs in ``run_dirs`` into ``output`` and returns it.

    One panel per metric in ``metrics`` (panel names such as ``loss``, ``ppl``, ``bleu``, or any
    numeric field of the records; None: those of ``DEFAULT_PANELS`` the runs have), runs
    overlaid in one colour each and named by their folders; x is the training step, the
    (fractional) epoch, or minutes of training. The format is ``output``'s suffix: .png, .svg or
    .pdf. Raises ``UserError`` for another suffix, an unknown x or metric, or unreadable runs.
    """
    path = _figure.check_output(output)
    if x not in X_LABELS:
        raise UserError(f"unknown x axis {x!r}; expected one of {', '.join(X_LABELS)}")
    if not run_dirs:
        raise UserError("no run folders to plot")
    runs = [read_metrics(d) for d in run_dirs]
    if not any(run.train or run.valid for run in runs):  # (one empty among others: no line)
        raise UserError(
            f"{', '.join(map(str, run_dirs))}: no training or validation record in their "
            "metrics.jsonl yet"
        )
    names = run_labels([Path(d) for d in run_dirs])
    panels = _choose(available_panels(runs), metrics)
    to_x = [x_map(run, x, name) for run, name in zip(runs, names)]
    with _figure.style():
        fig = _draw(runs, names, to_x, panels, x)
        return _figure.save(fig, path)


def _log_axis(ax: Axes) -> None:
    """A log y axis labelled in plain numbers (5, 20, 1e+03), not as powers of ten."""
    from matplotlib.ticker import LogFormatter

    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(LogFormatter())
    # minor labels only while the axis spans few decades, as matplotlib's own default does
    ax.yaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(2, 0.4)))


def _draw(
    runs: Sequence[RunMetrics],
    names: Sequence[str],
    to_x: Sequence[StepMap | None],
    panels: Sequence[Panel],
    x: XAxis,
) -> Figure:
    """The figure: a grid of panels and one legend on top."""
    from matplotlib.lines import Line2D

    ncols = min(len(panels), 2 if len(panels) <= 4 else 3)
    nrows = -(-len(panels) // ncols)
    fig = _figure.new_figure(4.6 * ncols, 3.2 * nrows + 0.5)
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    colors = _figure.distinct_colors(len(runs))
    for ax, panel in zip(axes, panels):
        for run, color, mapping in zip(runs, colors, to_x):
            for s in panel_series(run, panel, mapping):
                if s.split == "train":
                    # a line through one point draws nothing: that point gets a marker
                    alone = {"marker": "o", "markersize": 3} if len(s.x) == 1 else {}
                    ax.plot(s.x, s.y, color=color, linewidth=1.2, **alone)
                else:
                    ax.plot(
                        s.x,
                        s.y,
                        color=color,
                        linewidth=1.2,
                        linestyle="--",
                        marker="o",
                        markersize=3,
                    )
        ax.set_title(panel.name)
        ax.set_ylabel(panel.label)
        ax.set_xlabel(X_LABELS[x])
        if panel.log_y:
            _log_axis(ax)
    for ax in axes[len(panels) :]:
        ax.set_visible(False)
    handles = [Line2D([], [], color=c, linewidth=2, label=n) for c, n in zip(colors, names)]
    handles += [
        Line2D([], [], color="0.3", label="training"),
        Line2D([], [], color="0.3", linestyle="--", marker="o", markersize=3, label="validation"),
    ]
    fig.legend(
        handles=handles, loc="outside upper center", ncols=min(len(handles), 6), frameon=False
    )
    return fig
