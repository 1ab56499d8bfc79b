"""Constituency trees: an immutable tree type, reading and writing Penn Treebank brackets, and
the cleaning that parsing papers and EVALB apply to the treebank.

A tree is a ``Tree`` (a label and a non-empty tuple of children) whose leaves are ``Leaf``
objects: one word with its part-of-speech (preterminal) tag. Brackets are read as the Penn
Treebank writes them, several trees per text, NLTK's empty root included::

    ( (S (NP-SBJ (NNP Pierre) (NNP Vinken)) (VP (MD will) (VP (VB join))) (. .)) )

and written back on one line with a preterminal around every word, the root relabelled ``TOP``::

    (TOP (S (NP (NNP Pierre) (NNP Vinken)) (VP (MD will) (VP (VB join))) (. .)))

Cleaning (``clean_tree``), as EVALB and parsing papers do: function tags and indices are stripped
from constituent labels (``NP-SBJ-1`` -> ``NP``, ``PP-LOC=2`` -> ``PP``; labels that begin and
end with ``-``, such as ``-NONE-``, ``-LRB-``, ``-RRB-``, are kept whole), empty elements (tag
``-NONE-``) are removed together with the constituents that are left with no words by that,
and the root becomes ``TOP``.
"""

from __future__ import annotations

import gzip
import re
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from transduce.data.parallel import GZIP_MAGIC
from transduce.errors import UserError

__all__ = [
    "EMPTY_TAG",
    "ROOT_LABEL",
    "Leaf",
    "Node",
    "Tree",
    "check_words",
    "clean_tree",
    "parse_trees",
    "read_tree_file",
    "strip_function_tags",
    "to_brackets",
]

ROOT_LABEL = "TOP"
EMPTY_TAG = "-NONE-"
_ROOT_LABELS = ("", "TOP", "ROOT")  # NLTK's empty root, EVALB's TOP, the Stanford ROOT
# a whole (tag word) on one line is one token (most of a treebank: reads 2.5x faster)
_TOKEN = re.compile(r"\(([^\s()]+)[ \t]+([^\s()]+)[ \t]*\)|\(|\)|[^\s()]+")
_UNWRITABLE = re.compile(r"[\s()]")


@dataclass(frozen=True, slots=True)
class Leaf:
    """One word with its part-of-speech tag: written ``(tag word)``."""

    tag: str
    word: str


@dataclass(frozen=True, slots=True)
class Tree:
    """A constituent: a label and its children, in order (at least one)."""

    label: str
    children: tuple[Node, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.children, tuple):
            raise TypeError(f"Tree children must be a tuple, got {type(self.children).__name__}")
        if not self.children:
            raise ValueError(f"constituent {self.label!r} has no children")

    def leaves(self) -> list[Leaf]:
        """The leaves, left to right."""
        return list(_iter_leaves(self))

    def words(self) -> list[str]:
        """The words, left to right."""
        return [leaf.word for leaf in _iter_leaves(self)]

    def tags(self) -> list[str]:
        """The part-of-speech tags of the words, left to right."""
        return [leaf.tag for leaf in _iter_leaves(self)]

    def __str__(self) -> str:
        return to_brackets(self)


Node = Tree | Leaf


def _iter_leaves(node: Node) -> Iterator[Leaf]:
    stack: list[Node] = [node]  # explicit stack: no recursion limit on deep trees
    while stack:
        top = stack.pop()
        if isinstance(top, Leaf):
            yield top
        else:
            stack.extend(reversed(top.children))


# ------------------------------------------------------------------------------------ writing


def check_words(sentences: Sequence[Sequence[str]], name: str) -> None:
    """A UserError naming ``name`` and the line (sentence i is line i + 1) of the first word a
    bracketed tree cannot hold (a bracket), before any work: a parse of it could not be
    written."""
    for i, words in enumerate(sentences):
        for word in words:
            if _UNWRITABLE.search(word):
                raise UserError(
                    f"{name}: line {i + 1}: word {word!r} cannot be written in a bracketed tree "
                    "(it holds a bracket); the Penn Treebank writes -LRB- and -RRB- for brackets"
                )


def _check_writable(text: str, what: str) -> None:
    if not text or _UNWRITABLE.search(text):
        raise UserError(
            f"{what} {text!r} cannot be written in a bracketed tree (it is empty or holds a "
            "bracket or a space); the Penn Treebank writes -LRB- and -RRB- for brackets"
        )


