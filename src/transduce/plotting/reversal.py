"""The input-reversal experiment's figure: a synthetic task learnt with its inputs as given
(baseline) and reversed, compared by sequence accuracy, accuracy per answer position, and loss.

``reversal_summary`` and ``reversal_curves`` compute what is shown; ``reversal_figure`` draws it;
``plot_reversal`` reads two run folders and writes the figure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

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
    from matplotlib.figure import Figure, SubFigure

__all__ = [
    "ReversalCurves",
    "plot_reversal",
    "reversal_curves",
    "reversal_figure",
    "reversal_summary",
]

Records = RunMetrics | tuple[Sequence[Record], Sequence[Record]]
COLUMNS = ("sequence accuracy", "accuracy per answer position", "loss")


def _accuracy_records(records: Records) -> tuple[Sequence[Record], Sequence[Record]]:
    train, valid = records
    if not any(r.scalar("seq_accuracy") is not None for r in valid):
        raise UserError(
            "no validation line holds seq_accuracy (the reversal figure is for synthetic tasks)"
        )
    return train, valid


def reversal_summary(records: Records, threshold: float = 0.99) -> dict[str, Any]:
    """The numbers to compare a run by, from its ``(train, valid)`` records (``read_metrics``).

    Returns ``final_step``, ``final_seq_accuracy``, ``final_token_accuracy`` and
    ``final_position_accuracy`` (a list; None when not logged) of the last validation holding
    ``seq_accuracy``; ``threshold``; ``steps_to_threshold``: the first validation step whose
    sequence accuracy reaches ``threshold``, and ``seconds_to_threshold``: the training seconds
    (``elapsed``, interpolated between logged steps) at that step; each None when never reached
    (or, for seconds, when no training line holds ``elapsed``). Raises ``UserError`` when no
    validation line holds ``seq_accuracy``.
    """
    train, valid = _accuracy_records(records)
    scored = [r for r in valid if r.scalar("seq_accuracy") is not None]
    last = scored[-1]
    reached = next((r.step for r in scored if (r.scalar("seq_accuracy") or 0.0) >= threshold), None)
    clock = minutes_map(train)
    seconds = None if reached is None or clock is None else float(clock(reached)) * 60
    position = last.vector("position_accuracy")
    return {
        "final_step": last.step,
        "final_seq_accuracy": last.scalar("seq_accuracy"),
        "final_token_accuracy": last.scalar("token_accuracy"),
        "final_position_accuracy": None if position is None else list(position),
        "threshold": threshold,
        "steps_to_threshold": reached,
        "seconds_to_threshold": seconds,
    }


@dataclass(frozen=True, eq=False)
class ReversalCurves:
    """What one row of the figure shows; arrays indexed by validation (V) or training (N) line.

    ``position_accuracy`` is (V, P), NaN where a line lacks a position (P: the most positions
    any line has; 0 columns when none holds the list). ``epochs`` maps steps to epochs (None
    before an epoch has ended).
    """

    valid_steps: np.ndarray  # (V,)
    seq_accuracy: np.ndarray  # (V,)
    token_accuracy: np.ndarray  # (V,), NaN where not logged
    position_accuracy: np.ndarray  # (V, P)
    train_steps: np.ndarray  # (N,)
    train_loss: np.ndarray  # (N,)
    valid_loss_steps: np.ndarray  # (V',)
    valid_loss: np.ndarray  # (V',)
    epochs: StepMap | None


def reversal_curves(records: Records) -> ReversalCurves:
    """The curves of one run from its ``(train, valid)`` records; a UserError without
    ``seq_accuracy`` in the validation lines."""
    train, valid = _accuracy_records(records)
    scored = [r for r in valid if r.scalar("seq_accuracy") is not None]
    vectors = [r.vector("position_accuracy") or () for r in scored]
    positions = np.full((len(scored), max(map(len, vectors))), np.nan)
    for i, v in enumerate(vectors):
        positions[i, : len(v)] = v
    token = [r.scalar("token_accuracy") for r in scored]
    train_steps, train_loss = series(train, "loss")
    valid_loss_steps, valid_loss = series(valid, "valid_loss")
    return ReversalCurves(
        valid_steps=np.array([r.step for r in scored], dtype=float),
        seq_accuracy=np.array([r.scalar("seq_accuracy") for r in scored], dtype=float),
        token_accuracy=np.array([np.nan if t is None else t for t in token], dtype=float),
        position_accuracy=positions,
        train_steps=train_steps,
        train_loss=train_loss,
        valid_loss_steps=valid_loss_steps,
        valid_loss=valid_loss,
        epochs=epoch_map(train),
    )


def _load(run: Path | str | Records, role: str) -> tuple[str, Records]:
    """The row's name (its role, and its folder when read from one) and the run's records."""
    if isinstance(run, Path | str):
        return f"{role} ({Path(run).name})", read_metrics(run)
    return role, run


def plot_reversal(
    baseline: Path | str | Records,
    reversed_input: Path | str | Records,
    output: Path,
    threshold: float = 0.99,
) -> Path:
    """Draws the baseline run (top row) against the input-reversed run (bottom row) into
    ``output`` (.png, .svg or .pdf) and returns it. Each run is a run folder or its
    ``(train, valid)`` records; both should be of the same synthetic task. Columns: sequence and
    token accuracy, accuracy per answer position, training and validation loss, all against
    training steps (epochs on top), the y limits of a column shared by both rows. Raises
    ``UserError`` for a bad suffix, unreadable runs, or runs without ``seq_accuracy``.
    """
    path = _figure.check_output(output)
    rows = []
    for run, role in ((baseline, "baseline"), (reversed_input, "input reversed")):
        label, records = _load(run, role)
        try:
            rows.append((label, reversal_summary(records, threshold), reversal_curves(records)))
        except UserError as e:
            raise UserError(f"{label}: {e}") from e
    with _figure.style():
        return _figure.save(reversal_figure(rows), path)


def reversal_figure(rows: Sequence[tuple[str, dict[str, Any], ReversalCurves]]) -> Figure:
    """The figure of (name, summary, curves) rows, three columns each (see ``COLUMNS``); the
    x limits are shared by all panels and the y limits by each column."""
    fig = _figure.new_figure(13.0, 3.6 * len(rows))
    subfigs = fig.subfigures(len(rows), 1, squeeze=False)[:, 0]
    grid = [
        _draw_row(sub, name, summary, curves) for sub, (name, summary, curves) in zip(subfigs, rows)
    ]
    axes = np.array(grid)
    x_max = max(max(ax.get_xlim()[1] for ax in row) for row in grid)
    for ax in axes.ravel():
        ax.set_xlim(0, x_max)
    for column in axes.T:
        low = min(ax.get_ylim()[0] for ax in column)
        high = max(ax.get_ylim()[1] for ax in column)
        for ax in column:
            ax.set_ylim(low, high)
    return fig


def _row_title(name: str, summary: dict[str, Any]) -> str:
    reached = summary["steps_to_threshold"]
    pct = f"{summary['threshold']:.0%}"
    if reached is None:
        when = f"below {pct} sequence accuracy by step {summary['final_step']}"
    else:
        seconds = summary["seconds_to_threshold"]
        clock = "" if seconds is None else f" ({seconds / 60:.1f} min)"
        when = f"{pct} sequence accuracy at step {reached}{clock}"
    return f"{name}: {when}; final {summary['final_seq_accuracy']:.3f}"


def _draw_row(sub: SubFigure, name: str, summary: dict[str, Any], c: ReversalCurves) -> list[Axes]:
    """One row: accuracy, accuracy per position, loss; epochs on a secondary top axis."""
    axes = list(sub.subplots(1, 3))
    sub.suptitle(_row_title(name, summary), fontsize=10, fontweight="bold")
    acc, pos, loss = axes
    acc.plot(c.valid_steps, c.seq_accuracy, marker="o", markersize=3, label="sequence")
    if not np.isnan(c.token_accuracy).all():
        acc.plot(
            c.valid_steps, c.token_accuracy, linestyle="--", marker="o", markersize=3, label="token"
        )
    acc.axhline(summary["threshold"], color="0.5", linestyle=":", linewidth=1)
    if summary["steps_to_threshold"] is not None:
        acc.axvline(summary["steps_to_threshold"], color="0.5", linestyle=":", linewidth=1)
    acc.set_ylabel("validation accuracy")
    acc.legend(loc="lower right")
    _draw_positions(pos, c)
    loss.plot(c.train_steps, c.train_loss, label="training")
    loss.plot(
        c.valid_loss_steps,
        c.valid_loss,
        linestyle="--",
        marker="o",
        markersize=3,
        label="validation",
    )
    loss.set_ylabel("loss (nats/token)")
    loss.legend(loc="upper right")
    for ax, title in zip(axes, COLUMNS):
        ax.set_title(title)
        ax.set_xlabel("training step")
        if c.epochs is not None:
            top = ax.secondary_xaxis("top", functions=(c.epochs, c.epochs.inverse))
            top.set_xlabel("epoch", fontsize=8)
    return axes


def _draw_positions(ax: Axes, c: ReversalCurves) -> None:
    """One line per answer position, coloured from dark (first) to light (last)."""
    mpl = _figure.matplotlib_module()
    count = c.position_accuracy.shape[1]
    ax.set_ylabel("validation token accuracy")
    if count == 0:
        ax.text(
            0.5,
            0.5,
            "no position_accuracy logged",
            ha="center",
            va="center",
            transform=ax.transAxes,
        )
        return
    # viridis without its last, too pale tenth: position 1 dark, the last light
    colors = mpl.colormaps["viridis"](np.linspace(0.0, 0.9, count))
    for p in range(count):
        ax.plot(
            c.valid_steps,
            c.position_accuracy[:, p],
            color=colors[p],
            linewidth=1.2,
            label=f"position {p + 1}",
        )
    if count <= 8:
        ax.legend(loc="lower right", ncols=2 if count > 4 else 1)
    else:  # a legend of many positions would hide the lines
        norm = mpl.colors.BoundaryNorm(np.arange(0.5, count + 1), count)
        scale = mpl.cm.ScalarMappable(norm=norm, cmap=mpl.colors.ListedColormap(colors))
        bar = ax.figure.colorbar(scale, ax=ax, label="answer position")
        bar.set_ticks(range(1, count + 1, max(1, count // 8)))
