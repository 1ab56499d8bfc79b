"""Trees: reading, writing, cleaning, linearising and delinearising (with repairs)."""

import os
import zipfile
from pathlib import Path

import pytest

from transduce.data.linearise import (
    WORD_SLOT,
    delinearise,
    fill_slots,
    linearise,
    slots_to_placeholders,
)
from transduce.data.trees import (
    Leaf,
    Tree,
    clean_tree,
    parse_trees,
    read_tree_file,
    strip_function_tags,
    to_brackets,
)
from transduce.errors import UserError

CAT = "(TOP (S (NP (XX The) (XX cat)) (VP (XX sat)) (XX .)))"
RAW = """
( (S
    (NP-SBJ-1 (DT The) (NN cat) )
    (VP (VBD sat)
      (NP (-NONE- *-1) ))
    (. .) ))
( (NP (NN dog) ))
"""


def data_root() -> Path:
    root = os.environ.get("TRANSDUCE_DATA")
    if not root:
        pytest.skip("TRANSDUCE_DATA is not set (folder holding ptb-sample/treebank.zip)")
    return Path(root)


@pytest.fixture(scope="module")
def sample_texts() -> dict[str, str]:
    with zipfile.ZipFile(data_root() / "ptb-sample" / "treebank.zip") as z:
        names = sorted(n for n in z.namelist() if n.endswith(".mrg"))
        return {n: z.read(n).decode("utf-8") for n in names}


@pytest.fixture(scope="module")
def sample_trees(sample_texts) -> list[Tree]:
    return [t for n, text in sample_texts.items() for t in parse_trees(text, name=n, clean=True)]


def test_cleaning_while_reading_equals_clean_tree(sample_texts):
    for name in list(sample_texts)[::10]:  # every 10th file: 20 files, ~400 trees
        raw = parse_trees(sample_texts[name])
        assert parse_trees(sample_texts[name], clean=True) == [clean_tree(t) for t in raw]


def test_parse_nltk_root_and_several_trees():
    trees = parse_trees(RAW)
    assert len(trees) == 2
    first = trees[0]
    assert first.label == ""
    assert first.words() == ["The", "cat", "sat", "*-1", "."]
    assert first.tags() == ["DT", "NN", "VBD", "-NONE-", "."]
    assert first.children[0].children[0] == Tree("NP-SBJ-1", (Leaf("DT", "The"), Leaf("NN", "cat")))
    assert trees[1] == Tree("", (Tree("NP", (Leaf("NN", "dog"),)),))


def test_lone_preterminal_is_a_tree_without_root():
    assert parse_trees("(NN dog)") == [Tree("", (Leaf("NN", "dog"),))]
    assert to_brackets(clean_tree(parse_trees("(NN dog)")[0])) == "(TOP (NN dog))"


@pytest.mark.parametrize(
    "text, line, fragment",
    [
        ("(S (NP (DT a))\n\n", 1, "never closed"),
        ("(S (NP (DT a)))\n)", 2, "closes no open bracket"),
        ("\n(S ()\n)", 2, "empty brackets"),
        ("(S\n (NN a b))", 2, "exactly one word"),
        ("(S\n (NN a", 2, "the end of the text"),
        ("(S (NP (DT a))\n word)", 2, "directly inside (S"),
        ("(S (DT a))\nstray", 2, "outside any bracket"),
        ("(S\n (NP ))", 2, "(NP has no children"),
        ("(S (DT a))\n(", 2, "at the end of the text"),
    ],
)
def test_malformed_brackets_name_file_and_line(text, line, fragment):
    with pytest.raises(UserError) as e:
        parse_trees(text, name="x.mrg")
    msg = str(e.value)
    assert msg.startswith(f"x.mrg: line {line}: "), msg
    assert fragment in msg
    assert "\n" not in msg


@pytest.mark.parametrize(
    "label, stripped",
    [
        ("NP-SBJ-1", "NP"),
        ("PP-LOC=2", "PP"),
        ("NP=3", "NP"),
        ("S-TPC-2", "S"),
        ("NP", "NP"),
        ("PRP$", "PRP$"),
        ("-NONE-", "-NONE-"),
        ("-LRB-", "-LRB-"),
        ("-RRB-", "-RRB-"),
        ("", ""),
    ],
)
def test_strip_function_tags(label, stripped):
    assert strip_function_tags(label) == stripped