def to_brackets(node: Node) -> str:
    """One line of brackets, e.g. ``(TOP (S (NP (DT The) (NN cat)) (VP (VBD sat)) (. .)))``.

    Every word is written inside its preterminal ``(tag word)``. A word or label that holds a
    bracket or whitespace (or a word or tag that is empty) would not read back: ``UserError``.
    """
    if isinstance(node, Leaf):
        _check_writable(node.tag, "tag")
        _check_writable(node.word, "word")
        return f"({node.tag} {node.word})"
    if node.label:
        _check_writable(node.label, "label")
    return f"({node.label} {' '.join(to_brackets(child) for child in node.children)})"


# ------------------------------------------------------------------------------------ reading


@dataclass
class _Open:
    """A constituent being read: its label, the line of its ``(``, its children so far and how
    many it had before cleaning removed any."""

    label: str
    line: int
    children: list[Node] = field(default_factory=list)
    seen: int = 0

    def add(self, child: Node | None) -> None:
        self.seen += 1
        if child is not None:
            self.children.append(child)


_Token = str | Leaf


def _tokens(text: str) -> list[tuple[_Token, int]]:
    """Brackets, symbols and whole one-line leaves, with their 1-based line numbers."""
    return [
        (Leaf(m[1], m[2]) if m[1] is not None else m[0], line)
        for line, text_line in enumerate(text.split("\n"), start=1)
        for m in _TOKEN.finditer(text_line)
    ]


def _shown(tok: _Token | None) -> str:
    if tok is None:
        return "the end of the text"
    return repr(tok) if isinstance(tok, str) else f"'({tok.tag} {tok.word})'"


def _read_open(toks: list[tuple[_Token, int]], i: int, name: str) -> tuple[int, Leaf | _Open]:
    """Read from the ``(`` at ``toks[i]``: a whole leaf ``(tag word)`` or the start of a
    constituent ``(label`` / ``(``. Returns the index after what was read."""
    line = toks[i][1]
    nxt = toks[i + 1][0] if i + 1 < len(toks) else None
    if nxt is None:
        raise UserError(f"{name}: line {line}: '(' at the end of the text; expected a label")
    if nxt == "(" or isinstance(nxt, Leaf):
        return i + 1, _Open("", line)  # an unlabelled constituent: NLTK's empty root
    if nxt == ")":
        raise UserError(f"{name}: line {line}: empty brackets '()'; expected a label")
    after = toks[i + 2][0] if i + 2 < len(toks) else None
    if after in ("(", ")", None) or isinstance(after, Leaf):
        return i + 2, _Open(nxt, line)
    end = toks[i + 3][0] if i + 3 < len(toks) else None
    if end != ")":
        raise UserError(
            f"{name}: line {line}: ({nxt} {after} is followed by {_shown(end)}; expected ')' "
            "(a preterminal holds exactly one word)"
        )
    return i + 4, Leaf(nxt, after)


def _close(done: _Open, name: str, clean: bool) -> Tree | None:
    """The tree of a constituent whose ``)`` was read; None when cleaning left it empty."""
    if not done.seen:
        raise UserError(
            f"{name}: line {done.line}: constituent ({done.label} has no children; "
            "expected a constituent or (tag word) inside it"
        )
    if not done.children:
        return None  # only empty elements, removed by cleaning
    return Tree(strip_function_tags(done.label) if clean else done.label, tuple(done.children))


def _root(tree: Tree) -> Tree:
    """``clean_tree``'s root rule on a tree cleaned below its root."""
    if tree.label in _ROOT_LABELS:
        return Tree(ROOT_LABEL, tree.children)
    return Tree(ROOT_LABEL, (Tree(strip_function_tags(tree.label), tree.children),))


