"""Labelled bracketing scores of constituency parses, with EVALB's standard conventions
(Sekine & Collins, ``COLLINS.prm``).

Rules, in the order they apply to each (gold, test) pair of trees:

1. Both trees are cleaned (``transduce.data.trees.clean_tree``): function tags and indices
   stripped from constituent labels (EVALB's ``modify_label`` cuts a label at its first ``-``
   or ``=``), empty elements (``-NONE-``) removed with the constituents they leave empty.
2. The words of the two trees are compared. If they differ (in number or in any word), the
   sentence counts as **zero matched brackets**: all its gold brackets are missed and all its
   test brackets are wrong (test punctuation deleted by the test tree's own tags, the only ones
   that fit its words), and it is not an exact match. EVALB itself leaves such sentences out
   of its totals (as errors or skips); leaving nothing out keeps a parser from gaining by
   garbling the words.
3. Punctuation is deleted: the words whose **gold** tag is one of ``,  :  ``  ''  .``
   (``COLLINS.prm``'s ``DELETE_LABEL`` for preterminals) are removed from both trees before
   brackets are counted. Using the gold tree's tags for the test tree too is what the later
   EVALB releases do when two trees tag a quote differently (``fix_quote``), and what output
   with placeholder tags (``XX``) needs: its own tags would delete nothing.
4. Brackets: every constituent above the preterminals gives one (label, start, end), start and
   end counted over the words left after step 3. Preterminals are not brackets. Unary chains
   give one bracket per constituent, so ``(S (VP ...))`` over the same words counts twice, and
   brackets are a multiset: a duplicate matches only a duplicate. Brackets that span no word
   after step 3 (a constituent holding only punctuation) are not counted, nor are brackets
   labelled ``TOP`` or ``ROOT`` (``DELETE_LABEL TOP``: the root).
5. ``ADVP`` and ``PRT`` are the same label (``EQ_LABEL ADVP PRT``).
6. Matched brackets are the multiset intersection of the gold and test brackets.
7. Totals are summed over the corpus before dividing (micro average): precision = matched /
   test brackets, recall = matched / gold brackets, F1 their harmonic mean, all in percent as
   EVALB prints them (0 when a denominator is 0). Exact match: the percentage of sentences
   whose gold and test brackets are equal as multisets (EVALB's "complete match").
8. The cut-off subset (``CUTOFF_LEN 40``) holds the sentences of at most 40 gold words, counted
   **with** punctuation: EVALB's length leaves out only ``DELETE_LABEL_FOR_LENGTH`` labels,
   which ``COLLINS.prm`` sets to ``-NONE-`` alone.

EVALB's tagging accuracy and crossing brackets are not computed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from transduce.data.trees import Leaf, Tree, clean_tree

__all__ = [
    "CUTOFF_LEN",
    "PUNCTUATION_TAGS",
    "BracketCounts",
    "EvalbScores",
    "SentenceCounts",
    "brackets",
    "score_corpus",
    "score_sentence",
]

PUNCTUATION_TAGS = frozenset({",", ":", "``", "''", "."})
DELETED_BRACKET_LABELS = frozenset({"TOP", "ROOT"})
EQUIVALENT_LABELS = {"PRT": "ADVP"}
CUTOFF_LEN = 40

Bracket = tuple[str, int, int]


@dataclass(frozen=True)
class SentenceCounts:
    """One sentence: gold, test and matched brackets, its gold length (words, punctuation
    included), whether the words agreed and whether the brackets matched exactly."""

    gold: int
    test: int
    matched: int
    length: int
    words_match: bool
    exact: bool


@dataclass(frozen=True)
class BracketCounts:
    """Summed counts over a set of sentences, with the scores they give (percentages)."""

    sentences: int = 0
    gold: int = 0
    test: int = 0
    matched: int = 0
    exact: int = 0
    word_mismatches: int = 0

    def add(self, s: SentenceCounts) -> BracketCounts:
        """These counts with sentence ``s`` added."""
        return BracketCounts(
            self.sentences + 1,
            self.gold + s.gold,
            self.test + s.test,
            self.matched + s.matched,
            self.exact + s.exact,
            self.word_mismatches + (not s.words_match),
        )

    @property
    def precision(self) -> float:
        return 100.0 * self.matched / self.test if self.test else 0.0

    @property
    def recall(self) -> float:
        return 100.0 * self.matched / self.gold if self.gold else 0.0

    @property
    def f1(self) -> float:
        p, r = self.precision, self.recall
        return 2 * p * r / (p + r) if p + r else 0.0

    @property
    def exact_match(self) -> float:
        return 100.0 * self.exact / self.sentences if self.sentences else 0.0


@dataclass(frozen=True)
class EvalbScores:
    """Scores of a corpus: ``all`` sentences and those of at most ``CUTOFF_LEN`` words."""

    all: BracketCounts
    le40: BracketCounts

    @property
    def precision(self) -> float:
        return self.all.precision

    @property
    def recall(self) -> float:
        return self.all.recall

    @property
    def f1(self) -> float:
        return self.all.f1

    @property
    def exact_match(self) -> float:
        return self.all.exact_match

    @property
    def sentences(self) -> int:
        return self.all.sentences

    @property
    def f1_le40(self) -> float:
        return self.le40.f1

    def as_dict(self) -> dict[str, float | int]:
        """The headline figures, rounded to 2 decimals, for JSON."""
        out: dict[str, float | int] = {}
        for prefix, c in (("", self.all), ("le40_", self.le40)):
            out |= {
                f"{prefix}sentences": c.sentences,
                f"{prefix}precision": round(c.precision, 2),
                f"{prefix}recall": round(c.recall, 2),
                f"{prefix}f1": round(c.f1, 2),
                f"{prefix}exact_match": round(c.exact_match, 2),
            }
        out["word_mismatches"] = self.all.word_mismatches
        return out


def brackets(tree: Tree, deleted: Collection[int] = ()) -> Counter[Bracket]:
    """The brackets of a cleaned ``tree`` as a multiset of (label, start, end), after deleting
    the words at the positions in ``deleted`` (0-based, over all the tree's words): rules 4-5
    of the module docstring."""
    out: Counter[Bracket] = Counter()
    # explicit stack of (node, start position, closing?): (start, kept-word count) bookkeeping
    position = 0  # index over all words
    kept = 0  # index over words not deleted
    stack: list[tuple[Tree | Leaf, int, bool]] = [(tree, 0, False)]
    while stack:
        node, start, closing = stack.pop()
        if isinstance(node, Leaf):
            kept += position not in deleted
            position += 1
        elif closing:
            label = EQUIVALENT_LABELS.get(node.label, node.label)
            if kept > start and label not in DELETED_BRACKET_LABELS:
                out[(label, start, kept)] += 1
        else:
            stack.append((node, kept, True))
            stack.extend((child, 0, False) for child in reversed(node.children))
    return out


def score_sentence(gold: Tree, test: Tree) -> SentenceCounts:
    """The counts of one sentence (rules 1-6); trees may be raw or cleaned.

    A gold tree with no words besides empty elements counts as nothing (0 brackets, length 0);
    a test tree with none counts as having other words than the gold unless the gold has none.
    """
    g, t = clean_tree(gold), clean_tree(test)
    g_words = g.words() if g is not None else []
    t_words = t.words() if t is not None else []
    if g_words != t_words or g is None or t is None:
        g_br = brackets(g, _punctuation(g.tags())) if g is not None else Counter()
        t_br = brackets(t, _punctuation(t.tags())) if t is not None else Counter()
        same = g_words == t_words  # only when both are empty
        return SentenceCounts(g_br.total(), t_br.total(), 0, len(g_words), same, same)
    deleted = _punctuation(g.tags())
    g_br, t_br = brackets(g, deleted), brackets(t, deleted)
    matched = (g_br & t_br).total()
    return SentenceCounts(g_br.total(), t_br.total(), matched, len(g_words), True, g_br == t_br)


def _punctuation(tags: Sequence[str]) -> frozenset[int]:
    return frozenset(i for i, tag in enumerate(tags) if tag in PUNCTUATION_TAGS)


def score_corpus(gold: Sequence[Tree], test: Sequence[Tree]) -> EvalbScores:
    """Scores of ``test`` against ``gold``, tree by tree (rules 1-8). ``ValueError`` when the
    two have different numbers of trees."""
    if len(gold) != len(test):
        raise ValueError(f"{len(gold)} gold trees but {len(test)} test trees")
    total, le40 = BracketCounts(), BracketCounts()
    for g, t in zip(gold, test):
        s = score_sentence(g, t)
        total = total.add(s)
        if s.length <= CUTOFF_LEN:
            le40 = le40.add(s)
    return EvalbScores(total, le40)
