"""LibreTranslate's html format: the runs of text between tags are the segments; the markup,
and the text of script, style, code and pre, come back as they were."""

from __future__ import annotations

import pytest

from transduce.serve.html_text import split_html


def _upper(html: str) -> tuple[tuple[str, ...], str]:
    d = split_html(html)
    return d.segments, d.rebuild([s.upper() for s in d.segments])


@pytest.mark.parametrize(
    ("html", "segments", "rebuilt"),
    [
        ("<p>x < y and z</p>", ("x < y and z",), "<p>X &lt; Y AND Z</p>"),  # one segment
        ("<style>a > b {}</style><p>hi</p>", ("hi",), "<style>a > b {}</style><p>HI</p>"),
        ("<script>if (a < b && c) {}</script>", (), "<script>if (a < b && c) {}</script>"),
        ("<pre>keep &lt;me&gt;</pre> ok", ("ok",), "<pre>keep &lt;me&gt;</pre> OK"),
        ("<![CDATA[y]]><b>a &amp; b</b>", ("a & b",), "<![CDATA[y]]><b>A &amp; B</b>"),
        (
            "<svg><![cdata[x]]></svg><![if !IE]>z<![endif]>",
            ("z",),
            "<svg><![cdata[x]]></svg><![if !IE]>Z<![endif]>",
        ),
        (
            '<a href="/x?a=1&amp;b=2">go <br/> on</a>',
            ("go", "on"),
            '<a href="/x?a=1&amp;b=2">GO <br/> ON</a>',
        ),
        ("  \n<p>\n  two\n  lines  </p>", ("two lines",), "  \n<p>\n  TWO LINES  </p>"),
    ],
)
def test_segments_and_markup(html: str, segments: tuple[str, ...], rebuilt: str) -> None:
    assert _upper(html) == (segments, rebuilt)


def test_markup_the_parser_cannot_read_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="not HTML that can be read"):
        split_html("a <![ b")
    with pytest.raises(ValueError, match="2 translations for 1 segments"):
        split_html("<p>a</p>").rebuild(["x", "y"])
