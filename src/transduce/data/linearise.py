"""Trees as token sequences, after Vinyals et al. (2014), "Grammar as a Foreign Language".

``linearise`` writes a tree depth-first with labelled open and close brackets and one token per
word, the part-of-speech tag replaced by the placeholder ``XX`` (``tags=True`` keeps the tags
as the tokens instead)::

    (TOP (S (NP (DT The) (NN cat)) (VP (VBD sat)) (. .)))
    ->  (S (NP XX XX )NP (VP XX )VP XX )S

The ``TOP`` root is left out, as in Vinyals et al. (their Figure 2 linearises
``John has a dog .`` as ``(S (NP NNP )NP (VP VBZ (NP DT NN )NP )VP . )S``, before the tags
become ``XX``): every tree has it, so it carries no information and would cost two tokens per
sentence; ``delinearise`` puts it back. Each tree of the Penn Treebank sample has exactly one
constituent under its root, so a well-formed linearisation is one bracketed constituent.

``delinearise`` turns output tokens and the input words back into a tree, repairing malformed
output deterministically (each repair is counted once; the rules are in its docstring).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from transduce.data.trees import ROOT_LABEL, Leaf, Node, Tree
from transduce.errors import UserError

__all__ = [
    "WORD_SLOT",
    "delinearise",
    "fill_slots",
    "is_close",
    "is_open",
    "linearise",
    "slots_to_placeholders",
]

WORD_SLOT = "XX"


def is_open(token: str) -> bool:
    """Whether ``token`` is an open bracket ``(LABEL`` (a non-empty label after ``(``)."""
    return len(token) > 1 and token[0] == "("


def is_close(token: str) -> bool:
    """Whether ``token`` is a close bracket ``)LABEL`` (a non-empty label after ``)``)."""
    return len(token) > 1 and token[0] == ")"


def linearise(tree: Tree, *, tags: bool = False) -> list[str]:
    """The tokens of ``tree`` without its ``TOP`` root (a root with another label is kept).

    Takes a (cleaned) tree; returns open brackets ``(L``, close brackets ``)L`` and per word
    ``XX`` (or, with ``tags``, the word's tag), depth-first, left to right.
    """
    roots: tuple[Node, ...] = tree.children if tree.label == ROOT_LABEL else (tree,)
    out: list[str] = []
    # explicit stack of (node, closing?): no recursion limit on deep trees
    stack: list[tuple[Node, bool]] = [(node, False) for node in reversed(roots)]
    while stack:
        node, closing = stack.pop()
        if isinstance(node, Leaf):
            out.append(node.tag if tags else WORD_SLOT)
        elif closing:
            out.append(")" + node.label)
        else:
            out.append("(" + node.label)
            stack.append((node, True))
            stack.extend((child, False) for child in reversed(node.children))
    return out


def fill_slots(tokens: Sequence[str], fillers: Sequence[str]) -> list[str]:
    """``tokens`` (a linearisation with ``XX`` slots) with the i-th slot replaced by
    ``fillers[i]``; there must be one filler per slot (``ValueError`` otherwise)."""
    n_slots = sum(t == WORD_SLOT for t in tokens)
    if n_slots != len(fillers):
        raise ValueError(f"{n_slots} word slots but {len(fillers)} fillers")
    it = iter(fillers)
    return [next(it) if t == WORD_SLOT else t for t in tokens]


def slots_to_placeholders(tokens: Sequence[str]) -> list[str]:
    """Every token that is not a bracket read as a word slot ``XX`` (output whose slots are
    words' pieces, ``fill_slots``' inverse for ``delinearise``)."""
    return [t if is_open(t) or is_close(t) else WORD_SLOT for t in tokens]


@dataclass
class _Building:
    """A constituent under construction (mutable until ``freeze``)."""

    label: str
    children: list[_Building | Leaf] = field(default_factory=list)

    def freeze(self) -> Tree:
        return Tree(
            self.label,
            tuple(c if isinstance(c, Leaf) else c.freeze() for c in self.children),
        )


@dataclass
class _Reader:
    """The state of ``delinearise`` while it reads tokens."""

    words: Sequence[str]
    tags: bool
    top: list[_Building | Leaf] = field(default_factory=list)
    stack: list[_Building] = field(default_factory=list)
    used: int = 0
    repairs: int = 0

    def attach(self, node: _Building | Leaf) -> None:
        if self.stack:
            self.stack[-1].children.append(node)
            return
        if self.top or isinstance(node, Leaf):
            self.repairs += 1  # a second top-level item, or a word outside every bracket
        self.top.append(node)

    def close(self, label: str | None) -> None:
        """Close the innermost constituent; ``label`` is the close token's (None at the end)."""
        done = self.stack.pop()
        if label is not None and label != done.label:
            self.repairs += 1  # wrong label: it closes the innermost one, which keeps its own
        if not done.children:
            self.repairs += 1  # an empty constituent is dropped
            return
        self.attach(done)

    def read(self, token: str) -> None:
        if is_open(token):
            self.stack.append(_Building(token[1:]))
        elif is_close(token):
            if self.stack:
                self.close(token[1:])
            else:
                self.repairs += 1  # a close bracket with nothing open is dropped
        elif token == WORD_SLOT or (self.tags and token not in ("(", ")")):
            if self.used < len(self.words):
                self.attach(Leaf(token, self.words[self.used]))
                self.used += 1
            else:
                self.repairs += 1  # a word slot beyond the last word is dropped
        else:
            self.repairs += 1  # any other token (a bare bracket, an unknown symbol) is dropped


def delinearise(
    tokens: Sequence[str], words: Sequence[str], *, tags: bool = False
) -> tuple[Tree, int]:
    """The tree that ``tokens`` describe over ``words``, and how many repairs it took.

    Word slots take the words in order. A slot is ``XX`` (its leaf is tagged ``XX``) or, with
    ``tags``, any token that is not a bracket (its leaf is tagged with that token). The result
    is rooted in ``TOP``. Well-formed tokens (one constituent, balanced and matching brackets, no
    empty constituent, one slot per word) take 0 repairs; otherwise these rules apply, each
    counting one repair per application:

    1. a close bracket closes the innermost open constituent, whose label stays that of its open
       bracket, even when the labels differ (a mismatch is a repair);
    2. a close bracket with nothing open is dropped;
    3. a constituent closed with no children is dropped;
    4. a word slot after the last word is dropped;
    5. a token that is neither a bracket nor a word slot is dropped;
    6. a second constituent at the top, or a word slot outside every bracket, is kept as a
       further child of ``TOP``;
    7. at the end, constituents still open are closed, innermost first (and dropped by rule 3
       when empty);
    8. words that no slot took are appended, in order, tagged ``XX``, as the last children of
       the last top-level constituent (of ``TOP`` when there is none). Empty output thus gives
       ``TOP`` over the bare words, with one repair per word.

    ``words`` must not be empty (``UserError``: there is no tree over no words).
    """
    if not words:
        raise UserError("cannot build a tree over an empty sentence")
    reader = _Reader(words, tags)
    for token in tokens:
        reader.read(token)
    while reader.stack:
        reader.repairs += 1  # rule 7: a missing close bracket
        reader.close(None)
    missing = [Leaf(WORD_SLOT, w) for w in words[reader.used :]]
    reader.repairs += len(missing)
    last = reader.top[-1] if reader.top else None
    (last.children if isinstance(last, _Building) else reader.top).extend(missing)
    children = tuple(c if isinstance(c, Leaf) else c.freeze() for c in reader.top)
    return Tree(ROOT_LABEL, children), reader.repairs
