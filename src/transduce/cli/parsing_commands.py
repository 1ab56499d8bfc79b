"""Subcommands of constituency parsing (section 6.3): data ptb-sample, parse."""

from __future__ import annotations

import argparse
import json
import sys


def _cmd_data_ptb(args: argparse.Namespace) -> int:
    from transduce.data.ptb import prepare_ptb_sample

    counts = prepare_ptb_sample(args.dest, args.from_dir)
    print(json.dumps({"dest": str(args.dest), "sentences": counts}))
    return 0


def _cmd_parse(args: argparse.Namespace) -> int:
    from transduce.cli.translation_commands import _read_input, _write_output
    from transduce.data.trees import to_brackets
    from transduce.inference.parsing import Parser

    parser = Parser.load(args.model, device=args.device)  # a bad --model: before stdin
    sentences = [line.split() for line in _read_input(args.input)]
    parses = parser.parse(
        sentences, beam=args.beam, alpha=args.alpha, max_len_offset=args.max_len_offset,
        constrained=args.constrained, show_progress=None if not args.quiet else False,
    )  # fmt: skip
    _write_output(args.output, [to_brackets(p.tree) for p in parses])
    if not args.quiet:
        repaired = sum(p.repairs > 0 for p in parses)
        print(f"transduce: {len(parses)} trees, {repaired} repaired", file=sys.stderr)
    return 0


def add_data_command(data_sub: argparse._SubParsersAction) -> None:
    """``transduce data ptb-sample`` beside the other corpora."""
    d = data_sub.add_parser(
        "ptb-sample",
        help="NLTK's Penn Treebank sample (WSJ 0001-0199) split for parsing",
        description="Put treebank.zip into DEST (downloaded, or copied from --from FOLDER) and "
        "write {train,dev,test}.words and .trees: wsj_0001-0159 train, 0160-0179 dev, "
        "0180-0199 test.",
    )
    d.add_argument("--dest", required=True, help="folder to write (e.g. data/ptb-sample)")
    d.add_argument("--from", dest="from_dir", default=None, metavar="FOLDER",
                   help="a folder holding treebank.zip, instead of downloading it")  # fmt: skip
    d.set_defaults(func=_cmd_data_ptb)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "parse",
        help="parse tokenised sentences into trees with a parsing model",
        description="One tokenised sentence per line from --input (or stdin) to one tree per "
        "line, Penn Treebank brackets with a preterminal around every word.",
    )
    p.add_argument("--model", required=True, help="checkpoint of a parsing run")
    p.add_argument("--input", default=None, help="text file, plain or .gz (default: stdin)")
    p.add_argument("--output", default=None, help="file to write (default: stdout)")
    p.add_argument("--beam", type=int, default=None, help="default: the model's (21)")
    p.add_argument("--alpha", type=float, default=None, help="default: the model's (0.3)")
    p.add_argument("--max-len-offset", type=int, default=None, metavar="N",
                   help="outputs of at most input + N tokens (default: the model's, 300)")
    p.add_argument("--constrained", action=argparse.BooleanOptionalAction, default=None,
                   help="only continuations that can still become a well-formed tree with the "
                   "input's words (default: the model's task.constrained)")  # fmt: skip
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default: cpu)")
    p.add_argument("--quiet", action="store_true", help="no progress bar or summary line")
    p.set_defaults(func=_cmd_parse)
