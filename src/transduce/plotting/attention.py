"""Attention maps: heat maps per head (``grid``) or the paper's appendix figures (``lines``:
two columns of tokens joined by lines as strong as the weights, one colour per head).

``plot_attention`` takes plain arrays and token strings; ``select_heads`` and ``attention_lines``
compute what is drawn, so that it can be checked without a figure.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np
from numpy.typing import ArrayLike

from transduce.errors import UserError
from transduce.plotting import _figure

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["attention_lines", "plot_attention", "select_heads", "strongest_keys"]

Style = Literal["grid", "lines"]
ATTENTION_SUFFIXES = (".png", ".svg", ".pdf", ".html")
MIN_LINE_SHARE = 0.02  # lines weaker than this share of the largest weight would be invisible


def select_heads(
    weights: ArrayLike,
    queries: Sequence[str],
    keys: Sequence[str],
    heads: int | Sequence[int] | None = None,
) -> tuple[np.ndarray, tuple[int, ...]]:
    """The weights of the chosen heads as a float array (H', T_q, T_k), and those heads' indices.

    ``weights``: (H, T_q, T_k), or (T_q, T_k) for one head, non-negative and finite (a CPU array:
    call ``.detach().cpu()`` on a tensor). ``heads``: 0-based indices, one index, or None for all.
    Raises ``UserError`` when shapes and token counts disagree, or a head index is out of range.
    """
    w = np.asarray(weights, dtype=float)
    if w.ndim == 2:
        w = w[None]
    if w.ndim != 3:
        raise UserError(
            f"attention weights: expected an array (heads, queries, keys), got shape {w.shape}"
        )
    if w.shape[1:] != (len(queries), len(keys)):
        raise UserError(
            f"attention weights of shape {w.shape} (heads, queries, keys) but {len(queries)} query "
            f"and {len(keys)} key tokens"
        )
    if w.size == 0 or not np.isfinite(w).all() or (w < 0).any():
        raise UserError("attention weights: expected finite, non-negative numbers (softmax rows)")
    chosen = (
        tuple(range(w.shape[0]))
        if heads is None
        else (heads,)
        if isinstance(heads, int)
        else tuple(heads)
    )
    bad = [h for h in chosen if not 0 <= h < w.shape[0]]
    if bad or not chosen or len(set(chosen)) != len(chosen):
        raise UserError(
            f"heads {list(chosen)}: expected distinct indices from 0 to {w.shape[0] - 1} "
            f"(the weights have {w.shape[0]} heads)"
        )
    return w[list(chosen)], chosen


def attention_lines(weights: np.ndarray, min_share: float = MIN_LINE_SHARE) -> list[np.ndarray]:
    """For each head of ``weights`` (H, T_q, T_k), the lines to draw as an array (N, 3) of
    (query index, key index, weight) rows: the weights of at least ``min_share`` of the largest
    weight of all heads, in row-major order."""
    top = float(weights.max())
    out = []
    for head in weights:
        q, k = np.nonzero(head >= min_share * top) if top > 0 else (np.array([], int),) * 2
        out.append(np.column_stack([q, k, head[q, k]]).astype(float))
    return out


def strongest_keys(weights: np.ndarray) -> np.ndarray:
    """The key each query attends to most, per head: an int array (H, T_q) from (H, T_q, T_k)."""
    return weights.argmax(axis=2)


def plot_attention(
    weights: ArrayLike,
    queries: Sequence[str],
    keys: Sequence[str],
    output: Path,
    style: Style = "grid",
    heads: int | Sequence[int] | None = None,
    title: str | None = None,
) -> Path:
    """Draws attention weights (H, T_q, T_k) between ``queries`` and ``keys`` tokens into
    ``output`` (.png, .svg, .pdf, or .html: a self-contained page with the figure as an embedded
    PNG, the tokens and each query's strongest key per head) and returns it.

    ``style="grid"``: one heat map per head, tokens as tick labels (readable up to ~30 tokens).
    ``style="lines"``: queries in a left column, keys in a right one, a line from each query to
    the keys it attends to, its opacity and width growing with the weight; one colour per head.
    ``heads`` picks 0-based heads (None: all). Raises ``UserError`` on bad input.
    """
    path = _figure.check_output(output, ATTENTION_SUFFIXES)
    if style not in ("grid", "lines"):
        raise UserError(f"unknown attention style {style!r}; expected grid or lines")
    w, chosen = select_heads(weights, queries, keys, heads)
    with _figure.style():
        fig = (_draw_grid if style == "grid" else _draw_lines)(w, chosen, queries, keys, title)
        if path.suffix.lower() != ".html":
            return _figure.save(fig, path, dpi=100)
        png = io.BytesIO()
        fig.savefig(png, format="png", dpi=100, metadata={"Software": None})  # no URL in the page
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(_html_page(png.getvalue(), w, chosen, queries, keys, title), encoding="utf-8")
    return path


def _label(token: str) -> str:
    # '$' would start mathtext in matplotlib
    return token.replace("$", r"\$")


def _draw_grid(
    w: np.ndarray,
    heads: Sequence[int],
    queries: Sequence[str],
    keys: Sequence[str],
    title: str | None,
) -> Figure:
    """One heat map per head, 4 to a row, sharing their axes and one colour bar."""
    n = len(heads)
    ncols = min(n, 4)
    nrows = -(-n // ncols)
    cell = 0.19  # inches per token: room for 7-point labels
    width = ncols * max(2.6, cell * len(keys) + 0.6) + 1.6
    height = nrows * max(2.4, cell * len(queries) + 0.6) + 0.8
    fig = _figure.new_figure(width, height)
    axes = fig.subplots(nrows, ncols, squeeze=False, sharex=True, sharey=True)
    vmax = float(w.max()) or 1.0
    images = []
    for ax, head, weights in zip(axes.ravel(), heads, w):
        images.append(
            ax.imshow(
                weights, cmap="viridis", vmin=0.0, vmax=vmax, aspect="auto", interpolation="nearest"
            )
        )
        ax.set_title(f"head {head}")
        ax.grid(False)
        ax.set_xticks(range(len(keys)), [_label(t) for t in keys], rotation=90, fontsize=7)
        ax.set_yticks(range(len(queries)), [_label(t) for t in queries], fontsize=7)
    for ax in axes.ravel()[n:]:
        ax.set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel("key")
    for ax in axes[:, 0]:
        ax.set_ylabel("query")
    fig.colorbar(images[0], ax=axes, shrink=0.6, label="attention weight")
    if title:
        fig.suptitle(title)
    return fig


def _draw_lines(
    w: np.ndarray,
    heads: Sequence[int],
    queries: Sequence[str],
    keys: Sequence[str],
    title: str | None,
) -> Figure:
    """Two token columns joined by lines (the paper's Figures 3-5), one colour per head."""
    from matplotlib.collections import LineCollection
    from matplotlib.lines import Line2D

    rows = max(len(queries), len(keys))
    fig = _figure.new_figure(5.2, 0.22 * rows + 1.4)
    ax = fig.add_subplot()
    # shorter column centred against the longer one
    yq = np.arange(len(queries)) + (rows - len(queries)) / 2
    yk = np.arange(len(keys)) + (rows - len(keys)) / 2
    top = float(w.max()) or 1.0
    colors = _figure.distinct_colors(len(heads)) if len(heads) > 1 else [(0.12, 0.35, 0.75, 1.0)]
    for lines, color in zip(attention_lines(w), colors):
        q, k, weight = lines[:, 0].astype(int), lines[:, 1].astype(int), lines[:, 2] / top
        segments = np.stack(
            [
                np.column_stack([np.zeros_like(weight), yq[q]]),
                np.column_stack([np.ones_like(weight), yk[k]]),
            ],
            axis=1,
        )
        rgba = np.tile(color, (len(weight), 1))
        rgba[:, 3] = weight
        ax.add_collection(
            LineCollection(list(segments), colors=rgba, linewidths=0.4 + 2.6 * weight)
        )
    ax.set_xlim(0, 1)
    ax.set_ylim(rows - 0.5, -0.5)
    ax.set_yticks(yq, [_label(t) for t in queries])
    ax.set_ylabel("query")
    right = ax.twinx()
    right.set_ylim(ax.get_ylim())
    right.set_yticks(yk, [_label(t) for t in keys])
    right.set_ylabel("key")
    for a in (ax, right):
        a.grid(False)
        a.tick_params(length=0)
        a.set_xticks([])
        for spine in a.spines.values():
            spine.set_visible(False)
    if len(heads) > 1:
        handles = [
            Line2D([], [], color=c, linewidth=2, label=f"head {h}") for c, h in zip(colors, heads)
        ]
        fig.legend(
            handles=handles, loc="outside upper center", ncols=min(len(heads), 4), frameon=False
        )
    ax.set_title(title if title else f"head {heads[0]}" if len(heads) == 1 else "")
    return fig


def _html_page(
    png: bytes,
    w: np.ndarray,
    heads: Sequence[int],
    queries: Sequence[str],
    keys: Sequence[str],
    title: str | None,
) -> str:
    """A page needing nothing else: the figure as a data: URL, the tokens, and a table of each
    query's strongest key (and its weight) per head."""
    e = html.escape
    name = title or "Attention weights"
    best = strongest_keys(w)
    header = "".join(f"<th>head {h}</th>" for h in heads)
    rows = "".join(
        f"<tr><td>{i}</td><td>{e(q)}</td>"
        + "".join(
            f"<td>{e(keys[best[h, i]])} ({w[h, i, best[h, i]]:.2f})</td>" for h in range(len(heads))
        )
        + "</tr>\n"
        for i, q in enumerate(queries)
    )
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{e(name)}</title>
<style>
body {{ font-family: sans-serif; margin: 1.5em; }}
img {{ max-width: 100%; height: auto; }}
table {{ border-collapse: collapse; font-size: 0.9em; }}
td, th {{ border: 1px solid #ccc; padding: 0.2em 0.5em; text-align: left; }}
</style>
</head>
<body>
<h1>{e(name)}</h1>
<p>Heads {", ".join(map(str, heads))}; {len(queries)} query and {len(keys)} key tokens.</p>
<img alt="{e(name)}" src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}">
<h2>Tokens</h2>
<p><b>Queries:</b> {e(" ".join(queries))}</p>
<p><b>Keys:</b> {e(" ".join(keys))}</p>
<h2>Strongest key of each query</h2>
<table>
<tr><th>#</th><th>query</th>{header}</tr>
{rows}</table>
</body>
</html>
"""