def test_clean_removes_empty_elements_and_emptied_constituents():
    text = (
        "( (S (NP-SBJ (-NONE- *-1)) (VP (VBD reported) (SBAR (-NONE- 0) "
        "(S (-NONE- *T*-1)))) (. .)))"
    )
    # SBAR holds only empty elements (directly and through S): both go, and NP-SBJ too
    assert to_brackets(clean_tree(parse_trees(text)[0])) == "(TOP (S (VP (VBD reported)) (. .)))"


def test_clean_root_forms():
    for root in ("", "TOP", "ROOT"):
        tree = parse_trees(f"({root} (S-1 (NN a)))")[0]
        assert to_brackets(clean_tree(tree)) == "(TOP (S (NN a)))"
    # a root of another label is kept under a new TOP
    assert to_brackets(clean_tree(parse_trees("(S (NN a))")[0])) == "(TOP (S (NN a)))"
    assert clean_tree(parse_trees("( (S (-NONE- *)))")[0]) is None
    assert clean_tree(parse_trees("(X (-NONE- *))")[0]) is None


def test_parse_clean_names_the_line_of_an_all_empty_tree():
    with pytest.raises(UserError, match=r"^x: line 3: tree has no words"):
        parse_trees("( (S (NN a)))\n\n( (S (-NONE- *)))", name="x", clean=True)


def test_write_one_line_with_preterminals():
    tree = parse_trees("( (S (NP (XX The)\n (XX cat)) (VP (XX sat)) (XX .)) )", clean=True)[0]
    assert to_brackets(tree) == CAT
    assert str(tree) == CAT
    assert parse_trees(CAT) == [tree]


@pytest.mark.parametrize("word", ["(", "a b", ")x", ""])
def test_unwritable_word_is_a_user_error(word):
    tree = Tree("TOP", (Leaf("NN", word),))
    with pytest.raises(UserError, match="cannot be written"):
        to_brackets(tree)


def test_tree_checks_its_children():
    with pytest.raises(ValueError, match="no children"):
        Tree("NP", ())
    with pytest.raises(TypeError, match="tuple"):
        Tree("NP", [Leaf("NN", "a")])  # type: ignore[arg-type]


def test_read_tree_file(tmp_path):
    path = tmp_path / "out.trees"
    path.write_text(CAT + "\n" + CAT + "\n", encoding="utf-8")
    assert len(read_tree_file(path)) == 2
    path.write_text(CAT + "\n(S (NP (XX a)\n", encoding="utf-8")
    with pytest.raises(UserError, match=rf"^{path}: line 2: "):
        read_tree_file(path)
    path.write_bytes(CAT.encode() + b"\n\xff\n")
    with pytest.raises(UserError, match=rf"^{path}: line 2: invalid UTF-8"):
        read_tree_file(path)
    with pytest.raises(UserError, match="cannot read"):
        read_tree_file(tmp_path / "missing.trees")
    path.write_bytes("\ufeff".encode() + (CAT + "\n").encode())  # a byte order mark
    assert [str(t) for t in read_tree_file(path)] == [str(t) for t in parse_trees(CAT)]


def test_linearise_placeholder_and_tags():
    tree = parse_trees("(TOP (S (NP (DT The) (NN cat)) (VP (VBD sat)) (. .)))")[0]
    assert " ".join(linearise(tree)) == "(S (NP XX XX )NP (VP XX )VP XX )S"
    assert " ".join(linearise(tree, tags=True)) == "(S (NP DT NN )NP (VP VBD )VP . )S"
    # Vinyals et al. (2014), Figure 2
    john = parse_trees("(TOP (S (NP (NNP John)) (VP (VBZ has) (NP (DT a) (NN dog))) (. .)))")[0]
    assert " ".join(linearise(john, tags=True)) == "(S (NP NNP )NP (VP VBZ (NP DT NN )NP )VP . )S"
    # a root that is not TOP is linearised with the rest
    assert linearise(Tree("S", (Leaf("NN", "a"),))) == ["(S", "XX", ")S"]


def _placeholder(tree: Tree) -> Tree:
    """``tree`` with every tag replaced by XX."""
    kids = tuple(
        Leaf(WORD_SLOT, c.word) if isinstance(c, Leaf) else _placeholder(c) for c in tree.children
    )
    return Tree(tree.label, kids)


