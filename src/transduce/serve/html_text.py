"""LibreTranslate's ``format: html`` (what Mastodon sends): the text between the tags is
translated, the markup kept as it is.

Each run of text between two tags (``<p>``, ``<br>``, ``<a ...>``, ...) is one segment for the
model, its whitespace folded to single spaces and its character references read (``&amp;`` is
``&``); the translation goes back in its place, escaped, with the run's leading and trailing
whitespace. Tags, comments and declarations are written back as they came (an end tag in lower
case), and the text inside ``script``, ``style``, ``code`` and ``pre`` is not prose: it is kept
(that of ``script`` and ``style`` byte for byte, unescaped, as HTML reads it).
A sentence cut by an inline tag (``a <b>big</b> dog``) is translated in its pieces, as
LibreTranslate's own HTML mode does with its tags.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from html import escape
from html.parser import HTMLParser

KEPT = frozenset({"script", "style", "code", "pre"})  # their text is kept, not translated


@dataclass(frozen=True)
class HtmlText:
    """An HTML text cut into its markup and its segments of text: ``parts`` in order, the
    segments' places among them (``slots``), each segment's text (``segments``, whitespace
    folded) and the whitespace around it (``edges``)."""

    parts: tuple[str, ...]
    slots: tuple[int, ...]
    segments: tuple[str, ...]
    edges: tuple[tuple[str, str], ...]

    def rebuild(self, translations: Sequence[str]) -> str:
        """The HTML with each segment replaced by its translation (one per segment)."""
        if len(translations) != len(self.slots):
            raise ValueError(f"{len(translations)} translations for {len(self.slots)} segments")
        parts = list(self.parts)
        for slot, text, (before, after) in zip(self.slots, translations, self.edges, strict=True):
            parts[slot] = before + escape(text, quote=False) + after
        return "".join(parts)


class _Splitter(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.slots: list[int] = []
        self.segments: list[str] = []
        self.edges: list[tuple[str, str]] = []
        self.kept = 0  # inside how many KEPT elements
        self._data: list[str] = []  # text not yet placed: runs the parser hands in pieces

    def _place(self) -> None:
        """The text read since the last markup, as a segment (or kept as it is)."""
        data, self._data = "".join(self._data), []
        if not data:
            return
        if self.cdata_elem is not None:  # inside script or style: raw text
            self.parts.append(data)
            return
        text = " ".join(data.split())
        if self.kept or not text:
            self.parts.append(escape(data, quote=False))
            return
        stripped = data.strip()
        start = data.index(stripped[0])
        self.edges.append((data[:start], data[start + len(stripped) :]))
        self.slots.append(len(self.parts))
        self.segments.append(text)
        self.parts.append("")  # the translation's place

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._place()
        self.parts.append(self.get_starttag_text() or f"<{tag}>")
        self.kept += tag in KEPT

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._place()
        self.parts.append(self.get_starttag_text() or f"<{tag}/>")

    def handle_endtag(self, tag: str) -> None:
        self._place()
        self.parts.append(f"</{tag}>")
        if tag in KEPT and self.kept:
            self.kept -= 1

    def handle_data(self, data: str) -> None:
        self._data.append(data)  # a bare "<" ends a piece: "x < y" comes in three

    def handle_comment(self, data: str) -> None:
        self._place()
        self.parts.append(f"<!--{data}-->")

    def handle_decl(self, decl: str) -> None:
        self._place()
        self.parts.append(f"<!{decl}>")

    def handle_pi(self, data: str) -> None:
        self._place()
        self.parts.append(f"<?{data}>")

    def unknown_decl(self, data: str) -> None:
        self._place()
        # a marked section (CDATA[...], in any case) closes with ]]>; <![if ...]> with ]>
        marked = "[" in data and data.split("[", 1)[0].strip().isalpha()
        self.parts.append(f"<![{data}]]>" if marked else f"<![{data}]>")


def split_html(html: str) -> HtmlText:
    """``html`` cut into its markup and the segments of text to translate; a ValueError for
    markup Python's parser cannot read (``<![`` and no name after it)."""
    splitter = _Splitter()
    try:
        splitter.feed(html)
        splitter.close()
    except AssertionError as e:  # html.parser's way of refusing some malformed markup
        raise ValueError(f"not HTML that can be read: {e}") from None
    splitter._place()
    return HtmlText(
        tuple(splitter.parts),
        tuple(splitter.slots),
        tuple(splitter.segments),
        tuple(splitter.edges),
    )


__all__ = ["KEPT", "HtmlText", "split_html"]
