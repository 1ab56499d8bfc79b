"""Attention figures: head selection, the lines drawn, and the files written (png, svg, html)."""

from __future__ import annotations

import base64
import re

import numpy as np
import pytest
from plot_helpers import check_png, check_vector, requires_matplotlib

from transduce.errors import UserError
from transduce.plotting.attention import (
    attention_lines,
    plot_attention,
    select_heads,
    strongest_keys,
)

QUERIES = ["<s>", "the", "cat", "$5"]
KEYS = ["le", "chat", "<EOS>", "&", "x"]


def toy_weights() -> np.ndarray:
    """(3, 4, 5): head 0 attends query i -> key i, head 1 spreads evenly, head 2 -> the last key."""
    w = np.zeros((3, 4, 5))
    w[0, np.arange(4), np.arange(4)] = 1.0
    w[1] = 0.2
    w[2, :, 4] = 0.9
    w[2, :, 0] = 0.1
    return w


def test_select_heads():
    w = toy_weights()
    picked, heads = select_heads(w, QUERIES, KEYS, [2, 0])
    assert heads == (2, 0) and np.array_equal(picked, w[[2, 0]])
    assert select_heads(w, QUERIES, KEYS, 1)[1] == (1,)
    one, heads = select_heads(w[0], QUERIES, KEYS)  # (T_q, T_k) is one head
    assert one.shape == (1, 4, 5) and heads == (0,)


@pytest.mark.parametrize(
    ("weights", "heads", "message"),
    [
        (np.zeros((3, 4, 4)), None, r"shape \(3, 4, 4\) .* but 4 query and 5 key tokens"),
        (np.zeros((2, 3, 4, 5)), None, "expected an array"),
        (-toy_weights(), None, "non-negative"),
        (np.full((1, 4, 5), np.nan), None, "finite"),
        (toy_weights(), [3], "expected distinct indices from 0 to 2"),
        (toy_weights(), [1, 1], "distinct"),
    ],
)
def test_select_heads_errors(weights, heads, message):
    with pytest.raises(UserError, match=message):
        select_heads(weights, QUERIES, KEYS, heads)


def test_attention_lines_and_strongest_keys():
    w = toy_weights()
    lines = attention_lines(w, min_share=0.05)
    # head 0: the diagonal; head 1: all 20 pairs at 0.2; head 2: every query to keys 0 and 4
    assert lines[0].tolist() == [[i, i, 1.0] for i in range(4)]
    assert len(lines[1]) == 20 and set(lines[1][:, 2]) == {0.2}
    assert lines[2].tolist() == [[q, k, v] for q in range(4) for k, v in ((0, 0.1), (4, 0.9))]
    # a higher floor drops head 1 and head 2's weaker lines
    assert [len(x) for x in attention_lines(w, min_share=0.5)] == [4, 0, 4]
    assert strongest_keys(w).tolist() == [[0, 1, 2, 3], [0, 0, 0, 0], [4, 4, 4, 4]]


@requires_matplotlib
def test_grid_png_size_and_content(tmp_path):
    out = plot_attention(toy_weights(), QUERIES, KEYS, tmp_path / "grid.png", title="toy")
    # 3 heads in a row of 2.6 x 2.4 in panels, plus 1.6 in (colour bar) by 0.8 in, at 100 dpi
    check_png(out, size=(940, 320), min_colors=6)


@requires_matplotlib
def test_lines_svg_has_the_tokens(tmp_path):
    out = plot_attention(
        toy_weights(), QUERIES, KEYS, tmp_path / "lines.svg", style="lines", heads=[0, 2]
    )
    text = check_vector(out)
    for token in ("cat", "$5", "&lt;EOS&gt;", "&amp;", "head 0", "head 2"):
        assert token in text
    assert "head 1" not in text


@requires_matplotlib
def test_html_is_self_contained(tmp_path):
    out = plot_attention(
        toy_weights(),
        QUERIES,
        KEYS,
        tmp_path / "a" / "attn.html",
        style="lines",
        heads=2,
        title="Layer <2>",
    )
    page = out.read_text()
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert "http" not in page and "<title>Layer &lt;2&gt;</title>" in page
    png = base64.b64decode(re.search(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)[1])
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and b"http" not in png
    # the strongest key of each query under head 2 is "x" at 0.9
    assert page.count("<td>x (0.90)</td>") == 4


def test_bad_output_or_style(tmp_path):
    with pytest.raises(UserError, match="expected one of .png, .svg, .pdf, .html"):
        plot_attention(toy_weights(), QUERIES, KEYS, tmp_path / "a.gif")
    with pytest.raises(UserError, match="unknown attention style 'arcs'"):
        plot_attention(toy_weights(), QUERIES, KEYS, tmp_path / "a.png", style="arcs")  # type: ignore[arg-type]
