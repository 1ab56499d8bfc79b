"""EVALB-style bracket scoring: hand-counted cases, and agreement with supar's span metric."""

import os
import random
from pathlib import Path

import pytest

from transduce.data.ptb import read_treebank, split_treebank
from transduce.data.trees import Leaf, Tree, parse_trees, to_brackets
from transduce.evaluation.evalb import brackets, score_corpus, score_sentence


def tree(text: str) -> Tree:
    return parse_trees(text)[0]


def data_root() -> Path:
    root = os.environ.get("TRANSDUCE_DATA")
    if not root:
        pytest.skip("TRANSDUCE_DATA is not set (folder holding ptb-sample/treebank.zip)")
    return Path(root)


MAT_GOLD = (
    "(TOP (S (NP (DT The) (NN cat)) (VP (VBD sat) (PP (IN on) (NP (DT the) (NN mat)))) (. .)))"
)
# VP closed too early: PP attached to S
MAT_TEST = (
    "(TOP (S (NP (XX The) (XX cat)) (VP (XX sat)) (PP (XX on) (NP (XX the) (XX mat))) (XX .)))"
)


def test_hand_counted_sentence():
    # words The0 cat1 sat2 on3 the4 mat5 .6; '.' (gold tag) deleted, 6 words left
    # gold: S(0,6) NP(0,2) VP(2,6) PP(3,6) NP(4,6)          = 5 brackets
    # test: S(0,6) NP(0,2) VP(2,3) PP(3,6) NP(4,6)          = 5 brackets
    # matched: S, NP(0,2), PP, NP(4,6)                      = 4
    s = score_sentence(tree(MAT_GOLD), tree(MAT_TEST))
    assert (s.gold, s.test, s.matched, s.length, s.exact) == (5, 5, 4, 7, False)
    assert brackets(tree(MAT_GOLD), {6}) == {
        ("S", 0, 6): 1,
        ("NP", 0, 2): 1,
        ("VP", 2, 6): 1,
        ("PP", 3, 6): 1,
        ("NP", 4, 6): 1,
    }
    scores = score_corpus([tree(MAT_GOLD)], [tree(MAT_TEST)])
    assert scores.precision == pytest.approx(80.0)  # 4/5
    assert scores.recall == pytest.approx(80.0)  # 4/5
    assert scores.f1 == pytest.approx(80.0)
    assert scores.exact_match == 0.0 and scores.sentences == 1


def test_punctuation_is_deleted_by_the_gold_tags():
    gold = tree("(TOP (S (NP (DT The) (NN cat)) (VP (VBD sat)) (. .)))")
    # the test tree puts '.' inside VP and tags it XX: with the gold tag it is deleted anyway
    test = tree("(TOP (S (NP (XX The) (XX cat)) (VP (XX sat) (XX .))))")
    # gold S(0,3) NP(0,2) VP(2,3); test S(0,3) NP(0,2) VP(2,3): all 3 match
    s = score_sentence(gold, test)
    assert (s.gold, s.test, s.matched, s.exact) == (3, 3, 3, True)
    # by the test tree's own tags '.' would stay, and VP(2,4) would not match VP(2,3)
    assert brackets(test, ()) != brackets(gold, {3})


def test_all_punctuation_tags_and_a_constituent_of_punctuation_only():
    gold = tree("(TOP (S (`` ``) (NP (NN a)) (PRN (, ,) (: --)) (VP (VB b)) ('' '') (. .)))")
    # every word but a and b is deleted; PRN then spans nothing and is not counted:
    # S(0,2) NP(0,1) VP(1,2) = 3 brackets
    assert brackets(gold, {0, 2, 3, 5, 6}) == {("S", 0, 2): 1, ("NP", 0, 1): 1, ("VP", 1, 2): 1}
    test = tree("(TOP (S (XX ``) (NP (XX a)) (XX ,) (XX --) (VP (XX b)) (XX '') (XX .)))")
    s = score_sentence(gold, test)
    assert (s.gold, s.test, s.matched, s.exact) == (3, 3, 3, True)
    # '?' and '!' are tagged '.' in the treebank; other tags (here $ and #) are not deleted
    money = tree("(TOP (NP ($ $) (CD 5) (# #)))")
    assert brackets(money, ()) == {("NP", 0, 3): 1}


