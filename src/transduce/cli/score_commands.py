"""``transduce score``: forced decoding of given sentence pairs (corpus filtering, reranking).

Reads line-aligned ``--src`` and ``--tgt`` and writes one JSON object per pair, in input order:
``log_prob`` (the sum of the target's token log-probabilities, EOS included), ``tokens`` (the
target's subword tokens + EOS), ``per_token`` (``log_prob / tokens``), ``normalized``
(``log_prob / lp(tokens)`` with the length penalty's alpha, what beam search ranks by) and
``score``: ``normalized`` with ``--normalize``, else ``log_prob``. Scored by
``Translator.score`` (``transduce.inference.scoring``), batched by ``--batch-tokens``.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from typing import Any

from transduce.cli.common import (
    add_device,
    add_models,
    add_precision,
    check_output,
    unknown_warning,
    write_output,
)
from transduce.errors import SentenceError, UserError


def _cmd_score(args: argparse.Namespace) -> int:
    from transduce.cli.decoding_tools import flag_settings, load_translator
    from transduce.data.parallel import read_aligned

    check_output(args.output)
    translator = load_translator(args)
    decode = flag_settings(
        translator, scoring=True, alpha=args.alpha, batch_tokens=args.batch_tokens
    )
    if translator.cfg.task.name == "parsing":
        scores = _parser_scores(args, translator, decode)
    else:
        sources, targets = read_aligned(args.src, args.tgt, what="source and target")
        try:
            scores = translator.score(sources, targets, decode)
        except SentenceError as e:  # pair K is line K of --src and of --tgt
            raise e.at_line(args.tgt if e.noun == "target" else args.src, e.sentence) from None
        for path, texts, target in ((args.src, sources, False), (args.tgt, targets, True)):
            warning = unknown_warning(translator.vocab, texts, f"{path}: ", target=target)
            if warning:  # a target read as <unk> is scored as <unk>: not the text given
                print(warning, file=sys.stderr)
    if not scores:  # as translate answers an empty input: nothing, but said
        print(f"transduce: warning: {args.src}: no lines to score", file=sys.stderr)
    out = []
    for pair in scores:
        row = asdict(pair)
        row["score"] = pair.normalized if args.normalize else pair.log_prob
        out.append(json.dumps(row))
    write_output(args.output, out)
    return 0


def _parser_scores(args: argparse.Namespace, translator: Any, decode: Any) -> list[Any]:
    """A parsing model's scores of --tgt's trees (one a line, as ``evaluate --ref``) for
    --src's sentences (words): each tree linearised as the model was trained."""
    from transduce.data.parallel import read_lines
    from transduce.data.trees import read_tree_file
    from transduce.parsing.parser import Parser

    if len(args.model) > 1:
        raise UserError("a parsing model is scored alone, not in an ensemble")
    if args.weights == "int8":  # the parser's own engine is the float model's
        raise UserError(
            "--precision int8 is for translation models; a parser takes fp32, bf16 or fp16"
        )
    parser = Parser(translator.model, translator.vocab, translator.cfg)
    sentences = [line.split() for line in read_lines(args.src)]
    empty = next((i for i, words in enumerate(sentences) if not words), None)
    if empty is not None:  # a tree file holds no blank lines: the counts would mislead
        raise UserError(
            f"{args.src}: line {empty + 1} is empty: every line of a parser's scoring needs "
            f"words, and its tree on the same line of {args.tgt}"
        )
    trees = read_tree_file(args.tgt)
    if len(trees) != len(sentences):
        raise UserError(f"{args.src} has {len(sentences)} lines but {args.tgt} {len(trees)} trees")
    try:
        return parser.score(sentences, trees, decode)
    except SentenceError as e:  # pair K is line K of --src and of --tgt
        raise e.at_line(args.tgt if e.noun == "target" else args.src, e.sentence) from None
    except UserError as e:  # about a tree
        raise UserError(f"{args.tgt}: {e}") from None


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "score",
        help="log-probabilities a model gives sentence pairs (forced decoding)",
        description="Score each pair of line-aligned --src and --tgt: one JSON line per pair, "
        "in order, with log_prob (sum over the target's tokens and EOS), tokens, per_token, "
        "normalized (log_prob / length penalty, as beam search ranks) and score (normalized "
        "with --normalize, else log_prob).",
    )
    add_models(p)
    p.add_argument("--src", required=True, help="source sentences, one per line (plain or .gz)")
    p.add_argument("--tgt", required=True, help="target sentences, line-aligned with --src")
    p.add_argument(
        "--normalize",
        action="store_true",
        help="score = log_prob / length penalty (default: score = log_prob)",
    )
    p.add_argument(
        "--alpha",
        type=float,
        default=None,
        help="the length penalty's alpha of normalized (default: the checkpoint's decode.alpha)",
    )
    p.add_argument(
        "--batch-tokens",
        type=int,
        default=None,
        metavar="N",
        help="padded tokens per batch (default: the model's decode.batch_tokens, 4000)",
    )
    p.add_argument(
        "--output", default=None, help="file to write (default: stdout; a .gz name: gzip)"
    )
    add_device(p)
    add_precision(p)
    p.set_defaults(func=_cmd_score)


__all__ = ["register"]
