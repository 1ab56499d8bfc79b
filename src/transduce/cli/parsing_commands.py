"""The subcommand of constituency parsing (section 6.3): parse. (``data ptb-sample`` fetches the
treebank sample; ``evaluate`` scores a parsing model too.)"""

from __future__ import annotations

import argparse
import sys

from transduce.cli.common import Once, add_device, check_output, read_input, write_output
from transduce.cli.decoding_tools import check_alpha, flag_settings


def _cmd_parse(args: argparse.Namespace) -> int:
    from transduce.data.trees import check_words, to_brackets
    from transduce.parsing.parser import Parser, lines_named

    check_output(args.output)
    parser = Parser.load(args.model, device=args.device)  # a bad --model: before stdin
    sentences = [line.split() for line in read_input(args.input)]
    name = "<stdin>" if args.input in (None, "-") else args.input
    check_words(sentences, name)  # before any work: a tree of them could not be written
    decode = flag_settings(
        parser.translator, beam=args.beam, alpha=args.alpha, max_len_offset=args.max_len_offset
    )
    check_alpha(args.alpha, decode, has_nbest=False)
    todo = [i for i, words in enumerate(sentences) if words]  # a blank line stays blank
    with lines_named(name, todo):  # "sentence K" of those parsed is its line of the input
        parses = parser.parse(
            [sentences[i] for i in todo],
            decode,
            constrained=args.constrained,
            show_progress=None if not args.quiet else False,
        )
    out = [""] * len(sentences)
    for i, parsed in zip(todo, parses, strict=True):
        out[i] = to_brackets(parsed.tree)
    write_output(args.output, out)
    if not args.quiet:
        repaired = sum(p.repairs > 0 for p in parses)
        print(f"transduce: {len(parses)} trees, {repaired} repaired", file=sys.stderr)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "parse",
        help="parse tokenised sentences into trees with a parsing model",
        description="One tokenised sentence per line from --input (or stdin) to one tree per "
        "line, Penn Treebank brackets with a preterminal around every word; a blank line gives "
        "a blank line.",
    )
    p.add_argument("--model", required=True, action=Once, help="checkpoint of a parsing run")
    p.add_argument("--input", default=None, help="text file, plain or .gz (default: stdin)")
    p.add_argument(
        "--output", default=None, help="file to write (default: stdout; a .gz name: gzip)"
    )
    p.add_argument(
        "--beam",
        type=int,
        default=None,
        help="default: the checkpoint's decode.beam (21 in configs/ptb_parsing.yaml)",
    )
    p.add_argument(
        "--alpha",
        type=float,
        default=None,
        help="default: the checkpoint's decode.alpha (0.3 in configs/ptb_parsing.yaml)",
    )
    p.add_argument(
        "--max-len-offset",
        type=int,
        default=None,
        metavar="N",
        help="outputs of at most input tokens + 1 (its EOS) + N tokens (default: the "
        "checkpoint's decode.max_len_offset; 300 in configs/ptb_parsing.yaml)",
    )
    p.add_argument(
        "--constrained",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="only continuations that can still become a well-formed tree with the "
        "input's words (default: the model's task.constrained)",
    )
    add_device(p)
    p.add_argument("--quiet", action="store_true", help="no progress bar or summary line")
    p.set_defaults(func=_cmd_parse)
