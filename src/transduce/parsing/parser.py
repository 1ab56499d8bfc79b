"""Words in, trees out: ``Parser``, the Python API behind ``transduce parse``, and the evaluation of
a parsing model with EVALB (``transduce evaluate`` of a parsing model; section 6.3).

A parsing checkpoint (``task.name: parsing``) holds a source vocabulary of word pieces and a
target vocabulary of bracket tokens. Parsing a sentence decodes its linearised tree (by default
with the checkpoint's ``decode`` section; ``configs/ptb_parsing.yaml`` sets the paper's beam 21,
alpha 0.3 and input + 300 tokens; ``constrained`` lets the search emit only what can still
become a well-formed tree with the input's number of words),
then ``delinearise`` puts the words back in order and repairs malformed output, counting repairs.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from transduce.architectures import Seq2Seq
from transduce.checkpoint import load_model
from transduce.config import Config, DecodeConfig, ParsingTaskConfig
from transduce.data.linearise import WORD_SLOT, delinearise, linearise, slots_to_placeholders
from transduce.data.parallel import read_lines
from transduce.data.trees import Tree, check_words, read_tree_file
from transduce.data.vocab import EOS, SPECIALS, UNK, Vocab, VocabPair
from transduce.device import resolve_device
from transduce.errors import SentenceError, UserError
from transduce.evaluation.evalb import score_corpus
from transduce.inference.scoring import PairScore
from transduce.inference.translator import Translator
from transduce.parsing.constrained import ConstrainedTrees
from transduce.parsing.targets import parsing_targets
from transduce.parsing.tree_constraint import TreeConstraint


def word_units(vocab: VocabPair) -> tuple[torch.Tensor, torch.Tensor]:
    """For ``position_unit: word``: (V_src,) bool, the source ids that begin a word (SentencePiece
    starts each with "▁"; the end of sentence counts as one more word, where the tree closes), and
    (V_tgt,) bool, the target ids that are word slots (neither a bracket nor a special token),
    which are also the word tokens of the tree constraint."""
    to_src = getattr(vocab.source, "id_to_piece")
    to_tgt = getattr(vocab.target, "id_to_piece")
    starts = [to_src(i).startswith("▁") or i == EOS for i in range(len(vocab.source))]
    slots = [i >= len(SPECIALS) and to_tgt(i)[0] not in "()" for i in range(len(vocab.target))]
    return torch.tensor(starts), torch.tensor(slots)


@dataclass(frozen=True)
class Parse:
    """One sentence's tree (``TOP`` root, a preterminal around every word), the repairs its
    decoded tokens needed (0: well-formed as decoded) and those tokens."""

    tree: Tree
    repairs: int
    tokens: str


class Parser:
    """A trained parsing model with its vocabularies and the task's settings."""

    def __init__(self, model: Seq2Seq, vocab: Vocab, cfg: Config) -> None:
        if not isinstance(cfg.task, ParsingTaskConfig) or not isinstance(vocab, VocabPair):
            raise UserError(f"not a parsing model (task.name is {cfg.task.name!r})")
        self.model, self.vocab, self.cfg, self.task = model, vocab, cfg, cfg.task
        self.translator = Translator(model, vocab, cfg)

    @classmethod
    def load(cls, path: str | Path, device: str | torch.device = "cpu") -> Parser:
        model, vocab, cfg = load_model(path, device=resolve_device(device))
        return cls(model, vocab, cfg)

    def _constrained(self, max_len_offset: int) -> Translator:
        """A Translator whose searches run under the tree constraint."""
        assert isinstance(self.vocab, VocabPair)
        target = self.vocab.target
        tokens = [getattr(target, "id_to_piece")(i) for i in range(len(target))]
        words = {tokens[i] for i in word_units(self.vocab)[1].nonzero().flatten().tolist()}
        constraint = TreeConstraint(tokens, eos=SPECIALS[2], word_tokens=words or {WORD_SLOT})

        # around the plain Translator's engine: one snapshot of the weights, not two
        wrapped = ConstrainedTrees(
            self.translator.decoding, constraint, self._word_starts, max_len_offset
        )
        return Translator(self.model, self.vocab, self.cfg, decoding=wrapped)

    def _word_starts(self, ids: list[int]) -> int:
        """The words among source pieces ``ids``: SentencePiece starts every word with "▁"."""
        to_piece = getattr(getattr(self.vocab, "source"), "id_to_piece")
        return sum(to_piece(i).startswith("▁") for i in ids)

    def _check_counted(self, sentences: list[list[str]]) -> None:
        """A SentenceError naming the first word that the tree constraint would not count as
        one word (it has no piece of its own, or holds "▁", which starts another)."""
        encode = getattr(self.vocab, "source").encode
        for i, words in enumerate(sentences):
            for word in words:
                if self._word_starts(encode(word)) != 1:
                    raise SentenceError(
                        i + 1,
                        f": word {word!r} is not one word to the model's subword vocabulary "
                        "(it makes no piece, or holds '▁'); the tree constraint counts words",
                    )

    def score(
        self,
        sentences: Sequence[Sequence[str]],
        trees: Sequence[Tree],
        decode: DecodeConfig | None = None,
    ) -> list[PairScore]:
        """Forced decoding: for each sentence (a list of words) the log-probability the model
        gives its tree (``Translator.score`` of the tree's target text, ``parsing.targets``). A
        UserError naming the first tree with another number of words than its sentence or a
        label the model never saw."""
        sentences = _word_lists(sentences)
        texts = self.target_texts(sentences, trees)
        return self.translator.score([" ".join(w) for w in sentences], texts, decode)

    def target_texts(self, sentences: Sequence[Sequence[str]], trees: Sequence[Tree]) -> list[str]:
        """Each sentence's tree as the model's target text (linearised as it was trained, what
        ``score`` scores and attention maps draw); the UserErrors of ``score``."""
        sentences = _word_lists(sentences)
        _check_scorable(self, sentences, trees)
        return parsing_targets(trees, sentences, self.task, getattr(self.vocab, "source"))

    def parse(
        self,
        sentences: Sequence[Sequence[str]],
        decode: DecodeConfig | None = None,
        *,
        constrained: bool | None = None,
        show_progress: bool | None = False,
    ) -> list[Parse]:
        """One ``Parse`` per sentence (a list of words), decoded with ``decode`` (default: the
        checkpoint's ``decode`` section; ``self.translator.decode_config`` replaces some), under
        the tree constraint when ``constrained`` (default: the task's). An empty sentence has no
        tree: a UserError naming it, before any decoding (``transduce parse`` keeps blank lines
        apart and writes them back blank)."""
        sentences = _word_lists(sentences)
        empty = next((i for i, words in enumerate(sentences) if not words), None)
        if empty is not None:
            raise SentenceError(empty + 1, " is empty: a tree needs at least one word")
        if decode is not None and not isinstance(decode, DecodeConfig):
            raise TypeError(f"decode must be a DecodeConfig, not {type(decode).__name__}")
        if constrained is not None and not isinstance(constrained, bool):
            raise TypeError(f"constrained must be True, False or None; got {constrained!r}")
        cfg = self.cfg.decode if decode is None else decode
        use = self.task.constrained if constrained is None else constrained
        if use:
            self._check_counted(sentences)
        translator = self._constrained(cfg.max_len_offset) if use else self.translator
        texts = [" ".join(words) for words in sentences]
        decoded = translator.translate(texts, cfg, show_progress=show_progress)
        out = []
        for words, tokens in zip(sentences, decoded, strict=True):
            read = tokens.split()
            if self.task.slot_pieces:  # a word's first piece in each slot: a slot as any other
                read = slots_to_placeholders(read)
            tree, repairs = delinearise(read, list(words), tags=self.task.keep_tags)
            out.append(Parse(tree, repairs, tokens))
        return out


