"""The parsing task (section 6.3): trees -> linearised targets, separate vocabularies (word
pieces in, bracket tokens out), validation by EVALB F1 on dev; best.pt by F1."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from transduce.architectures import Seq2Seq
from transduce.config import Config, ParsingTaskConfig
from transduce.data.batching import Pair
from transduce.data.parallel import read_lines, resolve_data_path
from transduce.data.subword import SentencePieceVocab, train_sentencepiece
from transduce.data.trees import Tree, read_tree_file
from transduce.data.vocab import TokenVocab, VocabPair
from transduce.errors import UserError
from transduce.model.transformer import Transformer
from transduce.parsing.parser import Parser, parsing_scores, word_units
from transduce.parsing.targets import parsing_targets
from transduce.training import distributed
from transduce.training.feed import Resegment
from transduce.training.fit import (
    Log,
    RunOptions,
    TaskData,
    check_new_run,
    epoch_seed,
    fit,
    rank_log,
)
from transduce.training.trainer import StepCallback
from transduce.training.validation import Validator


def read_split(folder: Path, split: str) -> tuple[list[list[str]], list[Tree]]:
    """The sentences (word lists) and gold trees of ``folder/{split}.words`` / ``.trees``; a
    split of no sentences is refused (train would learn nothing; dev, which every parsing run
    validates on, would score F1 0 and stop the run early)."""
    words_path, trees_path = folder / f"{split}.words", folder / f"{split}.trees"
    for path in (words_path, trees_path):
        if not path.is_file():
            raise UserError(
                f"{path} not found: task.parse_data names a folder that `transduce data "
                "ptb-sample --dest FOLDER` fills"
            )
    sentences = [line.split() for line in read_lines(words_path)]
    trees = read_tree_file(trees_path)
    if len(sentences) != len(trees):
        raise UserError(f"{words_path}: {len(sentences)} sentences but {len(trees)} trees")
    if not sentences:
        use = "to train on" if split == "train" else "to validate on (F1, best.pt, patience)"
        raise UserError(
            f"{words_path} and {trees_path.name}: no sentences; the {split} split needs "
            f"sentences {use}"
        )
    for i, (words, tree) in enumerate(zip(sentences, trees, strict=True)):
        if words != tree.words():  # a line dropped, added or edited: every pair after it wrong
            shown = " ".join(tree.words())
            raise UserError(
                f"{words_path}: line {i + 1}: the words differ from tree {i + 1} of "
                f"{trees_path.name} ({' '.join(words)[:60]!r} against {shown[:60]!r})"
            )
    return sentences, trees


def parsing_vocab(
    sentences: Sequence[Sequence[str]], trees: Sequence[Tree], task: ParsingTaskConfig, seed: int
) -> tuple[VocabPair, list[str]]:
    """Word pieces learned on the training sentences, and the training targets' tokens (both
    deterministic, so every rank and a resumed run learn the same); with ``slot_pieces`` every
    word-initial source piece is a target token too (a test word's may not occur in training).
    Returns the vocabularies and the training targets."""
    source = train_sentencepiece(
        [" ".join(s) for s in sentences], task.src_vocab_size, seed=seed, hard_vocab_limit=False
    )
    targets = parsing_targets(trees, sentences, task, source)
    extra: list[str] = []
    if task.slot_pieces:
        pieces = (source.id_to_piece(i) for i in range(len(source)))
        extra = [" ".join(p for p in pieces if p.startswith("▁"))]
    return VocabPair(source, TokenVocab.learn(targets + extra)), targets


def source_dropout_pairs(
    cfg: Config,
    source: SentencePieceVocab,
    sentences: Sequence[Sequence[str]],
    targets: Sequence[list[int]],
) -> Resegment | None:
    """Each epoch's training pairs with the source words under BPE-dropout ``task.bpe_dropout``
    (None when 0), seeded by ``train.seed`` and the epoch (the same pairs within a process, not
    across processes: ``SentencePieceVocab.sample_batch``); the targets stay as they are."""
    assert isinstance(cfg.task, ParsingTaskConfig)
    p = cfg.task.bpe_dropout
    if not p:
        return None
    texts = [" ".join(words) for words in sentences]

    def pairs(epoch: int) -> list[Pair]:
        seed = epoch_seed(cfg.train.seed, epoch)
        return list(zip(source.sample_batch(texts, dropout=p, seed=seed), targets, strict=True))

    return pairs


def f1_validator(
    cfg: Config, vocab: VocabPair, sentences: list[list[str]], gold: list[Tree]
) -> Validator:
    """EVALB F1 of the model's parses of dev (beam ``train.valid_beam``)."""

    def validate(model: Seq2Seq) -> dict[str, Any]:
        parser = Parser(model, vocab, cfg)
        decode = parser.translator.decode_config(beam=cfg.train.valid_beam)
        return parsing_scores(parser, sentences, gold, decode)

    return validate


def train_parsing(
    cfg: Config,
    out_dir: str | Path,
    *,
    resume: bool = False,
    show_progress: bool | None = None,
    log: Log | None = None,
    callbacks: Sequence[StepCallback] = (),
    allow_change: Sequence[str] = (),
) -> dict[str, Any]:
    """Train a parser on ``task.parse_data``'s train split, validating on dev; best.pt by F1."""
    task = cfg.task
    if not isinstance(task, ParsingTaskConfig):
        raise UserError(f"task.name is {task.name!r}, not 'parsing'")
    check_new_run(out_dir, resume)
    world, _ = distributed.init_from_env(cfg.train.device)
    log = rank_log(log, world)
    folder = resolve_data_path(task.parse_data, "parse_data", must_exist=False)  # (read_split)
    train_words, train_trees = read_split(folder, "train")
    dev_words, dev_trees = read_split(folder, "dev")
    vocab, targets = parsing_vocab(train_words, train_trees, task, cfg.train.seed)
    log(
        f"parsing: {len(train_words)} training and {len(dev_words)} dev sentences from "
        f"{folder}; {len(vocab.source)} source pieces, {len(vocab.target)} target tokens"
    )
    train_pairs: list[Pair] = [
        (vocab.source.encode(" ".join(w)), vocab.target.encode(t))
        for w, t in zip(train_words, targets, strict=True)
    ]
    assert isinstance(vocab.source, SentencePieceVocab)
    dev_targets = parsing_targets(dev_trees, dev_words, task, vocab.source)
    dev_pairs: list[Pair] = [
        (vocab.source.encode(" ".join(w)), vocab.target.encode(t))
        for w, t in zip(dev_words, dev_targets, strict=True)
    ]
    data = TaskData(
        vocab,
        train_pairs,
        dev_pairs,
        f1_validator(cfg, vocab, dev_words, dev_trees),
        "f1",
        source_dropout_pairs(cfg, vocab.source, train_words, [t for _, t in train_pairs]),
        counts={"train_sentences": len(train_words), "dev_sentences": len(dev_words)},
    )

    def adapt(model: Seq2Seq) -> None:
        if cfg.model.position_unit == "word" and isinstance(model, Transformer):  # rnn: none
            model.set_word_units(*word_units(vocab))

    return fit(
        cfg, out_dir, data, RunOptions(resume, show_progress, callbacks, allow_change), adapt=adapt
    )


__all__ = [
    "f1_validator",
    "parsing_vocab",
    "read_split",
    "source_dropout_pairs",
    "train_parsing",
]