def test_round_trip_on_every_sample_tree(sample_trees):
    assert len(sample_trees) == 3914
    for tree in sample_trees:
        words = tree.words()
        assert delinearise(linearise(tree, tags=True), words, tags=True) == (tree, 0)
        assert delinearise(linearise(tree), words) == (_placeholder(tree), 0)


W3 = ["a", "b", "c"]


@pytest.mark.parametrize(
    "tokens, expected, repairs",
    [
        # well-formed: no repair
        ("(S (NP XX XX )NP XX )S", "(TOP (S (NP (XX a) (XX b)) (XX c)))", 0),
        # rule 1: a close bracket with the wrong label closes the innermost (NP keeps its label)
        ("(S (NP XX XX )VP XX )S", "(TOP (S (NP (XX a) (XX b)) (XX c)))", 1),
        # rule 2: a stray close bracket is dropped
        ("(S XX XX XX )S )S", "(TOP (S (XX a) (XX b) (XX c)))", 1),
        # rule 3: an empty constituent is dropped
        ("(S (NP )NP XX XX XX )S", "(TOP (S (XX a) (XX b) (XX c)))", 1),
        # rule 4: a slot beyond the last word is dropped
        ("(S XX XX XX XX )S", "(TOP (S (XX a) (XX b) (XX c)))", 1),
        # rule 5: unknown tokens are dropped
        ("(S XX <unk> XX ( XX )S", "(TOP (S (XX a) (XX b) (XX c)))", 2),
        # rule 6: a second constituent, a word outside every bracket
        ("(S XX )S (S XX )S XX", "(TOP (S (XX a)) (S (XX b)) (XX c))", 2),
        # rule 7: unclosed constituents are closed at the end (two missing close brackets)
        ("(S (NP XX XX XX", "(TOP (S (NP (XX a) (XX b) (XX c))))", 2),
        # rule 7 + 3: an unclosed empty constituent is closed and dropped
        ("(S XX XX XX (NP", "(TOP (S (XX a) (XX b) (XX c)))", 3),
        # rule 8: missing words go to the end of the last top-level constituent
        ("(S (NP XX )NP )S", "(TOP (S (NP (XX a)) (XX b) (XX c)))", 2),
        # rule 8 on empty output: TOP over the bare words
        ("", "(TOP (XX a) (XX b) (XX c))", 3),
        (")S )S", "(TOP (XX a) (XX b) (XX c))", 5),
    ],
)
def test_repairs(tokens, expected, repairs):
    tree, n = delinearise(tokens.split(), W3)
    assert (to_brackets(tree), n) == (expected, repairs)
    assert tree.words() == W3  # the words always come back, in order


def test_repairs_with_tags():
    tree, n = delinearise("(S DT NN VBD )S".split(), W3, tags=True)
    assert (to_brackets(tree), n) == ("(TOP (S (DT a) (NN b) (VBD c)))", 0)
    tree, n = delinearise("(S DT )S".split(), W3, tags=True)
    assert (to_brackets(tree), n) == ("(TOP (S (DT a) (XX b) (XX c)))", 2)


def test_delinearise_needs_words():
    with pytest.raises(UserError, match="empty sentence"):
        delinearise(["(S", ")S"], [])


def test_slots_filled_with_pieces_and_read_back(sample_trees):
    tree = parse_trees("(TOP (S (NP (DT The) (NN cat)) (VP (VBD sat)) (. .)))")[0]
    filled = fill_slots(linearise(tree), ["▁The", "▁c", "▁sat", "▁."])
    assert " ".join(filled) == "(S (NP ▁The ▁c )NP (VP ▁sat )VP ▁. )S"
    assert slots_to_placeholders(filled) == linearise(tree)
    with pytest.raises(ValueError, match="4 word slots but 3 fillers"):
        fill_slots(linearise(tree), ["▁The", "▁c", "▁sat"])
    for tree in sample_trees[:500]:  # any token as a slot: the tree comes back
        words = tree.words()
        pieces = fill_slots(linearise(tree), ["▁" + w for w in words])
        assert delinearise(slots_to_placeholders(pieces), words) == (_placeholder(tree), 0)