def _word_lists(sentences: Sequence[Sequence[str]]) -> list[list[str]]:
    """``sentences`` as lists of words; a TypeError for one string where sentences are wanted,
    a sentence that is a string (not split into words) and a word that is not a string, a
    SentenceError for a word that is empty or holds whitespace."""
    if isinstance(sentences, str | bytes):
        raise TypeError("a list of sentences (each a list of words) is wanted, not one str")
    out = []
    for i, words in enumerate(sentences, start=1):
        if isinstance(words, str | bytes) or not isinstance(words, Sequence):
            raise TypeError(
                f"sentence {i} is a {type(words).__name__}, not a list of words "
                "(str.split() makes one)"
            )
        for word in words:
            if not isinstance(word, str):
                raise TypeError(f"sentence {i}: word {word!r} is a {type(word).__name__}")
            if not word or any(c.isspace() for c in word):
                raise SentenceError(i, f": word {word!r} is empty or holds whitespace")
        out.append(list(words))
    return out


def _check_scorable(
    parser: Parser, sentences: Sequence[Sequence[str]], trees: Sequence[Tree]
) -> None:
    """A UserError naming the first tree that is not its sentence's or holds a label (or tag)
    the model's target vocabulary lacks: it would be scored as <unk>, a score of nothing."""
    if isinstance(trees, str | bytes):
        raise TypeError("a list of trees is wanted, not one str")
    trees = list(trees)
    if len(sentences) != len(trees):
        raise UserError(f"{len(sentences)} sentences but {len(trees)} trees")
    target = getattr(parser.vocab, "target")
    for i, (words, tree) in enumerate(zip(sentences, trees, strict=True)):
        if not isinstance(tree, Tree):
            raise TypeError(
                f"tree {i + 1} is a {type(tree).__name__}, not a Tree (transduce.data.trees "
                "reads bracketed text)"
            )
        if len(tree.leaves()) != len(words):
            raise UserError(
                f"tree {i + 1} has {len(tree.leaves())} words, its sentence {len(words)}"
            )
        tokens = linearise(tree, tags=parser.task.keep_tags)
        unknown = next((t for t in tokens if t != WORD_SLOT and target.encode(t) == [UNK]), None)
        if unknown is not None:
            raise UserError(
                f"tree {i + 1}: {unknown!r} is not in the model's target vocabulary (the "
                "labels it was trained on)"
            )


