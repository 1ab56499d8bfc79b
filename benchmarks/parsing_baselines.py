"""Parsing baselines on the Penn Treebank sample's test split, scored by transduce's EVALB.

Two baselines, both scored with ``transduce.evaluation.evalb`` against the cleaned gold trees
of the fixed split (``transduce.data.ptb``: train wsj_0001-0159, test wsj_0180-0199):

* right-branching: over the gold words, ``(S w1 (S w2 (S ... wn)))``, every word tagged ``XX``;
  all 245 test sentences, and the PCFG's subset.
* PCFG: a treebank grammar read off the training trees with ``nltk.induce_pcfg`` (the ``TOP``
  root kept as start symbol, unary chains below it collapsed, then Chomsky normal form with
  horizontal Markovisation of order 1); words seen once in training also count as an
  unknown-word class (a signature: ``<unk-num>``, ``<unk-cap>``, ``<unk-ing>`` ...), and test
  words unseen in training are replaced by theirs. Parsed with ``nltk.ViterbiParser``, which is
  slow (seconds per sentence of 10 words, growing with the cube of the length), so only the
  test sentences of at most ``--max-length`` words are parsed; a sentence without any parse
  gets the right-branching tree (counted as a fallback).

Prints one JSON line. Needs nltk (``pip install nltk``)::

    python benchmarks/parsing_baselines.py --data "$TRANSDUCE_DATA/ptb-sample" [--max-length 12]
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import nltk

from transduce.data.ptb import read_treebank, split_treebank
from transduce.data.trees import Leaf, Tree, parse_trees, to_brackets
from transduce.evaluation.evalb import score_corpus


def right_branching(words: Sequence[str]) -> Tree:
    """``(TOP (S w1 (S w2 ... (S wn-1 wn))))`` with every word tagged ``XX``."""
    node: Tree = Tree("S", (Leaf("XX", words[-1]),))
    if len(words) > 1:
        node = Tree("S", (Leaf("XX", words[-2]), Leaf("XX", words[-1])))
        for word in reversed(words[:-2]):
            node = Tree("S", (Leaf("XX", word), node))
    return Tree("TOP", (node,))


def signature(word: str) -> str:
    """The unknown-word class of ``word`` (a coarse shape and suffix)."""
    if any(c.isdigit() for c in word):
        return "<unk-num>"
    if "-" in word:
        return "<unk-hyph>"
    if word[:1].isupper():
        return "<unk-cap>"
    for suffix in ("ing", "ed", "ly", "s"):
        if word.lower().endswith(suffix):
            return f"<unk-{suffix}>"
    return "<unk>"


def _to_nltk(tree: Tree) -> nltk.Tree:
    # nltk's CNF marks its own nodes with '|': the few treebank labels like PRT|ADVP lose it
    text = to_brackets(tree)
    result = nltk.Tree.fromstring(text)
    for sub in result.subtrees():
        sub.set_label(sub.label().split("|")[0])
    return result


def induce_grammar(train: Sequence[Tree]) -> tuple[nltk.PCFG, Counter[str]]:
    """The PCFG of ``train`` (module docstring) and the training word counts."""
    counts = Counter(w for t in train for w in t.words())
    productions = []
    for tree in train:
        t = _to_nltk(tree)
        t.collapse_unary(collapsePOS=False, collapseRoot=False)
        t.chomsky_normal_form(horzMarkov=1)
        productions += t.productions()
        productions += [
            nltk.Production(nltk.Nonterminal(tag), [signature(w)])
            for w, tag in t.pos()
            if counts[w] == 1
        ]
    return nltk.induce_pcfg(nltk.Nonterminal("TOP"), productions), counts


def pcfg_parse(
    parser: nltk.ViterbiParser, words: Sequence[str], counts: Counter[str], known: set[str]
) -> Tree | None:
    """The Viterbi parse of ``words`` with its real words put back; None without a parse."""
    tokens = []
    for w in words:
        if counts[w] > 0:
            tokens.append(w)
        else:
            tokens.append(signature(w) if signature(w) in known else "<unk>")
    parses = list(parser.parse(tokens))
    if not parses:
        return None
    best = parses[0]
    best.un_chomsky_normal_form()
    for position, word in zip(best.treepositions("leaves"), words):
        best[position] = word
    return parse_trees(best.pformat(margin=1 << 30))[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--data",
        type=Path,
        required=True,
        help="treebank.zip, or the folder holding it, or a folder of .mrg files",
    )
    parser.add_argument(
        "--max-length",
        type=int,
        default=12,
        help="parse the test sentences of at most this many words with the PCFG",
    )
    args = parser.parse_args()
    source = args.data / "treebank.zip" if (args.data / "treebank.zip").is_file() else args.data
    splits = split_treebank(read_treebank(source))
    gold = splits["test"]
    subset = [t for t in gold if len(t.words()) <= args.max_length]

    start = time.perf_counter()
    grammar, counts = induce_grammar(splits["train"])
    known = {str(p.rhs()[0]) for p in grammar.productions() if p.is_lexical()}
    viterbi = nltk.ViterbiParser(grammar, max_time=None)  # a wall-clock limit is not repeatable
    parsed, fallbacks = [], 0
    for t in subset:
        result = pcfg_parse(viterbi, t.words(), counts, known)
        fallbacks += result is None
        parsed.append(result if result is not None else right_branching(t.words()))

    print(
        json.dumps(
            {
                "split": "test (wsj_0180-0199)",
                "sentences": len(gold),
                "right_branching": score_corpus(
                    gold, [right_branching(t.words()) for t in gold]
                ).as_dict(),
                "subset": f"test sentences of at most {args.max_length} words",
                "subset_sentences": len(subset),
                "right_branching_subset": score_corpus(
                    subset, [right_branching(t.words()) for t in subset]
                ).as_dict(),
                "pcfg_subset": score_corpus(subset, parsed).as_dict(),
                "pcfg_productions": len(grammar.productions()),
                "pcfg_fallbacks": fallbacks,
                "pcfg_seconds": round(time.perf_counter() - start, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