def test_unequal_words_count_as_zero_matched():
    gold = tree("(TOP (S (NP (DT The) (NN cat)) (VP (VBD sat)) (. .)))")
    other_word = tree("(TOP (S (NP (XX The) (XX dog)) (VP (XX sat)) (XX .)))")
    # gold 3 brackets (after deleting '.'); test S(0,4) NP(0,2) VP(2,3): its own XX tags
    # delete nothing; matched 0
    s = score_sentence(gold, other_word)
    assert (s.gold, s.test, s.matched, s.words_match, s.exact) == (3, 3, 0, False, False)
    longer = tree("(TOP (S (NP (XX The) (XX cat)) (VP (XX sat) (XX down)) (XX .)))")
    s = score_sentence(gold, longer)
    assert (s.gold, s.test, s.matched, s.words_match) == (3, 3, 0, False)
    # never skipped: the sentence still counts in the corpus totals
    scores = score_corpus([gold, gold], [gold, other_word])
    assert scores.all.sentences == 2 and scores.all.word_mismatches == 1
    assert scores.recall == pytest.approx(50.0)  # 3 of 6 gold brackets
    assert scores.precision == pytest.approx(50.0)  # 3 of 6 test brackets
    assert scores.exact_match == pytest.approx(50.0)


def test_advp_and_prt_are_equivalent():
    gold = tree("(TOP (S (NP (PRP He)) (VP (VBD gave) (PRT (RP up)))))")
    # S(0,3) NP(0,1) VP(1,3) PRT(2,3) = 4; ADVP in its place matches, PP does not
    advp = tree("(TOP (S (NP (PRP He)) (VP (VBD gave) (ADVP (RP up)))))")
    pp = tree("(TOP (S (NP (PRP He)) (VP (VBD gave) (PP (RP up)))))")
    assert score_sentence(gold, advp).matched == 4
    assert score_sentence(advp, gold).matched == 4
    assert score_sentence(gold, pp).matched == 3


def test_brackets_are_a_multiset():
    gold = tree("(TOP (S (NP (NP (NN a))) (VP (VB b))))")
    test = tree("(TOP (S (NP (NN a)) (VP (VB b))))")
    # gold S(0,2) NP(0,1) NP(0,1) VP(1,2) = 4; test S NP VP = 3; matched 3 (one NP unmatched)
    s = score_sentence(gold, test)
    assert (s.gold, s.test, s.matched, s.exact) == (4, 3, 3, False)
    scores = score_corpus([gold], [test])
    assert scores.precision == pytest.approx(100.0)
    assert scores.recall == pytest.approx(75.0)
    assert scores.f1 == pytest.approx(2 * 100 * 75 / 175)
    assert score_sentence(test, gold).matched == 3
    assert score_sentence(gold, gold).matched == 4


def test_unary_chains_count_each_bracket_and_preterminals_none():
    gold = tree("(TOP (S (VP (VB Go)) (. .)))")
    test = tree("(TOP (VP (XX Go) (XX .)))")
    # gold S(0,1) VP(0,1) = 2; test VP(0,1) = 1; matched 1; the preterminals are no brackets
    s = score_sentence(gold, test)
    assert (s.gold, s.test, s.matched) == (2, 1, 1)


def test_raw_trees_are_cleaned_and_the_root_is_not_a_bracket():
    raw = tree("( (S (NP-SBJ-1 (-NONE- *)) (VP-TPC=2 (VB Go)) (. .)))")
    cleaned = tree("(ROOT (S (VP (XX Go)) (XX .)))")
    # raw: NP-SBJ holds only an empty element and goes; labels cut: S(0,1) VP(0,1) = 2
    s = score_sentence(raw, cleaned)
    assert (s.gold, s.test, s.matched, s.length, s.exact) == (2, 2, 2, 2, True)