def _parse(text: str, name: str, clean: bool) -> Iterator[tuple[int, Tree | None]]:
    """Yield (line of the opening bracket, tree) for each tree in ``text``; with ``clean``, the
    tree cleaned as it is read (None when nothing is left), as ``clean_tree`` would."""
    toks = _tokens(text)
    stack: list[_Open] = []
    i = 0
    while i < len(toks):
        tok, line = toks[i]
        if isinstance(tok, Leaf) or tok == "(":
            item: Leaf | _Open
            i, item = (i + 1, tok) if isinstance(tok, Leaf) else _read_open(toks, i, name)
            if isinstance(item, _Open):
                stack.append(item)
                continue
            kept = item if not (clean and item.tag == EMPTY_TAG) else None
            if stack:
                stack[-1].add(kept)
            else:  # a lone (tag word) is a one-word tree without a root
                yield line, Tree(ROOT_LABEL if clean else "", (kept,)) if kept is not None else None
            continue
        if tok == ")":
            if not stack:
                raise UserError(f"{name}: line {line}: ')' closes no open bracket")
            done = stack.pop()
            tree = _close(done, name, clean)
            if stack:
                stack[-1].add(tree)
            else:
                yield done.line, _root(tree) if clean and tree is not None else tree
        elif stack:
            raise UserError(
                f"{name}: line {line}: word {tok!r} directly inside ({stack[-1].label}; "
                "expected it inside a preterminal (tag word)"
            )
        else:
            raise UserError(f"{name}: line {line}: {tok!r} outside any bracket; expected '('")
        i += 1
    if stack:
        raise UserError(
            f"{name}: line {stack[-1].line}: '(' opened here is never closed "
            f"({len(stack)} bracket(s) still open at the end of the text)"
        )


def parse_trees(text: str, *, name: str = "<string>", clean: bool = False) -> list[Tree]:
    """The trees in ``text`` (Penn Treebank brackets, any layout, several trees per text).

    ``name`` is how error messages call the text (a file name). With ``clean`` each tree is
    cleaned as ``clean_tree`` does (while it is read: one pass); a tree left with no words by
    that is a ``UserError`` naming its line. Malformed brackets are a ``UserError`` naming the
    line and what was expected.
    """
    trees: list[Tree] = []
    for line, tree in _parse(text, name, clean):
        if tree is None:
            raise UserError(f"{name}: line {line}: tree has no words besides empty elements")
        trees.append(tree)
    return trees


def read_tree_file(path: str | Path, *, clean: bool = False) -> list[Tree]:
    """The trees of a UTF-8 file of brackets, plain or gzip-compressed (``.gz``): ``parse_trees``,
    errors naming the file and line; e.g. a ``{split}.trees`` file of ``transduce.data.ptb`` or a
    parser's output."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise UserError(f"{path}: cannot read ({e.strerror or e})") from None
    if path.suffix.lower() == ".gz":  # decompressed, as every other input file here
        try:
            data = gzip.decompress(data)
        except (gzip.BadGzipFile, EOFError, zlib.error) as e:
            detail = "truncated" if isinstance(e, EOFError) else str(e)
            raise UserError(f"{path}: corrupt gzip file ({detail})") from None
    elif data.startswith(GZIP_MAGIC):
        raise UserError(f"{path}: gzip data in a file not named .gz (name it so, or decompress it)")
    try:
        text = data.decode("utf-8-sig")  # a byte order mark dropped, as every reader here does
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise UserError(f"{path}: line {line}: invalid UTF-8 (byte offset {e.start})") from None
    return parse_trees(text, name=str(path), clean=clean)


# ----------------------------------------------------------------------------------- cleaning


def strip_function_tags(label: str) -> str:
    """The label without function tags and indices: cut at the first ``-`` or ``=`` that is not
    its first character (``NP-SBJ-1`` -> ``NP``, ``PP-LOC=2`` -> ``PP``, ``NP=3`` -> ``NP``).
    Labels that begin and end with ``-`` (``-NONE-``, ``-LRB-``, ``-RRB-``) are returned whole."""
    if len(label) > 1 and label[0] == "-" and label[-1] == "-":
        return label
    cut = [p for p in (label.find("-", 1), label.find("=", 1)) if p > 0]
    return label[: min(cut)] if cut else label


def _clean(node: Node) -> Node | None:
    if isinstance(node, Leaf):
        return None if node.tag == EMPTY_TAG else node  # tags keep their form (EVALB too)
    kids = tuple(c for c in (_clean(child) for child in node.children) if c is not None)
    return Tree(strip_function_tags(node.label), kids) if kids else None


def clean_tree(tree: Tree) -> Tree | None:
    """``tree`` cleaned as described in the module docstring, rooted in ``TOP``; ``None`` when it
    holds nothing but empty elements.

    A root labelled ``""`` (NLTK's empty root), ``TOP`` or ``ROOT`` is relabelled ``TOP``; any
    other root is kept and put under a new ``TOP``.
    """
    if tree.label in _ROOT_LABELS:
        kids = tuple(c for c in (_clean(child) for child in tree.children) if c is not None)
        return Tree(ROOT_LABEL, kids) if kids else None
    cleaned = _clean(tree)
    return None if cleaned is None else Tree(ROOT_LABEL, (cleaned,))