@contextmanager
def lines_named(name: str, lines: Sequence[int]) -> Iterator[None]:
    """Errors about sentence K of the sentences parsed (``SentenceError``), told as line
    ``lines[K - 1] + 1`` of ``name`` (a file whose blank lines were not parsed)."""
    try:
        yield
    except SentenceError as e:
        if not 1 <= e.sentence <= len(lines):
            raise
        raise e.at_line(name, lines[e.sentence - 1] + 1) from None


def evaluate_parser(
    parser: Parser,
    words_path: str | Path,
    trees_path: str | Path,
    decode: DecodeConfig | None = None,
    *,
    constrained: bool | None = None,
    show_progress: bool | None = False,
) -> tuple[dict[str, Any], list[Parse]]:
    """Parse ``words_path`` (one tokenised sentence a line) and score the trees against
    ``trees_path`` (one gold tree a line) with ``evaluation.evalb``: precision, recall, F1,
    exact match, F1 on sentences of at most 40 words, the share well-formed as decoded, the
    repairs and the number of sentences: the evaluation of a parsing model (``transduce
    evaluate``). ``decode``, ``constrained``: as ``Parser.parse`` takes them. Returns (scores,
    the parses in order), as ``evaluate_files`` returns a translation model's."""
    sentences = [line.split() for line in read_lines(words_path)]
    if not sentences:  # an F1 of no sentence would read as a score of 0
        raise UserError(f"{words_path}: no sentences to parse")
    empty = next((i for i, words in enumerate(sentences) if not words), None)
    if empty is not None:  # before any decoding; EVALB scores a tree for every sentence
        raise UserError(
            f"{words_path}: line {empty + 1} is empty: every line of a parser's "
            "evaluation needs a sentence (and its gold tree)"
        )
    check_words(sentences, str(words_path))
    gold = read_tree_file(trees_path)
    if len(gold) != len(sentences):
        raise UserError(
            f"{words_path} has {len(sentences)} sentences but {trees_path} has {len(gold)} trees"
        )
    lines = list(range(len(sentences)))
    with lines_named(str(words_path), lines):
        parses = parser.parse(
            sentences, decode, constrained=constrained, show_progress=show_progress
        )
    scores = score_corpus(gold, [p.tree for p in parses]).as_dict()
    repairs = sum(p.repairs for p in parses)
    well_formed = sum(p.repairs == 0 for p in parses) / max(len(parses), 1)
    return {**scores, "well_formed": well_formed, "repairs": repairs}, parses


def parsing_scores(
    parser: Parser,
    sentences: Sequence[Sequence[str]],
    gold: Sequence[Tree],
    decode: DecodeConfig | None = None,
) -> dict[str, float]:
    """EVALB F1 (and precision, recall, exact match) of ``parser`` on ``sentences`` against
    ``gold`` decoded with ``decode`` (default: the model's settings), for validation during
    training."""
    parses = parser.parse(sentences, decode)
    scores = score_corpus(gold, [p.tree for p in parses])
    return {
        "f1": scores.f1,
        "precision": scores.precision,
        "recall": scores.recall,
        "exact_match": scores.exact_match,
        "well_formed": sum(p.repairs == 0 for p in parses) / max(len(parses), 1),
    }


__all__ = ["Parse", "Parser", "evaluate_parser", "lines_named", "parsing_scores", "word_units"]