def test_the_40_word_cutoff_counts_punctuation():
    def sentence(n_words: int, n_punct: int) -> Tree:
        leaves = [Leaf("NN", f"w{i}") for i in range(n_words - n_punct)]
        leaves += [Leaf(",", ",")] * n_punct
        return Tree("TOP", (Tree("S", tuple(leaves)),))

    forty = sentence(40, 1)  # 40 words, 39 without punctuation: in
    forty_one = sentence(41, 2)  # 41 words, 39 without punctuation: out (EVALB's r_wn1)
    flat = [Tree("TOP", t.children[0].children) for t in (forty, forty_one)]  # no brackets
    scores = score_corpus([forty, forty_one], [forty, flat[1]])
    assert scores.all.sentences == 2 and scores.le40.sentences == 1
    # all: gold S + S = 2 brackets, test 1 (the flat tree has none), matched 1: P 100, R 50
    assert scores.f1 == pytest.approx(2 * 100 * 50 / 150)
    assert scores.f1_le40 == pytest.approx(100.0)


def test_micro_average_and_empty_denominators():
    a = tree("(TOP (NP (NN a)))")
    b_gold = tree("(TOP (S (NP (NN b)) (VP (VB c) (NP (NN d)))))")  # S NP VP NP = 4
    b_test = tree("(TOP (S (NP (NN b) (VB c)) (VP (NP (NN d)))))")  # S NP(0,2) VP(2,3) NP = 4
    # matched: a's NP; b's S and NP(2,3): 3 of 5 gold, 3 of 5 test (not the 75% mean of 100/50)
    scores = score_corpus([a, b_gold], [a, b_test])
    assert scores.precision == pytest.approx(60.0) and scores.recall == pytest.approx(60.0)
    flat = score_corpus([b_gold], [tree("(TOP (NN b) (VB c) (NN d))")])
    assert (flat.precision, flat.recall, flat.f1) == (0.0, 0.0, 0.0)
    assert flat.as_dict()["f1"] == 0.0
    with pytest.raises(ValueError, match="1 gold trees but 2 test trees"):
        score_corpus([a], [a, a])


# ------------------------------------------------------------- agreement with an independent one


def _perturbed(node: Tree, rng: random.Random) -> Tree:
    """``node`` with some constituents flattened into their parent and some relabelled."""
    kids: list[Tree | Leaf] = []
    for child in node.children:
        if isinstance(child, Leaf):
            kids.append(child)
            continue
        child = _perturbed(child, rng)
        if rng.random() < 0.15:
            kids.extend(child.children)  # flatten
        elif rng.random() < 0.15:
            kids.append(Tree(rng.choice(["NP", "VP", "PP", "ADVP", "PRT", "S"]), child.children))
        else:
            kids.append(child)
    return Tree(node.label, tuple(kids))


def _right_branching(leaves: list[Leaf]) -> Tree:
    node: Tree | Leaf = leaves[-1]
    for leaf in reversed(leaves[:-1]):
        node = Tree("S", (leaf, node))
    return Tree("TOP", (node,) if isinstance(node, Tree) else (Tree("S", (node,)),))


@pytest.fixture(scope="module")
def test_split() -> list[Tree]:
    return split_treebank(read_treebank(data_root() / "ptb-sample" / "treebank.zip"))["test"]


def test_agrees_with_supar_on_the_sample(test_split):
    pytest.importorskip("supar", reason="supar is not installed (optional cross-check)")
    nltk = pytest.importorskip("nltk")
    from supar.utils.metric import SpanMetric
    from supar.utils.transform import Tree as SuparTree

    delete = {"TOP", "-NONE-", ",", ":", "``", "''", "."}  # COLLINS.prm's DELETE_LABEL
    rng = random.Random(0)
    # test trees keep the gold tags, so deleting by their own tags (supar) = by the gold tags
    systems = {
        "gold": test_split,
        "perturbed": [_perturbed(t, rng) for t in test_split],
        "right-branching": [_right_branching(t.leaves()) for t in test_split],
    }
    for name, predicted in systems.items():
        ours = score_corpus(test_split, predicted)

        def spans(trees: list[Tree]) -> list[list[tuple[int, int, str]]]:
            return [
                SuparTree.factorize(nltk.Tree.fromstring(to_brackets(t)), delete, {"ADVP": "PRT"})
                for t in trees
            ]

        metric = SpanMetric()(spans(predicted), spans(test_split))
        assert ours.precision == pytest.approx(100 * metric.lp, abs=1e-6), name
        assert ours.recall == pytest.approx(100 * metric.lr, abs=1e-6), name
        assert ours.f1 == pytest.approx(100 * metric.lf, abs=1e-6), name
        assert ours.exact_match == pytest.approx(100 * metric.lcm, abs=1e-6), name
